"""Right on NCCL, on hand-written rows: a host blocked on its device is followed to the
collective its GPU waited in, the step that issued it and the rank it waited for.

On NCCL the rank that waits for a late peer waits on the GPU; its host blocks at its next
device-bound call, in the next step, as ``device_wait`` time outside the phases
(sources/gaps.py). The same report on real NCCL ranks is tests/gpu/test_nccl_attribution.py;
here each rule on rows written out, and the split of a stretch by the GPU's phase ends.
"""

from __future__ import annotations

import pytest

from otel_train import semconv as sc
from otel_train.analysis import arrivals as arr
from otel_train.analysis import attribution as st
from otel_train.analysis.device_waits import GpuIntervals
from otel_train.analysis.otlp import decode_attributes
from otel_train.analysis.traces import UNTIMED, Gap, StepTable
from otel_train.sources.gaps import blocked_ns, gpu_outside_ns

S = 1_000_000_000  # ns a second
NORMAL = {sc.PHASE_DATA_WAIT: 0.01, sc.PHASE_FORWARD: 0.01, sc.PHASE_BACKWARD: 0.01,
          sc.PHASE_OPTIMIZER: 0.01}
STEP_S = 0.2  # a normal step: 40 ms of phases, 150 ms blocked on the device, 10 ms busy


def step_row(table: StepTable, step: int, rank: int, duration: float, device_wait: float,
             host_busy: float, gpu_forward: float = 0.05, gaps: list[Gap] | None = None,
             gpu_outside: float = 0.0001, blocked_outside: float = 0.0) -> None:
    """``gpu_outside``: GPU seconds of work queued outside the phases (between forward and
    backward); ``blocked_outside``: seconds of the blocked time spent while the device ran
    such work (the part ``gpu_outside_phases``, beside ``device_wait``)."""
    attrs = {sc.ATTR_STEP: step, sc.ATTR_RANK: rank, sc.ATTR_STEP_DURATION: duration,
             sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_DEVICE_WAIT: device_wait,
             sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_GPU_OUTSIDE_PHASES: blocked_outside,
             sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_HOST_BUSY: host_busy,
             sc.ATTR_PHASE_GPU_TOTAL_PREFIX + sc.PHASE_FORWARD: gpu_forward,
             sc.ATTR_GPU_OUTSIDE_PHASES: gpu_outside,
             sc.ATTR_GPU_OUTSIDE_SEGMENT: "between forward and backward",
             **{sc.ATTR_PHASE_TOTAL_PREFIX + p: s for p, s in NORMAL.items()}}
    if gaps:
        table.gaps[len(table.steps)] = gaps
    table.add(attrs, {}, duration)


def gap(start_s: float, seconds: float, device_wait: float, location: str | None) -> Gap:
    function, _, where = (location or "").partition("() at ")
    file, _, line = where.partition(":")
    return Gap(sc.EVENT_GAP, "between data_wait and forward" if device_wait else
               "between forward and backward", seconds, 4, function or None, file or None,
               int(line) if line else None, None, int(start_s * S), device_wait)


def collectives(rows: list[tuple[int, int, int, float, float, float]]) -> GpuIntervals:
    """(rank, seq, step, issued at s, GPU end at s, GPU seconds) per all_reduce."""
    out = arr.ArrivalRows()
    for rank, seq, step, issued, end, gpu_s in rows:
        attrs = decode_attributes([
            {"key": sc.ATTR_COLLECTIVE_SEQ, "value": {"intValue": str(seq)}},
            {"key": sc.ATTR_COLLECTIVE_GROUP, "value": {"stringValue": "nccl:0"}},
            {"key": sc.ATTR_COLLECTIVE_SOURCE, "value": {"stringValue": "nccl_profiler"}},
            {"key": sc.ATTR_COLLECTIVE_GROUP_SIZE, "value": {"intValue": "2"}},
            {"key": sc.ATTR_RANK, "value": {"intValue": str(rank)}},
            {"key": sc.ATTR_STEP, "value": {"intValue": str(step)}},
            {"key": sc.ATTR_COLLECTIVE_GPU_DURATION, "value": {"doubleValue": gpu_s}}])
        out.add(attrs, {}, "all_reduce", int(issued * S), int(end * S))
    return GpuIntervals(out, arr.match(out))


