"""Who arrived late at each collective: the same collective matched across ranks by its
process group and sequence number, and the ranks' arrival times compared.

In synchronous training every rank leaves a collective at about the same time, so what the
early ranks wait inside it is the late rank's lateness. The collective-wait signal
(steps.py) infers the late rank from that wait; this sees it: a ``training.collective`` span
starts when its rank issued the collective on the host (the Python wrapper or process-group
hook on gloo, the NCCL flight recorder's ``time_created``, the NCCL plugin's kernel launch),
so the rank whose span of a (group, seq) starts last arrived last, ``lag`` after the latest
of the others. Sequence numbers count per process group on each rank (and NCCL's per
communicator), so in SPMD code one (source, group, seq) is one collective on every rank; a
(group, seq) whose ops or steps differ across ranks is counted as mismatched, not compared.

Pass one keeps seven integers a collective span (:class:`ArrivalRows`); the matching runs
once over them, after every file is read, in an order that does not depend on the files'.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.report_model import (
    LATE_STEP_SHARE,
    Arrivals,
    LateArrival,
    RankLateness,
    StepLateness,
)

#: the attributes pass one reads for this, besides the op
ARRIVAL_ATTRIBUTES = frozenset({sc.ATTR_COLLECTIVE_SEQ, sc.ATTR_COLLECTIVE_GROUP,
                                sc.ATTR_COLLECTIVE_SOURCE, sc.ATTR_COLLECTIVE_GROUP_SIZE,
                                sc.ATTR_COLLECTIVE_COUNT, sc.ATTR_RANK, sc.ATTR_STEP,
                                sc.ATTR_COLLECTIVE_GPU_DURATION})
#: point-to-point operations: one rank sends, another receives, nobody waits for all
POINT_TO_POINT = frozenset({"send", "recv"})


@dataclass
class ArrivalRows:
    """Columns of one row per collective span that stands for one collective."""

    keys: array = field(default_factory=lambda: array("l"))  # name id of "run/source/group"
    seqs: array = field(default_factory=lambda: array("q"))
    ranks: array = field(default_factory=lambda: array("l"))
    steps: array = field(default_factory=lambda: array("q"))
    starts: array = field(default_factory=lambda: array("q"))  # epoch ns: the arrival
    ops: array = field(default_factory=lambda: array("l"))  # name id
    sizes: array = field(default_factory=lambda: array("l"))  # group size, 0 if unknown
    #: epoch ns: when it ended (on NCCL, its GPU end on the host's clock)
    ends: array = field(default_factory=lambda: array("q"))
    #: its GPU seconds, -1 where not measured (gloo)
    gpu_s: array = field(default_factory=lambda: array("d"))
    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    #: collectives inside summary spans: not comparable
    summarised: int = 0

    def add(self, values: dict[str, Any], resource: dict[str, Any], op: str,
            start_ns: int, end_ns: int = 0) -> None:
        """One ``training.collective`` span (``values``: its decoded attributes, those of
        ``ARRIVAL_ATTRIBUTES`` at least)."""
        get = values.get
        count = get(sc.ATTR_COLLECTIVE_COUNT)
        if count is not None:
            self.summarised += int(count)
            return
        seq = get(sc.ATTR_COLLECTIVE_SEQ)
        if seq is None or op in POINT_TO_POINT:
            return
        # a collector's files may hold several runs, whose sequence numbers all start at 1
        key = (f"{resource.get(sc.RES_RUN_ID, '')}/"
               f"{get(sc.ATTR_COLLECTIVE_SOURCE, '')}/"
               f"{get(sc.ATTR_COLLECTIVE_GROUP, '')}")
        self.keys.append(self._id(key))
        self.seqs.append(int(seq))
        self.ranks.append(int(get(sc.ATTR_RANK, resource.get(sc.RES_RANK, 0))))
        self.steps.append(int(get(sc.ATTR_STEP, -1)))
        self.starts.append(start_ns)
        self.ops.append(self._id(op))
        self.sizes.append(int(get(sc.ATTR_COLLECTIVE_GROUP_SIZE, 0)))
        self.ends.append(max(end_ns, start_ns))
        self.gpu_s.append(float(get(sc.ATTR_COLLECTIVE_GPU_DURATION, -1.0)))

    def _id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found

    def merge(self, other: ArrivalRows) -> None:
        remap = [self._id(name) for name in other.names]
        self.keys.extend(remap[k] for k in other.keys)
        self.ops.extend(remap[o] for o in other.ops)
        for mine, theirs in ((self.seqs, other.seqs), (self.ranks, other.ranks),
                             (self.steps, other.steps), (self.starts, other.starts),
                             (self.sizes, other.sizes), (self.ends, other.ends),
                             (self.gpu_s, other.gpu_s)):
            mine.extend(theirs)
        self.summarised += other.summarised

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass
class Matching:
    """Every compared collective's late arrival, in (group, seq) order, and what was not."""

    late: list[LateArrival] = field(default_factory=list)
    unmatched: int = 0
    mismatched: int = 0
    sources: set[str] = field(default_factory=set)
    #: (key id, seq) -> the rows of that collective, one per rank
    members: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    #: (key id, seq) -> its late arrival, where compared
    late_of: dict[tuple[int, int], LateArrival] = field(default_factory=dict)


