"""``otel-train compare A B [C ...]``: which configuration is faster, by how much, and where
the time went (docs/compare.md).

The first run is the baseline. Each figure (compare_runs.FIGURES) of each other run is
given as a change against it, in %, with a 95% interval from a circular block bootstrap over
each run's steady steps (compare_stats.py), and a verdict: better, worse, or no detectable
difference (the interval includes zero). Figures without a per-step series get no interval:
a verdict only beyond their stated tolerance. One sentence per run says where the step time
moved; ``--gate`` makes it a CI check (exit 1 when a figure is worse beyond its threshold
and its interval excludes zero).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.compare_runs import (
    BY_KEY,
    FIGURES,
    HIGHER,
    LOWER,
    PART_LABELS,
    SYMPTOMS,
    Figure,
    RunData,
    in_points,
    load_run,
)
from otel_train.analysis.compare_stats import (
    CONFIDENCE,
    MIN_STEPS,
    Change,
    block_length,
    change,
    replicates,
)

SCHEMA = "otel-train.compare/1"
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no detectable difference"
NO_INTERVAL = "no interval"
NOT_RECORDED = "not recorded"
TOO_FEW_STEPS = "too few steps"
#: the straggler's rank is shown, not ranked
SAME, CHANGED = "same", "changed"
#: the gates that apply unless ``--gate KEY=off``: step time and throughput, 5% (the false
#: alarms this leaves on same-configuration runs: bench/results/compare-false-alarms.md)
DEFAULT_GATES: dict[str, Threshold] = {}  # filled below the class
RESAMPLES = 2000
#: the sentence names the parts (largest move first) until they explain this share of the
#: step's change, at most ``MOST_PARTS`` causes; a part moving less than ``MIN_PART_SHARE``
#: of it is not named
EXPLAINED_SHARE = 0.8
MOST_PARTS = 3
MIN_PART_SHARE = 0.1
#: a part moved on the ranks where it moved at least this share of its largest move on one
#: rank; on all of them it moved "on every rank"
RANK_SHARE = 0.5


@dataclass(frozen=True)
class Threshold:
    """How much worse a figure may get before its gate fails: relatively (0.05: 5%), by
    ``amount`` seconds (``absolute``: figures with no relative change, or where 0 is near),
    or by a share of the baseline's mean step (``of_step``: a part of the step, ``+5%step``:
    a part of 2% of the step that grows by half moves the step by 1%)."""

    amount: float
    absolute: bool = False
    of_step: bool = False

    def text(self, figure: Figure) -> str:
        sign = "+" if figure.better == LOWER else "-"
        if self.absolute and in_points(figure):
            return f"{sign}{self.amount * 100:g} pts"
        if self.absolute:
            return f"{sign}{_signed_s(self.amount)[1:]}"
        return f"{sign}{self.amount * 100:g}%{'step' if self.of_step else ''}"


DEFAULT_GATES.update(step_time=Threshold(0.05), samples_per_s=Threshold(0.05))
#: every ranked row's threshold by default (``compare(gates=DEFAULT_THRESHOLDS)``, or each as
#: ``--gate``): 5% for the rates and step times, 5% of the baseline's step for a part of the
#: step, the tolerance of a row without an interval; what the false-alarm benchmark holds
#: every row to (bench/results/compare-false-alarms.md)
DEFAULT_THRESHOLDS: dict[str, Threshold] = {
    figure.key: (Threshold(0.05, of_step=True) if figure.key in PART_LABELS
                 else Threshold(0.05) if figure.stepwise and figure.relative
                 else Threshold(figure.tolerance or 0.0, absolute=in_points(figure)))
    for figure in FIGURES if figure.better is not None and figure.relative}


@dataclass
class Cell:
    """One run's figure against the baseline's."""

    run: str
    verdict: str
    #: the figure's difference (in its unit) and relative change (0.05: +5%); None where
    #: either run did not record it (a relative change also where the baseline is 0)
    delta: float | None = None
    change: float | None = None
    #: the 95% intervals of both; None without one
    delta_interval: tuple[float, float] | None = None
    change_interval: tuple[float, float] | None = None


@dataclass
class Row:
    figure: Figure
    values: list[float | None]
    cells: list[Cell]  # one per run after the baseline


@dataclass
class PartMove:
    """A part of the step named in the sentence: its mean change a step, where it moved."""

    part: str
    delta_s: float
    ranks: list[int]
    every_rank: bool


@dataclass
class Where:
    """Where a run's step time moved against the baseline's."""

    run: str
    sentence: str
    parts: list[PartMove] = field(default_factory=list)
    #: said where every compute part moved by about the same factor (:func:`_alike`)
    alike: str | None = None


@dataclass
class GateFailure:
    run: str
    key: str
    #: the threshold as given (``+5%``, ``+2 ms``)
    threshold: str
    change: float | None
    change_interval: tuple[float, float] | None
    delta: float | None
    delta_interval: tuple[float, float] | None


@dataclass
class Comparison:
    runs: list[RunData]
    rows: list[Row]
    where: list[Where]
    gates: dict[str, Threshold]
    failures: list[GateFailure]
    resamples: int
    seed: int

    @property
    def baseline(self) -> RunData:
        return self.runs[0]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (docs/compare.md "JSON")."""
        return {
            "schema": SCHEMA,
            "method": {"interval": "circular block bootstrap, percentile",
                       "confidence": CONFIDENCE, "resamples": self.resamples,
                       "seed": self.seed, "min_steps": MIN_STEPS},
            "runs": [{"label": r.label, "path": str(r.path), "run_id": r.report.run_id,
                      "baseline": i == 0, "ranks": len(r.report.ranks),
                      "steady_steps": r.steady_steps,
                      "warmup_steps": sorted(s.step for s in r.report.warmup_steps),
                      "block_length": block_length(r.steady_steps) if r.has_intervals
                      else None, "straggler_waited_for": r.waited_for}
                     for i, r in enumerate(self.runs)],
            "rows": [{"key": row.figure.key, "label": row.figure.label,
                      "unit": row.figure.unit, "better": row.figure.better,
                      "interval": row.figure.stepwise, "tolerance": row.figure.tolerance,
                      "values": [_number(row.figure, v) for v in row.values], "changes": [_cell_dict(c) for c in row.cells]}
                     for row in self.rows],
            "where": [asdict(w) for w in self.where],
            "gate": {"thresholds": {k: t.text(BY_KEY[k]) for k, t in self.gates.items()},
                     "passed": not self.failures,
                     "failures": [asdict(f) for f in self.failures]},
        }


