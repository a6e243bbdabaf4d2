"""One rank's finished step: the record built once, on the emitter thread, and what it
becomes (its spans, its ``training.step.end`` log and its metric points).

The emitter builds one :class:`StepRecord` per step from the tracker's records, hands it,
inside its working state (``otel_train/emitter/work.py``: ``StepWork``, what the listeners
read and write beside the record and never sent), to the sources' step listeners (which add
GPU times, memory, exposed communication...), then the record alone to the pipeline: to the
exporter process, where :func:`emit` makes the telemetry, or to the in-process pipeline.
Every field of a StepRecord crosses the process boundary (:data:`WIRE_FIELDS`). No torch
here.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train import identity, semconv
from otel_train.wire import CtxTuple, context_of

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(0)

class PhaseRow(NamedTuple):
    """One phase span of a sampled step."""

    phase: str
    micro: int  # micro batch
    start_ns: int  # wall clock; GPU-timed where known
    end_ns: int
    span_id: int
    attributes: dict[str, Any] | None  # added by sources
    error: str | None

#: the instruments a step records into, in :func:`emit`'s order
INSTRUMENTS = (semconv.METRIC_STEP_DURATION, semconv.METRIC_PHASE_DURATION,
               semconv.METRIC_SAMPLES, semconv.METRIC_TOKENS)


@dataclasses.dataclass(eq=False)
class StepRecord:
    """One rank's finished step, as it crosses to where spans are built: every field is a
    wire field (:data:`WIRE_FIELDS`). The step listeners' working state on the emitter
    thread is not here: it is ``otel_train.emitter.work.StepWork``, which holds the record."""

    run_id: str
    rank: int
    world_size: int
    step: int
    start_ns: int  # wall clock (epoch) ns
    end_ns: int
    micro_batches: int
    samples: int
    tokens: int
    #: seconds by phase; listeners add exposed_comm and compile
    phase_totals: dict[str, float]
    sampled: bool
    trace_id: int
    rank_step_span_id: int
    #: the links of the rank's step spans: the training.run span, the launcher's context
    links: list[CtxTuple] = dataclasses.field(default_factory=list)
    #: the phase spans, made once the listeners have run (sampled steps only)
    phases: list[PhaseRow] = dataclasses.field(default_factory=list)
    #: added to the training.rank_step span by listeners (GPU totals, memory, throttling, MFU...)
    extra_attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: events of the training.rank_step span as (name, epoch ns, attributes) (sources/gaps/)
    events: list[tuple[str, int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    #: the step's time split into disjoint parts that add up to it, ns in semconv.PARTS'
    #: order (otel_train/step_time.py; made once the listeners have run; their counters are
    #: added on the emitter, once a drain: emitter/steps.py TimeCounters)
    parts_ns: list[int] = dataclasses.field(default_factory=list)

    def __reduce__(self) -> tuple[Any, ...]:
        # what crosses to the exporter process: the fields, in WIRE_FIELDS' order, the phase
        # rows as plain tuples (a NamedTuple pickles at about twice the cost)
        values = list(_wire_values(self))
        values[_PHASES_AT] = [tuple(row) for row in self.phases]
        return _from_wire, (values,)


#: the fields that cross the process boundary, in the order they are pickled: all of
#: StepRecord's
WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord))


#: a record's wire values, in WIRE_FIELDS' order (one C call)
_wire_values = operator.attrgetter(*WIRE_FIELDS)


_PHASES_AT = WIRE_FIELDS.index("phases")


def _from_wire(values: list[Any]) -> StepRecord:
    values[_PHASES_AT] = [PhaseRow._make(row) for row in values[_PHASES_AT]]
    return StepRecord(**dict(zip(WIRE_FIELDS, values, strict=True)))


def lost(record: StepRecord) -> tuple[int, int, int]:
    """(spans, metric points, logs) the record would have made: counted when it is lost."""
    points = 1 + len(record.phase_totals) + bool(record.samples) + bool(record.tokens)
    if not record.sampled:
        return 0, points, 0
    return (record.rank == 0) + 1 + len(record.phases), points, 1


def emit(record: StepRecord, span: Callable[..., Any], emit_log: Callable[..., Any],
         step_hist: Callable[..., Any], phase_hist: Callable[..., Any],
         samples_ctr: Callable[..., Any], tokens_ctr: Callable[..., Any],
         observed_ns: int = 0) -> None:
    """Make the step's telemetry with a Pipeline's ``span`` and ``emit_log`` and the
    ``record``/``add`` of its step-duration, phase-duration, samples and tokens instruments."""
    rank_ctx = SpanContext(record.trace_id, record.rank_step_span_id, False,
                           _SAMPLED if record.sampled else _UNSAMPLED)
    if record.sampled:
        _spans(record, rank_ctx, span)
    base = {semconv.ATTR_RANK: record.rank, semconv.ATTR_RUN_ID: record.run_id}
    ctx = trace.set_span_in_context(NonRecordingSpan(rank_ctx)) if record.sampled else None
    step_s = (record.end_ns - record.start_ns) / 1e9
    step_hist(step_s, base, context=ctx)
    for phase, seconds in record.phase_totals.items():
        phase_hist(seconds, {**base, semconv.ATTR_PHASE: phase}, context=ctx)
    if record.samples:
        samples_ctr(record.samples, base)
    if record.tokens:
        tokens_ctr(record.tokens, base)
    if record.sampled:
        attributes: dict[str, Any] = {
            semconv.LOG_STEP: record.step, semconv.LOG_PHASE: "step",
            semconv.LOG_DURATION: step_s,
            **{semconv.ATTR_PHASE_TOTAL_PREFIX + p: s for p, s in record.phase_totals.items()},
            **_parts(record),
            semconv.LOG_RUN_ID: record.run_id, semconv.LOG_RANK: record.rank,
        }
        emit_log(record.end_ns, observed_ns or record.end_ns, rank_ctx, SeverityNumber.INFO,
                 "INFO", semconv.LOG_STEP_END, attributes)


#: the rank step's attribute of each part, in semconv.PARTS' order
_PART_ATTRIBUTES = tuple(semconv.ATTR_RANK_STEP_PART_PREFIX + p for p in semconv.PARTS)


def _parts(record: StepRecord) -> dict[str, float]:
    """The step's parts as attributes, seconds (none where they were not made)."""
    return {key: ns / 1e9 for key, ns in zip(_PART_ATTRIBUTES, record.parts_ns)}


