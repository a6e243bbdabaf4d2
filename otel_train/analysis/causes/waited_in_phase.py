"""A rank that waited inside its phase for another: when the blamed rank started the blamed
phase well before another rank (by at least half its excess), it was waiting inside it (a
collective with no exposed communication recorded), and the rank that started last is
blamed instead, for what it did before it got there. From the phases' spans (pass two)."""

from __future__ import annotations

from otel_train.analysis.causes.case import StepCase, WaitingCause
from otel_train.analysis.traces import StepTable


def waited_for(table: StepTable, index: int | None, phase: str, excess: float,
               starts: dict[int, int]) -> int | None:
    if index is None or len(starts) < 2 or table.ranks[index] not in starts:
        return None
    rank = table.ranks[index]
    late = max(starts, key=lambda r: starts[r])
    lag_s = (starts[late] - starts[rank]) / 1e9
    return late if late != rank and lag_s >= 0.5 * excess else None


class WaitedInPhase(WaitingCause):
    name = "waited_in_phase"

    def late_rank(self, case: StepCase) -> int | None:
        excess, index, phase = case.worst
        phase_starts = case.evidence.phase_starts
        starts = phase_starts(case.step, phase) if phase_starts and index is not None else {}
        return waited_for(case.table, index, phase, excess, starts)


CAUSE = WaitedInPhase()
