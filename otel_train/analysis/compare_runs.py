"""What ``otel-train compare`` compares: each run's report, and its steady steps as per-step
series (the report's step table), which the intervals resample (compare_stats.py).

Every figure with a per-step series is a statistic over the run's steady steps (warm-up and
compile steps left out, as the report does): a step's step time and parts are the mean over
the ranks that recorded it, so that the parts of the mean step add up to the mean step and
a change of the step splits exactly into the changes of its parts. Figures that are run
totals or gauges (peak memory, compile time, goodput) have no series and get no interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_train import semconv as sc
from otel_train.analysis import attribution as st
from otel_train.analysis.build import build_report_and_table
from otel_train.analysis.compare_stats import MIN_STEPS, Quantile, RatioOfSums, Statistic
from otel_train.analysis.otlp import resolve_run_dir
from otel_train.analysis.report_model import Report
from otel_train.analysis.traces import (
    NOT_EXPLAINED,
    PHASES,
    UNTIMED,
    UNTIMED_PARTS,
    StepTable,
)

LOWER, HIGHER = "lower", "higher"
#: parts that are waiting for another rank (or for the device), never the cause of a change
#: of the step in synchronous training: they are named after the parts that caused it
SYMPTOMS = (sc.PART_EXPOSED_COMM, sc.PART_DEVICE_WAIT)


@dataclass(frozen=True)
class Figure:
    """One row of the comparison."""

    key: str  # stable: the JSON's and --gate's name
    label: str
    #: "s", "bytes", "ratio" (shown in %), "count", "rank", or a rate ("samples/s")
    unit: str
    better: str | None  # LOWER, HIGHER, or None (not ranked: the straggler's rank)
    #: the figure has a per-step series, and so an interval
    stepwise: bool = True
    #: no interval: the relative change beyond which it is called better or worse
    tolerance: float | None = None
    #: its change is given relatively (in %); else as the difference only (a figure that
    #: can be near 0 or below, such as a difference of waits)
    relative: bool = True


PART_LABELS = {
    sc.PART_DATA_WAIT: "data wait", sc.PART_FORWARD: "forward", sc.PART_BACKWARD: "backward",
    sc.PART_OPTIMIZER: "optimizer", sc.PART_REGIONS: "your regions",
    sc.PART_EXPOSED_COMM: "exposed comm",
    sc.PART_COMPILE: "compile", sc.PART_DEVICE_WAIT: "blocked on device",
    sc.PART_GPU_OUTSIDE_PHASES: "GPU work outside phases", sc.PART_HOST_BUSY: "host busy",
    sc.PART_NOT_EXPLAINED: "not explained",
}

#: the tolerances of the rows without an interval (docs/compare.md): memory is nearly
#: deterministic for one configuration; compile time varies with the machine's load and
#: caches. A ratio's (overlap, goodput) is in points, not relative: goodput of short runs is
#: mostly their startup, a few % of the wall clock, and 5% of that is a tenth of a point
MEMORY_TOLERANCE = 0.02
OVERLAP_TOLERANCE = 0.05
COMPILE_TOLERANCE = 0.20
GOODPUT_TOLERANCE = 0.02


def in_points(figure: Figure) -> bool:
    """Is the figure's tolerance (and default threshold) a difference in points (a ratio)
    rather than a relative change?"""
    return figure.unit == "ratio"


FIGURES: tuple[Figure, ...] = (
    Figure("samples_per_s", "samples/s (steady)", "samples/s", HIGHER),
    Figure("tokens_per_s", "tokens/s (steady)", "tokens/s", HIGHER),
    Figure("mfu", "MFU (steady)", "ratio", HIGHER),
    Figure("step_time", "step time, mean", "s", LOWER),
    Figure("step_time_median", "step time, median", "s", LOWER),
    Figure("step_time_p95", "step time, p95", "s", LOWER),
    *(Figure(part, f"part: {PART_LABELS[part]}", "s", LOWER) for part in sc.PARTS),
    Figure("peak_memory", "peak memory allocated", "bytes", LOWER, False, MEMORY_TOLERANCE),
    Figure("reserved_memory", "memory reserved", "bytes", LOWER, False, MEMORY_TOLERANCE),
    Figure("comm_overlap", "comm/compute overlap", "ratio", HIGHER, False, OVERLAP_TOLERANCE),
    Figure("compile_time", "compile time", "s", LOWER, False, COMPILE_TOLERANCE),
    Figure("recompiles", "recompiles", "count", LOWER, False, 0.0),
    Figure("goodput", "goodput", "ratio", HIGHER, False, GOODPUT_TOLERANCE),
    Figure("straggler", "straggler", "rank", None, False),
    Figure("straggler_wait", "others' wait for it", "s", LOWER, relative=False),
)
BY_KEY = {figure.key: figure for figure in FIGURES}


@dataclass
class RunData:
    """One run, as compared: its report, the per-step statistics and the run totals."""

    label: str
    #: where it was read: its run directory, or (``--jaeger``) the trace store's URL and the
    #: run id
    path: Path | str
    report: Report
    steady_steps: int
    statistics: dict[str, Statistic] = field(default_factory=dict)
    #: the figures without a series (and the straggler's rank)
    totals: dict[str, float | None] = field(default_factory=dict)
    #: each rank's mean seconds a steady step in each part, and "step"
    rank_parts: dict[int, dict[str, float]] = field(default_factory=dict)
    #: the rank whose wait the ``straggler_wait`` row measures
    waited_for: int | None = None

    @property
    def has_intervals(self) -> bool:
        return self.steady_steps >= MIN_STEPS

    def value(self, key: str) -> float | None:
        if key in self.statistics:
            return self.statistics[key].value()
        return self.totals.get(key)


def load_run(path: Path, label: str) -> RunData:
    """Read one run (a run directory, or a root: its newest run): the report, and its step
    table for the per-step series. Raises OSError when it is not there or holds nothing."""
    run_dir = resolve_run_dir(path)
    # the report's figures, as `otel-train report` computes them, and the step table its
    # pass one made, for the per-step series (the traces are read once)
    report, table = build_report_and_table(run_dir, top=0, timelines=0)
    if not report.ranks and report.trained_steps is None:
        raise FileNotFoundError(f"{run_dir}: its files hold no telemetry that could be read")
    table = table.pad()
    by_rank = st.steady_rows(table, st.rows_by_rank(table), st.warmup_steps(table))
    steps = sorted({table.steps[i] for rows in by_rank.values() for i in rows})
    run = RunData(label, run_dir, report, len(steps))
    run.rank_parts = _rank_parts(table, by_rank)
    run.waited_for = _waited_for(report, run.rank_parts)
    run.statistics = _statistics(table, by_rank, steps, report, run.waited_for)
    run.totals = _totals(report)
    return run


def row_parts(table: StepTable, row: int) -> dict[str, float]:
    """A rank step's parts (semconv.PARTS), from the report's columns."""
    out = {phase: table.phases[phase][row] for phase in PHASES if phase != UNTIMED}
    out.update({part: table.untimed_parts[part][row] for part in UNTIMED_PARTS})
    out[NOT_EXPLAINED] = table.not_explained(row)
    return out


def _rank_parts(table: StepTable, by_rank: dict[int, list[int]]) -> dict[int, dict[str, float]]:
    out = {}
    for rank, rows in by_rank.items():
        means = {part: 0.0 for part in sc.PARTS}
        for row in rows:
            for part, seconds in row_parts(table, row).items():
                means[part] += seconds / len(rows)
        means["step"] = sum(table.durations[i] for i in rows) / len(rows)
        out[rank] = means
    return out


def _waited_for(report: Report, rank_parts: dict[int, dict[str, float]]) -> int | None:
    """The rank the others wait for: the report's straggler, else the rank that waits least
    itself (the one the others' waits are for, straggler or not)."""
    if report.straggler is not None:
        return report.straggler
    if len(rank_parts) < 2:
        return None
    return min(rank_parts, key=lambda r: _wait(rank_parts[r]))


def _wait(parts: dict[str, float]) -> float:
    return sum(parts.get(p, 0.0) for p in SYMPTOMS)


def _statistics(table: StepTable, by_rank: dict[int, list[int]], steps: list[int],
                report: Report, waited_for: int | None) -> dict[str, Statistic]:
    """Each stepwise figure as a statistic of per-step series, one value per steady step."""
    position = {step: j for j, step in enumerate(steps)}
    # per step: each rank's row (steps a rank did not record are missing from its dict)
    cells: list[dict[int, int]] = [{} for _ in steps]
    for rank, rows in by_rank.items():
        for row in rows:
            cells[position[table.steps[row]]][rank] = row
    have = [1.0 if cell else 0.0 for cell in cells]
    step_mean = [_mean([table.durations[r] for r in cell.values()]) for cell in cells]
    steps_known = [v if cell else None for v, cell in zip(step_mean, cells, strict=True)]
    out: dict[str, Statistic] = {
        "step_time": RatioOfSums([(step_mean, have)]),
        # one series for both quantiles: the replicates sort it once (compare_stats.py)
        "step_time_median": Quantile(steps_known, 0.5),
        "step_time_p95": Quantile(steps_known, 0.95),
    }
    parts = [{r: row_parts(table, row) for r, row in cell.items()} for cell in cells]
    for part in sc.PARTS:
        series = [_mean([p[part] for p in step.values()]) for step in parts]
        out[part] = RatioOfSums([(series, have)])
    for key, column, index in (("samples_per_s", table.samples, 0),
                               ("tokens_per_s", table.tokens, 1)):
        pairs = _rate_pairs(table, by_rank, cells, column, index, report)
        if pairs:
            out[key] = RatioOfSums(pairs)
    mfu = _mfu_series(table, cells)
    if mfu is not None:
        out["mfu"] = RatioOfSums([mfu])
    if waited_for is not None and len(by_rank) > 1:
        wait = [_others_wait(step, waited_for) for step in parts]
        out["straggler_wait"] = RatioOfSums([([w or 0.0 for w in wait],
                                              [0.0 if w is None else 1.0 for w in wait])])
    return out


def _mfu_series(table: StepTable, cells: list[dict[int, int]]
                ) -> tuple[list[float], list[float]] | None:
    """The run's MFU as one ratio of sums: per step, the ranks' mean of MFU times step
    seconds over their mean step seconds (a time-weighted mean: the model FLOPs of the steps
    over their time, over the peak). None unless every steady rank step says its MFU (the
    FLOPs a step and the peak known: docs/telemetry.md)."""
    if not cells or any(table.mfu[row] < 0 for cell in cells for row in cell.values()):
        return None
    num, den = [], []
    for cell in cells:
        rows = list(cell.values())
        num.append(_mean([table.mfu[r] * table.durations[r] for r in rows]))
        den.append(_mean([table.durations[r] for r in rows]) if rows else 0.0)
    return num, den


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _others_wait(step: dict[int, dict[str, float]], rank: int) -> float | None:
    """How much longer the other ranks waited in a step than ``rank`` did (exposed
    communication and blocked on the device), mean over them; None where it is missing."""
    others = [_wait(parts) for r, parts in step.items() if r != rank]
    if rank not in step or not others:
        return None
    return _mean(others) - _wait(step[rank])


def _rate_pairs(table: StepTable, by_rank: dict[int, list[int]], cells: list[dict[int, int]],
                column: Sequence[float], index: int, report: Report
                ) -> list[tuple[list[float], list[float]]]:
    """(samples, seconds) per step of each rank: the report's steady throughput is the sum
    over ranks of their ratio. A rank whose spans do not say is given the report's rate as
    samples per step (from its counters), spread evenly over its steps."""
    rates = {row.rank: (row.samples_per_s, row.tokens_per_s)[index] for row in report.rank_rows}
    pairs = []
    for rank, rows in by_rank.items():
        if rates.get(rank) is None:
            continue
        known = all(column[i] >= 0 for i in rows)
        seconds = sum(table.durations[i] for i in rows)
        per_step = (rates[rank] or 0.0) * seconds / len(rows)
        num, den = [], []
        for cell in cells:
            row = cell.get(rank)
            den.append(table.durations[row] if row is not None else 0.0)
            value = column[row] if known else per_step
            num.append(value if row is not None else 0.0)
        pairs.append((num, den))
    return pairs


def _totals(report: Report) -> dict[str, float | None]:
    resources = report.resources

    def known(name: str) -> list[float]:
        return [getattr(r, name) for r in resources if getattr(r, name) is not None]

    peak, reserved, overlap = (known("memory_peak_bytes"), known("memory_reserved_bytes"),
                               known("comm_overlap"))
    return {
        "peak_memory": max(peak) if peak else None,
        "reserved_memory": max(reserved) if reserved else None,
        "comm_overlap": _mean(overlap) if overlap else None,
        "compile_time": report.compile.total_s,
        "recompiles": float(report.compile.recompiles),
        "goodput": report.goodput.ratio,
        "straggler": float(report.straggler) if report.straggler is not None else None,
    }
