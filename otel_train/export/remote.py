"""The training process's side of the exporter process: telemetry leaves as plain tuples.

Building OpenTelemetry spans, metric points and log records, encoding OTLP and exporting
cost ~100-200 us of interpreter time per span; on a thread of the training process that
time is taken from the training thread, which waits for the GIL (docs/overhead.md). So the
emitter hands what it would have built to :class:`RemotePipeline` as tuples of ints,
strings and attribute dicts, and one exporter process per rank (``exporter/process.py``,
started the way CUDA programs must start children: a fresh interpreter, never a fork)
builds and exports them with the ordinary :class:`~otel_train.exporter.providers.Pipeline`.

The socket, its frames, the operations and the exporter's replies are ``wire/messages.py``'s.
The emitter thread sends a batch after each drain: a blocking send,
which releases the GIL while it waits, so a slow exporter slows the emitter (whose
bounded buffer then drops and counts) and never the training thread. An exporter that
dies is restarted (at most ``MAX_RESTARTS`` times; every loss is warned about and counted
in ``losses``); what it had not taken is counted as dropped, metrics in data points as they
are exported: the points of the collection it never made, one per series it held (which it
reports whenever they change) or that what it never applied would have added. The counts
reach the metrics of the next exporter and the user at exit. The exporter reports its own
losses back after each batch that changed them (absolute counts, read without waiting at
each drain), so the emitter's dropped counter and ``Instrumentation.dropped`` include them,
as they do with export in process. The exporter reads until the socket closes, so it never
outlives the training process (also after SIGKILL: the kernel closes the socket), and it
holds no shared memory.
"""

from __future__ import annotations

import collections
import os
import pickle
import random
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from otel_train import semconv
from otel_train.config import Config, ConfigWarning, choose_exporter
from otel_train.identity import Identity
from otel_train.wire import ctx_tuple
from otel_train.wire import step as wire_step
from otel_train.wire.messages import (
    OP_COLLECTIVES,
    OP_INSTRUMENT,
    OP_LOG,
    OP_MEASURE,
    OP_SHUTDOWN,
    OP_SPAN,
    OP_STEP,
    REPLY_DONE,
    REPLY_DROPS,
    REPLY_READY,
    REPLY_SERIES,
    SIGNALS,
    Inbox,
    count_lost,
    recv_message,
    send_message,
)

MAX_RESTARTS = 3
READY_TIMEOUT_S = 60.0
#: how often the emitter reads the exporter's replies (acknowledgements, drop reports):
#: reading them after every batch cost a system call, an exception and an unpickled report
#: per drain; they are counts, so the latest one is all that matters, and a lost exporter's
#: replies are read before its losses are settled
REPLY_POLL_S = 0.5
#: unacknowledged batches past which the replies are read at once (bounds what they hold)
REPLY_POLL_BATCHES = 32
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# The exporter process runs this copy of otel_train (its directory first on the path,
# whatever else is installed) and never imports torch: the package's names load lazily
# (otel_train/__init__.py) and exporter/process.py imports nothing that needs it
# (tests/sdk/test_exporter_process.py).
_BOOT = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from otel_train.exporter.process import main\n"
    "sys.exit(main(int(sys.argv[2])))\n"
)


class _ProxyInstrument:
    """A synchronous instrument whose measurements become tuples for the exporter."""

    __slots__ = ("_id", "_ops", "_last")

    def __init__(self, instrument_id: int, ops: collections.deque[tuple[Any, ...]]) -> None:
        self._id, self._ops = instrument_id, ops
        self._last: tuple[Any, Any] = (None, None)  # (context, its span as a tuple)

    def _measure(self, value: float, attributes: dict[str, Any] | None = None,
                 context: Any = None) -> None:
        parent = None
        if context is not None:
            last_context, parent = self._last
            if context is not last_context:  # one context per step, many points per step
                span_ctx = trace.get_current_span(context).get_span_context()
                parent = ctx_tuple(span_ctx) if span_ctx.is_valid else None
                self._last = (context, parent)
        self._ops.append((OP_MEASURE, self._id, value, attributes, parent))

    record = add = set = _measure


