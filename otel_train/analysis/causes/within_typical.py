"""A step no longer than the typical one: nothing to explain (listed as a warm-up step, or
for its throttling); where no rank's step of it was recorded, that is said."""

from __future__ import annotations

from otel_train.analysis.causes.case import MIN_EXPLAINING_S, Description
from otel_train.analysis.report_model import SlowStep


class WithinTypical:
    name = "within_typical"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if said.step_excess >= MIN_EXPLAINING_S:
            return False
        if said.index is None:
            slow.unexplained = "no rank's step of it was recorded"
        return True


DETAIL = WithinTypical()
