"""A finished step made into its spans, its ``train.step.end`` log and its metric points.

This runs where spans are built: in the exporter process, which receives one
:class:`StepRecord` per step (plain values, pickled with the batch), or on the emitter thread
when export runs in process. The training process's emitter pays for the record, not for the
step's four to eight spans, its log record and its points (building them costs ~0.3-0.5 ms
of interpreter time a step, docs/overhead.md). No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train import identity, semconv
from otel_train.export.collective_rows import context_of

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(0)

CtxTuple = tuple[int, int, int, bool]  # (trace_id, span_id, flags, is_remote)


class StepRecord(NamedTuple):
    """What one rank's finished step needs to become telemetry; plain values."""

    step: int
    start_ns: int  # wall clock (epoch) ns
    end_ns: int
    micro_batches: int
    samples: int
    tokens: int
    phase_totals: dict[str, float]  # seconds, exposed_comm and compile included
    sampled: bool
    trace_id: int
    rank_step_span_id: int
    #: (phase, micro batch, start, end (wall ns, GPU-timed where known), span id,
    #:  attributes added by sources or None, error text or None)
    phases: list[tuple[str, int, int, int, int, dict[str, Any] | None, str | None]]
    #: added to the train.rank_step span (GPU totals, memory, throttling, MFU...)
    extra: dict[str, Any]
    #: the links of the rank's step spans: the train.run span, the launcher's context
    links: list[CtxTuple]
    run_id: str
    rank: int
    world_size: int
    #: events of the train.rank_step span: (name, epoch ns, attributes) (sources/gaps.py)
    events: list[tuple[str, int, dict[str, Any]]] | tuple[()] = ()


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
            semconv.LOG_RUN_ID: record.run_id, semconv.LOG_RANK: record.rank,
        }
        emit_log(record.end_ns, observed_ns or record.end_ns, rank_ctx, SeverityNumber.INFO,
                 "INFO", semconv.LOG_STEP_END, attributes)


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
        **record.extra,
    }
    span(semconv.SPAN_RANK_STEP, root_ctx, record.start_ns, record.end_ns, rank_attrs,
         record.rank_step_span_id, 0, links, None, record.events)
    for phase, micro, start, end, span_id, added, error in record.phases:
        attrs = {semconv.ATTR_STEP: record.step, semconv.ATTR_RANK: record.rank,
                 semconv.ATTR_RUN_ID: record.run_id, semconv.ATTR_PHASE: phase,
                 semconv.ATTR_MICRO_BATCH: micro}
        if added:
            attrs.update(added)
        span(semconv.PHASE_SPAN[phase], rank_ctx, start, end, attrs, span_id, 0, (), error)
