"""Statistics shared by the overhead benchmarks (CPU, one GPU, several GPUs). Stdlib only.

The benchmarks measure paired rounds: in round ``i`` the bare arm and an instrumented arm run
back to back, so drift of the machine (clocks, neighbours, thermal state) hits both alike.
What is reported from those pairs:

- the ratio of medians (instrumented / bare), the headline number;
- a 95% confidence interval of the median of the per-round ratios, by a paired bootstrap
  that resamples whole rounds (so the pairing, and with it the drift cancellation, is kept);
- the noise of the bare arm (median, p99, max, spread, coefficient of variation), because a
  ratio is only as good as the noise allows.

``verdict`` turns figures and targets into the list of missed targets, and
``environment`` / ``environment_markdown`` say on what the numbers were measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import random
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20240615  # fixed: the same data always gives the same interval


@dataclasses.dataclass(frozen=True)
class Summary:
    """Distribution of one sample (e.g. the bare arm's per-block step times)."""

    n: int
    median: float
    mean: float
    p99: float
    max: float
    min: float
    #: coefficient of variation, stdev / mean (0 for fewer than two values)
    cv: float

    @property
    def spread(self) -> tuple[float, float]:
        return (self.min, self.max)


@dataclasses.dataclass(frozen=True)
class PairedRatio:
    """Instrumented against bare over paired rounds."""

    rounds: int
    #: median(instrumented) / median(bare)
    ratio_of_medians: float
    #: median of the per-round ratios instrumented_i / bare_i
    median_ratio: float
    #: bootstrap confidence interval of ``median_ratio``
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int
    bare: Summary
    instrumented: Summary

    @property
    def half_width(self) -> float:
        """Half the interval's width, as a fraction (0.005 is +-0.5%)."""
        return (self.ci_high - self.ci_low) / 2

    def contains(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high


def _finite(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what}: no values")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{what}: values must be finite")
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    data = sorted(_finite(values, "percentile"))
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q} outside 0..100")
    pos = (len(data) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def summarize(values: Sequence[float]) -> Summary:
    """Median, mean, p99, extremes and coefficient of variation of ``values``."""
    data = _finite(values, "summarize")
    mean = statistics.fmean(data)
    cv = statistics.stdev(data) / abs(mean) if len(data) > 1 and mean != 0 else 0.0
    return Summary(n=len(data), median=statistics.median(data), mean=mean,
                   p99=percentile(data, 99), max=max(data), min=min(data), cv=cv)


def bootstrap_median_ci(values: Sequence[float], resamples: int = RESAMPLES,
                        confidence: float = CONFIDENCE, seed: int = SEED
                        ) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values``."""
    data = _finite(values, "bootstrap")
    if resamples < 1:
        raise ValueError("bootstrap: resamples must be positive")
    if not 0 < confidence < 1:
        raise ValueError("bootstrap: confidence must be between 0 and 1")
    rng = random.Random(seed)
    n = len(data)
    medians = sorted(statistics.median(rng.choices(data, k=n)) for _ in range(resamples))
    alpha = (1 - confidence) / 2
    return percentile(medians, 100 * alpha), percentile(medians, 100 * (1 - alpha))


def paired_ratio(bare: Sequence[float], instrumented: Sequence[float],
                 resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                 seed: int = SEED) -> PairedRatio:
    """Ratio instrumented/bare of paired rounds, with a bootstrap CI over rounds.

    ``bare[i]`` and ``instrumented[i]`` are one round's per-step times (any unit, the same
    for both). Resampling rounds keeps each pair together.
    """
    b = _finite(bare, "bare")
    x = _finite(instrumented, "instrumented")
    if len(b) != len(x):
        raise ValueError(f"paired rounds differ in length: {len(b)} bare, {len(x)} instrumented")
    if any(v <= 0 for v in b):
        raise ValueError("bare: per-step times must be positive")
    ratios = [xi / bi for xi, bi in zip(x, b)]
    low, high = bootstrap_median_ci(ratios, resamples, confidence, seed)
    return PairedRatio(rounds=len(b), ratio_of_medians=statistics.median(x) / statistics.median(b),
                       median_ratio=statistics.median(ratios), ci_low=low, ci_high=high,
                       confidence=confidence, resamples=resamples,
                       bare=summarize(b), instrumented=summarize(x))


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """Instrumented minus bare over paired rounds: median of per-round differences, with a
    bootstrap CI over rounds."""

    rounds: int
    median: float
    ci_low: float
    ci_high: float

    def contains(self, value: float) -> bool:
        return self.ci_low <= value <= self.ci_high


def paired_difference(bare: Sequence[float], instrumented: Sequence[float],
                      resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                      seed: int = SEED) -> PairedDifference:
    """Per-round ``instrumented_i - bare_i`` (e.g. CPU per step), median and bootstrap CI."""
    b = _finite(bare, "bare")
    x = _finite(instrumented, "instrumented")
    if len(b) != len(x):
        raise ValueError(f"paired rounds differ in length: {len(b)} bare, {len(x)} instrumented")
    diffs = [xi - bi for xi, bi in zip(x, b)]
    low, high = bootstrap_median_ci(diffs, resamples, confidence, seed)
    return PairedDifference(len(diffs), statistics.median(diffs), low, high)


def rounds_for_half_width(ratio: PairedRatio, half_width: float = 0.005) -> int | None:
    """Rounds a CI of ``half_width`` would need at the noise seen (width ~ 1/sqrt(rounds))."""
    if ratio.half_width <= 0:
        return ratio.rounds
    if half_width <= 0:
        return None
    return math.ceil(ratio.rounds * (ratio.half_width / half_width) ** 2)


def length_difference(short: float, long: float, short_steps: int, long_steps: int) -> float:
    """Per-step cost from runs of two lengths: start and stop costs cancel in the difference."""
    if long_steps <= short_steps:
        raise ValueError("the long run must have more steps than the short one")
    return (long - short) / (long_steps - short_steps)


# --- verdict ------------------------------------------------------------------------------

_OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


@dataclasses.dataclass(frozen=True)
class Target:
    """``figures[key] <op> limit`` must hold."""

    key: str
    op: str
    limit: float
    label: str = ""
    unit: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"target {self.key}: op must be one of {', '.join(_OPS)}")

    def describe(self) -> str:
        return f"{self.label or self.key} {self.op} {self.limit:g}{(' ' + self.unit) if self.unit else ''}"


def verdict(figures: Mapping[str, float | None], targets: Sequence[Target]) -> list[str]:
    """One line per missed target; a figure that is absent or not finite counts as missed
    (a benchmark that measured nothing must not pass)."""
    missed = []
    for t in targets:
        value = figures.get(t.key)
        if value is None or not math.isfinite(value):
            missed.append(f"{t.describe()}: not measured")
        elif not _OPS[t.op](value, t.limit):
            missed.append(f"{t.describe()}: measured {value:.4g}")
    return missed


# --- where it was measured ----------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _git_commit() -> str:
    """The checkout's commit, and whether otel_train/ differs from it (read-only git);
    ``BENCH_COMMIT`` names it where the copy's git metadata is stale (the device machine's
    copy of the working tree reports an old HEAD)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        # --no-optional-locks: never take index.lock (a commit may be running beside us)
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", repo, "diff", "--quiet",
                                "HEAD", "--", "otel_train"], capture_output=True,
                               timeout=10).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return head + (" + uncommitted otel_train changes" if dirty else "")


