"""What a rank's GPU was doing while its host was blocked on it, and whom it waited for.

On NCCL the training thread enqueues a collective and runs on. A rank that waits for a late
peer waits on the GPU, and its host finds out at the next call that blocks on the device (a
pageable copy, ``.item()``, a tensor the collective still writes), often in the next step.
``sources/gaps.py`` records how long each stretch outside the phases was blocked on the
device (``training.gap.device_wait_s``). Here that wait is followed to the collective whose
GPU interval holds it on the same rank (the NCCL plugin's or the flight recorder's GPU time,
ending at its completion on the host's clock), and from the collective to the rank it waited
for: the one that issued it last on the host (:mod:`arrivals`), or, where every host issued
it in time, the one whose GPU reached it last, which is the one with the shortest GPU time
in it (the others' kernels spun until it joined).
"""

from __future__ import annotations

from bisect import bisect_left

from otel_train.analysis.arrivals import ArrivalRows, Matching

#: a collective holds a blocked stretch when its GPU interval covers this share of it; the
#: rank it waited for is named when it made the others wait this share of the overlap
HOLD_SHARE = 0.5
LATE_SHARE = 0.5
HOST, GPU = "host", "gpu"


class GpuIntervals:
    """Each rank's collectives by their GPU intervals, and the cross-rank matching."""

    def __init__(self, rows: ArrivalRows, matching: Matching) -> None:
        self.rows, self.matching = rows, matching
        by_rank: dict[int, list[int]] = {}
        for index, rank in enumerate(rows.ranks):
            by_rank.setdefault(rank, []).append(index)
        self._order = {r: sorted(ix, key=lambda i: rows.ends[i]) for r, ix in by_rank.items()}
        self._ends = {r: [rows.ends[i] for i in ix] for r, ix in self._order.items()}
        self._longest = {r: max((rows.ends[i] - self.start_ns(i) for i in ix), default=0)
                         for r, ix in self._order.items()}
        self._typical_s: dict[tuple[int, int], float | None] = {}

    def start_ns(self, row: int) -> int:
        """The collective's GPU start: its end less its GPU time, else its host issue."""
        gpu_s = self.rows.gpu_s[row]
        if gpu_s < 0:
            return self.rows.starts[row]
        return self.rows.ends[row] - int(gpu_s * 1e9)

    def holding(self, rank: int, start_ns: int, end_ns: int) -> tuple[int, float] | None:
        """(row, overlap in s) of the rank's collective whose GPU interval covers most of
        [start, end], if it covers at least ``HOLD_SHARE`` of it."""
        order, ends = self._order.get(rank), self._ends.get(rank)
        if not order or end_ns <= start_ns:
            return None
        best, best_ns = None, 0
        limit = end_ns + self._longest[rank]
        for k in range(bisect_left(ends, start_ns), len(order)):
            if ends[k] > limit:
                break
            row = order[k]
            overlap = min(ends[k], end_ns) - max(self.start_ns(row), start_ns)
            if overlap > best_ns:
                best, best_ns = row, overlap
        if best is None or best_ns < HOLD_SHARE * (end_ns - start_ns):
            return None
        return best, best_ns / 1e9

    def waited_for(self, row: int, wait_s: float) -> tuple[int, str] | None:
        """(rank, HOST or GPU) the collective of ``row`` waited for on that row's rank, where
        its lateness explains at least ``LATE_SHARE`` of ``wait_s``."""
        rows = self.rows
        key = (rows.keys[row], rows.seqs[row])
        mine = rows.ranks[row]
        late = self.matching.late_of.get(key)
        if late is not None and late.rank != mine and late.lag_s >= LATE_SHARE * wait_s:
            return late.rank, HOST
        gpu = {rows.ranks[i]: rows.gpu_s[i] for i in self.matching.members.get(key, ())
               if rows.gpu_s[i] >= 0}
        if len(gpu) < 2 or mine not in gpu:
            return None
        last = min(gpu, key=lambda r: (gpu[r], r))
        if last != mine and gpu[mine] - gpu[last] >= LATE_SHARE * wait_s:
            return last, GPU
        return None

    def describe(self, row: int) -> tuple[str, int, int, float | None, float | None]:
        """(op, seq, step, GPU seconds, the op's median GPU seconds on that rank) of a
        row's collective."""
        rows = self.rows
        gpu_s = rows.gpu_s[row]
        return (rows.names[rows.ops[row]], rows.seqs[row], rows.steps[row],
                gpu_s if gpu_s >= 0 else None, self._typical(rows.ranks[row], rows.ops[row]))

    def _typical(self, rank: int, op: int) -> float | None:
        key = (rank, op)
        if key not in self._typical_s:
            rows = self.rows
            times = sorted(rows.gpu_s[i] for i in self._order.get(rank, ())
                           if rows.ops[i] == op and rows.gpu_s[i] >= 0)
            self._typical_s[key] = times[len(times) // 2] if times else None
        return self._typical_s[key]
