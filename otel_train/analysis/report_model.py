"""What a report says, as plain data: the terminal, HTML and JSON renderers all read this."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from otel_train import semconv as sc


@dataclass
class RankBreakdown:
    rank: int
    steps: int
    median_s: float
    p95_s: float
    max_s: float
    phase_mean_s: dict[str, float]  # mean seconds per step in each phase
    quantiles_s: list[float]  # min, p25, p50, p75, p95, max of step time
    #: the mean untimed seconds a step, split: the host blocked on the device
    #: (``device_wait``), busy on the host (``host_busy``), and ``not_explained``
    untimed_split_s: dict[str, float] = field(default_factory=dict)
    #: the mean step: the sum of ``phase_mean_s`` (the parts are disjoint and add up to the
    #: step), which is the mean of its steps' durations
    mean_s: float = 0.0
    #: this rank's steady-state throughput: the samples (tokens) of its steady steps over
    #: their time; None where not recorded
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


#: a step waited for its late rank when it arrived this share of the step's duration after
#: the others (the slow-step blame takes it as evidence, the run's verdict counts the step,
#: a slow step's cause says it); below it is jitter: on the 2-core gloo demo, ranks took
#: turns being late by up to 17% of a 50 ms step, while a rank sleeping before its forward
#: is late by 70-85% of its step
LATE_STEP_SHARE = 0.25
#: a collective no rank was late to was slow itself when its GPU time was this many times
#: its op's median on that rank
SLOW_COLLECTIVE_RATIO = 2.0


@dataclass
class LateArrival:
    """A collective that one rank reached after every other rank of its process group."""

    step: int
    rank: int
    lag_s: float  # after the latest of the other ranks
    op: str
    seq: int
    group: str

    @property
    def at(self) -> str:
        return f"{_lag(self.lag_s)} at {self.op} #{self.seq}"

    @property
    def sentence(self) -> str:
        return f"rank {self.rank} arrived {_lag(self.lag_s)} after the others at {self.op} #{self.seq}"


def _lag(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


@dataclass
class StepLateness:
    """The rank a step's collectives waited for: how much later it arrived at them, summed
    over the step's matched collectives, than the next latest rank (arrivals.py)."""

    step: int
    rank: int
    lag_s: float
    #: the step's collective at which this rank was the latest
    worst: LateArrival


@dataclass
class RankLateness:
    rank: int
    #: sampled steps in which this rank arrived late, by at least ``arrivals.LATE_STEP_SHARE``
    #: of the step, and its median lateness in them
    late_steps: int
    median_lag_s: float | None
    #: its latest arrival at one collective, after the latest of the others
    worst_lag_s: float
    #: its lateness summed over the sampled steps it was the late rank of: what the others
    #: lost waiting for it
    total_lag_s: float


@dataclass
class Arrivals:
    """The same collective matched across ranks by (process group, sequence number), and the
    ranks' arrival times (the collective spans' starts) compared."""

    #: collectives seen on every rank of their group, and compared
    matched: int = 0
    #: seen on fewer ranks than their group has (a rank's spans missing)
    unmatched: int = 0
    #: one (group, seq) with different ops or steps across ranks, or a rank twice: the
    #: sequence numbers did not line up (ranks instrumented differently), not compared
    mismatched: int = 0
    #: collectives inside summary spans (``training.collective.count``): one span stands for several,
    #: so their arrivals are not known
    summarised: int = 0
    #: sampled steps with at least one matched collective
    steps: int = 0
    #: the rank whose late arrivals cost the others the most waiting (``total_lag_s``), the
    #: sampled steps it was late in (as ``RankLateness.late_steps``) and its median lateness
    #: in them (None when there are none)
    late_rank: int | None = None
    late_steps: int = 0
    median_lag_s: float | None = None
    #: the latest arrival at one collective in the run
    worst: LateArrival | None = None
    ranks: list[RankLateness] = field(default_factory=list)
    #: the ``training.collective.source`` of the matched spans (what their start times are)
    sources: list[str] = field(default_factory=list)


