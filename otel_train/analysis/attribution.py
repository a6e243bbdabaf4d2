"""Where the step time went: per-rank breakdowns, the straggler, the slowest steps' causes
and the breakdown over time, all computed from the step table of pass one. The causes of a
slow step are the ``causes`` package's, one module each, asked in its registry's order."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from otel_train import semconv as sc
from otel_train.analysis import causes
from otel_train.analysis.causes.case import (
    MIN_EXPLAINING_S,
    Blame,
    CollectiveSeconds,
    Evidence,
    LateOfStep,
    PhaseStarts,
    blocked_s,
)
from otel_train.analysis.causes.waited_in_collectives import (  # noqa: F401  (tests name it)
    waited_in_collectives as _waited_in_collectives,
)
from otel_train.analysis.device_waits import GpuIntervals
from otel_train.analysis.report_model import RankBreakdown, SlowStep, TimeBin
from otel_train.analysis.traces import NOT_EXPLAINED, StepTable

#: a rank this much busier than the median rank is called a straggler
STRAGGLER_RATIO = 1.05
#: ... and so is a rank the others wait for in collectives this share of a step (beyond what
#: it waits itself); the alert's threshold (prometheus/rules.yml) is 0.15 over 5 minutes
STRAGGLER_WAIT_SHARE = 0.05
SIGNAL_COLLECTIVE_WAIT = "collective_wait"
SIGNAL_BUSY_TIME = "busy_time"
SIGNAL_CPU_THROTTLED = "cpu_throttled"
#: a step is listed among the slowest only when it took at least this share of the typical
#: (median steady) step longer than it, and ``MIN_EXPLAINING_S``: below that it is jitter,
#: and a run without such a step lists none (a 5-step run does not list its every step)
SLOW_STEP_SHARE = 0.2
#: with fewer steady steps than this the typical step is a guess: when no step stands out
#: the report says there were too few to rank
MIN_RANKED_STEPS = 10


def quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rows_by_rank(table: StepTable) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = defaultdict(list)
    for index, rank in enumerate(table.ranks):
        rows[rank].append(index)
    return dict(sorted(rows.items()))


def warmup_steps(table: StepTable) -> set[int]:
    """The run's warm-up and compile steps: its first step (DataLoader workers starting,
    communicators made, the first compile) and every step in which a rank compiled. They are
    shown apart: a mean that carries a 3 s first step says nothing of the steady state."""
    if not len(table):
        return set()
    compiled = table.phases[sc.PHASE_COMPILE]
    return {min(table.steps)} | {table.steps[i] for i in range(len(table)) if compiled[i] > 0}


def steady_rows(table: StepTable, by_rank: dict[int, list[int]], warm: set[int]
                ) -> dict[int, list[int]]:
    """Each rank's rows outside ``warm`` (all of them where that leaves none)."""
    out = {}
    for rank, rows in by_rank.items():
        steady = [i for i in rows if table.steps[i] not in warm]
        out[rank] = steady or rows
    return out


def rank_breakdowns(table: StepTable, by_rank: dict[int, list[int]]) -> list[RankBreakdown]:
    table.pad()
    out = []
    for rank, rows in by_rank.items():
        ordered = sorted(table.durations[i] for i in rows)
        out.append(RankBreakdown(
            rank=rank, steps=len(rows), median_s=quantile(ordered, 0.5),
            p95_s=quantile(ordered, 0.95), max_s=ordered[-1],
            phase_mean_s={p: sum(col[i] for i in rows) / len(rows)
                          for p, col in table.phases.items()},
            quantiles_s=[quantile(ordered, q) for q in (0, 0.25, 0.5, 0.75, 0.95, 1)],
            mean_s=sum(table.durations[i] for i in rows) / len(rows),
            untimed_split_s={
                **{p: sum(col[i] for i in rows) / len(rows)
                   for p, col in table.untimed_parts.items()},
                NOT_EXPLAINED: sum(table.not_explained(i) for i in rows) / len(rows)},
        ))
    return out