def _number(figure: Figure, value: float | None) -> float | int | None:
    """A rank or a count as an integer."""
    return int(value) if value is not None and figure.unit in ("rank", "count") else value


def _cell_dict(cell: Cell) -> dict[str, Any]:
    out = asdict(cell)
    for key in ("delta_interval", "change_interval"):
        out[key] = list(out[key]) if out[key] is not None else None
    return out


# --- the comparison --------------------------------------------------------------------------


def compare(runs: list[RunData], gates: dict[str, Threshold] | None = None,
            resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """Every figure of ``runs[1:]`` against ``runs[0]``, the sentences and the gate."""
    gates = dict(DEFAULT_GATES if gates is None else gates)
    reps = [replicates(r.statistics, r.steady_steps, resamples, seed + i)
            if r.has_intervals else None for i, r in enumerate(runs)]
    rows = [_row(figure, runs, reps) for figure in FIGURES]
    by_key = {row.figure.key: row for row in rows}
    where = [_where(runs[0], run, by_key["step_time"].cells[i - 1])
             for i, run in enumerate(runs) if i]
    base_step = runs[0].value("step_time")
    return Comparison(runs, rows, where, gates, _gate(rows, gates, base_step), resamples,
                      seed)


def _row(figure: Figure, runs: list[RunData],
         reps: list[dict[str, list[float | None]] | None]) -> Row:
    values = [run.value(figure.key) for run in runs]
    base, base_reps = values[0], reps[0]
    cells = []
    for run, value, run_reps in zip(runs[1:], values[1:], reps[1:], strict=True):
        if figure.better is None:  # the straggler's rank (None: none): shown, not ranked
            cells.append(Cell(run.label, SAME if value == base else CHANGED))
            continue
        if base is None or value is None:
            cells.append(Cell(run.label, NOT_RECORDED))
            continue
        enough = base_reps is not None and run_reps is not None
        with_interval = figure.stepwise and enough
        found = change(base, value, base_reps.get(figure.key) if with_interval else None,
                       run_reps.get(figure.key) if with_interval else None)
        if not figure.relative:
            found.change = found.change_interval = None
        cells.append(_cell(run.label, figure, found, too_few=not enough))
    return Row(figure, values, cells)


def _cell(run: str, figure: Figure, found: Change, too_few: bool) -> Cell:
    cell = Cell(run, NO_INTERVAL, found.delta, found.change, found.delta_interval,
                found.change_interval)
    detected = found.detected
    if detected is not None:
        cell.verdict = _direction(figure, found.delta) if detected else NO_DIFFERENCE
    elif figure.stepwise:  # too few steps, or a figure missing from many replicates
        cell.verdict = TOO_FEW_STEPS if too_few else NO_INTERVAL
    elif found.delta and (abs(found.delta) > (figure.tolerance or 0) if in_points(figure) else
                          found.change is None or abs(found.change) > (figure.tolerance or 0)):
        cell.verdict = _direction(figure, found.delta)
    return cell


def _direction(figure: Figure, delta: float) -> str:
    if delta == 0:
        return NO_DIFFERENCE
    lower = delta < 0
    return BETTER if lower == (figure.better == LOWER) else WORSE


def worse_by(figure: Figure, cell: Cell, absolute: bool = False,
             of_step: float | None = None) -> float:
    """How much worse the run is (negative: better): relatively, in the figure's unit
    (``absolute``), or as a share of ``of_step`` (the baseline's mean step, s); infinite
    where the baseline (or its step) is 0 and the run is worse."""
    if cell.delta is None:
        return 0.0
    sign = 1.0 if figure.better == LOWER else -1.0
    if absolute:
        return sign * cell.delta
    if of_step is not None:
        if of_step > 0:
            return sign * cell.delta / of_step
        return math.inf if sign * cell.delta > 0 else -math.inf
    if cell.change is None:
        return math.inf if sign * cell.delta > 0 else -math.inf
    return sign * cell.change


# --- the gate -----------------------------------------------------------------------------------


def _gate(rows: list[Row], gates: dict[str, Threshold],
          base_step: float | None) -> list[GateFailure]:
    """A figure fails its gate where it is worse beyond the threshold and its interval
    excludes zero (a figure without an interval: beyond the threshold alone); a threshold
    in a share of the step is taken of the baseline's mean step (``base_step``, s)."""
    failures = []
    by_key = {row.figure.key: row for row in rows}
    for key, threshold in gates.items():
        row = by_key[key]
        for cell in row.cells:
            if cell.verdict not in (WORSE, NO_INTERVAL, TOO_FEW_STEPS):
                continue
            of_step = (base_step or 0.0) if threshold.of_step else None
            if worse_by(row.figure, cell, threshold.absolute, of_step) > threshold.amount:
                failures.append(GateFailure(
                    cell.run, key, threshold.text(row.figure), cell.change,
                    cell.change_interval, cell.delta, cell.delta_interval))
    return failures


GATE_PATTERN = re.compile(r"^\s*([a-z_0-9]+)\s*=\s*(?:([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*"
                          r"(%step|%|ms|s|us|µs)|(off))\s*$")
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_gate(raw: str) -> tuple[str, Threshold | None]:
    """An argparse ``type``: ``KEY=+3%`` (worse by more than 3%: for a figure where higher
    is better, ``-3%``; the sign may be left out), ``KEY=+2ms`` (figures in seconds),
    ``KEY=+5%step`` (a part of the step: by 5% of the baseline's mean step), or
    ``KEY=off``."""
    match = GATE_PATTERN.match(raw)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not KEY=+N%, KEY=+Nms or KEY=off (such as step_time=+3%)")
    key, sign, number, unit, off = match.groups()
    figure = BY_KEY.get(key)
    if figure is None or figure.better is None:
        keys = ", ".join(f.key for f in FIGURES if f.better is not None)
        raise argparse.ArgumentTypeError(f"{raw!r}: no figure {key!r} (figures: {keys})")
    if off:
        return key, None
    worse_sign = "+" if figure.better == LOWER else "-"
    if sign and sign != worse_sign:
        raise argparse.ArgumentTypeError(
            f"{raw!r}: {figure.better} is better for {key}, so its threshold is a "
            f"{'rise' if figure.better == LOWER else 'fall'}: write {key}={worse_sign}"
            f"{number}{unit}")
    if unit == "%step":
        if key not in PART_LABELS:
            raise argparse.ArgumentTypeError(
                f"{raw!r}: only a part of the step has a threshold in %step (parts: "
                f"{', '.join(PART_LABELS)})")
        return key, Threshold(float(number) / 100, of_step=True)
    if unit == "%":
        if not figure.relative:
            raise argparse.ArgumentTypeError(
                f"{raw!r}: {key} has no relative change; give its threshold in ms or s")
        return key, Threshold(float(number) / 100)
    if figure.unit != "s":
        raise argparse.ArgumentTypeError(
            f"{raw!r}: {key} is not in seconds; give its threshold in %")
    return key, Threshold(float(number) * SECONDS[unit], absolute=True)


def gates_of(given: list[tuple[str, Threshold | None]]) -> dict[str, Threshold]:
    """The defaults, with the ``--gate`` options given over them (``off`` removes one)."""
    gates: dict[str, Threshold | None] = dict(DEFAULT_GATES)
    gates.update(given)
    return {key: value for key, value in gates.items() if value is not None}


# --- where the time moved ----------------------------------------------------------------------


def _where(base: RunData, run: RunData, step: Cell) -> Where:
    """The sentence: the step's change with its interval, and the parts whose change
    explains most of it, with where they moved (every rank, or which)."""
    head = _step_words(base, run, step)
    if step.verdict not in (BETTER, WORSE) or not step.delta:
        return Where(run.label, head)
    moves = _moves(base, run, step.delta)
    picked = _explaining(moves, step.delta)
    if not picked:
        return Where(run.label, head + "; no part of the step explains it")
    picked.sort(key=lambda m: -abs(m.delta_s))
    everywhere = all(m.every_rank for m in picked)
    words = ", ".join(_move_words(m, not everywhere) for m in picked)
    if everywhere:
        words += " on every rank"
    words += _waiting_words(moves, picked, step.delta)
    alike = _alike(base, run, step.delta)
    return Where(run.label, f"{head}: {words}{'; ' + alike if alike else ''}", picked, alike)


#: the compute parts looked at for a change that scales them alike, those of at least this
#: share of the baseline's step; alike when their ratios (run over baseline) are within
#: ALIKE_SPREAD of each other and each moved by at least ALIKE_MIN
ALIKE_PARTS = (sc.PART_FORWARD, sc.PART_BACKWARD, sc.PART_OPTIMIZER)
ALIKE_SHARE = 0.05
ALIKE_SPREAD = 1.15
ALIKE_MIN = 0.05


def _alike(base: RunData, run: RunData, step_delta: float) -> str | None:
    """Where every compute part moved by about the same factor, in the step's direction:
    what a slower or busier machine does (and a change that scales all compute, such as a
    wider model), rather than one part's code. None otherwise."""
    step_s = base.value("step_time") or 0.0
    ratios = {}
    for part in ALIKE_PARTS:
        before, after = base.value(part), run.value(part)
        if before is None or after is None or before < ALIKE_SHARE * step_s or before <= 0:
            continue
        ratios[part] = after / before
    if len(ratios) < 2:
        return None
    low, high = min(ratios.values()), max(ratios.values())
    sign = 1.0 if step_delta > 0 else -1.0
    if high / low > ALIKE_SPREAD or min(sign * (r - 1) for r in ratios.values()) < ALIKE_MIN:
        return None
    names = [PART_LABELS[p] for p in ratios]
    listed = (", ".join(names[:-1]) + " and " + names[-1]) if len(names) > 2 \
        else " and ".join(names)
    span = (_pct(low - 1) if _pct(low - 1) == _pct(high - 1)
            else f"{_pct(low - 1)} to {_pct(high - 1)}")
    return (f"{listed} all {span}: every compute part moved alike, as on a "
            f"{'slower or busier' if sign > 0 else 'faster or quieter'} machine or with a "
            "change that scales all compute, rather than one part's code")


def _step_words(base: RunData, run: RunData, step: Cell) -> str:
    interval = _pct_interval(step.change_interval)
    if step.verdict == NOT_RECORDED:
        return f"{run.label}'s step time cannot be compared with {base.label}'s (not recorded)"
    if step.verdict == TOO_FEW_STEPS:
        return (f"{run.label}'s step is {_pct(step.change)} against {base.label}'s, but too "
                f"few steady steps for an interval (at least {MIN_STEPS} a run)")
    if step.verdict == NO_DIFFERENCE:
        return (f"{run.label}'s step is no different from {base.label}'s within the noise: "
                f"{_pct(step.change)} {interval}")
    longer = "longer" if (step.delta or 0) > 0 else "shorter"
    size = f"{abs(step.change) * 100:.3g}%" if step.change is not None else "?"
    return f"{run.label}'s step is {size} {interval} {longer} than {base.label}'s"


def _moves(base: RunData, run: RunData, step_delta: float) -> list[PartMove]:
    """Each part's move, in the step change's direction, on the ranks where it moved."""
    ranks = sorted(set(base.rank_parts) & set(run.rank_parts))
    sign = 1.0 if step_delta > 0 else -1.0
    out = []
    for part in PART_LABELS:
        deltas = {r: run.rank_parts[r][part] - base.rank_parts[r][part] for r in ranks}
        largest = max((sign * d for d in deltas.values()), default=0.0)
        if largest <= 0:
            continue
        moved = [r for r in ranks if sign * deltas[r] >= RANK_SHARE * largest]
        every = len(moved) == len(ranks)
        on = ranks if every else moved
        out.append(PartMove(part, sum(deltas[r] for r in on) / len(on), moved, every))
    return out


def _explaining(moves: list[PartMove], step_delta: float) -> list[PartMove]:
    """The causes first (largest first, at most ``MOST_PARTS``), then the waits (exposed
    communication, blocked on the device) while the named parts explain less than
    ``EXPLAINED_SHARE`` of the step's change."""
    picked: list[PartMove] = []
    explained = 0.0
    for symptoms in (False, True):
        group = sorted((m for m in moves if (m.part in SYMPTOMS) == symptoms),
                       key=lambda m: -abs(m.delta_s))
        for move in group:
            if explained >= EXPLAINED_SHARE * abs(step_delta):
                break
            if abs(move.delta_s) < MIN_PART_SHARE * abs(step_delta):
                break
            if not symptoms and len(picked) >= MOST_PARTS:
                break
            picked.append(move)
            explained += abs(move.delta_s)
    return picked


def _waiting_words(moves: list[PartMove], picked: list[PartMove], step_delta: float) -> str:
    """Where the causes are on some ranks only: the others' waiting for them, if it moved."""
    cause_ranks = {r for m in picked if not m.every_rank for r in m.ranks}
    if not cause_ranks or any(m.every_rank for m in picked):
        return ""
    waits = [m for m in moves if m.part in SYMPTOMS and m not in picked
             and not cause_ranks & set(m.ranks)
             and abs(m.delta_s) >= MIN_PART_SHARE * abs(step_delta)]
    if not waits:
        return ""
    waiting = sorted({r for m in waits for r in m.ranks})
    return (f"; {_ranks_words(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it: "
            + ", ".join(_move_words(m, False) for m in waits))


def _move_words(move: PartMove, where: bool) -> str:
    text = f"{PART_LABELS[move.part]} {_signed_s(move.delta_s)}"
    if where and not move.every_rank:
        text += f" on {_ranks_words(move.ranks)}"
    elif where:
        text += " on every rank"
    return text


#: at most this many runs of consecutive ranks are named; the rest are counted
MOST_RANK_RUNS = 8


def _ranks_words(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0, 2``, ``ranks 0-2, 4-1023``: runs of consecutive ranks as
    ranges, at most :data:`MOST_RANK_RUNS` of them (a job of thousands of ranks stays one
    line)."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    runs: list[tuple[int, int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    words = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"
             for a, b in runs[:MOST_RANK_RUNS]]
    more = ""
    if len(runs) > MOST_RANK_RUNS:
        rest = sum(b - a + 1 for a, b in runs[MOST_RANK_RUNS:])
        more = f" and {rest} more"
    return "ranks " + ", ".join(words) + more


def _signed_s(seconds: float) -> str:
    sign = "+" if seconds >= 0 else "-"
    magnitude = abs(seconds)
    if magnitude >= 1:
        return f"{sign}{magnitude:.3g} s"
    if magnitude >= 1e-3:
        return f"{sign}{magnitude * 1e3:.3g} ms"
    return f"{sign}{magnitude * 1e6:.3g} µs"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.3g}%"