@dataclass
class DeviceWait:
    """A host blocked on its device, and what the device was waiting for: where a slow
    step's time surfaced on a rank that did not cause it (sources/gaps.py records the
    blocked time, analysis/device_waits.py follows it)."""

    rank: int
    step: int  # the step in which the host blocked
    seconds: float
    #: the stretch it lay in and the blocking call sampled there ("<module>() at train.py:107")
    segment: str | None = None
    location: str | None = None
    #: the collective the device waited in, where one holds the wait
    op: str | None = None
    seq: int | None = None
    collective_step: int | None = None
    collective_gpu_s: float | None = None
    #: the median GPU time of that op on that rank over the run
    collective_typical_s: float | None = None
    #: the rank it waited for, and how that rank was late: "host" (issued the collective
    #: last), "gpu" (its GPU reached it last) or "own" (the device ran this rank's own work)
    waited_for: int | None = None
    late_on: str | None = None

    @property
    def sentence(self) -> str:
        at = f" at {self.location.rsplit(' at ', 1)[-1]}" if self.location else ""
        text = f"rank {self.rank} blocked {_lag(self.seconds)}{at} in step {self.step}"
        if self.late_on == "own":
            return text + " waiting for its own GPU work"
        if self.op is None:
            return text + " waiting for the GPU"
        verb = "waited on" if self.waited_for is not None else "was running"
        text += f" waiting for the GPU, which {verb} {self.op} #{self.seq}"
        if self.collective_step is not None and self.collective_step != self.step:
            text += f" (step {self.collective_step})"
        if self.waited_for is not None:
            text += f" for rank {self.waited_for}"
            if self.late_on == "gpu":
                text += " (its GPU reached it last)"
        elif self.collective_gpu_s is not None:
            text += f", {_lag(self.collective_gpu_s)} on the GPU"
            typical = self.collective_typical_s
            if typical and self.collective_gpu_s >= SLOW_COLLECTIVE_RATIO * typical:
                text += (f" against a typical {_lag(typical)}, with no rank late to it: the "
                         "collective itself was slow")
            else:
                text += " (as usual), with no rank late to it"
        return text


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
    #: the rank that arrived late at the step's collectives, where they were matched
    late_arrival: StepLateness | None = None
    #: the phase's time is its GPU time (a GPU-side straggler: extra kernels on one rank)
    on_gpu: bool = False
    #: where the step's time surfaced on another rank's host (or this rank's, blocked on
    #: its device), and what its device waited for
    device_wait: DeviceWait | None = None
    #: ranks of the world that sent no telemetry for the step
    missing: list[int] = field(default_factory=list)
    #: a warm-up or compile step (the run's first, or one with compile time)
    warmup: bool = False

    @property
    def cause(self) -> str:
        wait = self.device_wait
        if self.phase == "device_wait" and wait is not None:
            text = f"step {self.step}: {wait.sentence}, {self.share:.0%} of step"
            return text + (f"; not explained: {self.unexplained}" if self.unexplained else "")
        if self.warmup:
            return dataclasses.replace(self, warmup=False).cause + " (warm-up)"
        if self.unexplained and not self.segment:  # no phase named by default
            text = f"step {self.step}: not explained: {self.unexplained}"
            return text + (f"; {wait.sentence}" if wait is not None else "")
        where = self.segment or self.phase.replace("_", " ")
        if self.on_gpu:
            where += " on the GPU"
        text = (f"step {self.step}: rank {self.rank} {where} {self.phase_s:.3g} s, "
                f"{self.share:.0%} of step")
        if self.segment:
            text = (f"step {self.step}: rank {self.rank} {self.phase_s:.3g} s {self.segment}, "
                    f"{self.share:.0%} of step")
        if self.phase == sc.PART_REGIONS and self.segment:  # a region the user named
            text = (f"step {self.step}: rank {self.rank} region {self.segment} "
                    f"{self.phase_s:.3g} s, {self.share:.0%} of step")
        if self.phase == sc.PHASE_GPU_OUTSIDE_PHASES:  # the rank's GPU work no phase holds
            text = (f"step {self.step}: rank {self.rank} {self.phase_s:.3g} s of GPU work "
                    f"queued {self.segment or 'outside the phases'}, {self.share:.0%} of step")
            if self.location:
                text += f", issued from {self.location}"
        if self.throttled_s is not None:
            text = (f"step {self.step}: rank {self.rank} CPU-throttled {self.throttled_s:.3g} s "
                    f"by its cgroup's CPU quota ({where} {self.phase_s:.3g} s, "
                    f"{self.share:.0%} of step)")
        if self.location and self.phase != sc.PHASE_GPU_OUTSIDE_PHASES:
            text += f", in {self.location}"
        if self.worker is not None:
            text += f", waiting for DataLoader worker {self.worker}"
        late = self.late_arrival
        if (late is not None and late.rank == self.rank and late.worst is not None
                and late.lag_s >= LATE_STEP_SHARE * self.duration_s):
            text += f"; {late.worst.sentence}"
        if wait is not None and wait.rank != self.rank:
            text += f"; {wait.sentence}"
        elif wait is not None:
            text += f"; it {wait.sentence.split(' ', 2)[2]}"
        if self.unexplained:
            text += f"; not explained: {self.unexplained}"
        return text


