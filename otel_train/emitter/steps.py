"""A finished step's records made into one ``StepRecord`` (``wire/step.py``), given to the
sources' step listeners inside its working state (``StepWork``, work.py) and handed to the
pipeline.

The tracker's ``PHASE`` records wait here by step until the step's ``STEP`` record comes;
then the step is sampled or not (the configured sampler on the step's derived trace id),
its record is built once, the pre-step listeners add to it (GPU times, exposed
communication, throttling, untimed stretches) in the order their declared fields ask
(work.py), its phase spans are laid out, and the record is handed on. Sources may hold
finished steps back, in order, until they are ready (their GPU events resolved, the flight
recorder read): :meth:`StepAssembly.hold_steps`. A listener that raises loses its own part,
not the step; a step whose own assembly fails is counted as dropped, in exactly what it
would have made.

The training thread's records are plain tuples (``wire/hot_path.py``); they are read here
by their fields' names (:data:`EMIT_STEP_FIELDS`, ``step_fields``, ``phase_interval``,
``phase_span_id`` and the indices below, all taken from ``hot_path``'s field tuples), never
by positions written out.
"""

from __future__ import annotations

import collections
import logging
import operator
import random
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train import identity, semconv, step_time
from otel_train.emitter.pipeline import Pipeline
from otel_train.emitter.work import StepListener, StepWork, order_listeners
from otel_train.identity import Identity
from otel_train.wire import CtxTuple
from otel_train.wire import step as wire_step
from otel_train.wire.hot_path import PHASE_FIELDS, STEP_FIELDS
from otel_train.wire.step import PhaseRow, StepRecord

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_INT = int(_SAMPLED)
_UNSAMPLED = TraceFlags(0)

# --- the training thread's records, read by their fields' names (wire/hot_path.py) ---------
#: what :meth:`StepAssembly.emit_step` takes of a STEP record: its parameters, by the names
#: ``hot_path.STEP_FIELDS`` gives the record's fields (tests/sdk/test_step_seams.py holds
#: the two to each other)
EMIT_STEP_FIELDS = ("step", "start_ns", "end_ns", "micro_batches", "samples", "tokens")
#: ``step_fields(record)``: a STEP record's :data:`EMIT_STEP_FIELDS`, in that order (one C
#: call, a plain tuple: what ``record[1:]`` cost, without assuming where each field lies)
step_fields: Callable[[tuple[Any, ...]], tuple[Any, ...]] = operator.itemgetter(
    *(STEP_FIELDS.index(name) for name in EMIT_STEP_FIELDS))
_STEP_AT, _STEP_END_AT = STEP_FIELDS.index("step"), STEP_FIELDS.index("end_ns")
_PHASE_STEP_AT, _PHASE_AT = PHASE_FIELDS.index("step"), PHASE_FIELDS.index("phase")
#: a PHASE record's (phase, micro, start_ns, end_ns): a row of StepWork.phase_intervals
phase_interval: Callable[[tuple[Any, ...]], tuple[Any, ...]] = operator.itemgetter(
    *(PHASE_FIELDS.index(name) for name in ("phase", "micro", "start_ns", "end_ns")))
#: a PHASE record's span id (0: nobody asked for one while the phase ran)
phase_span_id: Callable[[tuple[Any, ...]], int] = operator.itemgetter(
    PHASE_FIELDS.index("span_id"))

#: the gap sampler's split of the time outside the phases (sources/gaps/), on the rank step
_DEVICE_WAIT_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + semconv.PART_DEVICE_WAIT
_HOST_BUSY_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + semconv.PART_HOST_BUSY
_GPU_OUTSIDE_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + semconv.PART_GPU_OUTSIDE_PHASES
_CHECKPOINT = semconv.REGION_CHECKPOINT


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


def _debug_enabled(console: Any) -> bool:
    """Does otel-train's console logger print debug lines? (Building a filtered line's
    arguments costs a few microseconds a step for nothing.)"""
    check = getattr(console, "is_enabled_for", None)
    try:
        return bool(check(logging.DEBUG)) if check is not None else True
    except Exception:
        return True