def match(rows: ArrivalRows) -> Matching:
    """Group the rows by (source, group, seq) and compare each collective's arrivals."""
    members: dict[tuple[int, int], list[int]] = {}
    for index, key in enumerate(zip(rows.keys, rows.seqs, strict=True)):
        members.setdefault(key, []).append(index)
    out = Matching(members=members)
    for key, seq in sorted(members):
        found = _late_arrival(rows, members[(key, seq)])
        if found == "alone":  # a group of one rank (a world of one): nothing to compare
            continue
        if found == "unmatched":
            out.unmatched += 1
        elif found == "mismatched":
            out.mismatched += 1
        else:
            rank, lag_ns, step, op = found
            _, source, group = rows.names[key].split("/", 2)
            out.late.append(LateArrival(step, rank, lag_ns / 1e9, rows.names[op], seq, group))
            out.late_of[(key, seq)] = out.late[-1]
            out.sources.add(source)
    return out


def _late_arrival(rows: ArrivalRows, index: list[int]) -> tuple[int, int, int, int] | str:
    """(rank, lag in ns, step, op id) of the last of one collective's arrivals."""
    size = max(rows.sizes[i] for i in index)
    if size == 1 and len(index) == 1:
        return "alone"
    if len(index) < max(2, size):
        return "unmatched"
    ranks = {rows.ranks[i] for i in index}
    if (len(ranks) != len(index) or len({rows.ops[i] for i in index}) > 1
            or len({rows.steps[i] for i in index}) > 1):
        return "mismatched"
    order = sorted(index, key=lambda i: (rows.starts[i], rows.ranks[i]))
    last, runner_up = order[-1], order[-2]
    return (rows.ranks[last], rows.starts[last] - rows.starts[runner_up], rows.steps[last],
            rows.ops[last])


def step_lateness(matching: Matching) -> dict[int, StepLateness]:
    """Per sampled step, the rank its collectives waited for: each rank's lateness summed
    over the step's collectives, the largest less the next largest (what the others lost to
    it, with the jitter that makes every rank a little late somewhere cancelled out)."""
    totals: dict[int, dict[int, float]] = {}
    worst: dict[tuple[int, int], LateArrival] = {}
    for late in matching.late:
        if late.step < 0 or late.lag_s <= 0:
            continue
        per_rank = totals.setdefault(late.step, {})
        per_rank[late.rank] = per_rank.get(late.rank, 0.0) + late.lag_s
        known = worst.get((late.step, late.rank))
        if known is None or late.lag_s > known.lag_s:
            worst[(late.step, late.rank)] = late
    out = {}
    for step, per_rank in sorted(totals.items()):
        ranked = sorted(per_rank, key=lambda r: (-per_rank[r], r))
        margin = per_rank[ranked[0]] - (per_rank[ranked[1]] if len(ranked) > 1 else 0.0)
        if margin > 0:
            out[step] = StepLateness(step, ranked[0], margin, worst[(step, ranked[0])])
    return out


def late_of_step(lateness: dict[int, StepLateness], durations: dict[int, float]
                 ) -> Callable[[int], tuple[int, float] | None]:
    """``steps.slow_steps``' ``late_of_step``: (late rank, seconds) of a step, or None where
    no rank arrived ``LATE_STEP_SHARE`` of the step after the others (jitter is no evidence:
    the blame is then inferred as it was without arrivals)."""
    def late(step: int) -> tuple[int, float] | None:
        found = lateness.get(step)
        if found is None or found.lag_s < LATE_STEP_SHARE * durations.get(step, 0.0):
            return None
        return found.rank, found.lag_s

    return late


def summarise(rows: ArrivalRows, matching: Matching, lateness: dict[int, StepLateness],
              durations: dict[int, float]) -> Arrivals:
    """The run's verdict: the rank whose late arrivals cost the others the most waiting
    (its lateness summed over the sampled steps it was the late rank of), the steps it was
    late in by at least ``LATE_STEP_SHARE`` of the step and its median lateness there; and
    the worst collective, all past the run's first step. Summed, not counted: in a run of short steps jitter makes every
    rank the late one of some steps, and a rank that made the others wait 0.3 s twice is
    the one to name, not one late by 8 ms three times."""
    out = Arrivals(matched=len(matching.late), unmatched=matching.unmatched,
                   mismatched=matching.mismatched, summarised=rows.summarised,
                   steps=len({late.step for late in matching.late if late.step >= 0}),
                   sources=sorted(matching.sources))
    if not matching.late:
        return out
    # The run's first step is left out of its verdict: ranks start training at different
    # moments, and the first collectives carry the set-up (NCCL makes its communicators at
    # the first one), which says nothing about who holds the others back in training.
    first = min((late.step for late in matching.late if late.step >= 0), default=-1)
    trained = [late for late in matching.late if late.step != first] or matching.late
    out.worst = max(trained, key=lambda a: (a.lag_s, -a.step, -a.seq))
    total: dict[int, float] = {}
    late_lags: dict[int, list[float]] = {}
    for step, late in sorted(lateness.items()):
        if step == first and len(lateness) > 1:
            continue
        total[late.rank] = total.get(late.rank, 0.0) + late.lag_s
        if late.lag_s >= LATE_STEP_SHARE * durations.get(step, 0.0):
            late_lags.setdefault(late.rank, []).append(late.lag_s)
    worst_of: dict[int, float] = {}
    for late in trained:
        worst_of[late.rank] = max(worst_of.get(late.rank, 0.0), late.lag_s)
    out.ranks = [RankLateness(rank, len(late_lags.get(rank, ())),
                              median(late_lags[rank]) if rank in late_lags else None,
                              worst_of[rank], total.get(rank, 0.0))
                 for rank in sorted(worst_of)]
    if total:
        out.late_rank = max(total, key=lambda r: (total[r], -r))
        out.late_steps = len(late_lags.get(out.late_rank, ()))
        out.median_lag_s = (median(late_lags[out.late_rank]) if out.late_steps else None)
    return out