def _spans(record: StepRecord, rank_ctx: SpanContext, span: Callable[..., Any]) -> None:
    links = [context_of(t) for t in record.links]
    step_attrs = {semconv.ATTR_STEP: record.step, semconv.ATTR_RUN_ID: record.run_id,
                  semconv.ATTR_WORLD_SIZE: record.world_size}
    root_id = identity.step_span_id(record.run_id, record.step)
    if record.rank == 0:
        span(semconv.SPAN_STEP, None, record.start_ns, record.end_ns, step_attrs, root_id,
             record.trace_id, links)
    root_ctx = SpanContext(record.trace_id, root_id, is_remote=True, trace_flags=_SAMPLED)
    rank_attrs = {
        **step_attrs,
        semconv.ATTR_RANK: record.rank,
        semconv.ATTR_MICRO_BATCHES: record.micro_batches,
        semconv.ATTR_STEP_DURATION: (record.end_ns - record.start_ns) / 1e9,
        semconv.ATTR_SAMPLES: record.samples,
        semconv.ATTR_TOKENS: record.tokens,
        **{semconv.ATTR_PHASE_TOTAL_PREFIX + p: s for p, s in record.phase_totals.items()},
        **_parts(record),
        **record.extra_attributes,
    }
    span(semconv.SPAN_RANK_STEP, root_ctx, record.start_ns, record.end_ns, rank_attrs,
         record.rank_step_span_id, 0, links, None, record.events)
    for phase, micro, start, end, span_id, added, error in record.phases:  # PhaseRow
        attrs = {semconv.ATTR_STEP: record.step, semconv.ATTR_RANK: record.rank,
                 semconv.ATTR_RUN_ID: record.run_id, semconv.ATTR_PHASE: phase,
                 semconv.ATTR_MICRO_BATCH: micro}
        if added:
            attrs.update(added)
        span(semconv.PHASE_SPAN.get(phase, semconv.SPAN_REGION), rank_ctx, start, end, attrs,
             span_id, 0, (), error)
