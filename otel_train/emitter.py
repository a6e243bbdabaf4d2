"""The background thread: records from the hot path become steps, rows and log records.

Off the training thread, the emitter puts the hot path's records (``wire/hot_path.py``)
together: a step's phases, its sources' additions (GPU times, memory, throttling, exposed
communication), its collectives. What leaves it is plain values: one ``StepRecord`` per step
(``wire/step.py``: built once, given to the sources' step listeners, then handed on), the
step's collectives as rows (``wire/collectives.py``), log records and metric points with the
ids the training thread stamped. The spans, points and log
records themselves (explicit times, preset ids, exemplars in the step's span context) are made
where spans are built: the exporter process by default, else the Pipeline on this thread.
Anything that goes wrong here is logged and counted, never raised.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from otel_train import identity, internal_errors, redact, semconv
from otel_train.config import Config
from otel_train.export.prometheus import PrometheusEndpoint
from otel_train.identity import Identity
from otel_train.recorder import Recorder
from otel_train.wire import ctx_tuple
from otel_train.wire import step as wire_step
from otel_train.wire.hot_path import EVENT, LOG, PHASE, STEP
from otel_train.wire.step import StepRecord

if TYPE_CHECKING:
    from otel_train.exporter.providers import Pipeline

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_INT = int(_SAMPLED)
_SEVERITY = {
    "debug": SeverityNumber.DEBUG, "info": SeverityNumber.INFO,
    "warning": SeverityNumber.WARN, "warn": SeverityNumber.WARN,
    "error": SeverityNumber.ERROR, "exception": SeverityNumber.ERROR,
    "critical": SeverityNumber.FATAL,
}


def _debug_enabled(console: Any) -> bool:
    """Does otel-train's console logger print debug lines? (Building a filtered line's
    arguments costs a few microseconds a step for nothing.)"""
    check = getattr(console, "is_enabled_for", None)
    try:
        return bool(check(logging.DEBUG)) if check is not None else True
    except Exception:
        return True


def _step_decision(sampler: sampling.Sampler) -> Callable[[int], bool]:
    """``trace_id -> sampled`` as ``sampler.should_sample`` decides it for a root span, without
    building its ``SamplingResult`` (a few us a step): for the SDK's own samplers the answer is
    their rule (tests/sdk/test_sampling.py holds it to the SDK's), others are asked."""

    def ask(trace_id: int) -> bool:
        return sampler.should_sample(None, trace_id, semconv.SPAN_STEP).decision.is_sampled()

    root = getattr(sampler, "_root", None) if type(sampler) is sampling.ParentBased else sampler
    if type(root) is sampling.StaticSampler and isinstance(
            getattr(root, "_decision", None), sampling.Decision):
        always = root._decision.is_sampled()
        return lambda trace_id: always
    if type(root) is sampling.TraceIdRatioBased:
        bound, limit = root.bound, root.TRACE_ID_LIMIT
        return lambda trace_id: trace_id & limit < bound
    return ask


#: the longest text a log attribute carries (characters)
_MAX_ATTR_CHARS = 4096


def _attr_value(value: Any, keep_end: bool = False) -> Any:
    """A log attribute from a field's redacted value (strings scrubbed already): numbers as
    they are, anything else as text, at most ``_MAX_ATTR_CHARS`` of it (its end if
    ``keep_end``: a traceback's says what was raised, and where)."""
    if isinstance(value, (bool, int, float)):
        return value
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = (value.decode("utf-8", "backslashreplace") if isinstance(value, bytes)
                    else repr(value))
        except Exception:  # an object whose repr raises
            text = f"<unrepresentable {type(value).__name__}>"
        text = redact.scrub(text)  # whole, before the cut: a secret across it would show
    if len(text) <= _MAX_ATTR_CHARS:
        return text
    return "..." + text[3 - _MAX_ATTR_CHARS:] if keep_end else text[:_MAX_ATTR_CHARS]


class _Backpressure:
    """Lets the exporters' queues drain before the emitter adds more to them.

    The emitter turns a backlog of records into spans in bursts; a burst larger than the
    span processor's queue would be dropped there. So the emitter (never the training
    thread: the hot-path buffer absorbs the delay) waits while the queues are more than half
    full, up to a time budget per pump; past it, a dead collector's drops are counted as
    usual and the emitter keeps up with the training thread.
    """

    def __init__(self, pipeline: Any, budget_s: float) -> None:
        self.pipeline = pipeline
        self.deadline = time.monotonic() + budget_s

    def wait_for_room(self) -> None:
        while self.pipeline.backlog() > 0.5 and time.monotonic() < self.deadline:
            self.pipeline.nudge()
            time.sleep(0.002)


Remover = Callable[[], None]

#: the emitter is woken early once the buffer holds capacity / FILL_DIVISOR records: the
#: other half absorbs what the training thread adds before the emitter has drained
FILL_DIVISOR = 2
#: the longest the emitter sleeps while nothing is recorded and no source asked for a
#: deadline (the exporter process's drop reports, internal errors: counted, not urgent)
KEEPALIVE_S = 30.0


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
        self.sampler = cfg.sampler()
        self._decide = _step_decision(self.sampler)
        self._getrandbits = random.Random().getrandbits  # phase span ids (not the user's RNG)
        self._phases: dict[int, list[tuple[Any, ...]]] = collections.defaultdict(list)
        self._handlers: dict[str, Callable[[Any], None]] = {}
        # tuples, replaced whole by a registration or its remover: the emitter thread
        # iterates the one it found, whatever another thread adds or removes meanwhile
        self._step_listeners: tuple[Callable[[StepRecord], None], ...] = ()
        self._pre_step_listeners: tuple[Callable[[StepRecord], None], ...] = ()
        self._tick_listeners: tuple[Callable[[], None], ...] = ()
        self._step_gates: list[Callable[[int, int], bool]] = []
        self._held_steps: collections.deque[tuple[Any, ...]] = collections.deque()
        self._max_held_steps = 0
        self._reported_drops: collections.Counter[str] = collections.Counter()
        self._drops_seen: tuple[Any, ...] | None = None
        self._stop = threading.Event()
        #: set by the recorder when the buffer fills (or its first record after an empty
        #: drain comes), and by stop()
        self._wake = threading.Event()
        #: how many times the thread woke (bench/bench_wakeups.py reads it)
        self.wakeups = 0
        self._wake_within_s: float | None = None  # asked for during this drain
        self._thread = threading.Thread(target=self._run, name="otel-train-emitter", daemon=True)
        self.steps_emitted = 0
        #: (end on the perf_counter clock, step) of the last steps the training thread
        #: finished, held or emitted: which step a moment belonged to (step_at)
        self._step_ends: collections.deque[tuple[int, int]] = collections.deque(maxlen=1024)
        self._errors = internal_errors.Tally()
        self._base_attrs = {semconv.ATTR_RANK: ident.rank, semconv.ATTR_RUN_ID: ident.run_id}
        self._link_tuples = [ctx_tuple(link.context) for link in self._links()]
        self._console_debug = console is not None and _debug_enabled(console)
        self._make_instruments()

    # --- instruments -----------------------------------------------------------------
    def _make_instruments(self) -> None:
        # a step's and its collectives' instruments are made where they become telemetry
        # (wire/step.py names them); these are the emitter's own
        meter = self.pipeline.meter
        self.dropped_ctr = semconv.create(meter, semconv.METRIC_TELEMETRY_DROPPED)
        for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
            # a zero point for each signal, so "nothing dropped" is a fact, not a gap
            self.dropped_ctr.add(0, {**self._base_attrs, semconv.ATTR_SIGNAL: signal})
        self.internal_errors_ctr = semconv.create(meter, semconv.METRIC_INTERNAL_ERRORS)
        self._reported_internal: dict[str, int] = dict(internal_errors.snapshot())

    @property
    def errors(self) -> int:
        """Exceptions the emitter swallowed (the first five are logged)."""
        return self._errors.errors

    # --- extension points for sources/ (sources.SourceHost: their only door) ----------
    def on_event(self, source: str, handler: Callable[[Any], None]) -> Remover:
        """Handle ``(EVENT, source, payload)`` records put by a source module."""
        self._handlers[source] = handler

        def remove() -> None:
            if self._handlers.get(source) is handler:
                del self._handlers[source]

        return remove

    def on_step(self, listener: Callable[[StepRecord], None]) -> Remover:
        """Called with each finished step, after its spans are built and its metrics recorded:
        child spans go under ``info.phase_spans`` / ``info.rank_step_context`` from here."""
        return self._add("_step_listeners", listener)

    def before_step(self, listener: Callable[[StepRecord], None]) -> Remover:
        """Called with each finished step before its spans and metrics: may add to
        ``info.phase_totals`` (e.g. exposed_comm, compile), ``info.extra_attributes`` and
        ``info.events``."""
        return self._add("_pre_step_listeners", listener)

    def on_tick(self, listener: Callable[[], None]) -> Remover:
        """Called on the emitter thread after every drain, records or not: for sources that
        watch something over time (a collective that never ends). The emitter sleeps while
        nothing is recorded: a listener that must run again by a deadline asks for it
        (:meth:`wake_within`) each time it runs."""
        return self._add("_tick_listeners", listener)

    def _add(self, attr: str, listener: Any) -> Remover:
        setattr(self, attr, (*getattr(self, attr), listener))

        def remove() -> None:
            setattr(self, attr, tuple(x for x in getattr(self, attr) if x is not listener))

        return remove

    def step_context(self, step: int) -> SpanContext:
        """The ``train.rank_step`` span context of this rank's ``step`` (its ids are derived,
        so known before the step is emitted): the parent of what a source adds to a step."""
        trace_id = identity.step_trace_id(self.ident.run_id, step)
        flags = _SAMPLED if self.sampled(trace_id) else TraceFlags(0)
        return SpanContext(trace_id, identity.rank_step_span_id(
            self.ident.run_id, step, self.ident.rank), False, flags)

    def emit_log(self, level: str, message: str, fields: dict[str, Any], trace_id: int = 0,
                 span_id: int = 0) -> None:
        """A log line from the emitter thread: to the console and straight to OTel logs (a
        bridged structlog line would go through the recorder, which the emitter's last pass
        no longer reads), in the context of (``trace_id``, ``span_id``) if given."""
        if self.console is not None:
            getattr(self.console, level)(message, **fields)
        ids = (semconv.CONSOLE_TRACE_ID, semconv.CONSOLE_SPAN_ID)  # the record's context
        self._otel_log(time.time_ns(), level, message,
                       {k: v for k, v in fields.items() if k not in ids}, trace_id, span_id)

    def count_drop(self, signal: str, n: int = 1) -> None:
        """Telemetry a source lost (flight-recorder entries overwritten, say): counted into
        ``otel_train.telemetry.dropped{signal}`` and the total the user sees at exit."""
        self.pipeline.dropped[signal] += n

    def add_cpu_throttled(self, seconds: float) -> None:
        """CPU-throttled seconds for the per-rank Prometheus endpoint, where it is on."""
        if self.prometheus is not None:
            self.prometheus.add_cpu_throttled(seconds)

    def hold_steps(self, ready: Callable[..., bool], max_held: int = 64,
                   with_end: bool = False) -> None:
        """Hold finished steps back, in order, until ``ready(step)`` (their GPU events
        resolved, say), or ``ready(step, end)`` with the step's end on the perf_counter clock
        if ``with_end``; at most ``max_held`` wait, and the last pump waits at most a second
        before it emits what is still held."""
        self._step_gates.append(ready if with_end else (lambda step, end: ready(step)))
        self._max_held_steps = max(self._max_held_steps, max_held)

    def release_steps(self, final: bool = False) -> None:
        """Emit the held steps that are ready now (``final``: all of them, waiting at most a
        second for their gates): a source whose read just made steps ready calls it."""
        held = self._held_steps
        deadline = time.monotonic() + (1.0 if final else 0.0)
        while held:
            step, end = held[0][1], held[0][3]
            if (len(held) <= self._max_held_steps
                    and not all(ready(step, end) for ready in self._step_gates)):
                if not final:
                    return
                if time.monotonic() < deadline:
                    time.sleep(0.005)  # the last pump only: polling, never synchronising
                    continue
            self._emit_step(*held.popleft()[1:])

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

    def wake_within(self, seconds: float) -> None:
        """Ask for the next drain within ``seconds`` (once: ask again from the next tick):
        for sources with a deadline of their own (a stall's, the flight recorder's before its
        ring wraps, a Work without a future polled). Without one, the emitter sleeps until
        records wait (``emit_interval_s`` after the last drain that found some, or sooner when
        the buffer fills), or ``KEEPALIVE_S`` while none come."""
        if self._wake_within_s is None or seconds < self._wake_within_s:
            self._wake_within_s = seconds

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
        if drained or self._held_steps:  # held steps: their gate is looked at each drain
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
        handlers, dispatch = self._handlers, self._dispatch
        for at in range(0, len(records), 64):
            budget.wait_for_room()
            if at % 4096 == 4032:  # a long backlog leaves in parts, not all at the end
                self.pipeline.commit()
            for record in records[at:at + 64]:
                try:
                    # the sources' records inline (most records are theirs: a collective's
                    # issue and completion), the emitter's own through _dispatch
                    if record[0] == EVENT:
                        handler = handlers.get(record[1])
                        if handler is not None:
                            handler(record[2])
                    else:
                        dispatch(record)
                except Exception as err:  # never let one bad record stop the emitter
                    if self._errors.add(err, "emitter") and self.console is not None:
                        self.console.warning("otel_train.emitter_error", error=repr(err),
                                             record_kind=record[0])
        if self._held_steps:
            try:
                self.release_steps(final)
            except Exception as err:
                self._held_steps.clear()
                # counted in otel_train.internal.errors{component=emitter} like a record's
                if self._errors.add(err, "emitter") and self.console is not None:
                    self.console.warning("otel_train.emitter_error", error=repr(err),
                                         record_kind=STEP)
        for listener in self._tick_listeners:
            try:
                listener()
            except Exception as err:
                if self._errors.add(err, "emitter") and self.console is not None:
                    self.console.warning("otel_train.emitter_error", error=repr(err),
                                         record_kind="tick")
        self.report_drops()
        self.report_internal_errors()
        self.pipeline.commit()
        return len(records)

    def _dispatch(self, record: tuple[Any, ...]) -> None:
        """The emitter's own records; the sources' (``EVENT``) go to their handlers in
        :meth:`pump`'s loop."""
        kind = record[0]
        if kind == PHASE:
            self._phases[record[1]].append(record)
        elif kind == STEP:
            self._step_ends.append((record[3], record[1]))
            if self._step_gates:
                self._held_steps.append(record)
                self.release_steps()
            else:
                self._emit_step(*record[1:])
        elif kind == LOG:
            self._emit_log(*record[1:])

    # --- steps -----------------------------------------------------------------------
    def sampled(self, trace_id: int) -> bool:
        """The configured sampler's decision for a step's trace (a root: no parent)."""
        return self._decide(trace_id)

    def wall(self, perf_ns: int) -> int:
        return perf_ns + self.offset

    def _call_listener(self, listener: Callable[[StepRecord], None], info: StepRecord) -> None:
        """A source's step listener: one that raises loses its own part, not the step."""
        try:
            listener(info)
        except Exception as err:
            if self._errors.add(err, "emitter") and self.console is not None:
                self.console.warning("otel_train.emitter_error", error=repr(err),
                                     record_kind="step listener")

    def _emit_step(self, step: int, start: int, end: int, micro_batches: int, samples: int,
                   tokens: int) -> None:
        phases = self._phases.pop(step, [])
        try:
            self._emit_step_with(phases, step, start, end, micro_batches, samples, tokens)
        except Exception:
            # the step's own telemetry is lost: count what it would have made, from its phase
            # records (totals that listeners add, exposed_comm and compile, are not known here)
            try:
                sampled = self.sampled(identity.step_trace_id(self.ident.run_id, step))
            except Exception:
                sampled = True
            totals = {r[2] for r in phases}
            lost = StepRecord(
                run_id=self.ident.run_id, rank=self.ident.rank,
                world_size=self.ident.world_size, step=step, start_ns=start, end_ns=end,
                micro_batches=micro_batches, samples=samples, tokens=tokens,
                phase_totals=dict.fromkeys(totals, 0.0), sampled=sampled, trace_id=0,
                rank_step_span_id=0, phases=[None] * len(phases))  # type: ignore[list-item]
            for signal, n in zip((semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS,
                                  semconv.SIGNAL_LOGS), wire_step.lost(lost), strict=True):
                self.pipeline.dropped[signal] += n
            raise

    def _emit_step_with(self, phases: list[tuple[Any, ...]], step: int, start: int, end: int,
                        micro_batches: int, samples: int, tokens: int) -> None:
        ident = self.ident
        if self._phases:
            for stale in [k for k in self._phases if k < step]:
                del self._phases[stale]  # their step record was dropped (buffer full)
        totals: dict[str, float] = {}
        for _, _, phase, _, p_start, p_end, _ in phases:
            totals[phase] = totals.get(phase, 0.0) + (p_end - p_start) / 1e9
        duration_s = (end - start) / 1e9
        trace_id = identity.step_trace_id(ident.run_id, step)
        sampled = self.sampled(trace_id)
        rank_ctx = SpanContext(trace_id, identity.rank_step_span_id(ident.run_id, step, ident.rank),
                               is_remote=False, trace_flags=_SAMPLED if sampled else TraceFlags(0))
        info = StepRecord(
            run_id=ident.run_id, rank=ident.rank, world_size=ident.world_size, step=step,
            start_ns=self.wall(start), end_ns=self.wall(end), micro_batches=micro_batches,
            samples=samples, tokens=tokens, phase_totals=totals, sampled=sampled,
            trace_id=trace_id, rank_step_span_id=rank_ctx.span_id, links=self._link_tuples,
            rank_step_context=rank_ctx,
            phase_intervals=[(r[2], r[3], r[4], r[5]) for r in phases])
        for listener in self._pre_step_listeners:
            self._call_listener(listener, info)
        # The step's spans, log and points are made where spans are built (the exporter
        # process by default: wire/step.py); here only their plain values.
        if sampled:
            phase_rows, phase_spans = info.phases, info.phase_spans
            overrides, offset = info.phase_overrides, self.offset
            for _, _, phase, micro, p_start, p_end, span_id in phases:
                if not span_id:  # nobody asked for it on the training thread (tracker.py)
                    span_id = self._getrandbits(64) or 1
                over = overrides.get(span_id)
                if over is None:
                    p_start, p_end, added, error = p_start + offset, p_end + offset, None, None
                else:
                    p_start = over.get("start_ns", p_start + offset)
                    p_end = over.get("end_ns", p_end + offset)
                    added, error = over.get("attributes"), over.get("error")
                phase_rows.append((phase, micro, p_start, p_end, span_id, added, error))
                phase_spans.append((phase, micro, (trace_id, span_id, _SAMPLED_INT, False),
                                    p_start, p_end))
        self.pipeline.step(info)
        try:  # the step is handed over: what follows can fail without losing it
            self._after_step(info, duration_s, totals, samples, tokens)
        except Exception as err:
            self._errors.add(err, "emitter")

    def _after_step(self, info: StepRecord, duration_s: float, totals: dict[str, float],
                    samples: int, tokens: int) -> None:
        step, trace_id, sampled, rank_ctx = (info.step, info.trace_id, info.sampled,
                                             info.rank_step_context)
        if self.prometheus is not None:
            exemplar = ({"trace_id": f"{trace_id:032x}", "span_id": f"{rank_ctx.span_id:016x}"}
                        if sampled else None)
            self.prometheus.observe_step(duration_s, totals, samples, tokens, exemplar)
        for listener in self._step_listeners:
            self._call_listener(listener, info)
        if self._console_debug:
            self.console.debug("train.step.end", trace_id=f"{trace_id:032x}",
                               span_id=f"{rank_ctx.span_id:016x}", step=step,
                               phase="step", duration_ms=round(duration_s * 1e3, 3))
        self.steps_emitted += 1

    def _links(self) -> list[Link]:
        links = [Link(self.run_context)]
        if self.launcher_context is not None:
            links.append(Link(self.launcher_context))
        return links

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

    def step_at(self, perf_ns: int) -> int:
        """The training step a moment (perf_counter ns) belonged to: the first step that ended
        after it, or the one after the last step finished so far. Steps are contiguous, and
        steps held back (for the flight recorder, say) count: not the emitted count."""
        ends = self._step_ends
        if not ends:
            return self.steps_emitted
        if perf_ns >= ends[-1][0]:
            return ends[-1][1] + 1
        found = ends[-1][1]
        for end, step in reversed(ends):
            if end <= perf_ns:
                break
            found = step
        return found

    def exemplar_context(self, info: StepRecord) -> otel_context.Context | None:
        """The context that binds a step's metric points to its span (made once a step:
        building an OpenTelemetry Context cost ~5 us, and every collective asks)."""
        if not info.sampled:
            return None
        if info.exemplar is None:
            info.exemplar = trace.set_span_in_context(NonRecordingSpan(info.rank_step_context))
        return info.exemplar

    # --- logs and drops --------------------------------------------------------------
    def _emit_log(self, time_ns: int, level: str, message: str, fields: dict[str, Any],
                  scope: str = semconv.SCOPE_NAME) -> None:
        trace_hex = fields.pop(semconv.CONSOLE_TRACE_ID, None)
        span_hex = fields.pop(semconv.CONSOLE_SPAN_ID, None)
        trace_id = int(trace_hex, 16) if isinstance(trace_hex, str) and trace_hex else 0
        span_id = int(span_hex, 16) if isinstance(span_hex, str) and span_hex else 0
        self._otel_log(time_ns, level, message, fields, trace_id, span_id, scope)

    def _otel_log(self, time_ns: int, level: str, message: str, fields: dict[str, Any],
                  trace_id: int, span_id: int, scope: str = semconv.SCOPE_NAME) -> None:
        attributes = {}
        rename = semconv.CONSOLE_TO_ATTRIBUTE  # run_id, rank, step: the spans' names
        # denied keys redacted and strings scrubbed at any depth; other values' text scrubbed
        for k, v in redact.redact_mapping(fields).items():
            if k in ("level", "timestamp"):
                continue
            attributes[rename.get(k, k)] = _attr_value(
                v, keep_end=k == semconv.ATTR_EXCEPTION_STACKTRACE)
        attributes.setdefault(semconv.LOG_RUN_ID, self.ident.run_id)
        attributes.setdefault(semconv.LOG_RANK, self.ident.rank)
        parent = None
        if trace_id and span_id:
            flags = _SAMPLED if self.sampled(trace_id) else TraceFlags(0)
            parent = SpanContext(trace_id, span_id, False, flags)
        self.pipeline.emit_log(time_ns, time.time_ns(), parent,
                               _SEVERITY.get(level, SeverityNumber.INFO), level.upper(),
                               redact.redact_value(message), attributes, scope)

    def total_dropped(self) -> collections.Counter[str]:
        total = collections.Counter(self.recorder.dropped)
        total.update(self.pipeline.dropped)
        exporter_dropped = getattr(self.pipeline, "exporter_dropped", None)
        if exporter_dropped is not None:  # the exporter process's own losses
            total.update(exporter_dropped())
        return total

    def report_internal_errors(self) -> None:
        """Export the hook paths' swallowed exceptions; log each component's first one."""
        for component, count in internal_errors.snapshot().items():
            delta = count - self._reported_internal.get(component, 0)
            if delta <= 0:
                continue
            first = component not in self._reported_internal
            self._reported_internal[component] = count
            self.internal_errors_ctr.add(delta, {**self._base_attrs,
                                                 semconv.ATTR_COMPONENT: component})
            if first and self.console is not None:
                self.console.warning("otel_train.internal_error", component=component,
                                     error=internal_errors.first_error(component),
                                     hint="training goes on; this part of the telemetry may "
                                          "be missing (counted in otel_train.internal.errors)")

    def report_drops(self) -> None:
        """Bring the dropped counter up to date with what the recorder and exporters lost."""
        # counts only grow: unchanged sums (and no exporter report since) say nothing new,
        # without building the totals at every drain
        seen = (sum(self.recorder.dropped.values()), sum(self.pipeline.dropped.values()),
                getattr(self.pipeline, "reports_taken", None))
        if seen == self._drops_seen:
            return
        self._drops_seen = seen
        for signal, count in self.total_dropped().items():
            delta = count - self._reported_drops[signal]
            if delta > 0:
                self._reported_drops[signal] = count
                self.dropped_ctr.add(delta, {**self._base_attrs, semconv.ATTR_SIGNAL: signal})
                if self.prometheus is not None:
                    self.prometheus.add_dropped(signal, delta)