def _pct_interval(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return ""
    low, high = interval
    return f"[{low * 100:.3g}, {high * 100:.3g}]"


# --- the command ---------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    from otel_train.cli import integer_at_least

    parser = subparsers.add_parser(
        "compare", help="compare runs: which is faster, by how much, where the time went",
        description="Compare runs against the first (the baseline): each figure's change "
                    "with a 95% interval from the steps (a block bootstrap), a verdict, and "
                    "where the step time moved. Exit 1 when a --gate fails (docs/compare.md).")
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN",
                        help="run directories (or roots holding runs: the newest is read), "
                             "or run ids with --jaeger; the first is the baseline")
    parser.add_argument("--gate", type=parse_gate, action="append", default=[],
                        metavar="KEY=+N%",
                        help="fail (exit 1) when KEY is worse by more than N%% and its "
                             "interval excludes zero; KEY=off drops a default (defaults: "
                             + ", ".join(f"{k}={v.text(BY_KEY[k])}".replace("%", "%%")
                                         for k, v in DEFAULT_GATES.items())
                             + ")")
    parser.add_argument("--jaeger", metavar="URL",
                        help="read each RUN as a run id from this Jaeger's query API (its "
                             "traces: the per-step rows)")
    parser.add_argument("--prometheus", metavar="URL",
                        help="with --jaeger: read each run's totals (memory, overlap, "
                             "compile, goodput, MFU) from this Prometheus")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--html", type=Path, metavar="FILE",
                        help="also write the runs side by side as one HTML file")
    parser.add_argument("--resamples", type=integer_at_least(100), default=RESAMPLES,
                        help=f"bootstrap replicates (default {RESAMPLES})")
    parser.add_argument("--seed", type=integer_at_least(0), default=0,
                        help="the bootstrap's random seed (default 0: the same intervals "
                             "every time)")
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"otel-train compare: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from otel_train.analysis.cli import cannot_write, damage_on_stderr, write_outputs
    from otel_train.analysis.otlp import resolve_run_dir

    if len(args.runs) < 2:
        return _fail(f"give at least two runs, the baseline first (got {len(args.runs)})")
    if args.prometheus and not args.jaeger:
        return _fail("--prometheus gives the runs' totals; their steps come from the traces: "
                     "give --jaeger URL too (or the run directories, which hold both)")
    unwritable = args.html and cannot_write(args.html)
    if unwritable:
        return _fail(f"--html {unwritable}")
    with tempfile.TemporaryDirectory(prefix="otel-train-compare-") as scratch:
        try:
            if args.jaeger:
                from otel_train.analysis.live import from_jaeger

                dirs = [from_jaeger(args.jaeger, str(run_id), Path(scratch) / str(i))
                        for i, run_id in enumerate(args.runs)]
                if args.prometheus:
                    from otel_train.analysis.live import add_prometheus, first_start_ns

                    for d, run_id in zip(dirs, args.runs, strict=True):
                        add_prometheus(args.prometheus, str(run_id), d, first_start_ns(d))
            else:
                dirs = [resolve_run_dir(path) for path in args.runs]
            with damage_on_stderr():
                runs = [load_run(d, label)
                        for d, label in zip(dirs, labels(dirs), strict=True)]
            if args.jaeger:  # read from a scratch directory, gone once compared
                also = f" + {args.prometheus}" if args.prometheus else ""
                for loaded, run_id in zip(runs, args.runs, strict=True):
                    loaded.path = f"{args.jaeger}{also} {run_id}"
        except OSError as err:
            return _fail(str(err))
    result = compare(runs, gates_of(args.gate), args.resamples, args.seed)
    from otel_train.analysis import compare_render as render

    written = write_outputs("compare", args, result.to_dict, lambda: render.html(result),
                            lambda: render.terminal(result))
    if written:
        return written
    return 1 if result.failures else 0


def labels(dirs: list[Path]) -> list[str]:
    """Each run's name: its directory's, numbered where two are the same."""
    out: list[str] = []
    for path in dirs:
        name = path.name or str(path)
        count = sum(1 for seen in out if seen == name or seen.startswith(f"{name} ("))
        out.append(name if not count else f"{name} ({count + 1})")
    return out


__all__ = ["DEFAULT_THRESHOLDS", "HIGHER", "LOWER", "compare", "load_run", "parse_gate", "register", "run"]