class StepAssembly:
    """Phases to steps, steps to records, records to listeners and the pipeline."""

    def __init__(self, pipeline: Pipeline, ident: Identity, sampler: sampling.Sampler,
                 clock_offset_ns: int, links: list[CtxTuple], prometheus: Any, console: Any,
                 swallowed: Callable[[Exception, str], None]) -> None:
        self.pipeline = pipeline
        self.ident = ident
        self.offset = clock_offset_ns  # perf_counter_ns + offset = epoch ns
        self.links = links
        self.prometheus = prometheus
        self.console = console
        self._swallowed = swallowed  # counts (and logs the first) error it is given
        self._decide = _step_decision(sampler)
        self._ids = identity.StepIds(ident.run_id, ident.rank).of  # (trace id, rank span id)
        self._getrandbits = random.Random().getrandbits  # phase span ids (not the user's RNG)
        self._console_debug = console is not None and _debug_enabled(console)
        self._phases: dict[int, list[tuple[Any, ...]]] = collections.defaultdict(list)
        # tuples, replaced whole by a registration or its remover: the emitter thread
        # iterates the one it found, whatever another thread adds or removes meanwhile
        self.step_listeners: tuple[StepListener, ...] = ()
        #: in the order they run (work.order_listeners), and as they were registered
        self.pre_step_listeners: tuple[StepListener, ...] = ()
        self._pre_step_registered: tuple[StepListener, ...] = ()
        self._step_gates: list[Callable[[int, int], bool]] = []
        self._ready: Callable[[int, int], bool] = lambda step, end: True  # all the gates
        self.held: collections.deque[tuple[Any, ...]] = collections.deque()
        self._max_held = 0
        self.steps_emitted = 0
        #: (end on the perf_counter clock, step) of the last steps the training thread
        #: finished, held or emitted: which step a moment belonged to (step_at)
        self._step_ends: collections.deque[tuple[int, int]] = collections.deque(maxlen=1024)
        #: where the rank's run began for goodput (epoch ns), and its last step's end (perf
        #: ns; None before the first): the time before a step is start-up or between steps
        self.account_start_ns = step_time.run_start_ns(time.time_ns())
        self._last_end: int | None = None
        self.time_counters = TimeCounters(pipeline, ident, prometheus)

    # --- the step listeners -------------------------------------------------------------
    def add_pre_step_listener(self, listener: StepListener) -> Callable[[], None]:
        """Run ``listener`` with each finished step before its record is handed on, in the
        order the listeners' declared fields ask (work.order_listeners: computed here, once a
        registration, never per step); ValueError, and nothing registered, on a cycle or an
        unknown field. The remover takes it out again."""
        registered = (*self._pre_step_registered, listener)
        self.pre_step_listeners = order_listeners(registered)
        self._pre_step_registered = registered

        def remove() -> None:
            self._pre_step_registered = tuple(
                x for x in self._pre_step_registered if x is not listener)
            self.pre_step_listeners = tuple(
                x for x in self.pre_step_listeners if x is not listener)

        return remove

    # --- the tracker's records --------------------------------------------------------
    def on_phase(self, record: tuple[Any, ...]) -> None:
        self._phases[record[_PHASE_STEP_AT]].append(record)

    def on_step(self, record: tuple[Any, ...]) -> None:
        self._step_ends.append((record[_STEP_END_AT], record[_STEP_AT]))
        if self._step_gates:
            self.held.append(record)
            self.release_steps()
        else:
            self.emit_step(*step_fields(record))

    # --- held steps -------------------------------------------------------------------
    def hold_steps(self, ready: Callable[..., bool], max_held: int = 64,
                   with_end: bool = False) -> None:
        """Hold finished steps back, in order, until ``ready(step)`` (their GPU events
        resolved, say), or ``ready(step, end)`` with the step's end on the perf_counter clock
        if ``with_end``; at most ``max_held`` wait, and the last pump waits at most a second
        before it emits what is still held."""
        gates = self._step_gates
        gates.append(ready if with_end else (lambda step, end: ready(step)))
        # one gate (the usual: the collectives' route) is asked directly, no generator
        self._ready = gates[0] if len(gates) == 1 else (
            lambda step, end: all(gate(step, end) for gate in gates))
        self._max_held = max(self._max_held, max_held)

    def release_steps(self, final: bool = False) -> None:
        """Emit the held steps that are ready now (``final``: all of them, waiting at most a
        second for their gates)."""
        held, ready = self.held, self._ready
        deadline = time.monotonic() + (1.0 if final else 0.0)
        while held:
            step, end = held[0][_STEP_AT], held[0][_STEP_END_AT]
            if len(held) <= self._max_held and not ready(step, end):
                if not final:
                    return
                if time.monotonic() < deadline:
                    time.sleep(0.005)  # the last pump only: polling, never synchronising
                    continue
            self.emit_step(*step_fields(held.popleft()))

    # --- what sources ask ---------------------------------------------------------------
    def sampled(self, trace_id: int) -> bool:
        """The configured sampler's decision for a step's trace (a root: no parent)."""
        return self._decide(trace_id)

    def step_context(self, step: int) -> SpanContext:
        """The ``training.rank_step`` span context of this rank's ``step`` (its ids are derived,
        so known before the step is emitted)."""
        trace_id, span_id = self._ids(step)
        flags = _SAMPLED if self.sampled(trace_id) else TraceFlags(0)
        return SpanContext(trace_id, span_id, False, flags)

    def step_at(self, perf_ns: int) -> int:
        """The training step a moment (perf_counter ns) belonged to: the first step that ended
        after it, or the one after the last step finished so far. Steps are contiguous, and
        steps held back count: not the emitted count."""
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

    def exemplar_context(self, info: StepWork) -> otel_context.Context | None:
        """The context that binds a step's metric points to its span (made once a step:
        building an OpenTelemetry Context costs microseconds, and every collective asks)."""
        if not info.record.sampled:
            return None
        if info.exemplar is None:
            info.exemplar = trace.set_span_in_context(NonRecordingSpan(info.rank_step_context))
        return info.exemplar

    # --- a step -----------------------------------------------------------------------
    def emit_step(self, step: int, start_ns: int, end_ns: int, micro_batches: int, samples: int,
                  tokens: int) -> None:
        """A STEP record's fields (:data:`EMIT_STEP_FIELDS`: these parameters): the step made
        into its record, given to the listeners and handed on. Times on the perf_counter
        clock."""
        start, end = start_ns, end_ns
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
            totals = {r[_PHASE_AT] for r in phases}
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
        by_step = self._phases
        if by_step:
            # the steps whose step record was dropped (buffer full): steps only grow, so the
            # keys are in step order and the stale ones come first (the held steps' phases
            # wait behind them: a full pass each step would be quadratic in a drain's steps)
            stale = []
            for k in by_step:
                if k >= step:
                    break
                stale.append(k)
            for k in stale:
                del by_step[k]
        # a tuple: the listeners share it, and the phase spans below are made from it
        intervals = tuple(map(phase_interval, phases))
        totals: dict[str, float] = {}
        for phase, _, p_start, p_end in intervals:
            totals[phase] = totals.get(phase, 0.0) + (p_end - p_start) / 1e9
        duration_s = (end - start) / 1e9
        trace_id, rank_span_id = self._ids(step)
        sampled = self.sampled(trace_id)
        rank_ctx = SpanContext(trace_id, rank_span_id, is_remote=False,
                               trace_flags=_SAMPLED if sampled else _UNSAMPLED)
        record = StepRecord(
            run_id=ident.run_id, rank=ident.rank, world_size=ident.world_size, step=step,
            start_ns=start + self.offset, end_ns=end + self.offset,
            micro_batches=micro_batches, samples=samples, tokens=tokens, phase_totals=totals,
            sampled=sampled, trace_id=trace_id, rank_step_span_id=rank_ctx.span_id,
            links=self.links)
        info = StepWork(record, rank_step_context=rank_ctx, phase_intervals=intervals)
        for listener in self.pre_step_listeners:
            self._call_listener(listener, info)
        self._account(info, start, end)
        # The step's spans, log and points are made where spans are built (the exporter
        # process by default: wire/step.py); here only their plain values.
        if sampled:
            phase_rows, phase_spans = record.phases, info.phase_spans
            overrides, offset = info.phase_overrides, self.offset
            for (phase, micro, p_start, p_end), span_id in zip(
                    intervals, map(phase_span_id, phases)):
                if not span_id:  # nobody asked for it on the training thread (tracker.py)
                    span_id = self._getrandbits(64) or 1
                over = overrides.get(span_id)
                if over is None:
                    p_start, p_end, added, error = p_start + offset, p_end + offset, None, None
                else:
                    p_start = over.get("start_ns", p_start + offset)
                    p_end = over.get("end_ns", p_end + offset)
                    added, error = over.get("attributes"), over.get("error")
                phase_rows.append(PhaseRow(phase, micro, p_start, p_end, span_id, added, error))
                phase_spans.append((phase, micro, (trace_id, span_id, _SAMPLED_INT, False),
                                    p_start, p_end))
        self.pipeline.step(record)
        try:  # the step is handed over: what follows can fail without losing it
            self._after_step(info, duration_s)
        except Exception as err:
            self._swallowed(err, "")

    def _account(self, info: StepWork, start: int, end: int) -> None:
        """The step's parts and goodput (otel_train/step_time.py), once every listener has
        added what it measured: the one place a step's time is divided."""
        offset, extra = self.offset, info.record.extra_attributes
        compiles = info.compile_intervals
        info.record.parts_ns = parts = step_time.partition_ns(
            start, end, info.phase_intervals, info.exposed_intervals,
            [(a - offset, b - offset) for a, b in compiles] if compiles else compiles,
            int(extra.get(_DEVICE_WAIT_TOTAL, 0.0) * 1e9),
            int(extra.get(_HOST_BUSY_TOTAL, 0.0) * 1e9),
            int(extra.get(_GPU_OUTSIDE_TOTAL, 0.0) * 1e9))
        first = self._last_end is None
        before = start + offset - self.account_start_ns if first else start - self._last_end
        checkpoint = sum(min(b, end) - max(a, start) for phase, _, a, b in info.phase_intervals
                         if phase == _CHECKPOINT and min(b, end) > max(a, start))
        self.time_counters.add(parts, step_time.goodput_list(
            parts, first or bool(compiles), before, first, checkpoint))
        self._last_end = end

    def _after_step(self, info: StepWork, duration_s: float) -> None:
        record = info.record
        trace_id, rank_span_id = record.trace_id, record.rank_step_span_id
        if self.prometheus is not None:
            exemplar = ({"trace_id": f"{trace_id:032x}", "span_id": f"{rank_span_id:016x}"}
                        if record.sampled else None)
            self.prometheus.observe_step(duration_s, record.phase_totals, record.samples,
                                         record.tokens, exemplar)
        for listener in self.step_listeners:
            self._call_listener(listener, info)
        if self._console_debug:
            self.console.debug(semconv.LOG_STEP_END, trace_id=f"{trace_id:032x}",
                               span_id=f"{rank_span_id:016x}", step=record.step,
                               **{semconv.LOG_PHASE: "step",
                                  semconv.LOG_DURATION: round(duration_s, 6)})
        self.steps_emitted += 1

    def _call_listener(self, listener: StepListener, info: StepWork) -> None:
        """A source's step listener: one that raises loses its own part, not the step."""
        try:
            listener(info)
        except Exception as err:
            self._swallowed(err, "step listener")


