"""The phases do not hold where the time went: the blamed phase's excess is less than
``EXPLAINED_SHARE_OF_EXCESS`` of the step's time above the typical step, so the step is
not explained (no phase is named by default), and how much the phases hold is said."""

from __future__ import annotations

from otel_train.analysis.causes.case import (
    EXPLAINED_SHARE_OF_EXCESS,
    MIN_EXPLAINING_S,
    Description,
)
from otel_train.analysis.report_model import SlowStep


class NotExplained:
    name = "not_explained"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        limit = max(MIN_EXPLAINING_S, EXPLAINED_SHARE_OF_EXCESS * said.step_excess)
        if said.index is not None and said.excess >= limit:
            return False
        slow.unexplained = (f"its phases hold {max(said.excess, 0.0):.3g} s of the "
                            f"{max(said.step_excess, 0.0):.3g} s it took over the typical step")
        return True


DETAIL = NotExplained()
