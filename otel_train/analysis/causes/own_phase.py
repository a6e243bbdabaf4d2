"""The last resort, which always claims the step: the rank and phase furthest above typical,
for what it did itself (the details then say what the telemetry holds about that time, or
why the step is not explained)."""

from __future__ import annotations

from otel_train.analysis.causes.case import StepCase
from otel_train.analysis.report_model import SlowStep


class OwnPhase:
    name = "own_phase"

    def explain(self, case: StepCase) -> SlowStep | None:
        return case.explained(case.worst)


CAUSE = OwnPhase()
