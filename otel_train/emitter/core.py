"""The emitter thread: it sleeps until there is work, drains the hot-path buffer and hands
each record to its part (steps.py, logs.py, the sources' handlers), then brings the loss
counters up to date (accounts.py) and commits what the pass made to the pipeline.

:class:`Emitter` is also the sources' one door into the emitter (``sources.SourceHost``):
registrations and questions about steps are answered by its parts. Anything that goes wrong
here is logged and counted, never raised.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Link, SpanContext

from otel_train import internal_errors
from otel_train.config import Config
from otel_train.emitter.accounts import Losses
from otel_train.emitter.logs import LogRecords
from otel_train.emitter.pipeline import Pipeline
from otel_train.emitter.steps import StepAssembly
from otel_train.emitter.work import StepListener
from otel_train.export.prometheus import PrometheusEndpoint
from otel_train.identity import Identity
from otel_train.recorder import Recorder
from otel_train.wire import ctx_tuple
from otel_train.wire.hot_path import EVENT, LOG, LOG_FIELDS, PHASE, STEP

Remover = Callable[[], None]

#: the emitter is woken early once the buffer holds capacity / FILL_DIVISOR records: the
#: other half absorbs what the training thread adds before the emitter has drained
FILL_DIVISOR = 2
#: the longest the emitter sleeps while nothing is recorded and no source asked for a
#: deadline (the exporter process's drop reports, internal errors: counted, not urgent)
KEEPALIVE_S = 30.0
#: ``captured_fields(record)``: what ``LogRecords.captured`` takes of a LOG record, in its
#: parameters' order (time_ns, level, message, fields, scope), by the names
#: ``hot_path.LOG_FIELDS`` gives the record's fields
captured_fields: Callable[[tuple[Any, ...]], tuple[Any, ...]] = operator.itemgetter(
    *(LOG_FIELDS.index(name) for name in ("time_ns", "level", "event", "fields", "scope")))


class _Backpressure:
    """Lets the exporters' queues drain before the emitter adds more to them.

    The emitter turns a backlog of records into spans in bursts; a burst larger than the
    span processor's queue would be dropped there. So the emitter (never the training
    thread: the hot-path buffer absorbs the delay) waits while the queues are more than half
    full, up to a time budget per pump; past it, a dead collector's drops are counted as
    usual and the emitter keeps up with the training thread.
    """

    def __init__(self, pipeline: Pipeline, budget_s: float) -> None:
        self.pipeline = pipeline
        self.deadline = time.monotonic() + budget_s

    def wait_for_room(self) -> None:
        while self.pipeline.backlog() > 0.5 and time.monotonic() < self.deadline:
            self.pipeline.nudge()
            time.sleep(0.002)


class Emitter:
    def __init__(
        self,
        recorder: Recorder,
        pipeline: Pipeline,
        ident: Identity,
        cfg: Config,
        clock_offset_ns: int,
        run_context: SpanContext,
        launcher_context: SpanContext | None,
        prometheus: PrometheusEndpoint | None = None,
        console: Any = None,
    ) -> None:
        self.recorder = recorder
        self.pipeline = pipeline
        self.ident = ident
        self.cfg = cfg
        self.offset = clock_offset_ns  # perf_counter_ns + offset = epoch ns
        self.run_context = run_context
        self.launcher_context = launcher_context
        self.prometheus = prometheus
        self.console = console
        self._errors = internal_errors.Tally()
        self._handlers: dict[str, Callable[[Any], None]] = {}
        self._tick_listeners: tuple[Callable[[], None], ...] = ()
        self._stop = threading.Event()
        #: set by the recorder when the buffer fills (or its first record after an empty
        #: drain comes), and by stop()
        self._wake = threading.Event()
        #: how many times the thread woke (bench/bench_wakeups.py reads it)
        self.wakeups = 0
        self._wake_within_s: float | None = None  # asked for during this drain
        self._thread = threading.Thread(target=self._run, name="otel-train-emitter", daemon=True)
        self.steps = StepAssembly(pipeline, ident, cfg.sampler(), clock_offset_ns,
                                  [ctx_tuple(link.context) for link in self._links()],
                                  prometheus, console, self._swallowed)
        # the steps' time by part and goodput bucket, added once a drain (the first tick
        # listener: before the sources', after the drain's steps)
        self.on_tick(self.steps.time_counters.publish)
        self.logs = LogRecords(pipeline, ident, self.steps.sampled, console)
        self.losses = Losses(recorder, pipeline, ident, prometheus, console)
        # the sources' questions, answered by the parts
        self.sampled = self.steps.sampled
        self.step_context = self.steps.step_context
        self.step_at = self.steps.step_at
        self.exemplar_context = self.steps.exemplar_context
        self.hold_steps = self.steps.hold_steps
        self.release_steps = self.steps.release_steps
        self.emit_log = self.logs.emit_log
        #: the emitter's own records by kind (the sources' EVENT records go to their handlers)
        self._by_kind: dict[str, Callable[[tuple[Any, ...]], None]] = {
            PHASE: self.steps.on_phase, STEP: self.steps.on_step,
            LOG: lambda record: self.logs.captured(*captured_fields(record))}
        self.count_drop = self.losses.count_drop
        self.total_dropped = self.losses.total_dropped

    @property
    def errors(self) -> int:
        """Exceptions the emitter swallowed (the first five are logged)."""
        return self._errors.errors

    @property
    def steps_emitted(self) -> int:
        """Steps handed to export so far."""
        return self.steps.steps_emitted

    def _swallowed(self, err: Exception, record_kind: Any) -> None:
        """Count an error the emitter goes on after (otel_train.internal.errors{component=
        emitter}); log the first few, naming what it was handling if ``record_kind``."""
        if self._errors.add(err, "emitter") and record_kind and self.console is not None:
            self.console.warning("otel_train.emitter_error", error=repr(err),
                                 record_kind=record_kind)

    # --- extension points for sources/ (sources.SourceHost: their only door) ----------
    def on_event(self, source: str, handler: Callable[[Any], None]) -> Remover:
        """Handle ``(EVENT, source, payload)`` records put by a source module."""
        self._handlers[source] = handler

        def remove() -> None:
            if self._handlers.get(source) is handler:
                del self._handlers[source]

        return remove

    def on_step(self, listener: StepListener) -> Remover:
        """Called with each finished step (its ``StepWork``, work.py), after its spans are
        built and its metrics recorded: child spans go under ``info.phase_spans`` /
        ``info.rank_step_context`` from here."""
        return _add(self.steps, "step_listeners", listener)

    def before_step(self, listener: StepListener) -> Remover:
        """Called with each finished step (its ``StepWork``, work.py) before its spans and
        metrics: may add to ``info.phase_totals`` (e.g. exposed_comm, compile),
        ``info.extra_attributes`` and ``info.events``. The pre-step listeners run in the order
        the fields they declare ask (``work.step_uses``: each after those that write what it
        reads), else in the order they were registered; ValueError on a cycle."""
        return self.steps.add_pre_step_listener(listener)

    def on_tick(self, listener: Callable[[], None]) -> Remover:
        """Called on the emitter thread after every drain, records or not: for sources that
        watch something over time (a collective that never ends). The emitter sleeps while
        nothing is recorded: a listener that must run again by a deadline asks for it
        (:meth:`wake_within`) each time it runs."""
        return _add(self, "_tick_listeners", listener)

    def wake_within(self, seconds: float) -> None:
        """Ask for the next drain within ``seconds`` (once: ask again from the next tick):
        for sources with a deadline of their own (a stall's, the flight recorder's before its
        ring wraps, a Work without a future polled). Without one, the emitter sleeps until
        records wait (``emit_interval_s`` after the last drain that found some, or sooner when
        the buffer fills), or ``KEEPALIVE_S`` while none come."""
        if self._wake_within_s is None or seconds < self._wake_within_s:
            self._wake_within_s = seconds

    def wall(self, perf_ns: int) -> int:
        return perf_ns + self.offset

    def add_cpu_throttled(self, seconds: float) -> None:
        """CPU-throttled seconds for the per-rank Prometheus endpoint, where it is on."""
        if self.prometheus is not None:
            self.prometheus.add_cpu_throttled(seconds)

    def span(self, name: str, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: dict[str, Any], span_id: int = 0, trace_id: int = 0,
             links: list[Link] | None = None, error: str | None = None,
             events: list[tuple[str, int, dict[str, Any]]] | None = None) -> SpanContext:
        """Create and end one span with explicit times and (optionally) preset ids and
        ``events`` as (name, epoch ns, attributes)."""
        return self.pipeline.span(name, parent, start_ns, end_ns, attributes, span_id,
                                  trace_id, [link.context for link in links or ()], error,
                                  events or ())

    def collectives(self, spec: Any, rows: list[tuple[Any, ...]] | bytes) -> None:
        """A step's collectives (rows, or the NCCL plugin's records): spans and points are made
        where spans are built."""
        self.pipeline.collectives(spec, rows)

    def _links(self) -> list[Link]:
        links = [Link(self.run_context)]
        if self.launcher_context is not None:
            links.append(Link(self.launcher_context))
        return links

    # --- thread ----------------------------------------------------------------------
    def start(self) -> None:
        self.recorder.wake = self._wake.set
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        interval = self.cfg.emit_interval_s
        fill = max(1, self.recorder.capacity // FILL_DIVISOR)
        wait = self._next_wait(0, interval, fill)  # the first record wakes it
        while True:
            self._wake.wait(wait)
            if self._stop.is_set():
                break
            self._wake.clear()
            self._wake_within_s = None
            drained = self.pump()
            self.wakeups += 1  # after the pass: a reader that sees it sees the pass done
            wait = self._next_wait(drained, interval, fill)
        self.pump(final=True)
        for _ in range(3):  # records the last pass itself produced (its own log lines)
            if not len(self.recorder):
                break
            self.pump(final=True)

    def _next_wait(self, drained: int, interval: float, fill: int) -> float:
        """How long to sleep after a drain: ``interval`` while records come (or sooner if
        ``fill`` of them wait), until the first new record once a drain found none (then
        ``KEEPALIVE_S`` at most), and never past a deadline a source asked for."""
        recorder = self.recorder
        if drained or self.steps.held:  # held steps: their gate is looked at each drain
            recorder.arm(fill)
            wait = interval
        else:
            recorder.arm(0)  # the next record wakes this thread
            # one put between the drain and the arming found it disarmed: it waits here
            wait = interval if len(recorder) else KEEPALIVE_S
        asked = self._wake_within_s
        return wait if asked is None else max(0.01, min(wait, asked))

    def pump(self, final: bool = False) -> int:
        """Drain the buffer and hand on what it held; how many records it held."""
        budget = _Backpressure(self.pipeline, 0.1 if final or self._stop.is_set() else 0.5)
        records = self.recorder.drain()
        handlers, steps, by_kind, ignore = self._handlers, self.steps, self._by_kind, _ignore
        for at in range(0, len(records), 64):
            budget.wait_for_room()
            if at % 4096 == 4032:  # a long backlog leaves in parts, not all at the end
                self.pipeline.commit()
            for record in records[at:at + 64]:
                try:
                    # the sources' records inline (most records are theirs: a collective's
                    # issue and completion)
                    if record[0] == EVENT:
                        handler = handlers.get(record[1])
                        if handler is not None:
                            handler(record[2])
                    else:
                        by_kind.get(record[0], ignore)(record)
                except Exception as err:  # never let one bad record stop the emitter
                    self._swallowed(err, record[0])
        if steps.held:
            try:
                steps.release_steps(final)
            except Exception as err:
                steps.held.clear()
                self._swallowed(err, STEP)  # counted like a record's
        for listener in self._tick_listeners:
            try:
                listener()
            except Exception as err:
                self._swallowed(err, "tick")
        self.losses.report_drops()
        self.losses.report_internal_errors()
        self.pipeline.commit()
        return len(records)


def _ignore(record: tuple[Any, ...]) -> None:
    """A record of a kind the emitter does not know (none is made today)."""


def _add(owner: Any, attr: str, listener: Any) -> Remover:
    """Add ``listener`` to the tuple ``owner.attr`` (replaced whole); the remover takes it
    out again."""
    setattr(owner, attr, (*getattr(owner, attr), listener))

    def remove() -> None:
        setattr(owner, attr, tuple(x for x in getattr(owner, attr) if x is not listener))

    return remove
