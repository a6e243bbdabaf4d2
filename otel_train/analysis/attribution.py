"""Where the step time went: per-rank breakdowns, the straggler, the slowest steps' causes
and the breakdown over time, all computed from the step table of pass one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

from otel_train import semconv as sc
from otel_train.analysis.device_waits import GpuIntervals
from otel_train.analysis.report_model import DeviceWait, RankBreakdown, SlowStep, TimeBin
from otel_train.analysis.traces import NOT_EXPLAINED, UNTIMED, StepTable

#: a rank this much busier than the median rank is called a straggler
STRAGGLER_RATIO = 1.05
#: ... and so is a rank the others wait for in collectives this share of a step (beyond what
#: it waits itself); the alert's threshold (prometheus/rules.yml) is 0.15 over 5 minutes
STRAGGLER_WAIT_SHARE = 0.05
SIGNAL_COLLECTIVE_WAIT = "collective_wait"
SIGNAL_BUSY_TIME = "busy_time"
#: waiting for other ranks is a symptom, never the cause of a slow step; so is a host
#: blocked on its device, which is followed to what the device waited for
NOT_A_CAUSE = frozenset({sc.PHASE_EXPOSED_COMM, sc.PHASE_DEVICE_WAIT})
DEVICE_WAIT = sc.PHASE_DEVICE_WAIT
#: a rank's CPU throttling explains a slow step when it is at least this share of the step's
#: time above the typical step (and at least ``MIN_EXPLAINING_S``)
THROTTLED_SHARE_OF_EXCESS = 0.25
#: below this, a phase above typical or a throttled time explains nothing (clock noise)
MIN_EXPLAINING_S = 0.001
#: a slow step is explained when its blamed phase is at least this share of the step's time
#: above the typical step (else the phases do not hold where the time went)
EXPLAINED_SHARE_OF_EXCESS = 0.25
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
    """A step's duration: its ``train.step`` span, else its slowest rank's step."""
    durations: dict[int, float] = {}
    for step, seconds in zip(table.steps, table.durations, strict=True):
        durations[step] = max(durations.get(step, 0.0), seconds)
    for step, (_, seconds) in step_spans.items():
        durations[step] = seconds
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


PhaseStarts = Callable[[int, str], dict[int, int]]
CollectiveSeconds = Callable[[int], dict[int, float]]
LateOfStep = Callable[[int], tuple[int, float] | None]


def slow_steps(table: StepTable, durations: dict[int, float], top: int,
               phase_starts: PhaseStarts | None = None,
               collective_s: CollectiveSeconds | None = None,
               world_ranks: set[int] | None = None,
               late_of_step: LateOfStep | None = None,
               collectives: GpuIntervals | None = None,
               candidates: set[int] | None = None) -> list[SlowStep]:
    """The ``top`` slowest steps (of ``candidates``, where given: the others still set the
    typical step), each blamed on the (rank, phase) furthest above typical.

    A host blocked on its device (``device_wait``: on NCCL, where a rank waiting for a late
    peer finds out at its next blocking call, often in the next step) is never the cause:
    where it is the step's largest excess, it is followed (:func:`_follow_device`) to the
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
    """
    blame = _Blame(table, durations, world_ranks, collectives)
    out: list[SlowStep] = []
    listed: set[int] = set()
    for step in sorted(durations, key=lambda s: durations[s], reverse=True):
        if len(out) >= top:
            break
        if candidates is not None and step not in candidates:
            continue
        slow = blame.followed(step)
        if slow is None:
            slow = blame.step(step, phase_starts, collective_s, late_of_step)
        if slow.step not in listed:
            listed.add(slow.step)
            out.append(slow)
    return out


class _Blame:
    """The columns and typical values the blame of every slow step compares against."""

    def __init__(self, table: StepTable, durations: dict[int, float],
                 world_ranks: set[int] | None, collectives: GpuIntervals | None) -> None:
        self.table, self.durations, self.collectives = table.pad(), durations, collectives
        self.world_ranks = world_ranks
        self.rows: dict[int, list[int]] = defaultdict(list)
        for index, step in enumerate(table.steps):
            self.rows[step].append(index)
        blocked = table.untimed_parts[DEVICE_WAIT]
        #: what the blame compares: the phases, untimed time less its blocked part (the
        #: host's own), and the blocked part on its own
        self.cols = {**table.phases, DEVICE_WAIT: blocked}
        if any(blocked):
            self.cols[UNTIMED] = [max(u - b, 0.0) for u, b in zip(table.phases[UNTIMED], blocked)]
        self.typical = {p: median(col) if col else 0.0 for p, col in self.cols.items()}
        self.gpu_typical = {p: median(col) if col else 0.0
                            for p, col in table.gpu_phases.items()}
        self.typical_step = median(durations.values()) if durations else 0.0

    def step(self, step: int, phase_starts: PhaseStarts | None,
             collective_s: CollectiveSeconds | None, late_of_step: LateOfStep | None
             ) -> SlowStep:
        """The step blamed as on gloo: its largest excess, redirected to a late rank."""
        table, rows = self.table, self.rows.get(step, [])
        excess, index, phase = self.worst(rows)
        late = _arrived_late(excess, late_of_step(step)
                             if late_of_step is not None and index is not None else None)
        if late is None:  # no arrival evidence either way
            late = _waited_for(table, index, phase, excess, phase_starts(step, phase)
                               if phase_starts and index is not None else {})
            if late is None and collective_s is not None and index is not None:
                late = _waited_in_collectives(table.ranks[index], excess, collective_s(step))
        if late is not None and index is not None and late != table.ranks[index]:
            late_rows = [i for i in rows if table.ranks[i] == late]
            if late_rows:  # else the late rank's step was not exported: the blame stands
                excess, index, phase = self.worst(late_rows, skip=phase)
        throttled = _throttled_row(table, rows, self.durations[step] - self.typical_step)
        if throttled is not None and throttled != index:
            excess, index, phase = self.worst([throttled])
        return self.explained(step, self.durations[step], index, phase, excess,
                              throttled is not None)

    def followed(self, step: int) -> SlowStep | None:
        """The step's blame where its largest excess is a host blocked on its device:
        followed to what the device waited for (None where it is not)."""
        rows = self.rows.get(step, [])
        excess, index, phase = self.worst(rows, device=True)
        if index is None or phase != DEVICE_WAIT or excess < MIN_EXPLAINING_S:
            return None
        wait = self.device_wait(index)
        target, own_phase = step, None
        if wait.waited_for is not None and wait.late_on != "own":
            target = wait.collective_step if wait.collective_step is not None else step
            late_rows = [i for i in self.rows.get(target, [])
                         if self.table.ranks[i] == wait.waited_for]
            found = self.worst_own(late_rows)
        elif wait.op is None:  # no collective holds it: the device ran this rank's own work
            own_rows = [i for s in (step, step - 1) for i in self.rows.get(s, [])
                        if self.table.ranks[i] == wait.rank]
            found = self.worst_own(own_rows, gpu_only=True)
            if found is not None and found[0] >= EXPLAINED_SHARE_OF_EXCESS * excess:
                wait.waited_for, wait.late_on = wait.rank, "own"
            else:
                found = None
        else:  # a collective with no rank late to it: it was slow itself
            target = wait.collective_step if wait.collective_step is not None else step
            found = None
        if found is None:
            duration = max(self.durations.get(target, self.durations[step]), wait.seconds)
            slow = SlowStep(target, duration, wait.rank, DEVICE_WAIT, wait.seconds,
                            wait.seconds / duration if duration else 0.0, device_wait=wait)
            if wait.op is None:
                slow.unexplained = ("no collective or GPU-timed phase of this rank holds "
                                    "what its GPU was doing")
            return slow
        own_excess, own_index, own_phase, on_gpu = found
        target = self.table.steps[own_index]  # its own work may be of the step before
        # the step's time as its ranks lived it: a GPU-side cause's host step is short, the
        # wait it caused on the hosts is not
        duration = max(self.durations.get(target, 0.0), self.table.durations[own_index],
                       wait.seconds)
        slow = self.explained(target, duration, own_index, own_phase, own_excess, False,
                              on_gpu=on_gpu)
        slow.device_wait = wait
        return slow

    def device_wait(self, index: int) -> DeviceWait:
        """The blocked time of a row, and the collective and rank its device waited for."""
        table = self.table
        rank, step = table.ranks[index], table.steps[index]
        seconds = table.untimed_parts[DEVICE_WAIT][index]
        gaps = [g for g in table.gaps.get(index, ()) if g.kind == sc.EVENT_GAP]
        gap = max(gaps, key=lambda g: g.device_wait_s) if gaps else None
        wait = DeviceWait(rank, step, seconds)
        if gap is None or gap.device_wait_s <= 0:
            return wait
        wait.segment, wait.location = gap.segment, gap.location
        if self.collectives is None:
            return wait
        held = self.collectives.holding(rank, gap.start_ns,
                                        gap.start_ns + int(gap.device_wait_s * 1e9))
        if held is None:
            return wait
        row, overlap_s = held
        (wait.op, wait.seq, wait.collective_step, wait.collective_gpu_s,
         wait.collective_typical_s) = self.collectives.describe(row)
        late = self.collectives.waited_for(row, overlap_s)
        if late is not None:
            wait.waited_for, wait.late_on = late
        return wait

    def worst(self, rows: list[int], skip: str | None = None,
              device: bool = False) -> tuple[float, int | None, str]:
        """(excess, row, phase) of the largest phase excess over typical among ``rows``;
        the blocked time counts only with ``device``."""
        best: tuple[float, int | None, str] = (float("-inf"), None, sc.PHASE_DATA_WAIT)
        for index in rows:
            for phase, col in self.cols.items():
                if phase == skip or (phase in NOT_A_CAUSE
                                     and not (device and phase == DEVICE_WAIT)):
                    continue
                excess = col[index] - self.typical[phase]
                if excess > best[0]:
                    best = (excess, index, phase)
        return best

    def worst_own(self, rows: list[int], gpu_only: bool = False
                  ) -> tuple[float, int, str, bool] | None:
        """(excess, row, phase, on the GPU) of what the rank did itself: its host phases'
        excess (unless ``gpu_only``) or its phases' GPU time above typical."""
        best: tuple[float, int, str, bool] | None = None
        for index in rows:
            candidates = [] if gpu_only else [
                (col[index] - self.typical[p], p, False) for p, col in self.cols.items()
                if p not in NOT_A_CAUSE]
            candidates += [(col[index] - self.gpu_typical[p], p, True)
                           for p, col in self.table.gpu_phases.items() if col[index] > 0]
            for excess, phase, on_gpu in candidates:
                if best is None or excess > best[0]:
                    best = (excess, index, phase, on_gpu)
        return best

    def explained(self, step: int, duration: float, index: int | None, phase: str,
                  excess: float, throttled: bool, on_gpu: bool = False) -> SlowStep:
        table = self.table
        if index is None:
            slow = SlowStep(step, duration, -1, phase, 0.0, 0.0)
        else:
            col = table.gpu_phases[phase] if on_gpu else self.cols[phase]
            seconds = col[index]
            slow = SlowStep(step, duration, table.ranks[index], phase, seconds,
                            seconds / duration if duration else 0.0, on_gpu=on_gpu)
        seen = {table.ranks[i] for i in self.rows.get(step, [])}
        _explain(slow, table, index, excess, duration - self.typical_step,
                 sorted((self.world_ranks or seen) - seen), throttled)
        return slow


