"""The exporter process: one per rank, it builds and exports what the training process sent.

Started by :class:`otel_train.export.remote.RemotePipeline` as a fresh interpreter (never a
fork of the training process, which may hold CUDA state), it never imports torch. It reads
batches of operations from its socket, turns them into spans, metric points and log records
with the ordinary :class:`~otel_train.exporter.providers.Pipeline` (so files, OTLP, counting
and flushing are exactly what they are in process) and reports its own losses back to the
training process, whose emitter counts them into ``otel_train.telemetry.dropped``. It runs
at a lower priority than training (niceness +10). It ends when told to (after a bounded flush, replying with
its counts) or when the socket closes or its parent changes: the training process is gone,
so it flushes within the run's shutdown bound and exits. It ignores SIGINT and SIGTERM,
which reach it with its parent's process group: the training process decides when it ends.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_train import internal_errors, redact, semconv
from otel_train.config import ConfigWarning
from otel_train.exporter.providers import Pipeline
from otel_train.wire import context_of
from otel_train.wire import messages as wire

#: the longest one batch waits for the export queues to drain (see Exporter.apply_all)
BACKPRESSURE_S = 2.0
#: the exporter's niceness above the training process's (os.nice): ~1/10 of a busy core
NICENESS = 10
#: operations that make many spans each: the queues are checked before each of them
_BURSTY = (wire.OP_COLLECTIVES, wire.OP_STEP)
#: how often the exporter tells the training process what it has dropped, at most
DROP_REPORT_INTERVAL_S = 0.5


def _ctx(t: tuple[int, int, int, bool] | None) -> SpanContext | None:
    if t is None:
        return None
    return context_of(t)


class Exporter:
    """Applies operations to a Pipeline; counts what it could not apply."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.instruments: dict[int, Any] = {}
        #: instrument id -> metric name
        self.names: dict[int, str] = {}
        self._errors = internal_errors.Tally()
        self._reported: Any = None
        #: the version of the pending series the training process was last sent
        self._series_sent: Any = None
        #: batches applied so far (acknowledged with each report)
        self.applied = 0
        #: one writer at a time on the socket: the main loop and the drop reporter
        self.send_lock = threading.Lock()

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == wire.OP_SPAN:
            _, name, parent, start, end, attrs, span_id, trace_id, links, error, events = op
            self.pipeline.span(name, _ctx(parent), start, end, attrs, span_id, trace_id,
                               [_ctx(link) for link in links], error, events)
        elif kind == wire.OP_MEASURE:
            _, iid, value, attrs, parent = op
            ctx = (trace.set_span_in_context(NonRecordingSpan(_ctx(parent)))
                   if parent is not None else None)
            instrument = self.instruments[iid]
            if ctx is None:
                instrument(value, attrs)
            else:
                instrument(value, attrs, context=ctx)
        elif kind == wire.OP_LOG:
            _, time_ns, observed_ns, parent, severity, severity_text, body, attrs, scope = op
            self.pipeline.emit_log(time_ns, observed_ns, _ctx(parent), severity,
                                   severity_text, body, attrs, scope)
        elif kind == wire.OP_COLLECTIVES:
            self.pipeline.collectives(op[1], op[2])
        elif kind == wire.OP_STEP:
            self.pipeline.step(op[1])
        elif kind == wire.OP_INSTRUMENT:
            self._define(*op[1:])

    def _define(self, iid: int, name: str) -> None:
        if iid in self.instruments:  # sent again after a restart raced a batch
            return
        self.names[iid] = name
        # every series noted: what the next collection holds is what a kill would lose
        self.instruments[iid] = self.pipeline.measure_of(name)

    def apply_all(self, batch: list[tuple[Any, ...]]) -> float | None:
        """Apply a batch; the shutdown bound if the batch asks to shut down.

        A batch can hold many steps at once (steps held for the flight recorder are
        released together): let the batch processors' queues drain before adding more, as
        the in-process emitter does, up to ``BACKPRESSURE_S`` per batch; past it a stuck
        collector's losses are counted as usual. Waiting here holds nobody's interpreter."""
        deadline = time.monotonic() + BACKPRESSURE_S
        for i, op in enumerate(batch):
            # before every step and every step's collectives (each may make hundreds of
            # spans: a second of steps in one batch would overrun the span queue at once),
            # and every 64 operations otherwise
            if i % 64 == 0 or op[0] in _BURSTY:
                while self.pipeline.backlog() > 0.5 and time.monotonic() < deadline:
                    self.pipeline.nudge()
                    time.sleep(0.002)
            if op[0] == wire.OP_SHUTDOWN:
                return float(op[1])
            try:
                self.apply(op)
            except Exception as err:  # one bad operation never stops the exporter
                logged = self._errors.add(err)
                self._count_unapplied(op)
                if logged:
                    print(f"otel-train exporter: cannot apply {op[0]!r}: {err!r}",
                          file=sys.stderr)
        return None

    def _count_unapplied(self, op: tuple[Any, ...]) -> None:
        """Its spans and log records are lost; of its metric series, those no other
        measurement makes a point of in the next collection."""
        series: set[Any] = set()
        wire.count_lost(op, self.pipeline.dropped, series, self.names)
        with self.pipeline.pending.lock:
            pending = self.pipeline.pending.keys()
        self.pipeline.dropped[semconv.SIGNAL_METRICS] += len(series - pending)

    def _state(self) -> tuple[dict[str, int], dict[str, dict[str, int]], Any, Any]:
        """(drops, accounts, pending series version, the series or None if the training
        process has them already), read under the pending series' lock: a collection moves
        points from pending to produced, and the two are read on the same side of it."""
        pipeline = self.pipeline
        with pipeline.pending.lock:
            version = pipeline.pending.version()
            keys = pipeline.pending.keys() if version != self._series_sent else None
            return dict(pipeline.dropped), pipeline.accounts.snapshot(), version, keys

    def report_drops(self, sock: socket.socket, applied: int | None = None) -> None:
        """Tell the training process what this exporter has dropped so far (refused exports,
        full queues) and its accounts (produced, exported, dropped, by signal), when they
        changed, and after every batch (``applied``: batches applied so far, the
        acknowledgement that lets the training process count exactly what a killed
        exporter never applied). Its emitter counts the drops into
        ``otel_train.telemetry.dropped`` with its own losses, exactly once. Never waits for
        room: a periodic report that does not fit is replaced by the next (the counts are
        absolute); an acknowledgement is always sent whole."""
        with self.send_lock:
            if applied is not None:
                self.applied = applied
            counts, accounts, version, keys = self._state()
            state = (counts, accounts, self.applied, version)
            if state == self._reported and applied is None:
                return
            frame = wire.encode(
                (wire.REPLY_DROPS, counts, accounts, self.applied))
            if keys is not None:  # the series first: the counts after them rely on them
                frame = wire.encode((wire.REPLY_SERIES, keys), kept=True) + frame
            try:
                if applied is not None:
                    sock.sendall(frame)
                else:
                    sent = sock.send(frame, socket.MSG_DONTWAIT)
                    if sent < len(frame):  # never leave half a frame: finish it, it is small
                        sock.sendall(frame[sent:])
            except OSError:  # full (the next report carries the same counts) or closed
                return
            self._reported = state
            self._series_sent = version


