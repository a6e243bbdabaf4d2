"""A host blocked on its device: never the cause itself, it is followed to what the device
waited for. Where the step's largest excess (the blocked time counted) is ``device_wait``,
the wait is followed (device_waits.py) to the collective the device waited in, the step that
issued it and the rank it waited for, which is blamed for what it did in that step; or, where
no collective holds it, to the rank's own GPU work (this step's or the one before); or, where
the collective had no rank late to it, the collective itself. The blocked rank and the line
where its host waited go with it (``SlowStep.device_wait``)."""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis.causes.case import (
    DEVICE_WAIT,
    EXPLAINED_SHARE_OF_EXCESS,
    MIN_EXPLAINING_S,
    Blame,
    Blamed,
    StepCase,
    blocked_s,
)
from otel_train.analysis.report_model import DeviceWait, SlowStep


class DeviceWaitCause:
    name = "device_wait"

    def explain(self, case: StepCase) -> SlowStep | None:
        blame, table, step = case.blame, case.table, case.step
        excess, index, phase = blame.worst(case.rows, device=True)
        if index is None or phase != DEVICE_WAIT or excess < MIN_EXPLAINING_S:
            return None
        wait = device_wait(blame, index)
        target = step
        if wait.waited_for is not None and wait.late_on != "own":
            target = wait.collective_step if wait.collective_step is not None else step
            late_rows = [i for i in blame.rows.get(target, [])
                         if table.ranks[i] == wait.waited_for]
            found = blame.worst_own(late_rows)
        elif wait.op is None:  # no collective holds it: the device ran this rank's own work
            own_rows = [i for s in (step, step - 1) for i in blame.rows.get(s, [])
                        if table.ranks[i] == wait.rank]
            found = blame.worst_own(own_rows, gpu_only=True)
            if found is not None and found[0] >= EXPLAINED_SHARE_OF_EXCESS * excess:
                wait.waited_for, wait.late_on = wait.rank, "own"
            else:
                found = None
        else:  # a collective with no rank late to it: it was slow itself
            target = wait.collective_step if wait.collective_step is not None else step
            found = None
        if found is None:
            duration = max(blame.durations.get(target, blame.durations[step]), wait.seconds)
            slow = SlowStep(target, duration, wait.rank, DEVICE_WAIT, wait.seconds,
                            wait.seconds / duration if duration else 0.0, device_wait=wait)
            if wait.op is None:
                slow.unexplained = ("no collective or GPU-timed phase of this rank holds "
                                    "what its GPU was doing")
            return slow
        own_excess, own_index, own_phase, on_gpu = found
        target = table.steps[own_index]  # its own work may be of the step before
        # the step's time as its ranks lived it: a GPU-side cause's host step is short, the
        # wait it caused on the hosts is not
        duration = max(blame.durations.get(target, 0.0), table.durations[own_index],
                       wait.seconds)
        slow = case.explained(Blamed(own_excess, own_index, own_phase), step=target,
                              duration=duration, on_gpu=on_gpu)
        slow.device_wait = wait
        return slow


def device_wait(blame: Blame, index: int) -> DeviceWait:
    """The blocked time of a row, and the collective and rank its device waited for."""
    table = blame.table
    rank, step = table.ranks[index], table.steps[index]
    seconds = blocked_s(table, index)
    gaps = [g for g in table.gaps.get(index, ()) if g.kind == sc.EVENT_GAP]
    gap = max(gaps, key=lambda g: g.device_wait_s) if gaps else None
    wait = DeviceWait(rank, step, seconds)
    if gap is None or gap.device_wait_s <= 0:
        return wait
    wait.segment, wait.location = gap.segment, gap.location
    if blame.collectives is None:
        return wait
    held = blame.collectives.holding(rank, gap.start_ns,
                                     gap.start_ns + int(gap.device_wait_s * 1e9))
    if held is None:
        return wait
    row, overlap_s = held
    (wait.op, wait.seq, wait.collective_step, wait.collective_gpu_s,
     wait.collective_typical_s) = blame.collectives.describe(row)
    late = blame.collectives.waited_for(row, overlap_s)
    if late is not None:
        wait.waited_for, wait.late_on = late
    return wait


CAUSE = DeviceWaitCause()