@dataclass
class RankFate:
    """A rank whose run did not end well (analysis/fates.py)."""

    rank: int
    #: "crashed" (the first to fail: raised), "vanished" (killed: no run span, nothing after
    #: its last step), "failed_after" (raised after another rank failed, e.g. its collective
    #: lost the peer), "stopped" (stopped by a signal, the launcher's, after one failed)
    fate: str
    #: the step it failed or was stopped in (for "vanished": the step after its last one)
    step: int
    #: the exception's type and scrubbed message, or the signal
    error: str | None = None
    #: its last step with telemetry
    last_step: int = -1
    #: the rank whose failure this one followed
    after: int | None = None

    @property
    def sentence(self) -> str:
        error = f": {self.error}" if self.error else ""
        if self.fate == "crashed":
            return f"rank {self.rank} crashed in step {self.step}{error}"
        if self.fate == "vanished" and self.last_step < 0:
            return (f"rank {self.rank} vanished: no telemetry from it at all while the others "
                    "failed; killed before its first export, or its instrumentation did not "
                    "start (see its stderr)")
        if self.fate == "vanished":
            after = f" (after rank {self.after} failed)" if self.after is not None else ""
            return (f"rank {self.rank} vanished: no telemetry after step {self.last_step}"
                    f"{after}; killed (SIGKILL, out of memory) or its host lost")
        if self.fate == "failed_after":
            return (f"rank {self.rank} failed in step {self.step} after rank {self.after} "
                    f"did{error}")
        return (f"rank {self.rank} stopped in step {self.step} by the launcher after rank "
                f"{self.after} failed{f' ({self.error})' if self.error else ''}")


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
    #: where the step has more ranks than a timeline shows (32): how many it has (the bars
    #: are then of the ranks its cause names, its slowest and fastest, and a spread)
    ranks_of: int | None = None


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


#: the goodput buckets the report adds to the SDK's (semconv.GOODPUT_BUCKETS), so that
#: they add up to the run's wall clock: the mean rank's time after its last step's end to
#: its run span's end (final export, teardown), and the rest of the wall clock (ranks that
#: started or ended at other moments than the first and the last)
GOODPUT_AFTER_LAST_STEP = "after_last_step"
GOODPUT_OTHER = "other"
#: that rest where a rank was restarted under the same run id (several training.run spans): the
#: time between one attempt's last step and the next one's start, mostly
GOODPUT_RESTART = "restart"