class TimeCounters:
    """``training.step.time`` by part and ``training.goodput.time`` by bucket: the steps'
    ns summed here, in ``semconv.PARTS``' and ``semconv.GOODPUT_BUCKETS``' order, and added
    once a drain (:meth:`publish`, on the emitter's tick, the last drain's too), not once a
    step: a dozen counter adds a step cost the exporter more than the step's spans. A part or
    bucket is added once it holds time (its series appears then); what a step adds is never
    lost with the step's record."""

    def __init__(self, pipeline: Pipeline, ident: Identity, prometheus: Any) -> None:
        meter = getattr(pipeline, "meter", None)
        self._counters = None if meter is None else (
            semconv.create(meter, semconv.METRIC_STEP_TIME),
            semconv.create(meter, semconv.METRIC_GOODPUT_TIME))
        self.prometheus = prometheus
        base = {semconv.ATTR_RANK: ident.rank, semconv.ATTR_RUN_ID: ident.run_id}
        self._keys = (semconv.PARTS, semconv.GOODPUT_BUCKETS)
        self._attrs = (
            [{**base, semconv.ATTR_PART: p} for p in semconv.PARTS],
            [{**base, semconv.ATTR_GOODPUT_BUCKET: b} for b in semconv.GOODPUT_BUCKETS])
        self._parts = [0] * len(semconv.PARTS)
        self._buckets = [0] * len(semconv.GOODPUT_BUCKETS)
        self._pending = False

    def add(self, parts: list[int], buckets: list[int]) -> None:
        """A step's parts and goodput buckets, ns (step_time.partition_ns, goodput_list)."""
        self._parts = [a + b for a, b in zip(self._parts, parts)]
        self._buckets = [a + b for a, b in zip(self._buckets, buckets)]
        self._pending = True

    def publish(self) -> None:
        if not self._pending:
            return
        pending = (self._parts, self._buckets)
        self._parts = [0] * len(semconv.PARTS)
        self._buckets = [0] * len(semconv.GOODPUT_BUCKETS)
        self._pending = False
        if self._counters is not None:
            for counter, attrs, values in zip(self._counters, self._attrs, pending):
                for i, ns in enumerate(values):
                    if ns:
                        counter.add(ns / 1e9, attrs[i])
        if self.prometheus is not None:
            self.prometheus.add_step_time(*({key: ns / 1e9 for key, ns in zip(keys, values) if ns}
                                            for keys, values in zip(self._keys, pending)))