def _throttled_row(table: StepTable, rows: list[int], excess_s: float) -> int | None:
    """The row of the step's most throttled rank, if its throttling explains the step."""
    if not rows:
        return None
    row = max(rows, key=lambda i: table.throttled[i])
    seconds = table.throttled[row]
    if seconds >= MIN_EXPLAINING_S and seconds >= THROTTLED_SHARE_OF_EXCESS * max(excess_s, 0.0):
        return row
    return None


def _explain(slow: SlowStep, table: StepTable, index: int | None, excess: float,
             step_excess: float, missing: list[int], throttled: bool) -> None:
    """What the telemetry says about the blamed rank's time, or why it cannot say."""
    if index is not None and throttled:
        slow.throttled_s = table.throttled[index]
    slow.missing = missing
    if missing:
        named = ", ".join(map(str, missing))
        seen = (f" (of the ranks seen, rank {slow.rank} {slow.phase.replace('_', ' ')} "
                f"{slow.phase_s:.3g} s)" if index is not None else "")
        slow.unexplained = f"no telemetry from rank {named} for this step{seen}"
        return
    if throttled:
        return
    if step_excess < MIN_EXPLAINING_S:  # no longer than the typical step: nothing to explain
        if index is None:
            slow.unexplained = "no rank's step of it was recorded"
        return
    if index is None or excess < max(MIN_EXPLAINING_S, EXPLAINED_SHARE_OF_EXCESS * step_excess):
        slow.unexplained = (f"its phases hold {max(excess, 0.0):.3g} s of the "
                            f"{max(step_excess, 0.0):.3g} s it took over the typical step")
        return
    kind = {UNTIMED: sc.EVENT_GAP, sc.PHASE_DATA_WAIT: sc.EVENT_DATA_WAIT}.get(slow.phase)
    if kind is None or slow.on_gpu:
        return
    gaps = [g for g in table.gaps.get(index, ()) if g.kind == kind]
    if not gaps:
        if slow.phase == UNTIMED:
            slow.unexplained = ("untimed time with no stretch of it recorded (gap sampling "
                                "off, or many stretches under 10 ms)")
        return
    gap = max(gaps, key=lambda g: g.host_s)  # the host's own time, not its blocked time
    slow.location, slow.worker = gap.location, gap.worker
    if slow.phase == UNTIMED:
        slow.segment = gap.segment
        if gap.location is None:
            slow.unexplained = ("nothing was sampled there" if not gap.samples else
                                f"{gap.samples} samples there, none in user code")


