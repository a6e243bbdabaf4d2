"""GPU work queued outside the phases (a loss, a metric, gradient clipping, an EMA that
launches kernels between forward and backward): named by the stretch it was queued in
(``training.rank_step.gpu_outside_phases.segment``) and, where the host's own time in that
stretch was sampled (its ``training.gap`` event of the same segment), the line that issued
it."""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis.causes.case import GPU_OUTSIDE, Description
from otel_train.analysis.report_model import SlowStep


class GpuOutside:
    name = "gpu_outside"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if slow.phase != GPU_OUTSIDE or said.index is None:
            return False
        slow.segment = said.table.gpu_segments.get(said.index)
        gaps = [g for g in said.table.gaps.get(said.index, ())
                if g.kind == sc.EVENT_GAP and g.segment == slow.segment and g.location]
        if gaps:
            slow.location = max(gaps, key=lambda g: g.host_s).location
        return True


DETAIL = GpuOutside()