def environment() -> dict[str, Any]:
    """Machine, versions and date, for the record beside every result."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "opentelemetry-sdk": _version("opentelemetry-sdk"),
        "otel-train": _version("otel-train"),
        "commit": _git_commit(),
        # a busy machine (other jobs) is the first suspect when figures move between runs
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def machine_cpu_s() -> dict[str, float]:
    """Machine-wide CPU seconds so far from /proc/stat: busy (all but idle and iowait) and
    steal (taken by the hypervisor). Empty where /proc/stat is absent."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    return {"busy": (sum(fields[:8]) - idle - steal) / tick, "steal": steal / tick}


def other_load(before: Mapping[str, float], after: Mapping[str, float], ours_s: float,
               wall_s: float) -> dict[str, float]:
    """Cores' worth of CPU that others (not ``ours_s``) used, and steal, over ``wall_s``:
    a busy neighbour is the first suspect when figures move between runs."""
    if not before or not after or wall_s <= 0:
        return {}
    busy = after["busy"] - before["busy"]
    return {"other_cores": round(max(0.0, busy - ours_s) / wall_s, 3),
            "steal_cores": round((after["steal"] - before["steal"]) / wall_s, 3)}


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are ``str()``'d and pipes escaped."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def environment_markdown(env: Mapping[str, Any] | None = None) -> str:
    """The ``environment()`` record as a two-column markdown table."""
    env = environment() if env is None else env
    return markdown_table(["", "value"], [(k, v) for k, v in env.items()])
