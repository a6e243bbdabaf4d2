"""Untimed time (less what the host spent blocked on its device): named by the stretch it
lay in ("between forward and backward") and the user code sampled there (the
``training.gap`` event of the blamed rank's step that held most of the host's own time);
where no stretch was recorded, or nothing sampled in user code, that is said instead."""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis.causes.case import Description
from otel_train.analysis.report_model import SlowStep
from otel_train.analysis.traces import UNTIMED


class Untimed:
    name = "untimed"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if slow.phase != UNTIMED or slow.on_gpu or said.index is None:
            return False
        gaps = [g for g in said.table.gaps.get(said.index, ()) if g.kind == sc.EVENT_GAP]
        if not gaps:
            slow.unexplained = ("untimed time with no stretch of it recorded (gap sampling "
                                "off, or many stretches under 10 ms)")
            return True
        gap = max(gaps, key=lambda g: g.host_s)  # the host's own time, not its blocked time
        slow.location, slow.worker = gap.location, gap.worker
        slow.segment = gap.segment
        if gap.location is None:
            slow.unexplained = ("nothing was sampled there" if not gap.samples else
                                f"{gap.samples} samples there, none in user code")
        return True


DETAIL = Untimed()
