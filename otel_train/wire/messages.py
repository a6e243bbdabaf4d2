"""What the training process and its exporter process say to each other, and what a lost
message costs.

The socket: one AF_UNIX stream; each message (a *frame*) is a little-endian u64 length and a
pickle. The training process sends lists of operations, each a tuple whose first element
says what the rest is (the ``OP_*`` codes below); the exporter process answers with replies
(``REPLY_*``). Both sides read and write frames only through this module, so the framing is
written once.

Metric instruments are named by id: ``OP_INSTRUMENT`` binds an id to a metric of
``semconv.METRICS``, and each ``OP_MEASURE`` carries that id. The instruments a step and its
collectives record into are fixed by ``semconv`` and made where the records become
telemetry, so ``OP_STEP`` and ``OP_COLLECTIVES`` carry no instrument at all.

:func:`count_lost` says what an operation that will never be applied would have produced,
in each signal's own unit (spans, log records, metric data points), from the same expansion
that makes the telemetry (``wire/step.py``, ``wire/collectives.py``, ``wire/nccl.py``).
"""

from __future__ import annotations

import collections
import pickle
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from otel_train import semconv
from otel_train.wire import collectives, nccl, step

#: the signals, in the order counts are reported
SIGNALS = (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS)

# operations: the first element says what the rest is
OP_SPAN = "S"  # (S, name, parent, start, end, attrs, span_id, trace_id, links, error, events)
OP_LOG = "L"  # (L, time, observed, parent, severity, severity_text, body, attrs, scope)
OP_INSTRUMENT = "I"  # (I, id, metric name): the exporter makes semconv.METRICS[name]
OP_MEASURE = "M"  # (M, id, value, attrs, exemplar parent or None)
#: (C, spec, rows): a collectives.Spec with collectives.Row tuples, or an nccl.StepSpec with
#: the NCCL plugin's records (tuples, or nccl.pack's bytes)
OP_COLLECTIVES = "C"
OP_STEP = "T"  # (T, step.StepRecord)
OP_SHUTDOWN = "X"  # (X, timeout_s): flush, reply (dropped, flushed), exit

# replies of the exporter process (framed the same way)
REPLY_READY = "ready"  # (ready, exporter kind, [warning texts])
REPLY_DONE = "done"  # (done, {signal: dropped}, flushed, accounts, batches applied)
#: (drops, {signal: dropped so far}, accounts, batches applied): after every batch, and when
#: the counts change; accounts: produced/exported/dropped by signal
REPLY_DROPS = "drops"
#: (series, frozenset of series_key): the series the exporter's next metric collection will
#: carry, sent when they change; one point each is what its loss costs
REPLY_SERIES = "series"

HEADER = struct.Struct("<Q")
#: set in a frame's length header: a frame the reader keeps even when later ones arrived with
#: it (the pending series are sent only when they change: skipping one would lose them)
KEPT = 1 << 63

_SIGNAL_OF_OP = {OP_SPAN: semconv.SIGNAL_SPANS, OP_LOG: semconv.SIGNAL_LOGS,
                 OP_MEASURE: semconv.SIGNAL_METRICS}


# --- framing ------------------------------------------------------------------------------
def encode(obj: Any, kept: bool = False) -> bytes:
    """One frame: the length header (marked if ``kept``: see :data:`KEPT`) and the pickle."""
    data = pickle.dumps(obj, protocol=5)
    return HEADER.pack(len(data) | (KEPT if kept else 0)) + data


def send_message(sock: socket.socket, obj: Any, kept: bool = False) -> None:
    sock.sendall(encode(obj, kept))


def recv_message(sock: socket.socket) -> Any:
    """One message, or raises EOFError when the other side has closed."""
    header = _recv_exactly(sock, HEADER.size)
    return pickle.loads(_recv_exactly(sock, HEADER.unpack(header)[0] & ~KEPT))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other side closed the socket")
        got += k
    return bytes(buf)