def step_durations(table: StepTable, step_spans: dict[int, tuple[str, float]]) -> dict[int, float]:
    """A step's duration: its slowest rank's step, or its ``training.step`` span where that
    is longer. The span is rank 0's step: where collectives run on the GPU (NCCL), rank 0's
    host does not wait in the step another rank is late in, but in the next one, when it
    blocks on its GPU; ranked by rank 0's time alone, the late rank's own step would look
    typical."""
    durations: dict[int, float] = {}
    for step, seconds in zip(table.steps, table.durations, strict=True):
        durations[step] = max(durations.get(step, 0.0), seconds)
    for step, (_, seconds) in step_spans.items():
        durations[step] = max(durations.get(step, 0.0), seconds)
    return durations


def rankable_steps(durations: dict[int, float], warm: set[int]) -> tuple[set[int], str | None]:
    """The steps worth listing among the slowest: those at least ``SLOW_STEP_SHARE`` of the
    typical (median steady) step longer than it; and, where there are none, why (None
    where there are)."""
    steady = [d for s, d in durations.items() if s not in warm] or list(durations.values())
    if not steady:
        return set(), None
    typical = median(steady)
    margin = max(MIN_EXPLAINING_S, SLOW_STEP_SHARE * typical)
    out = {s for s, d in durations.items() if d - typical >= margin}
    if out:
        return out, None
    n = sum(1 for s in durations if s not in warm)
    if n < MIN_RANKED_STEPS:
        return out, f"too few steps to rank ({n} steady)"
    return out, (f"no step took {SLOW_STEP_SHARE:.0%} longer than the typical step "
                 f"({typical * 1e3:.3g} ms, {n} steady steps)")


def steady_throughput(table: StepTable, by_rank: dict[int, list[int]],
                      per_step: dict[int, tuple[float, float]] | None = None
                      ) -> tuple[dict[int, tuple[float | None, float | None]], str | None]:
    """Each rank's steady-state (samples/s, tokens/s): the samples (tokens) of its rows
    ``by_rank`` (the steady steps) over their time; and where the samples came from.

    A row's samples are its rank_step span's (``training.samples``); where the spans do not
    say, ``per_step[rank]`` (samples, tokens) a step, from the counters over the trained
    steps. A rank with neither has None."""
    table.pad()
    out: dict[int, tuple[float | None, float | None]] = {}
    sources: set[str] = set()
    for rank, rows in by_rank.items():
        seconds = sum(table.durations[i] for i in rows)
        rates: list[float | None] = []
        for column, k in ((table.samples, 0), (table.tokens, 1)):
            known = [column[i] for i in rows if column[i] >= 0]
            fallback = (per_step or {}).get(rank)
            if len(known) == len(rows) and any(known):
                total, source = sum(known), "spans"
            elif fallback is not None and fallback[k] > 0:
                total, source = fallback[k] * len(rows), "counters"
            else:
                rates.append(None)
                continue
            rates.append(total / seconds if seconds > 0 and total > 0 else None)
            if rates[-1] is not None:
                sources.add(source)
        out[rank] = (rates[0], rates[1])
    source = "spans" if sources == {"spans"} else ("counters" if sources else None)
    if len(sources) > 1:
        source = "spans and counters"
    return out, source