def _watch_parent(sock: socket.socket) -> None:
    """If the training process dies while a forked descendant keeps the socket open, the
    exporter is re-parented: notice it and end the read loop."""
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            try:
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            return


def _report_drops_periodically(exporter: Exporter, sock: socket.socket,
                               stop: threading.Event) -> None:
    """Export failures happen on the SDK's export threads, after the batch that caused
    them: report them within a second even when no batch follows."""
    while not stop.wait(DROP_REPORT_INTERVAL_S):
        try:
            exporter.report_drops(sock)
        except Exception:  # a closed socket: the main loop ends too
            return


def _yield_cpu_to_training() -> None:
    """Run at a lower priority than the training process: where cores are scarce (a CPU
    job, a host with a rank per core), the training threads come first and export takes
    what is left; where a core is idle, as on GPU hosts, nothing changes."""
    try:
        os.nice(NICENESS)
    except OSError:
        pass


def _settings_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The texts of the ConfigWarnings of building the pipeline, which the training process
    warns with as its own. Any other warning (a ResourceWarning, the SDK's deprecations) is
    not a setting's: it is issued here as what it is, under this process's filters, to the
    stderr both processes share."""
    texts = []
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            texts.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return texts


def main(fd: int) -> int:
    _yield_cpu_to_training()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        cfg, ident, run_dir = wire.recv_message(sock)
    except (EOFError, OSError):
        return 0
    redact.load_env_secrets()  # the training process's environment, so its secrets
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeline = Pipeline(cfg, ident, run_dir)
    wire.send_message(sock, (wire.REPLY_READY, pipeline.kind, _settings_warnings(caught)))
    threading.Thread(target=_watch_parent, args=(sock,), name="otel-train-parent-watch",
                     daemon=True).start()
    exporter = Exporter(pipeline)
    stop_reports = threading.Event()
    threading.Thread(target=_report_drops_periodically, args=(exporter, sock, stop_reports),
                     name="otel-train-drop-reports", daemon=True).start()
    bound = cfg.shutdown_timeout_s
    told = False
    applied = 0
    while True:
        try:
            batch = wire.recv_message(sock)
        except (EOFError, OSError):
            break  # the training process is gone: flush what we have, within its bound
        asked = exporter.apply_all(batch)
        applied += 1
        try:
            exporter.report_drops(sock, applied)
        except Exception:  # a closed socket: the next read ends the loop
            pass
        if asked is not None:
            bound, told = asked, True
            break
    flushed = pipeline.shutdown(bound)
    stop_reports.set()
    if told:
        with exporter.send_lock:
            try:
                wire.send_message(sock, (wire.REPLY_DONE, dict(pipeline.dropped), flushed,
                                           pipeline.accounts.snapshot(), applied))
            except OSError:
                pass
    sock.close()
    return 0