class Inbox:
    """Frames read without waiting (each drain) or with a bound (at shutdown); whole frames
    only."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def poll(self, sock: socket.socket) -> list[Any]:
        """The latest of what has arrived, without blocking: every reply carries absolute
        counts and the batches applied so far, so the last one says all the others do; and
        the latest kept frame (the pending series), which later ones do not repeat."""
        while True:
            try:
                chunk = sock.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break  # closed: the next send finds out and counts
            self._buf += chunk
        return self._frames(latest_only=True)

    def wait(self, sock: socket.socket, timeout_s: float) -> list[Any]:
        """At least one frame, or [] once ``timeout_s`` has passed or the socket closed."""
        deadline = time.monotonic() + timeout_s
        frames = self._frames()
        while not frames:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, OSError):
                return []
            finally:
                sock.settimeout(None)
            if not chunk:
                return []
            self._buf += chunk
            frames = self._frames()
        return frames

    def _frames(self, latest_only: bool = False) -> list[Any]:
        buf, size = self._buf, HEADER.size
        spans = []  # (start, end, kept) of each whole frame
        at = 0
        while len(buf) - at >= size:
            (raw,) = HEADER.unpack_from(buf, at)
            n = raw & ~KEPT
            if len(buf) - at < size + n:
                break
            spans.append((at + size, at + size + n, bool(raw & KEPT)))
            at += size + n
        if latest_only:
            kept = [span for span in spans if span[2]][-1:]
            spans = sorted({*kept, *spans[-1:]})
        out = [pickle.loads(bytes(buf[start:end])) for start, end, _ in spans]
        del buf[:at]
        return out


# --- what a lost operation costs ----------------------------------------------------------
def series_key(name: str, attributes: Any) -> tuple[str, frozenset[Any]]:
    """One metric series, which makes one data point in each collection it is part of: the
    metric's name and its attribute set."""
    items = (attributes or {}).items()
    try:
        return name, frozenset(items)
    except TypeError:  # an unhashable value (a list): its text tells the series apart too
        return name, frozenset((k, repr(v)) for k, v in items)


def count_lost(op: tuple[Any, ...], dropped: collections.Counter[str],
               series: set[tuple[str, frozenset[Any]]], names: dict[int, str]) -> None:
    """Count an operation that will never be applied: its spans and log records into
    ``dropped``, and the metric series it would have measured into ``series`` (``names``:
    instrument id -> metric name). Metrics are counted in data points, as they are exported:
    a lost measurement costs a point only where no other measurement makes its series' point
    in the same collection, so the caller counts the series, not the measurements."""
    kind = op[0]
    signal = _SIGNAL_OF_OP.get(kind)
    if kind == OP_MEASURE:
        series.add(series_key(names.get(op[1], str(op[1])), op[3]))
    elif signal is not None:
        dropped[signal] += 1
    elif kind == OP_COLLECTIVES:  # what the expansion would have made, exactly
        dropped[semconv.SIGNAL_SPANS] += _collectives_lost(op[1], op[2], series)
    elif kind == OP_STEP:
        record = op[1]
        spans, _, logs = step.lost(record)
        dropped[semconv.SIGNAL_SPANS] += spans
        dropped[semconv.SIGNAL_LOGS] += logs
        step.emit(record, _nothing, _nothing, *(_series_of(series, name)
                                                for name in step.INSTRUMENTS))


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _series_of(series: set[tuple[str, frozenset[Any]]], name: str) -> Callable[..., None]:
    """An instrument's ``record``/``add`` that notes the series it would have measured."""
    def measure(value: float, attributes: Any = None, **kwargs: Any) -> None:
        series.add(series_key(name, attributes))

    return measure


def _collectives_lost(spec: Any, rows: Any, series: set[tuple[str, frozenset[Any]]]) -> int:
    """The spans a lost OP_COLLECTIVES would have made; its series into ``series``."""
    spans = [0]

    def one_span(*args: Any, **kwargs: Any) -> None:
        spans[0] += 1

    duration = _series_of(series, semconv.METRIC_COLLECTIVE_DURATION)
    size = _series_of(series, semconv.METRIC_COLLECTIVE_SIZE)
    expand_collectives(spec, rows, one_span, duration, size)
    return spans[0]


def expand_collectives(spec: Any, rows: Any, span: Callable[..., Any],
                       duration: Callable[..., Any], size: Callable[..., Any]) -> int:
    """An OP_COLLECTIVES' rows made into spans and points, by the type of ``spec``."""
    if isinstance(spec, collectives.Spec):
        return collectives.expand(spec, rows, span, duration, size)
    return nccl.expand(spec, rows, span, duration, size)