def hang_run(late_on_host: bool, between: bool = False
             ) -> tuple[StepTable, dict[int, float], GpuIntervals]:
    """Two ranks, steps 0-5 of 0.2 s. In step 3 rank 1 spends 2 s between forward and
    backward (``late_on_host``: on the host, in ``main()``; else on its GPU, in forward, or
    with ``between`` in GPU work it queued between forward and backward); rank 0, which
    issued all_reduce #3 on time, blocks 2 s at its next batch copy in step 4.
    """
    table = StepTable()
    rows = []
    for step in range(6):
        t = step * STEP_S
        for rank in (0, 1):
            if step == 3 and rank == 1 and late_on_host:
                step_row(table, 3, 1, 2.2, 0.15, 2.01,
                         gaps=[gap(t + 0.05, 2.0, 0.0, "main() at train.py:122")])
            elif step == 3 and rank == 1 and between:
                step_row(table, 3, 1, 0.2, 0.15, 0.01, gpu_outside=2.0)
            elif step == 3 and rank == 1:
                step_row(table, 3, 1, 0.2, 0.15, 0.01, gpu_forward=2.05)
            elif step == 4 and rank == 0:
                step_row(table, 4, 0, 2.2, 2.15, 0.01,
                         gaps=[gap(t + 0.01, 2.1, 2.1, "main() at train.py:117")])
            else:
                step_row(table, step, rank, STEP_S, 0.15, 0.01)
        late = 2.0 if step == 3 else 0.0
        for rank in (0, 1):  # one all_reduce a step, GPU time 0.05 s unless waited in
            waits = step == 3 and rank == 0
            issued = t + 0.03 + (late if rank == 1 and late_on_host else 0.0)
            gpu_s = 2.05 if waits else 0.05
            rows.append((rank, step, step, issued, t + 0.1 + (2.0 if step == 3 else 0.0),
                         gpu_s))
    durations = {s: 2.2 if s == 4 else STEP_S for s in range(6)}  # rank 0's training.step spans
    return table, durations, collectives(rows)


def test_a_blocked_host_is_followed_to_the_late_rank_in_the_step_that_issued_the_wait(
        ) -> None:
    table, durations, gpu = hang_run(late_on_host=True)
    first = st.slow_steps(table, durations, 3, collectives=gpu)[0]
    assert (first.step, first.rank, first.phase) == (3, 1, UNTIMED), first.cause
    assert first.location == "main() at train.py:122" and first.phase_s == pytest.approx(2.01)
    wait = first.device_wait
    assert (wait.rank, wait.step, wait.op, wait.seq, wait.collective_step) == (
        0, 4, "all_reduce", 3, 3)
    assert (wait.waited_for, wait.late_on) == (1, "host")
    assert wait.location == "main() at train.py:117"
    assert "rank 0 blocked 2.15 s at train.py:117 in step 4 waiting for the GPU, which " \
           "waited on all_reduce #3 (step 3) for rank 1" in first.cause, first.cause


def test_without_the_collectives_the_blocked_host_is_not_named_as_the_cause() -> None:
    table, durations, _ = hang_run(late_on_host=True)
    first = st.slow_steps(table, durations, 1)[0]
    assert first.phase == sc.PHASE_DEVICE_WAIT and first.unexplained, first.cause
    assert first.location is None  # the copy's line is where it waited, not a cause


def test_a_gpu_straggler_is_found_by_who_spent_least_in_the_collective() -> None:
    """No host was late; rank 1's GPU reached all_reduce #3 last (its forward ran 2 s on the
    GPU), so its all_reduce took 0.05 s where rank 0's spun 2.05 s."""
    table, durations, gpu = hang_run(late_on_host=False)
    first = st.slow_steps(table, durations, 3, collectives=gpu)[0]
    assert (first.step, first.rank, first.phase, first.on_gpu) == (
        3, 1, sc.PHASE_FORWARD, True), first.cause
    assert (first.device_wait.waited_for, first.device_wait.late_on) == (1, "gpu")
    assert "forward on the GPU 2.05 s" in first.cause, first.cause


def test_steps_that_several_blocked_hosts_lead_to_are_listed_once() -> None:
    table, durations, gpu = hang_run(late_on_host=True)
    durations[3] = 2.2  # rank 1's own step as the slowest too
    slow = st.slow_steps(table, durations, 3, collectives=gpu)
    assert [s.step for s in slow].count(3) == 1, [s.cause for s in slow]


def test_the_untimed_split_per_rank_holds_blocked_busy_and_the_rest() -> None:
    table, _, _ = hang_run(late_on_host=True)
    (row0, row1) = st.rank_breakdowns(table, st.rows_by_rank(table))
    assert row0.untimed_split_s[sc.PHASE_DEVICE_WAIT] == pytest.approx((5 * 0.15 + 2.15) / 6)
    assert row1.untimed_split_s[sc.PHASE_HOST_BUSY] == pytest.approx((5 * 0.01 + 2.01) / 6)
    assert row0.untimed_split_s["not_explained"] == pytest.approx(0.0, abs=1e-9)