class _ProxyMeter:
    """``create_histogram``/``create_counter``/``create_gauge`` as ``semconv.create`` calls
    them. Only the name travels: the exporter process makes the instrument from the same
    definition in ``semconv.METRICS``, so a metric missing from the table fails here, at
    creation, not later in the exporter."""

    def __init__(self, pipeline: RemotePipeline) -> None:
        self._pipeline = pipeline

    def _create(self, kind: str, name: str) -> _ProxyInstrument:
        if semconv.METRICS[name].kind != kind:
            raise ValueError(f"{name} is a {semconv.METRICS[name].kind}, not a {kind}")
        return self._pipeline.define_instrument(name)

    def create_histogram(self, name: str, unit: str = "", description: str = "",
                         explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
                         ) -> _ProxyInstrument:
        return self._create(semconv.HISTOGRAM, name)

    def create_counter(self, name: str, unit: str = "", description: str = ""
                       ) -> _ProxyInstrument:
        return self._create(semconv.COUNTER, name)

    def create_gauge(self, name: str, unit: str = "", description: str = ""
                     ) -> _ProxyInstrument:
        return self._create(semconv.GAUGE, name)


_live: weakref.WeakSet[RemotePipeline] = weakref.WeakSet()


def _close_in_forked_child() -> None:
    # A DataLoader worker forked while instrumented must neither send nor keep the socket
    # open: the exporter learns of the training process's death by the socket closing.
    for pipeline in list(_live):
        pipeline.forget_in_child()


os.register_at_fork(after_in_child=_close_in_forked_child)


class ExporterUnavailable(RuntimeError):
    """The exporter process could not be started."""


