"""What a report says, as plain data: the terminal, HTML and JSON renderers all read this."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankBreakdown:
    rank: int
    steps: int
    median_s: float
    p95_s: float
    max_s: float
    phase_mean_s: dict[str, float]  # mean seconds per step in each phase
    quantiles_s: list[float]  # min, p25, p50, p75, p95, max of step time


@dataclass
class SlowStep:
    step: int
    duration_s: float
    rank: int
    phase: str
    phase_s: float
    share: float  # phase_s / duration_s
    #: untimed time: the stretch it lay in ("between forward and backward")
    segment: str | None = None
    #: the user code the training thread was sampled in most there ("heavy() at train.py:87")
    location: str | None = None
    #: a data wait: the DataLoader worker the rank waited for
    worker: int | None = None
    #: seconds the rank's cgroup was CPU-throttled in the step, where that is the cause
    throttled_s: float | None = None
    #: why the telemetry does not explain the step, where it does not
    unexplained: str | None = None

    @property
    def cause(self) -> str:
        if self.unexplained and not self.segment:  # no phase named by default
            return f"step {self.step}: not explained: {self.unexplained}"
        where = self.segment or self.phase.replace("_", " ")
        text = (f"step {self.step}: rank {self.rank} {where} {self.phase_s:.3g} s, "
                f"{self.share:.0%} of step")
        if self.segment:
            text = (f"step {self.step}: rank {self.rank} {self.phase_s:.3g} s {self.segment}, "
                    f"{self.share:.0%} of step")
        if self.throttled_s is not None:
            text = (f"step {self.step}: rank {self.rank} CPU-throttled {self.throttled_s:.3g} s "
                    f"by its cgroup's CPU quota ({where} {self.phase_s:.3g} s, "
                    f"{self.share:.0%} of step)")
        if self.location:
            text += f", in {self.location}"
        if self.worker is not None:
            text += f", waiting for DataLoader worker {self.worker}"
        if self.unexplained:
            text += f"; not explained: {self.unexplained}"
        return text


@dataclass
class Bar:
    """One span on the timeline, seconds from its step's start."""

    rank: int
    kind: str  # a phase name, or "collective"
    label: str
    start_s: float
    end_s: float


@dataclass
class StepTimeline:
    step: int
    duration_s: float
    bars: list[Bar]


@dataclass
class TimeBin:
    first_step: int
    last_step: int
    step_mean_s: float
    phase_mean_s: dict[str, float]


@dataclass
class CollectiveRow:
    op: str
    count: int
    total_s: float
    bytes: int
    mean_bus_bw_gbps: float | None
    max_bus_bw_gbps: float | None


@dataclass
class CompileSummary:
    compilations: int = 0
    total_s: float = 0.0
    graph_breaks: int = 0
    recompiles: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class RankResources:
    rank: int
    memory_peak_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    comm_overlap: float | None = None
    cpu_throttled_s: float | None = None


@dataclass
class Report:
    run_id: str
    world_size: int
    ranks: list[int]
    sampled_steps: int
    trained_steps: int | None
    wall_s: float
    phases: list[str]
    rank_rows: list[RankBreakdown]
    straggler: int | None
    #: how the straggler was named: "collective_wait" (the others wait for it in collectives)
    #: or "busy_time" (its own work, step less exposed communication); None when not named
    straggler_signal: str | None
    #: the named (else the busiest) rank's busy time over the median rank's
    straggler_busy_ratio: float | None
    straggler_slowest_share: float | None
    #: the share of a step the run's median rank waits in collectives beyond what the rank
    #: the others wait for most waits (``straggler_wait_rank``); None without collectives
    straggler_wait_share: float | None
    straggler_wait_rank: int | None
    #: the named rank's mean CPU-throttled seconds a step, where its cgroup's quota is a
    #: cause (signal "cpu_throttled" when nothing else named it)
    straggler_throttled_s: float | None
    slow_steps: list[SlowStep]
    timelines: list[StepTimeline]
    over_time: list[TimeBin]
    collectives: list[CollectiveRow]
    compile: CompileSummary
    resources: list[RankResources]
    samples_per_s: float | None
    tokens_per_s: float | None
    dropped: dict[str, float]

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the world (every rank records its world size) that sent no telemetry:
        a rank whose instrumentation failed to start trains on, and must not vanish."""
        return sorted(set(range(self.world_size)) - set(self.ranks))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["missing_ranks"] = self.missing_ranks
        for row, slow in zip(data["slow_steps"], self.slow_steps, strict=True):
            row["cause"] = slow.cause
        return data
