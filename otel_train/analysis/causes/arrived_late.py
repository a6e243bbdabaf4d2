"""The rank that arrived late at the step's collectives (arrivals.py: the direct evidence,
asked first): where it arrived late by at least half the blamed excess, the blamed rank was
waiting for it, and it is blamed instead, for what it did before it got there; where the
blamed rank itself arrived late, the blame stands (and no other evidence is asked)."""

from __future__ import annotations

from otel_train.analysis.causes.case import StepCase, WaitingCause


def arrived_late(excess: float, late: tuple[int, float] | None) -> int | None:
    """The rank that arrived at the step's collectives late enough to explain at least half
    the blamed excess (maybe the blamed rank itself), else None."""
    if late is None or excess <= 0:
        return None
    rank, lag_s = late
    return rank if lag_s >= 0.5 * excess else None


class ArrivedLate(WaitingCause):
    name = "arrived_late"

    def late_rank(self, case: StepCase) -> int | None:
        late_of_step = case.evidence.late_of_step
        if late_of_step is None or case.worst.index is None:
            return None
        return arrived_late(case.worst.excess, late_of_step(case.step))


CAUSE = ArrivedLate()
