"""One account of a step's time (otel_train/step_time.py): the parts of a step are disjoint
and complete, whatever the timeline; goodput buckets take every second of a step once.

The property is checked against an oracle that classifies every nanosecond of small random
timelines on its own (compile, then communication in flight inside a compute phase, then the
phase, then the time outside the phases), and shown to fail once with exposed communication
counted twice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_train import semconv as sc
from otel_train import step_time

PHASE_ORDER = (sc.PHASE_DATA_WAIT, sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER)
COMPUTE = (sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER)
SPAN = 240  # ns of a generated timeline: small enough to classify every instant

interval = st.tuples(st.integers(0, SPAN), st.integers(0, SPAN)).map(sorted).map(tuple)


@st.composite
def timelines(draw: st.DrawFn) -> dict:
    """A step window, phases (micro-batches, gaps between them, now and then overlapping),
    collectives' exposed intervals crossing phase edges, compilations, and the gap
    sampler's device-wait and host-busy figures."""
    lo = draw(st.integers(0, SPAN // 4))
    hi = draw(st.integers(lo, SPAN))
    phases = []
    t = lo - draw(st.integers(0, 10))  # a phase can start before the step's window
    for _ in range(draw(st.integers(0, 3))):  # micro-batches
        for phase in (*PHASE_ORDER, "loss"):  # "loss": a region the user named
            if draw(st.booleans()):
                t += draw(st.integers(0, 12))  # untimed gap
                length = draw(st.integers(0, 30))
                phases.append((phase, t, t + length))
                t += length - draw(st.integers(0, 4))  # a few ns of overlap now and then
    return {
        "lo": lo, "hi": hi, "phases": phases,
        "exposed": draw(st.lists(interval, max_size=5)),
        "compiles": draw(st.lists(interval, max_size=2)),
        "outside": {sc.PART_DEVICE_WAIT: draw(st.integers(-5, 80)),
                    sc.PART_GPU_OUTSIDE_PHASES: draw(st.integers(-5, 80)),
                    sc.PART_HOST_BUSY: draw(st.integers(-5, 80))},
    }


def oracle(case: dict) -> dict[str, int]:
    """Each instant of the step given to one part, one at a time (otel_train/step_time.py's
    order, written out)."""
    parts = dict.fromkeys(sc.PARTS, 0)
    left = left_with_comm = 0

    def inside(t: int, spans: list) -> bool:
        return any(s <= t < e for s, e in spans)

    for t in range(case["lo"], case["hi"]):
        phase = next((p for p in (*PHASE_ORDER, "loss")
                      if inside(t, [(s, e) for q, s, e in case["phases"] if q == p])), None)
        if phase == "loss":
            phase = sc.PART_REGIONS
        comm = inside(t, case["exposed"])
        if inside(t, case["compiles"]):
            parts[sc.PART_COMPILE] += 1
        elif comm and phase in COMPUTE:
            parts[sc.PART_EXPOSED_COMM] += 1
        elif phase is not None:
            parts[phase] += 1
        else:
            left += 1
            left_with_comm += comm
    device = min(max(case["outside"][sc.PART_DEVICE_WAIT], 0), left)
    gpu = min(max(case["outside"][sc.PART_GPU_OUTSIDE_PHASES], 0), left - device)
    busy = min(max(case["outside"][sc.PART_HOST_BUSY], 0), left - device - gpu)
    rest = left - device - gpu - busy
    parts[sc.PART_DEVICE_WAIT], parts[sc.PART_HOST_BUSY] = device, busy
    parts[sc.PART_GPU_OUTSIDE_PHASES] = gpu
    parts[sc.PART_EXPOSED_COMM] += min(left_with_comm, rest)
    parts[sc.PART_NOT_EXPLAINED] = rest - min(left_with_comm, rest)
    return parts


def holds_for(partition: Callable[..., dict[str, int]]) -> Callable[[], None]:
    """The property, for a partition function (the real one, or one broken on purpose)."""

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(timelines())
    def check(case: dict) -> None:
        parts = partition(case["lo"], case["hi"], case["phases"], case["exposed"],
                          case["compiles"], case["outside"])
        assert set(parts) == set(sc.PARTS)
        assert all(v >= 0 for v in parts.values()), parts
        assert sum(parts.values()) == case["hi"] - case["lo"], (parts, case)
        assert parts == oracle(case), case

    return check


def test_the_parts_of_any_step_are_disjoint_and_add_up_to_it() -> None:
    holds_for(step_time.partition)()


def double_counted(lo: int, hi: int, phases: list, exposed: list, compiles: list,
                   outside: dict) -> dict[str, int]:
    """The bug this guards against: exposed communication added on top of the phases it lies
    in (what the demo, the report and the dashboards did before the parts)."""
    parts = step_time.partition(lo, hi, phases, exposed, compiles, outside)
    alone = step_time.partition(lo, hi, phases, [], compiles, outside)
    for phase in PHASE_ORDER:
        parts[phase] = alone[phase]
    return parts


def test_the_property_fails_when_exposed_communication_is_counted_twice() -> None:
    with pytest.raises(AssertionError):
        holds_for(double_counted)()


def test_a_step_with_blocking_communication_inside_backward_adds_up() -> None:
    # forward 5-30 holds a compilation 10-20, backward 30-70 exposed communication 50-65;
    # 70-80 and 95-100 lie outside the phases, 8 of them the host's own work
    parts = step_time.partition(
        0, 100, [(sc.PHASE_DATA_WAIT, 0, 5), (sc.PHASE_FORWARD, 5, 30),
                 (sc.PHASE_BACKWARD, 30, 70), (sc.PHASE_OPTIMIZER, 80, 95)],
        exposed=[(50, 65)], compiles=[(10, 20)], outside={sc.PART_HOST_BUSY: 8})
    assert parts == {sc.PART_DATA_WAIT: 5, sc.PART_FORWARD: 15, sc.PART_COMPILE: 10,
                     sc.PART_BACKWARD: 25, sc.PART_EXPOSED_COMM: 15, sc.PART_OPTIMIZER: 15,
                     sc.PART_DEVICE_WAIT: 0, sc.PART_GPU_OUTSIDE_PHASES: 0,
                     sc.PART_HOST_BUSY: 8, sc.PART_NOT_EXPLAINED: 7, sc.PART_REGIONS: 0}
    assert sum(parts.values()) == 100


def test_an_empty_or_reversed_step_has_no_time() -> None:
    assert sum(step_time.partition(5, 5, [(sc.PHASE_FORWARD, 0, 10)]).values()) == 0
    assert sum(step_time.partition(9, 3, []).values()) == 0


def test_a_region_the_user_named_is_a_part_of_its_own() -> None:
    parts = step_time.partition(0, 10, [("eval", 0, 4), (sc.PHASE_FORWARD, 4, 10)])
    assert parts[sc.PART_FORWARD] == 6 and parts[sc.PART_REGIONS] == 4
    # a collective in flight inside a region leaves it the region's (the host ran user code)
    parts = step_time.partition(0, 10, [("eval", 0, 10)], exposed=[(2, 6)])
    assert parts[sc.PART_REGIONS] == 10 and parts[sc.PART_EXPOSED_COMM] == 0


def test_a_checkpoint_region_is_the_checkpoint_loss_and_other_regions_outside_phases() -> None:
    parts = dict.fromkeys(sc.PARTS, 0.0)
    parts.update({sc.PART_FORWARD: 1.0, sc.PART_REGIONS: 2.5})
    buckets = step_time.goodput(parts, warmup=False, before_s=0.0, checkpoint_s=2.0)
    assert buckets[sc.GOODPUT_CHECKPOINT] == 2.0
    assert buckets[sc.GOODPUT_OUTSIDE_PHASES] == pytest.approx(0.5)
    assert sum(buckets.values()) == pytest.approx(3.5)
    warm = step_time.goodput(parts, warmup=True, before_s=0.0, checkpoint_s=2.0)
    assert (warm[sc.GOODPUT_CHECKPOINT], warm[sc.GOODPUT_WARMUP]) == (2.0, 1.5)


def test_a_steady_step_s_goodput_takes_each_part_once() -> None:
    parts = {sc.PART_DATA_WAIT: 0.01, sc.PART_FORWARD: 0.02, sc.PART_BACKWARD: 0.04,
             sc.PART_OPTIMIZER: 0.01, sc.PART_EXPOSED_COMM: 0.005, sc.PART_COMPILE: 0.0,
             sc.PART_DEVICE_WAIT: 0.002, sc.PART_GPU_OUTSIDE_PHASES: 0.006,
             sc.PART_HOST_BUSY: 0.003, sc.PART_NOT_EXPLAINED: 0.001}
    buckets = step_time.goodput(parts, warmup=False, before_s=0.004)
    assert set(buckets) == set(sc.GOODPUT_BUCKETS)
    assert buckets[sc.GOODPUT_PRODUCTIVE] == pytest.approx(0.07)
    # GPU work queued outside the phases (a loss, metrics) is time outside them, not compute
    assert buckets[sc.GOODPUT_OUTSIDE_PHASES] == pytest.approx(0.010)
    assert buckets[sc.GOODPUT_BETWEEN_STEPS] == pytest.approx(0.004)
    assert sum(buckets.values()) == pytest.approx(sum(parts.values()) + 0.004)


def test_a_warm_up_step_is_compile_and_warm_up_and_its_start_up_before_it() -> None:
    parts = dict.fromkeys(sc.PARTS, 0.0)
    parts.update({sc.PART_FORWARD: 1.0, sc.PART_COMPILE: 3.0, sc.PART_DATA_WAIT: 0.5})
    buckets = step_time.goodput(parts, warmup=True, before_s=2.0,
                                before_bucket=sc.GOODPUT_STARTUP)
    assert buckets[sc.GOODPUT_STARTUP] == 2.0
    assert buckets[sc.GOODPUT_COMPILE] == 3.0
    assert buckets[sc.GOODPUT_WARMUP] == 1.5
    assert buckets[sc.GOODPUT_PRODUCTIVE] == 0.0


def test_the_process_start_is_before_now_and_taken_once() -> None:
    import time

    now = time.time_ns()
    step_time._process_start_taken = False
    first = step_time.run_start_ns(now)
    assert first <= now
    assert step_time.run_start_ns(now) == now  # a second instrument() in the process


def test_a_collective_in_flight_during_a_data_wait_leaves_it_a_data_wait() -> None:
    # NCCL: an all-gather issued ahead runs on while the host waits for its next batch; after
    # the step's phases, one in flight while nothing else is known is exposed
    parts = step_time.partition(0, 50, [(sc.PHASE_DATA_WAIT, 0, 20), (sc.PHASE_FORWARD, 20, 40)],
                                exposed=[(10, 30), (42, 48)])
    assert parts[sc.PART_DATA_WAIT] == 20
    assert parts[sc.PART_EXPOSED_COMM] == 10 + 6
    assert parts[sc.PART_FORWARD] == 10
    assert parts[sc.PART_NOT_EXPLAINED] == 4