def slow_steps(table: StepTable, durations: dict[int, float], top: int,
               phase_starts: PhaseStarts | None = None,
               collective_s: CollectiveSeconds | None = None,
               world_ranks: set[int] | None = None,
               late_of_step: LateOfStep | None = None,
               collectives: GpuIntervals | None = None,
               candidates: set[int] | None = None) -> list[SlowStep]:
    """The ``top`` slowest steps (of ``candidates``, where given: the others still set the
    typical step), each blamed on the (rank, phase) furthest above typical, or what the first
    cause of the registry that claims it names (``causes.CAUSES``, in the order below).

    A host blocked on its device (``device_wait``: on NCCL, where a rank waiting for a late
    peer finds out at its next blocking call, often in the next step) is never the cause:
    where it is the step's largest excess, it is followed (``causes/device_wait.py``) to the
    collective the device waited in (``collectives``), the step that issued it and the rank
    it waited for, which is blamed for what it did in that step; the blocked rank and the
    line where its host waited go with it (``SlowStep.device_wait``). Steps that several
    such waits lead to are listed once.

    ``late_of_step(step)`` gives the rank that arrived late at the step's collectives and by
    how many seconds (arrivals.py), or None where they were not matched. It is the direct
    evidence, so it is asked first: when another rank than the blamed one arrived late by at
    least half the blamed excess, the blamed rank was waiting for it, and the late rank is
    blamed instead, for what it did before it got there; when the blamed rank itself did,
    the blame stands. Only where it says neither are the two inferences below tried.

    ``phase_starts(step, phase)`` gives each rank's start of that phase (epoch ns) from the
    step's spans: when the blamed rank started the phase well before another rank, it was
    waiting inside it (a collective with no exposed_comm recorded), so the late rank is blamed
    instead, for what it did before it got there. ``collective_s(step)`` gives each rank's
    seconds in the step's collectives: on NCCL a rank that waits for a late one does so inside
    its collectives' GPU time (its forward or backward runs long on the GPU while its start
    times look normal), so when the blamed rank spent at least half its excess more in
    collectives than the rank that spent least, that rank is the late one and is blamed.

    A rank CPU-throttled by its cgroup for a good part of the step's excess over the typical
    step is the cause, named as such. Untimed time (less what the host spent blocked on the
    device) is named by the stretch it lay in and the user code sampled there
    (``training.gap`` events), a data wait by its sampled line or worker. Where the telemetry
    cannot explain the step (a rank of ``world_ranks`` sent nothing for it, no phase stands
    out, untimed time with nothing sampled) the step says so (``SlowStep.unexplained``)
    instead of naming a phase by default.

    A step whose blocked hosts are followed to another step (the one before, mostly) is
    also explained by what its ranks did in it, the blocked time left aside, and listed for
    that too where it holds a cause of its own: on NCCL a rank late in steps 10 and 11
    makes the others block at the top of step 11 for step 10, and that wait must not hide
    the late rank's own step 11.
    """
    blame = Blame(table, durations, world_ranks, collectives)
    evidence = Evidence(phase_starts, collective_s, late_of_step)
    out: list[SlowStep] = []
    listed: set[int] = set()
    for step in sorted(durations, key=lambda s: durations[s], reverse=True):
        if len(out) >= top:
            break
        if candidates is not None and step not in candidates:
            continue
        slow = causes.explain(blame, step, evidence)  # the registry's first claim
        if slow.step not in listed:
            listed.add(slow.step)
            out.append(slow)
        if slow.step != step and step not in listed and len(out) < top:
            own = causes.explain(blame, step, evidence, skip=_FOLLOWED)
            if own.step == step and own.unexplained is None and own.rank >= 0:
                listed.add(step)
                out.append(own)
    return out


#: the cause that follows a blocked host to another step: left aside for a step's own cause
_FOLLOWED = frozenset({"device_wait"})


def busy_s(table: StepTable, index: int) -> float:
    """A rank's own work in a step: the step less the time it waited for the others, on
    the host (exposed communication) or blocked on its device (on NCCL, where a rank
    that waits for another does so on the GPU)."""
    return (table.durations[index] - table.phases[sc.PHASE_EXPOSED_COMM][index]
            - blocked_s(table, index))


def collective_wait_shares(collective_s: dict[int, float], steps: dict[int, int],
                           step_s: dict[int, float]) -> dict[int, float]:
    """Per rank: how much of a step the run's median rank spends in collectives beyond what
    this rank spends, as a share of the median step time (the time the others lose waiting for
    it; prometheus/rules.yml's ``training_run_rank:collective_wait_caused:share_of_step5m``
    over the whole run).

    In synchronous training every rank's step lasts as long as the slowest rank's, so step
    times cannot single out a straggler; the waiting does: the ranks that arrive early wait
    inside each collective (on NCCL their kernels spin on the GPU until the late rank joins),
    the late rank hardly waits. Arguments are per-rank totals: seconds in collectives, steps,
    seconds of steps (the run's metrics, which cover every step, not just sampled ones).
    """
    ranks = [r for r in collective_s if steps.get(r)]
    if len(ranks) < 2:
        return {}
    per_step = {r: collective_s[r] / steps[r] for r in ranks}
    typical_step = median(step_s[r] / steps[r] for r in ranks if r in step_s) if any(
        r in step_s for r in ranks) else 0.0
    if typical_step <= 0:
        return {}
    typical = median(per_step.values())
    return {r: (typical - c) / typical_step for r, c in per_step.items()}


