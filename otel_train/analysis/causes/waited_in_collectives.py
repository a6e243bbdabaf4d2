"""A rank that waited for another inside its collectives' GPU time: on NCCL a rank that waits
for a late one does so on the GPU (its forward or backward runs long there while its start
times look normal), so when the blamed rank spent at least half its excess more in the
step's collectives than the rank that spent least, that rank is the late one and is blamed.
From the collectives' spans (pass two)."""

from __future__ import annotations

from otel_train.analysis.causes.case import StepCase, WaitingCause


def waited_in_collectives(rank: int, excess: float, seconds: dict[int, float]) -> int | None:
    if len(seconds) < 2 or rank not in seconds or excess <= 0:
        return None
    least = min(seconds, key=lambda r: seconds[r])
    return least if least != rank and seconds[rank] - seconds[least] >= 0.5 * excess else None


class WaitedInCollectives(WaitingCause):
    name = "waited_in_collectives"

    def late_rank(self, case: StepCase) -> int | None:
        collective_s = case.evidence.collective_s
        excess, index, _ = case.worst
        if collective_s is None or index is None:
            return None
        return waited_in_collectives(case.table.ranks[index], excess, collective_s(case.step))


CAUSE = WaitedInCollectives()