def test_a_stretch_is_blocked_until_the_gpu_finished_what_was_issued_before_it() -> None:
    # the forward ended on the host at 1.0 s, its GPU work at 1.3 s; the stretch after it
    # runs 1.0-1.5 s: 0.3 s blocked, 0.2 s the host's own
    ends = [(int(0.5 * S), int(0.9 * S)), (int(1.0 * S), int(1.3 * S))]
    assert blocked_ns([(int(1.0 * S), int(1.5 * S))], ends, True) == [int(0.3 * S)]
    # a GPU that had caught up before the stretch: nothing blocked
    assert blocked_ns([(int(2.0 * S), int(2.2 * S))], ends, True) == [0]
    # a GPU still busy past the stretch's end: all of it, no more
    assert blocked_ns([(int(1.0 * S), int(1.1 * S))], ends, True) == [int(0.1 * S)]
    # nothing GPU-timed before it: not blocked after a known step, unknown after one not
    assert blocked_ns([(int(0.1 * S), int(0.2 * S))], ends, True) == [0]
    assert blocked_ns([(int(0.1 * S), int(0.2 * S))], ends, False) == [None]


def test_a_host_blocked_on_its_own_gpu_work_is_blamed_on_that_work_in_its_own_step() -> None:
    """Rank 1's forward of step 3 ran 2 s on its GPU; its host blocked on it at the next
    batch copy, in step 4, while no collective held the wait: its own GPU work, step 3."""
    table = StepTable()
    rows = []
    for step in range(6):
        t = step * STEP_S
        for rank in (0, 1):
            if step == 3 and rank == 1:
                step_row(table, 3, 1, STEP_S, 0.15, 0.01, gpu_forward=2.05)
            elif step == 4 and rank == 1:
                step_row(table, 4, 1, 2.2, 2.15, 0.01,
                         gaps=[gap(t + 0.01, 2.1, 2.1, "main() at train.py:117")])
            else:
                step_row(table, step, rank, STEP_S, 0.15, 0.01)
            rows.append((rank, step, step, t + 0.03, t + 0.1, 0.05))
    durations = {s: 2.2 if s == 4 else STEP_S for s in range(6)}
    first = st.slow_steps(table, durations, 2, collectives=collectives(rows))[0]
    assert (first.step, first.rank, first.phase, first.on_gpu) == (
        3, 1, sc.PHASE_FORWARD, True), first.cause
    assert first.device_wait.late_on == "own" and first.share <= 1.0, first.cause
    assert "it blocked 2.15 s at train.py:117 in step 4 waiting for its own GPU work" in \
        first.cause, first.cause


def test_gpu_work_queued_between_the_phases_is_blamed_on_its_rank_step_and_stretch() -> None:
    """Rank 1 queued 2 s of kernels between forward and backward in step 3 (a loss or metric
    that launches GPU work; its host not delayed): its GPU reached all_reduce #3 last, rank 0
    blocked at its next copy in step 4. The blame goes to rank 1, step 3, on the GPU,
    between forward and backward: not to a phase, nor "not explained"."""
    table, durations, gpu = hang_run(late_on_host=False, between=True)
    first = st.slow_steps(table, durations, 3, collectives=gpu)[0]
    assert (first.step, first.rank, first.phase, first.on_gpu) == (
        3, 1, sc.PHASE_GPU_OUTSIDE_PHASES, True), first.cause
    assert first.segment == "between forward and backward" and not first.unexplained
    assert first.cause.startswith("step 3: rank 1 2 s of GPU work queued between forward "
                                  "and backward"), first.cause
    assert (first.device_wait.waited_for, first.device_wait.late_on) == (1, "gpu")


def test_a_host_blocked_on_its_own_gpu_work_between_the_phases_names_the_stretch() -> None:
    """One rank, no collective: rank 0 queued 2 s of GPU work between forward and backward in
    step 3 and blocked on it at step 4's copy (the part gpu_outside_phases): the work, its
    step, its stretch and the line the host was sampled at there are named."""
    table = StepTable()
    for step in range(12):
        if step == 3:
            step_row(table, 3, 0, STEP_S, 0.15, 0.01, gpu_outside=2.0, gaps=[
                Gap(sc.EVENT_GAP, "between forward and backward", 0.02, 2, "metrics",
                    "train.py", 121, None, int(3.05 * S), 0.0)])
        elif step == 4:
            step_row(table, 4, 0, 2.2, 0.15, 0.01, blocked_outside=2.0,
                     gaps=[gap(0.81, 2.15, 2.15, "main() at train.py:117")])
        else:
            step_row(table, step, 0, STEP_S, 0.15, 0.01)
    durations = {s: 2.2 if s == 4 else STEP_S for s in range(12)}
    first = st.slow_steps(table, durations, 2, collectives=collectives([]))[0]
    assert (first.step, first.rank, first.phase, first.on_gpu) == (
        3, 0, sc.PHASE_GPU_OUTSIDE_PHASES, True), first.cause
    assert first.device_wait.late_on == "own" and first.device_wait.seconds == \
        pytest.approx(2.15)
    assert ("2 s of GPU work queued between forward and backward, 93% of step, issued "
            "from metrics() at train.py:121") in first.cause, first.cause
    (row,) = st.rank_breakdowns(table, st.rows_by_rank(table))
    assert row.untimed_split_s[sc.PHASE_GPU_OUTSIDE_PHASES] == pytest.approx(2.0 / 12)