def straggler(table: StepTable, by_rank: dict[int, list[int]],
              wait_shares: dict[int, float] | None = None) -> Straggler:
    """The rank the others wait for, by the collective wait it causes (``wait_shares``, at
    least ``STRAGGLER_WAIT_SHARE``), else by its own work (step less exposed communication,
    ``STRAGGLER_RATIO`` over the median rank); rank None when neither names one."""
    out = Straggler()
    if len(by_rank) < 2:
        return out
    table.pad()
    if wait_shares:
        out.wait_rank = max(wait_shares, key=lambda r: wait_shares[r])
        out.wait_share = wait_shares[out.wait_rank]
    mean_busy = {r: sum(busy_s(table, i) for i in rows) / len(rows) for r, rows in by_rank.items()}
    slowest_of_step: dict[int, tuple[float, int]] = {}
    for index, step in enumerate(table.steps):
        busy = busy_s(table, index)
        if busy > slowest_of_step.get(step, (-1.0, -1))[0]:
            slowest_of_step[step] = (busy, table.ranks[index])
    busiest = max(mean_busy, key=lambda r: mean_busy[r])
    typical = median(mean_busy.values())
    throttled = {r: sum(table.throttled[i] for i in rows) / len(rows)
                 for r, rows in by_rank.items()}
    typical_step = median(sum(table.durations[i] for i in rows) / len(rows)
                          for rows in by_rank.values())

    def busy_ratio(rank: int) -> float | None:  # None for a rank with no sampled step
        return mean_busy[rank] / typical if typical and rank in mean_busy else None

    if out.wait_share is not None and out.wait_share >= STRAGGLER_WAIT_SHARE:
        out.rank, out.signal = out.wait_rank, SIGNAL_COLLECTIVE_WAIT
    elif (busy_ratio(busiest) or 0.0) >= STRAGGLER_RATIO:
        out.rank, out.signal = busiest, SIGNAL_BUSY_TIME
    most = max(throttled, key=lambda r: throttled[r])
    if out.rank is None and typical_step and throttled[most] >= (
            STRAGGLER_WAIT_SHARE * typical_step):
        out.rank, out.signal = most, SIGNAL_CPU_THROTTLED
    named = out.rank if out.rank is not None else busiest
    if typical_step and throttled.get(named, 0.0) >= STRAGGLER_WAIT_SHARE * typical_step:
        out.throttled_s = throttled[named]  # the named rank's throttling is (part of) why
    out.busy_ratio = busy_ratio(named)
    out.slowest_share = (sum(1 for _, r in slowest_of_step.values() if r == named)
                         / len(slowest_of_step)) if slowest_of_step else None
    return out


@dataclass
class Straggler:
    rank: int | None = None
    signal: str | None = None
    #: the named rank's (else the busiest rank's) mean busy time over the median rank's
    busy_ratio: float | None = None
    #: share of sampled steps in which that rank was the busiest
    slowest_share: float | None = None
    #: the rank the others wait for most in collectives, and that wait as a share of a step
    wait_rank: int | None = None
    wait_share: float | None = None
    #: the named rank's mean CPU-throttled seconds a step, where they are a cause
    throttled_s: float | None = None


def over_time(table: StepTable, bins: int = 40) -> list[TimeBin]:
    """Mean step and phase times per bin of consecutive sampled steps."""
    if not len(table):
        return []
    first, last = min(table.steps), max(table.steps)
    width = max(1, -(-(last - first + 1) // bins))
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0] * (len(table.phases) + 2))
    names = list(table.phases)
    for step, duration, *phase_s in zip(table.steps, table.durations, *table.phases.values(),
                                        strict=True):
        acc = sums[(step - first) // width]
        acc[0] += 1
        acc[1] += duration
        for k, seconds in enumerate(phase_s, 2):
            acc[k] += seconds
    return [TimeBin(first + b * width, min(last, first + (b + 1) * width - 1), acc[1] / acc[0],
                    {p: acc[k + 2] / acc[0] for k, p in enumerate(names)})
            for b, acc in sorted(sums.items())]
