"""Pure arithmetic of collectives: bus bandwidth, and the interval sets behind exposed
communication and overlap (definitions in docs/collectives.md)."""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]

#: nccl-tests bus-bandwidth factor for a group of n: busbw = algbw * factor
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


def bus_bandwidth_gbps(op: str, nbytes: int, seconds: float, group_size: int) -> float | None:
    """nccl-tests bus bandwidth in GB/s (1e9 bytes/s): ``algbw = bytes / time`` times the
    op's factor. None where it means nothing (no bytes, no time, unknown op)."""
    factor = _BUS_FACTOR.get(op)
    if factor is None or nbytes <= 0 or seconds <= 0 or group_size < 1:
        return None
    return nbytes / seconds / 1e9 * factor(group_size)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points (empty ones dropped). Runs on
    the emitter thread for every step's collectives: plain locals, no per-item lists."""
    out: list[Interval] = []
    cur_start = cur_end = 0
    have = False
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if have and start <= cur_end:
            if end > cur_end:
                cur_end = end
        else:
            if have:
                out.append((cur_start, cur_end))
            cur_start, cur_end, have = start, end, True
    if have:
        out.append((cur_start, cur_end))
    return out


def clip(intervals: list[Interval], lo: int, hi: int) -> list[Interval]:
    return [(s if s > lo else lo, e if e < hi else hi) for s, e in intervals
            if e > lo and s < hi and e > s]


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Points of ``a`` not in ``b`` (both sorted and disjoint, as :func:`union` gives)."""
    out: list[Interval] = []
    append = out.append
    j, nb = 0, len(b)
    for start, end in a:
        cur = start
        while j < nb and b[j][1] <= cur:
            j += 1
        k = j
        while k < nb:
            b_start, b_end = b[k]
            if b_start >= end:
                break
            if b_start > cur:
                append((cur, b_start))
            if b_end > cur:
                cur = b_end
            k += 1
        if cur < end:
            append((cur, end))
    return out


def measure(intervals: list[Interval]) -> int:
    total = 0
    for s, e in intervals:  # a loop: sum() over a generator costs twice as much
        total += e - s
    return total


def exposed_and_total(comm: list[Interval], blocking: list[Interval],
                      compute: list[Interval], lo: int, hi: int) -> tuple[int, int]:
    """(exposed, total) communication ns in the step window [lo, hi).

    ``comm``: every collective in flight; ``blocking``: the synchronous ones (the issuing
    thread is blocked in them, so computes nothing); ``compute``: the forward, backward and
    optimizer phases. Exposed = in flight while nothing computes."""
    exposed, total = exposed_intervals(comm, blocking, compute, lo, hi)
    return measure(exposed), total


def exposed_intervals(comm: list[Interval], blocking: list[Interval],
                      compute: list[Interval], lo: int, hi: int
                      ) -> tuple[list[Interval], int]:
    """The exposed communication of :func:`exposed_and_total` as intervals, with the total
    communication ns: where in the step it lay (the step's parts need it, step_time.py)."""
    in_flight = clip(union(comm), lo, hi)
    if not in_flight:
        return [], 0
    busy = union(compute)
    if blocking:  # none on the NCCL plugin's route: subtracting nothing leaves ``busy``
        busy = subtract(busy, union(blocking))
    return subtract(in_flight, busy), measure(in_flight)