def test_the_gpu_work_between_phases_is_what_ran_while_the_host_waited_or_had_gone_on() -> None:
    ms = 1_000_000  # ns a millisecond
    # forward's GPU work ended at 1.0 s, backward's began at 3.0 s; the host began backward
    # at 1.01 s: 1.99 s of GPU work queued between them (the host's 10 ms is its own)
    between = [("forward", "backward", 1000 * ms, 3000 * ms, 1010 * ms)]
    assert gpu_outside_ns(between, [], []) == ([1990 * ms], 0)
    # a CPU straggler: the host worked 0.4 s before backward, the GPU idle meanwhile
    between = [("forward", "backward", 1000 * ms, 1401 * ms, 1400 * ms)]
    assert gpu_outside_ns(between, [], []) == ([1 * ms], 0)
    # the host blocked in the stretch (a .item() at 1.005-2.0 s) on work queued there
    between = [("forward", "backward", 1000 * ms, 2011 * ms, 2010 * ms)]
    assert gpu_outside_ns(between, [], [(1005 * ms, 2000 * ms)]) == ([996 * ms], 995 * ms)
    # the next step's host, blocked at its copy 1.5-3.5 s, while the GPU ran the work
    # queued between the step before's forward and backward (1.0-3.0 s): 1.5 s of it, and
    # 0.3 s of work queued after the step before's optimizer
    earlier = [("forward", "backward", 1000 * ms, 3000 * ms, 1010 * ms)]
    now = [("optimizer", "forward", 3200 * ms, 3500 * ms, 3500 * ms)]
    assert gpu_outside_ns(now, earlier, [(1500 * ms, 3500 * ms)]) == (
        [300 * ms], 1800 * ms)


def test_a_late_rank_s_own_step_is_listed_though_the_others_wait_there_for_its_step_before(
        ) -> None:
    """Issue 53, item 3: rank 1 works 0.4 s on its host between forward and backward in
    steps 3, 4 and 5 (NCCL, 8 ranks: the CPU straggler). Rank 0 blocks at the top of each
    next step for the step before's all_reduce: 0.45 s in steps 4 and 6, longer than rank
    1's own 0.4 s, so their largest excess is that wait, followed to steps 3 and 5; 0.35 s
    in step 5. Step 4 must still be listed, for rank 1's own work in it: it was not (one of
    the three steps lost in one run of four on an H100)."""
    table = StepTable()
    rows = []
    heavy = "heavy() at train.py:88"
    blocked = {4: 0.45, 5: 0.35, 6: 0.45}  # rank 0, for the step before

    def start(step: int) -> float:
        return step * STEP_S + sum(b for s, b in blocked.items() if s < step)

    for step in range(12):
        t = start(step)
        late = 0.4 if step in (3, 4, 5) else 0.0
        for rank in (0, 1):
            if rank == 1 and late:
                step_row(table, step, 1, STEP_S + late, 0.15, 0.01 + late,
                         gaps=[gap(t + 0.05, late, 0.0, heavy)])
            elif rank == 0 and step in blocked:
                b = blocked[step]
                step_row(table, step, 0, STEP_S + b, 0.15 + b, 0.01,
                         gaps=[gap(t + 0.01, b, b, "main() at train.py:117")])
            else:
                step_row(table, step, rank, STEP_S, 0.15, 0.01)
            issued = t + 0.03 + (late if rank == 1 else 0.0)
            end = start(step + 1) + 0.01 + blocked[step + 1] if late else t + 0.1
            rows.append((rank, step, step, issued, end,
                         end - issued if rank == 0 else 0.05))
    durations = st.step_durations(table, {})
    slow = st.slow_steps(table, durations, 5, collectives=collectives(rows))
    named = {s.step: s for s in slow}
    assert {3, 4, 5} <= set(named), [s.cause for s in slow]
    for step in (3, 4, 5):
        assert (named[step].rank, named[step].location) == (1, heavy), named[step].cause
    assert 6 not in named, named[6].cause  # rank 0's wait for step 5: nothing of its own