@dataclass
class GoodputRank:
    rank: int
    #: its seconds in each bucket (semconv.GOODPUT_BUCKETS), adding up to ``total_s``
    buckets_s: dict[str, float]
    #: its start to its last step's end
    total_s: float
    #: its seconds CPU-throttled by its cgroup (overlaps the buckets); None where not measured
    cpu_throttled_s: float | None = None


@dataclass
class Goodput:
    """The run's wall clock split into productive time and named losses (analysis/goodput.py,
    docs/report.md "Goodput")."""

    #: where the buckets come from: "metrics" (the ranks' ``training.goodput.time``),
    #: "traces" (derived from run and step spans, every step sampled), or None: not recorded
    source: str | None = None
    #: the run's wall clock: the first rank's start to the last rank's end
    wall_s: float = 0.0
    #: mean seconds over the ranks in each bucket, plus ``after_last_step`` and ``other``;
    #: they add up to ``wall_s``
    buckets_s: dict[str, float] = field(default_factory=dict)
    productive_s: float = 0.0
    #: productive / wall clock; None when not recorded
    ratio: float | None = None
    ranks: list[GoodputRank] = field(default_factory=list)
    #: the mean rank's seconds CPU-throttled by its cgroup: a cause beside the buckets, not a
    #: bucket (the throttled time lies inside them); None where not measured
    cpu_throttled_s: float | None = None
    #: why it is not recorded, or what to know about it
    note: str | None = None


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
    dropped: dict[str, float]
    arrivals: Arrivals = field(default_factory=Arrivals)
    #: ranks whose run did not end well, the first to fail first (analysis/fates.py)
    rank_fates: list[RankFate] = field(default_factory=list)
    #: the warm-up and compile steps (the first step, any step with compile time), each
    #: with its cause, shown apart; the per-rank rows and the straggler are the steady
    #: state's (``steady_steps`` sampled steps); ``slow_steps`` ranks every step, a
    #: warm-up one flagged (``warmup``)
    warmup_steps: list[SlowStep] = field(default_factory=list)
    steady_steps: int = 0
    #: ranks of the world none of whose spans could be read although their traces file
    #: holds something (damaged or truncated: the readers name the file and line)
    unreadable_ranks: list[int] = field(default_factory=list)
    #: steady-state throughput, as users quote it: each rank's samples (tokens) of its
    #: steady steps over their time, summed over the ranks (data parallel: each rank trains
    #: its own samples); warm-up and compile steps left out. None where not recorded
    steady_samples_per_s: float | None = None
    steady_tokens_per_s: float | None = None
    #: where the samples per step came from: "spans" (``training.samples`` on the rank steps)
    #: or "counters" (the samples counter over the trained steps)
    throughput_source: str | None = None
    #: the whole run's: the samples (tokens) counters over the wall clock, warm-up included
    run_samples_per_s: float | None = None
    run_tokens_per_s: float | None = None
    goodput: Goodput = field(default_factory=Goodput)
    #: why ``slow_steps`` lists fewer steps than asked, or none ("too few steps to rank (5
    #: steady)"): only steps meaningfully above the typical step are listed
    slow_steps_note: str | None = None

    @property
    def samples_per_s(self) -> float | None:
        """Deprecated alias (not in the JSON): the steady-state rate, else the whole run's."""
        return self.steady_samples_per_s or self.run_samples_per_s

    @property
    def tokens_per_s(self) -> float | None:
        """Deprecated alias (not in the JSON): the steady-state rate, else the whole run's."""
        return self.steady_tokens_per_s or self.run_tokens_per_s

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the world (every rank records its world size) that sent no telemetry:
        a rank whose instrumentation failed to start trains on, and must not vanish. A
        rank whose file is there but unreadable is not one of them."""
        return sorted(set(range(self.world_size)) - set(self.ranks)
                      - set(self.unreadable_ranks))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["missing_ranks"] = self.missing_ranks
        for key in ("slow_steps", "warmup_steps"):
            for row, slow in zip(data[key], getattr(self, key), strict=True):
                row["cause"] = slow.cause
        return data