def _arrived_late(excess: float, late: tuple[int, float] | None) -> int | None:
    """The rank that arrived at the step's collectives late enough to explain at least half
    the blamed excess (maybe the blamed rank itself), else None."""
    if late is None or excess <= 0:
        return None
    rank, lag_s = late
    return rank if lag_s >= 0.5 * excess else None


def _waited_for(table: StepTable, index: int | None, phase: str, excess: float,
                starts: dict[int, int]) -> int | None:
    if index is None or len(starts) < 2 or table.ranks[index] not in starts:
        return None
    rank = table.ranks[index]
    late = max(starts, key=lambda r: starts[r])
    lag_s = (starts[late] - starts[rank]) / 1e9
    return late if late != rank and lag_s >= 0.5 * excess else None


def _waited_in_collectives(rank: int, excess: float, seconds: dict[int, float]) -> int | None:
    if len(seconds) < 2 or rank not in seconds or excess <= 0:
        return None
    least = min(seconds, key=lambda r: seconds[r])
    return least if least != rank and seconds[rank] - seconds[least] >= 0.5 * excess else None


def busy_s(table: StepTable, index: int) -> float:
    """A rank's own work in a step: the step less the time it waited for the others, on
    the host (exposed communication) or blocked on its device (on NCCL, where a rank
    that waits for another does so on the GPU)."""
    return (table.durations[index] - table.phases[sc.PHASE_EXPOSED_COMM][index]
            - table.untimed_parts[DEVICE_WAIT][index])


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