class RemotePipeline:
    """The :class:`~otel_train.exporter.providers.Pipeline` interface the emitter uses, with
    every OpenTelemetry object built in an exporter process."""

    def __init__(self, cfg: Config, ident: Identity, run_dir: Path | None,
                 on_warning: Callable[[str], None] | None = None) -> None:
        #: telemetry lost on this side: what could not be sent (a dead exporter), and
        #: what the sources count here (NCCL entries the ring overwrote)
        self.dropped: collections.Counter[str] = collections.Counter()
        #: the exporters' own losses (refused exports, full queues): the running
        #: exporter's latest report on top of the final counts of the ones before it
        self._exporter_live: collections.Counter[str] = collections.Counter()
        self._exporter_past: collections.Counter[str] = collections.Counter()
        #: the exporters' accounts (produced, exported, dropped by signal): the running
        #: one's latest report, and the settled totals of the ones before it
        self._accounts_live: dict[str, dict[str, int]] = {}
        self._accounts_past: dict[str, collections.Counter[str]] = {
            k: collections.Counter() for k in ("produced", "exported", "dropped")}
        #: batches sent to the running exporter and not yet acknowledged as applied
        self._unacked: collections.deque[tuple[int, list[tuple[Any, ...]]]] = (
            collections.deque())
        self._sent_batches = 0
        #: the running exporter's pending metric series (its latest REPLY_SERIES)
        self._series_live: frozenset[tuple[str, frozenset[Any]]] = frozenset()
        #: the series of the collection the last lost exporter never made, while no other
        #: runs: what is lost after it adds a point only for a series not in it
        self._lost_series: set[tuple[str, frozenset[Any]]] = set()
        #: instrument id -> metric name
        self._names: dict[int, str] = {}
        self._inbox = Inbox()
        self._replies_read_at = 0.0  # time.monotonic() of the last read of the replies
        self.kind = choose_exporter(cfg)
        self.meter = _ProxyMeter(self)
        self.restarts = 0
        #: exporter processes lost (died, killed) before the run's end; each one warned
        self.losses = 0
        self.on_warning = on_warning
        self._settings = (cfg, ident, run_dir)
        self._ops: collections.deque[tuple[Any, ...]] = collections.deque()
        self._instruments: list[tuple[Any, ...]] = []
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._child_pid = os.getpid()
        self._start_exporter()
        _live.add(self)

    # --- the exporter process ----------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start_exporter(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding otel_train
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, root, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as err:
            ours.close()
            raise ExporterUnavailable(f"cannot start the exporter process: {err}") from err
        finally:
            theirs.close()
        try:
            send_message(ours, self._settings)
            ours.settimeout(READY_TIMEOUT_S)
            reply = recv_message(ours)
            ours.settimeout(None)
        except (OSError, EOFError, pickle.PickleError) as err:
            ours.close()
            proc.kill()
            proc.wait()
            raise ExporterUnavailable(f"the exporter process did not start: {err!r}") from err
        if reply[0] != REPLY_READY:
            ours.close()
            proc.kill()
            proc.wait()
            raise ExporterUnavailable(f"unexpected reply from the exporter: {reply!r}")
        self.kind = reply[1]
        for text in reply[2]:
            warnings.warn(text, ConfigWarning, stacklevel=6)
        self._sock, self._proc = ours, proc
        if self._instruments:  # a restarted exporter: the instruments again, first
            send_message(ours, list(self._instruments))

    def _exporter_lost(self, ops: Sequence[tuple[Any, ...]], why: str) -> None:
        """The running exporter is gone: count what it and ``ops`` (which did not reach it)
        lose, warn, and start another one if a restart is left."""
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        if sock is not None:  # its last acknowledgements and accounts may still be unread
            try:
                self._take_replies(self._inbox.poll(sock))
            except Exception:
                pass
        self._settle_lost_exporter(ops)
        if sock is not None:
            sock.close()
        if proc is not None:
            proc.kill()
            proc.wait()
        self.losses += 1
        lost = f"otel-train: the exporter process was lost ({why}), loss {self.losses}"
        if self.restarts >= MAX_RESTARTS:
            self._warn(f"{lost}; no restart left ({MAX_RESTARTS} used): the rest of this "
                       "run's telemetry is dropped and counted")
            return
        self._restart(f"{lost}; starting another")

    def _restart(self, warning: str) -> None:
        self.restarts += 1
        self._warn(f"{warning} ({self.restarts} of {MAX_RESTARTS})")
        try:
            self._start_exporter()
        except ExporterUnavailable as err:
            self._warn(f"otel-train: {err}")
            return
        self._lost_series = set()  # the new exporter collects afresh

    def _warn(self, text: str) -> None:
        if self.on_warning is not None:
            self.on_warning(text)

    def _lost_without_exporter(self, ops: Sequence[tuple[Any, ...]]) -> None:
        """No exporter runs (none could be started, or no restart is left): ``ops`` are
        lost, their metric series a point each where the collection the lost exporter never
        made did not hold them already. Another exporter is tried while restarts are left."""
        before = len(self._lost_series)
        for op in ops:
            count_lost(op, self.dropped, self._lost_series, self._names)
        self.dropped[semconv.SIGNAL_METRICS] += len(self._lost_series) - before
        if self.restarts < MAX_RESTARTS:
            self._restart("otel-train: no exporter process runs; starting another")

    def _settle_lost_exporter(self, ops: Sequence[tuple[Any, ...]] = ()) -> None:
        """An exporter ended without saying it flushed: dropped are what it was sent and
        never applied (unacknowledged batches, and ``ops``, which never reached it), what
        it had taken and not exported by its last report (queued in its SDK when it died),
        and the points of the metric collection it never made: one for each series it held,
        and one for each series that only what it never applied would have added."""
        held = set(self._series_live)
        lost = set(held)
        for batch in (*(b for _, b in self._unacked), ops):
            for op in batch:
                count_lost(op, self.dropped, lost, self._names)
        self._unacked.clear()
        accounts = self._accounts_live
        for kind in ("produced", "exported", "dropped"):
            accounts.setdefault(kind, {})
        # the collection it never made: the held series' points were its SDK's, so they
        # are produced and dropped in its accounts; those only unapplied operations would
        # have added never reached an SDK (as unapplied spans); the run's drops hold both
        for kind in ("produced", "dropped"):
            counts = accounts[kind]
            counts[semconv.SIGNAL_METRICS] = counts.get(semconv.SIGNAL_METRICS, 0) + len(held)
        self.dropped[semconv.SIGNAL_METRICS] += len(lost)
        for signal, produced in accounts["produced"].items():
            missing = (produced - accounts["exported"].get(signal, 0)
                       - accounts["dropped"].get(signal, 0))
            if missing > 0:
                accounts["dropped"][signal] = accounts["dropped"].get(signal, 0) + missing
                self.dropped[signal] += missing
        self._lost_series = lost
        self._retire_exporter_counts()

    def _retire_exporter_counts(self) -> None:
        self._exporter_past.update(self._exporter_live)
        self._exporter_live = collections.Counter()
        for kind, counts in self._accounts_live.items():
            self._accounts_past[kind].update(counts)
        self._accounts_live = {}
        self._unacked.clear()
        self._sent_batches = 0
        self._series_live = frozenset()
        self._inbox = Inbox()

    def _replies_due(self) -> bool:
        """Time to read the exporter's replies (every ``REPLY_POLL_S``, or sooner when many
        batches wait for their acknowledgement)?"""
        now = time.monotonic()
        if (now - self._replies_read_at < REPLY_POLL_S
                and len(self._unacked) < REPLY_POLL_BATCHES):
            return False
        self._replies_read_at = now
        return True

    def _take_replies(self, frames: list[Any]) -> Any:
        """Apply drop reports and acknowledgements; return a REPLY_DONE frame if one came."""
        done = None
        for frame in frames:
            if frame[0] == REPLY_SERIES:
                self._series_live = frame[1]
            elif frame[0] == REPLY_DROPS:
                self._exporter_live = collections.Counter(frame[1])
                if len(frame) >= 4:
                    self._accounts_live = frame[2]
                    self._acknowledged(frame[3])
            elif frame[0] == REPLY_DONE:
                self._exporter_live = collections.Counter(frame[1])
                if len(frame) >= 5:
                    self._accounts_live = frame[3]
                    self._acknowledged(frame[4])
                done = frame
        return done

    def _acknowledged(self, applied: int) -> None:
        unacked = self._unacked
        while unacked and unacked[0][0] <= applied:
            unacked.popleft()

    def accounts_snapshot(self) -> dict[str, dict[str, int]]:
        """Produced, exported and dropped by signal over this run's exporter processes (what
        reached their SDKs; a lost exporter's unexported part settled as dropped)."""
        out: dict[str, dict[str, int]] = {}
        for kind, past in self._accounts_past.items():
            total = collections.Counter(past)
            total.update(self._accounts_live.get(kind, {}))
            out[kind] = {s: int(total[s]) for s in SIGNALS}
        return out

    def exporter_dropped(self) -> collections.Counter[str]:
        """What the exporter processes of this run reported dropping so far, its latest
        report read first: an export that fails after the training loop went quiet is
        reported by the exporter within DROP_REPORT_INTERVAL_S, while the emitter, with
        nothing recorded, may sleep for KEEPALIVE_S. Never waits: where a send holds the
        socket, what was read before is returned."""
        if self._sock is not None and self._send_lock.acquire(blocking=False):
            try:
                self._read_replies()
            finally:
                self._send_lock.release()
        return self._exporter_past + self._exporter_live

    def exporter_dropped_read(self) -> int:
        """The exporter processes' drops as read so far, all signals (no read: cheap)."""
        return sum(self._exporter_past.values()) + sum(self._exporter_live.values())

    def _read_replies(self) -> None:
        """Take what the exporter has replied so far (the caller holds the send lock)."""
        if self._sock is None:
            return
        try:
            self._take_replies(self._inbox.poll(self._sock))
        except OSError:
            pass  # a closed socket: the next send counts what it loses

    # --- what the emitter makes ---------------------------------------------------------
    def define_instrument(self, name: str) -> _ProxyInstrument:
        iid = len(self._instruments)
        op = (OP_INSTRUMENT, iid, name)
        self._names[iid] = name
        self._instruments.append(op)
        self._ops.append(op)
        return _ProxyInstrument(iid, self._ops)

    def span(self, name: str, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: dict[str, Any], span_id: int = 0, trace_id: int = 0,
             links: Sequence[SpanContext] = (), error: str | None = None,
             events: Sequence[tuple[str, int, dict[str, Any]]] = ()) -> SpanContext:
        """Queue one span; its context is decided here, exactly as the exporter's SDK will
        (ids preset or random; a sampled flag from the parent, roots always sampled)."""
        if parent is not None:
            trace_id, own_trace_id = 0, parent.trace_id  # a child's trace is its parent's
            flags = parent.trace_flags if not parent.is_remote else _SAMPLED
        else:
            trace_id = own_trace_id = trace_id or _random_id(128)
            flags = _SAMPLED
        span_id = span_id or _random_id(64)
        self._ops.append((OP_SPAN, name, ctx_tuple(parent), start_ns, end_ns, attributes,
                          span_id, trace_id, [ctx_tuple(link) for link in links], error,
                          list(events)))
        return SpanContext(own_trace_id, span_id, False, TraceFlags(flags))

    def collectives(self, spec: Any, rows: Sequence[tuple[Any, ...]] | bytes) -> None:
        """A step's collectives (rows, or the NCCL plugin's records), made into spans and
        points by the exporter."""
        self._ops.append((OP_COLLECTIVES, spec, rows))

    def step(self, record: wire_step.StepRecord) -> None:
        """A finished step, made into its spans, log and points by the exporter."""
        self._ops.append((OP_STEP, record))

    def emit_log(self, time_ns: int, observed_ns: int, parent: SpanContext | None,
                 severity: int, severity_text: str, body: Any,
                 attributes: dict[str, Any], scope: str = semconv.SCOPE_NAME) -> None:
        self._ops.append((OP_LOG, time_ns, observed_ns, ctx_tuple(parent),
                          getattr(severity, "value", severity),
                          severity_text, body, attributes, scope))

    def commit(self) -> None:
        """Send what was queued (the emitter calls this after each drain)."""
        ops = self._ops
        if not ops:
            with self._send_lock:  # nothing to send: still hear the exporter's reports
                if self._replies_due():
                    self._read_replies()
            return
        batch = []
        popleft = ops.popleft
        try:
            for _ in range(len(ops)):
                batch.append(popleft())
        except IndexError:
            pass
        with self._send_lock:
            self._send(batch)

    def _send(self, batch: list[tuple[Any, ...]]) -> None:
        sock = self._sock
        if sock is None:
            self._lost_without_exporter(batch)
            return
        try:
            if self._replies_due():
                self._take_replies(self._inbox.poll(sock))
            send_message(sock, batch)
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
            self._exporter_lost(batch, repr(err))
            return
        self._sent_batches += 1
        self._unacked.append((self._sent_batches, batch))

    # --- the Pipeline interface the emitter's back-pressure uses -------------------------
    def backlog(self) -> float:
        return 0.0  # the blocking send is the back-pressure

    def nudge(self) -> None:
        pass

    def forget_in_child(self) -> None:
        if os.getpid() == self._child_pid:
            return
        if self._sock is not None:
            self._sock.close()
        self._sock = self._proc = None
        self.restarts = MAX_RESTARTS  # a forked worker never starts an exporter
        self._ops.clear()
        self._unacked.clear()

    def shutdown(self, timeout_s: float) -> bool:
        """Send what is left, let the exporter flush within ``timeout_s``, collect its
        counts of what it dropped; False if it had to be killed."""
        deadline = time.monotonic() + timeout_s
        killed = False
        if not self._send_lock.acquire(timeout=max(0.0, timeout_s / 2)):
            # the emitter is stuck sending to an exporter that does not read: end it
            if self._proc is not None:
                self._proc.kill()
                killed = True
            self._send_lock.acquire()
        try:
            return self._shutdown_locked(deadline, killed)
        finally:
            self._send_lock.release()

    def _shutdown_locked(self, deadline: float, killed: bool) -> bool:
        rest = list(self._ops)
        self._ops.clear()
        if rest:
            self._send(rest)
        sock, proc = self._sock, self._proc
        if sock is None or proc is None:
            return False
        flushed = False
        done = None
        try:
            send_message(sock, [(OP_SHUTDOWN, max(0.1, deadline - time.monotonic() - 0.2))])
            while True:
                frames = self._inbox.wait(sock, max(0.1, deadline - time.monotonic()))
                if not frames:
                    break
                done = self._take_replies(frames)
                if done is not None:
                    flushed = bool(done[2])
                    break
        except (OSError, EOFError, pickle.PickleError):
            pass
        if done is None:  # no final word within the bound: what is unconfirmed is dropped
            self._settle_lost_exporter()
            if proc.poll() is not None and not killed:  # it ended by itself: a loss
                self.losses += 1
                self._warn(f"otel-train: the exporter process was lost at the run's end "
                           f"(exit status {proc.returncode}), loss {self.losses}; what it "
                           "had not exported is dropped and counted")
        else:
            self._retire_exporter_counts()
        sock.close()
        self._sock = None
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            flushed = False
        self._proc = None
        return flushed


def _random_id(bits: int) -> int:
    value = 0
    while value == 0:  # the SDK's own generator draws the same way
        value = random.getrandbits(bits)
    return value
