"""A rank's CPU throttled by its cgroup's quota: where the step's most throttled rank was
throttled for a good part of the step's time above the typical step, that rank is the cause,
named as such (with the phase it is blamed for: the one the waiting causes blamed on it, else
its own largest excess). Nothing else is said of its time but missing ranks."""

from __future__ import annotations

from otel_train.analysis.causes.case import MIN_EXPLAINING_S, Description, StepCase
from otel_train.analysis.report_model import SlowStep
from otel_train.analysis.traces import StepTable

#: a rank's CPU throttling explains a slow step when it is at least this share of the step's
#: time above the typical step (and at least ``MIN_EXPLAINING_S``)
THROTTLED_SHARE_OF_EXCESS = 0.25


def throttled_row(table: StepTable, rows: list[int], excess_s: float) -> int | None:
    """The row of the step's most throttled rank, if its throttling explains the step."""
    if not rows:
        return None
    row = max(rows, key=lambda i: table.throttled[i])
    seconds = table.throttled[row]
    if seconds >= MIN_EXPLAINING_S and seconds >= THROTTLED_SHARE_OF_EXCESS * max(excess_s, 0.0):
        return row
    return None


class CpuThrottled:
    name = "cpu_throttled"

    def explain(self, case: StepCase) -> SlowStep | None:
        row = throttled_row(case.table, case.rows, case.duration - case.blame.typical_step)
        if row is None:
            return None
        blamed = case.blamed
        if row != blamed.index:
            blamed = case.blame.worst([row])
        slow = case.explained(blamed, throttled=True)
        slow.throttled_s = case.table.throttled[row]
        return slow

    def describe(self, slow: SlowStep, said: Description) -> bool:
        """The throttling is what there is to say (after missing ranks)."""
        return said.throttled


CAUSE = DETAIL = CpuThrottled()
