"""A step's collectives made into what the emitter sends: the step's exposed communication and
overlap, then rows (in-process collectives) or the NCCL plugin's records as it wrote them,
with the span policy's choice of own spans or a summary. Spans and points are built from
them elsewhere (wire/collectives.py, wire/nccl.py), the exporter process by default,
so that the emitter thread only sorts and counts. Definitions: docs/collectives.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_train import collectives_math, semconv
from otel_train.sources.collectives.book import Collective
from otel_train.sources.collectives.stall import StallWatch
from otel_train.wire import collectives as collective_rows
from otel_train.wire import ctx_tuple
from otel_train.wire import nccl as nccl_rows
from otel_train.wire.collectives import Spec as RowSpec
from otel_train.wire.nccl import StepSpec

_COMPUTE = (semconv.PHASE_FORWARD, semconv.PHASE_BACKWARD, semconv.PHASE_OPTIMIZER)
#: the context of no step: what ran after the last one has points and no spans
_NO_STEP = (0, 0, 0, False)


class Assembly:
    """Turns a step's collectives into its exposed communication, rows and their points."""

    def __init__(self, ctx: Any, base: dict[str, Any], stall: StallWatch) -> None:
        self.emitter = ctx.emitter
        self.offset = ctx.emitter.offset
        self.base = base
        self.stall = stall
        meter = ctx.meter
        self.overlap = semconv.create(meter, semconv.METRIC_COMM_OVERLAP)  # its owner
        #: the last step's overlap, not yet set: a gauge exports its last value, so it is set
        #: once a drain (:meth:`publish`, on the emitter's tick), not once a step
        self._overlap: float | None = None
        mode = ctx.config.collective_spans
        #: "auto": own spans within the rank's budget, a step summarised past it
        self.budget = (collective_rows.SpanBudget(ctx.config.collective_span_rate)
                       if mode == "auto" else None)
        self.summary = mode == "summary"

    def count_exposed(self, info: Any, comm: list[tuple[int, int]],
                      blocking: list[tuple[int, int]]) -> None:
        """Add to the step's exposed communication what of ``comm`` (intervals, perf ns) no
        compute phase covers, and keep the overlap for :meth:`publish`: ``blocking`` ones
        count whole."""
        lo, hi = info.start_ns - self.offset, info.end_ns - self.offset
        compute = [(s, e) for phase, _, s, e in info.phase_intervals if phase in _COMPUTE]
        intervals, total = collectives_math.exposed_intervals(comm, blocking, compute, lo, hi)
        exposed = collectives_math.measure(intervals)
        info.exposed_intervals.extend(intervals)
        info.phase_totals[semconv.PHASE_EXPOSED_COMM] = (
            info.phase_totals.get(semconv.PHASE_EXPOSED_COMM, 0.0) + exposed / 1e9)
        if total > 0:
            self._overlap = 1.0 - exposed / total

    def publish(self) -> None:
        """Set the overlap gauge to the last step's, if a step set one since the last call
        (the emitter's tick: after the drain's steps, before its commit; the last drain's
        too, so the run's last step is not lost)."""
        value, self._overlap = self._overlap, None
        if value is not None:
            self.overlap.set(value, self.base)

    def summarise(self, info: Any, collectives: Sequence[Any] | bytes) -> bool:
        """Whether a step's collectives (Collective objects, or the plugin's records as the
        bytes it wrote, 64 a collective) become summary spans (docs/collectives.md, "The span
        policy"): always in summary mode, never in all mode; in auto mode when the sampled
        step's collectives would take the rank past its span budget."""
        if self.budget is None or not info.sampled:
            return self.summary
        return self.budget.summarise(nccl_rows.count(collectives), info.end_ns)

    def send(self, colls: list[Collective], info: Any, end_perf: int | None = None,
             points: bool = True) -> None:
        """The collectives of a step as rows: their spans and points are made where spans
        are built (wire/collectives.py), the exporter process by default."""
        spec = RowSpec(info.step, info.sampled, self.summarise(info, colls),
                       ctx_tuple(info.rank_step_context),
                       [(ctx, start, end) for _, _, ctx, start, end in info.phase_spans],
                       self.base, points)
        self.emitter.collectives(spec, [self.row(c, end_perf) for c in colls])

    def send_after_steps(self, colls: list[Collective]) -> None:
        """Collectives that ran after the last step: points, no spans."""
        spec = RowSpec(self.emitter.steps_emitted, False, self.summary, _NO_STEP, [],
                       self.base)
        self.emitter.collectives(spec, [self.row(c, None) for c in colls])

    def send_nccl(self, info: Any, rows: bytes, groups: dict[int, tuple[str, int]],
                  stalled: dict[tuple[int, int, int], tuple[int, int, float]]) -> None:
        """A step's NCCL operations as the plugin wrote them: expanded where spans are built
        (wire/nccl.py)."""
        spec = StepSpec(
            info.step, info.sampled, self.summarise(info, rows),
            ctx_tuple(info.rank_step_context),
            [(ctx, start, end) for _, _, ctx, start, end in info.phase_spans],
            self.offset, self.base, groups, stalled)
        self.emitter.collectives(spec, rows)

    def send_nccl_after_steps(self, rows: bytes, groups: dict[int, tuple[str, int]]) -> None:
        """NCCL operations after the last step: points, no spans."""
        spec = StepSpec(self.emitter.steps_emitted, False, self.summary, _NO_STEP, [],
                        self.offset, self.base, groups, {})
        self.emitter.collectives(spec, rows)

    def row(self, coll: Collective, end_perf: int | None) -> collective_rows.Row:
        off = self.offset
        done = coll.done is not None
        end = coll.done if coll.done is not None else (end_perf or coll.issue)
        stalled = ((coll.stalled_at + off, self.stall.timeout_ns / 1e9) if coll.stalled_at
                   else None)
        return (coll.op, coll.api, coll.backend, coll.group, coll.group_size, coll.nbytes,
                coll.dtype, tuple(coll.shape), coll.async_op, coll.issue + off, end + off, done,
                coll.seq, coll.source, coll.gpu_duration_s, stalled, coll.error, coll.span_id)
