"""Intervals for ``otel-train compare``: a circular block bootstrap over each run's steps.

Consecutive steps of a run are not independent (a slow node, a noisy neighbour, the
allocator's state last several steps), so resampling single steps would make the intervals
too narrow. Each run's series of steady steps is resampled in blocks of consecutive steps
(circular: a block may wrap from the last step to the first, so every step is equally
likely to be drawn), block length ``round(n ** (1/3))`` (the order that minimises the
error of a block bootstrap's variance estimate, Hall, Horowitz and Jing 1995). The runs are
resampled independently of each other; the interval of a change is the percentile interval
of the change over the replicates.

Pure Python (numpy is no dependency of otel-train): a statistic is a ratio of sums, read
off precomputed block sums (a replicate costs a few additions per block, not per step), or
a quantile, for which the replicate's steps are gathered and sorted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

#: with fewer steady steps than this a run's intervals are not computed: a handful of steps
#: resampled gives intervals far narrower than the truth (the report's own minimum for
#: ranking steps, analysis/attribution.py MIN_RANKED_STEPS, is the same)
MIN_STEPS = 10
CONFIDENCE = 0.95


@dataclass
class RatioOfSums:
    """Sum over ``pairs`` of sum(numerator) / sum(denominator), each a per-step series (a
    step a series lacks holds 0 in both). A mean over steps is one pair with denominator 1
    on the steps that have the value; a throughput summed over ranks is one pair per rank
    (its samples, its step seconds)."""

    pairs: list[tuple[list[float], list[float]]]

    def value(self) -> float | None:
        total = 0.0
        for num, den in self.pairs:
            d = math.fsum(den)
            if d <= 0:
                return None
            total += math.fsum(num) / d
        return total if self.pairs else None


@dataclass
class Quantile:
    """The ``q`` quantile of a per-step series (None: the step has no value)."""

    values: list[float | None]
    q: float

    def value(self) -> float | None:
        known = sorted(v for v in self.values if v is not None)
        return quantile(known, self.q) if known else None


Statistic = RatioOfSums | Quantile


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (the report's convention)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def block_length(n: int) -> int:
    return max(1, round(n ** (1 / 3)))


def replicates(statistics: dict[str, Statistic], n: int, resamples: int,
               seed: int) -> dict[str, list[float | None]]:
    """Each statistic on ``resamples`` circular-block-bootstrap replicates of the run's
    ``n`` steps (every series has ``n`` values); the same blocks for every statistic of
    one replicate, so that figures that move together (a part and the step) still do."""
    rng = random.Random(seed)
    length = block_length(n)
    blocks = math.ceil(n / length)
    tail = n - (blocks - 1) * length  # the last block is cut so that a replicate has n steps
    draws = [[int(rng.random() * n) for _ in range(blocks)] for _ in range(resamples)]
    out: dict[str, list[float | None]] = {}
    quantiles: dict[int, dict[str, Quantile]] = {}  # by series: each is gathered and sorted once
    for key, statistic in statistics.items():
        if isinstance(statistic, RatioOfSums):
            out[key] = _ratio_replicates(statistic, length, tail, draws)
        else:
            quantiles.setdefault(id(statistic.values), {})[key] = statistic
    for group in quantiles.values():
        out.update(_quantile_replicates(group, length, tail, draws))
    return out


def _block_sums(series: list[float], length: int) -> list[float]:
    """The sum of ``length`` circularly consecutive values from each start."""
    n = len(series)
    cumulative = [0.0]
    for value in series + series[:length]:
        cumulative.append(cumulative[-1] + value)
    return [cumulative[i + length] - cumulative[i] for i in range(n)]


def _ratio_replicates(statistic: RatioOfSums, length: int, tail: int,
                      draws: list[list[int]]) -> list[float | None]:
    sums = [(_block_sums(num, length), _block_sums(num, tail),
             _block_sums(den, length), _block_sums(den, tail))
            for num, den in statistic.pairs]
    out: list[float | None] = []
    for starts in draws:
        *whole, last = starts
        ratios = []
        for num_full, num_tail, den_full, den_tail in sums:
            den = sum(map(den_full.__getitem__, whole)) + den_tail[last]
            if den <= 0:  # a replicate that drew none of a rank's steps: no value
                break
            ratios.append((sum(map(num_full.__getitem__, whole)) + num_tail[last]) / den)
        out.append(sum(ratios) if sums and len(ratios) == len(sums) else None)
    return out


def _quantile_replicates(group: dict[str, Quantile], length: int, tail: int,
                         draws: list[list[int]]) -> dict[str, list[float | None]]:
    """The quantiles ``group`` of one series, on each replicate's steps sorted once."""
    values = next(iter(group.values())).values
    doubled = values + values
    out: dict[str, list[float | None]] = {key: [] for key in group}
    for starts in draws:
        *whole, last = starts
        picked = [v for s in whole for v in doubled[s:s + length] if v is not None]
        picked += [v for v in doubled[last:last + tail] if v is not None]
        picked.sort()
        for key, statistic in group.items():
            out[key].append(quantile(picked, statistic.q) if picked else None)
    return out


@dataclass
class Change:
    """Run B's figure against the baseline A's: the difference, the relative change, and
    their percentile intervals over the replicates (None where not computed)."""

    delta: float
    change: float | None  # B / A - 1; None where A is 0 and B is not
    delta_interval: tuple[float, float] | None = None
    change_interval: tuple[float, float] | None = None

    @property
    def detected(self) -> bool | None:
        """Whether the interval excludes zero; None without an interval."""
        if self.delta_interval is None:
            return None
        low, high = self.delta_interval
        return low > 0 or high < 0


def relative(a: float, b: float) -> float | None:
    if a == 0:
        return 0.0 if b == 0 else None
    return b / a - 1


def change(a: float, b: float, a_reps: list[float | None] | None = None,
           b_reps: list[float | None] | None = None) -> Change:
    """B against A, with the replicates' percentile intervals where both are given."""
    out = Change(b - a, relative(a, b))
    if a_reps is None or b_reps is None:
        return out
    pairs = [(x, y) for x, y in zip(a_reps, b_reps, strict=True)
             if x is not None and y is not None]
    if len(pairs) < 0.9 * len(a_reps):  # a figure missing in many replicates: no interval
        return out
    out.delta_interval = percentile_interval([y - x for x, y in pairs])
    rel = [relative(x, y) for x, y in pairs]
    known = [r for r in rel if r is not None]
    if len(known) == len(rel):
        out.change_interval = percentile_interval(known)
    return out


def percentile_interval(values: list[float], confidence: float = CONFIDENCE
                        ) -> tuple[float, float]:
    ordered = sorted(values)
    tail = (1 - confidence) / 2
    return quantile(ordered, tail), quantile(ordered, 1 - tail)


def wilson_interval(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``hits / n`` (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
