"""A step's duration, for ranking the slowest steps, is its slowest rank's step (issue 53).

The step's root span (``training.step``) is rank 0's step. Where collectives run on the GPU
(NCCL), a rank late on its host delays rank 0 one step later, when rank 0 blocks on its GPU:
rank 0's own step is typical in the step the late rank spent 0.4 s in, and ranked by the
root span alone that step would not be listed (bench/results/nccl-cpu-straggler-8-ranks-h100.md).
"""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis import attribution as st
from otel_train.analysis.traces import StepTable


def _table(durations: dict[tuple[int, int], float]) -> StepTable:
    table = StepTable()
    for (step, rank), seconds in sorted(durations.items()):
        table.add({sc.ATTR_STEP: step, sc.ATTR_RANK: rank, sc.ATTR_STEP_DURATION: seconds},
                  {}, seconds)
    return table.pad()


def test_the_late_ranks_step_is_the_steps_duration() -> None:
    steps = range(20)
    ranks = {(s, r): 0.26 for s in steps for r in (0, 1)}
    ranks[(10, 1)] = 0.66  # rank 1 late on its host in step 10
    ranks[(11, 0)] = 0.66  # rank 0 blocks on its GPU in step 11 for it
    # the root spans: rank 0's steps
    spans = {s: (f"{s:032x}", ranks[(s, 0)]) for s in steps}
    durations = st.step_durations(_table(ranks), spans)
    assert durations[10] == 0.66 and durations[11] == 0.66 and durations[3] == 0.26
    rankable, note = st.rankable_steps(durations, warm=set())
    assert rankable == {10, 11} and note is None


def test_a_root_span_longer_than_every_rank_step_still_counts() -> None:
    ranks = {(s, r): 0.26 for s in range(12) for r in (0, 1)}
    spans = {s: (f"{s:032x}", 0.3 if s == 4 else 0.26) for s in range(12)}
    assert st.step_durations(_table(ranks), spans)[4] == 0.3
