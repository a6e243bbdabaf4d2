"""Compare runs: the same figures for two run ids side by side, and B's change against A.

Runs compared (eager against compiled, FSDP2 against DDP, two bucket sizes) rarely ran at the
same time, so every figure is the run's own over the part of the dashboard's range where it
reported: ratios of increases over ``$__range`` (step time, throughput per second of step
time, parts per step) and ``*_over_time`` of the gauges, none of which shrinks when the run
fills a small part of the range. Each figure is one query per run, filtered by
``training_run_id="$run_a"`` or ``"$run_b"`` and aggregated by run: no per-rank series leave
Prometheus. A is drawn blue, B orange (field overrides on the series names ``A: ...`` and
``B: ...``); the change of B against A is ``B / A - 1`` (= (B - A) / A) in PromQL.
"""

from __future__ import annotations

from collections.abc import Iterable

from grafana_foundation_sdk.builders import barchart, bargauge
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from . import attribution, kit, names

UID = "otel-train-compare"

#: the two runs: A the baseline, B the run compared with it
RUNS = {"A": "$run_a", "B": "$run_b"}
COLOURS = {"A": "blue", "B": "orange"}
RANGE = "$__range"
RUN_LEGEND = "{{" + names.RUN + "}}"
#: how a change of B against A is coloured: within 2% either way is no change
NEUTRAL = 0.02


def run_sel(run: str, *matchers: str) -> str:
    """The selector of run ``run`` ("A" or "B"): an equality matcher on its run id."""
    return "{" + ", ".join([f'{names.RUN}="{RUNS[run]}"', *matchers]) + "}"


def _sum(by: Iterable[str]) -> str:
    by = tuple(by)
    return f"sum by ({', '.join(by)})" if by else "sum"


def _by(fn: str, by: Iterable[str]) -> str:
    by = tuple(by)
    return f"{fn} by ({', '.join(by)})" if by else fn


PER_RUN = (names.RUN,)


# --- the figures, for one run ------------------------------------------------------------


def step_mean(run: str, by: Iterable[str] = PER_RUN, window: str = RANGE) -> str:
    """Mean step time over all ranks: the step histogram's seconds over its steps."""
    s = run_sel(run)
    return (
        f"{_sum(by)} ({kit.rate(names.STEP + '_sum', s, window)})"
        f" / {_sum(by)} ({kit.rate(names.STEP + '_count', s, window)})"
    )


def step_p95(run: str, by: Iterable[str] = PER_RUN, window: str = RANGE) -> str:
    return kit.quantile(0.95, names.STEP, run_sel(run), by=tuple(by), window=window)


def throughput(run: str, counter: str, by: Iterable[str] = PER_RUN) -> str:
    """Per second of step time, summed over ranks: each rank's samples (tokens) over its own
    step seconds. A run filling a part of the range is not diluted by the rest (a rate over
    the range would be), and the time between steps (evaluation, checkpoints) is left to
    goodput: this is the steady throughput of the steps."""
    s = run_sel(run)
    return (
        f"{_sum(by)} ({kit.rate(counter, s, RANGE)}"
        f" / {kit.rate(names.STEP + '_sum', s, RANGE)})"
    )


def part_ms(run: str) -> str:
    """Milliseconds per step in each part (disjoint: their sum is the mean step time)."""
    s = run_sel(run)
    return (
        f"1e3 * sum by ({names.PART}) ({kit.rate(names.STEP_TIME, s, RANGE)})"
        f" / ignoring({names.PART}) group_left sum({kit.rate(names.STEP + '_count', s, RANGE)})"
    )


def part_share(run: str) -> str:
    """Each part's share of the run's step time: adds up to 100% over the parts."""
    s = run_sel(run)
    return (
        f"sum by ({names.PART}) ({kit.rate(names.STEP_TIME, s, RANGE)})"
        f" / ignoring({names.PART}) group_left sum({kit.rate(names.STEP_TIME, s, RANGE)})"
    )


def goodput(run: str, by: Iterable[str] = PER_RUN) -> str:
    """Productive over all goodput buckets, each rank's counters at their last sample in the
    range: the run's goodput from its start (start-up included) to its last step there."""

    def last(selector: str) -> str:
        return kit.dedup(f"last_over_time({names.GOODPUT}{selector}[{RANGE}])", names.GOODPUT)

    productive = run_sel(run, f'{names.BUCKET}="{names.GOODPUT_PRODUCTIVE}"')
    return f"{_sum(by)} ({last(productive)}) / {_sum(by)} ({last(run_sel(run))})"


def peak(run: str, gauge: str, by: Iterable[str] = PER_RUN) -> str:
    """The largest value of a memory gauge over the range, on any rank."""
    return f"{_by('max', by)} (max_over_time({gauge}{run_sel(run)}[{RANGE}]))"


def overlap(run: str, fn: str) -> str:
    """Each rank's median communication overlap over the range; ``fn`` across the ranks."""
    per_rank = kit.dedup(
        f"quantile_over_time(0.5, {names.COMM_OVERLAP}{run_sel(run)}[{RANGE}])",
        names.COMM_OVERLAP,
    )
    if fn == "median":
        return f"quantile by ({names.RUN}) (0.5, {per_rank})"
    return f"{fn} by ({names.RUN}) ({per_rank})"


def _or_zero(expr: str, run: str) -> str:
    """0 for a run that reported steps and none of ``expr``'s series (an eager run compiles
    nothing): its bar shows 0 instead of vanishing."""
    steps = kit.rate(names.STEP + "_count", run_sel(run), RANGE, fn="increase")
    return f"{expr} or sum by ({names.RUN}) ({steps}) * 0"


def compile_seconds(run: str) -> str:
    inc = kit.rate(names.COMPILE + "_sum", run_sel(run), RANGE, fn="increase")
    return _or_zero(f"sum by ({names.RUN}) ({inc})", run)


def recompiles(run: str) -> str:
    inc = kit.rate(names.RECOMPILES, run_sel(run), RANGE, fn="increase")
    return _or_zero(f"sum by ({names.RUN}) ({inc})", run)


def data_wait_share(run: str) -> str:
    """The data_wait part's share of the run's step time (0 where no rank waited)."""
    s = run_sel(run)
    wait = run_sel(run, f'{names.PART}="{names.PART_DATA_WAIT}"')
    every = f"sum by ({names.RUN}) ({kit.rate(names.STEP_TIME, s, RANGE)})"
    return (
        f"(sum by ({names.RUN}) ({kit.rate(names.STEP_TIME, wait, RANGE)}) or {every} * 0)"
        f" / {every}"
    )


def change(figure) -> str:
    """B against A, (B - A) / A, of a figure built by ``figure(run, by)`` without labels."""
    return f"({figure('B', ())}) / ({figure('A', ())}) - 1"


# --- panels ------------------------------------------------------------------------------


def _colour(colour: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour})


def coloured(panel):
    """A blue, B orange: overrides on the series' display names (``A: ...``, ``B: ...``)."""
    for run, colour in COLOURS.items():
        panel = panel.override_by_regexp(f"{run}: .*", [_colour(colour)])
    return panel


def per_run(figure, legend: str) -> list:
    """One instant query per run, A then B (refIds A and B), legends ``A: <run id> ...``."""
    return [
        kit.prom(figure(run), f"{run}: {RUN_LEGEND} {legend}", run, instant=True) for run in RUNS
    ]


def run_bars(title: str, description: str, targets: Iterable, unit: str, width: int = 8,
             height: int = 6):
    """One bar per query, A blue and B orange, from 0."""
    panel = (
        bargauge.Panel()
        .title(title)
        .datasource(kit.PROMETHEUS)
        .unit(unit)
        .min(0)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .show_unfilled(True)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for target in targets:
        panel = panel.with_target(target)
    return coloured(panel).span(width).height(height).description(description)


def change_stat(title: str, description: str, targets: Iterable, lower_is_better: bool):
    """B against A as a percentage, green where B is better, red where worse, plain within
    ±2%."""
    better, worse = ("green", "red") if lower_is_better else ("red", "green")
    return kit.single_stat(
        title,
        description,
        targets,
        unit="percentunit",
        steps=((None, better), (-NEUTRAL, "text"), (NEUTRAL, worse)),
    ).decimals(1)


def _changes(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("B against A over the time range: (B - A) / A"))
    board.with_panel(
        change_stat(
            "B vs A: step time (mean, p95)",
            "B's step time against A's over the range, (B - A) / A: the mean over all ranks' "
            "steps (the step histogram's seconds over its steps) and the p95 of the "
            "histogram. Negative is faster; red is slower by more than 2%.",
            [
                kit.prom(change(step_mean), "mean", "A", instant=True),
                kit.prom(change(step_p95), "p95", "B", instant=True),
            ],
            lower_is_better=True,
        )
    )
    board.with_panel(
        change_stat(
            "B vs A: throughput (samples/s, tokens/s)",
            "B's samples and tokens per second of step time (each rank's over its own step "
            "seconds, summed over ranks) against A's, (B - A) / A. Positive is faster.",
            [
                kit.prom(change(lambda run, by: throughput(run, names.SAMPLES, by)),
                         "samples/s", "A", instant=True),
                kit.prom(change(lambda run, by: throughput(run, names.TOKENS, by)),
                         "tokens/s", "B", instant=True),
            ],
            lower_is_better=False,
        )
    )
    board.with_panel(
        change_stat(
            "B vs A: goodput",
            "B's goodput (productive over all of its ranks' time since start) against A's, "
            "(B - A) / A: the relative change of the ratio, not the difference in points.",
            [kit.prom(change(goodput), "goodput", "A", instant=True)],
            lower_is_better=False,
        )
    )
    board.with_panel(
        change_stat(
            "B vs A: peak memory allocated",
            "The largest peak allocated memory of any rank of B against A's, (B - A) / A.",
            [kit.prom(change(lambda run, by: peak(run, names.MEMORY_PEAK, by)),
                      "peak allocated", "A", instant=True)],
            lower_is_better=True,
        )
    )


def _step_time(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("Step time: A = $run_a, B = $run_b"))
    board.with_panel(
        run_bars(
            "Step time over the range: mean and p95",
            "training_step_duration_seconds over the range, all ranks of each run: the mean "
            "(the histogram's seconds over its steps, rate(sum) / rate(count)) and the p95 "
            "(histogram_quantile of the buckets' increase). Pick a range over the runs' "
            "steady stretch to leave the warm-up steps out.",
            [
                *per_run(step_mean, "mean"),
                kit.prom(step_p95("A"), f"A: {RUN_LEGEND} p95", "C", instant=True),
                kit.prom(step_p95("B"), f"B: {RUN_LEGEND} p95", "D", instant=True),
            ],
            unit="s",
            width=8,
            height=8,
        )
    )
    rate = "$__rate_interval"
    panel = kit.series(
        "Step time over time: mean (solid) and p95 (dashed)",
        "The same figures over the rate window: where the runs overlapped in time, or to see "
        "which stretch of each run the range holds.",
        [
            kit.prom(step_mean("A", window=rate), f"A: {RUN_LEGEND} mean", "A"),
            kit.prom(step_mean("B", window=rate), f"B: {RUN_LEGEND} mean", "B"),
            kit.prom(step_p95("A", window=rate), f"A: {RUN_LEGEND} p95", "C"),
            kit.prom(step_p95("B", window=rate), f"B: {RUN_LEGEND} p95", "D"),
        ],
        width=16,
    )
    panel = coloured(panel).override_by_regexp(
        ".* p95",
        [model.DynamicConfigValue(id_val="custom.lineStyle",
                                  value={"fill": "dash", "dash": [10, 10]})],
    )
    board.with_panel(panel)


def _throughput(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("Throughput: A = $run_a, B = $run_b"))
    for counter, what in ((names.SAMPLES, "samples"), (names.TOKENS, "tokens")):
        board.with_panel(
            run_bars(
                f"Throughput over the range: {what}/s",
                f"{counter} summed over ranks, per second of step time: each rank's increase "
                "over the range divided by its step seconds (training_step_duration_seconds "
                "sum), summed over the run's ranks. The time between steps (evaluation, "
                "checkpoints) is in goodput, not here.",
                per_run(lambda run, by=PER_RUN, c=counter: throughput(run, c, by), f"{what}/s"),
                unit="short",
                width=6,
            )
        )
    board.with_panel(
        coloured(
            kit.series(
                "Samples/s over time",
                f"{names.SAMPLES} summed over ranks, per second of wall time over the rate "
                "window.",
                [
                    kit.prom(f"sum by ({names.RUN}) ({kit.rate(names.SAMPLES, run_sel(run))})",
                             f"{run}: {RUN_LEGEND} samples/s", run)
                    for run in RUNS
                ],
                unit="short",
                width=12,
                height=6,
            )
        )
    )


def _parts(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("Where the step goes: the disjoint parts, per step"))
    organize_bars = model.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "renameByName": {names.PART: "part", "Value #A": "A: baseline",
                             "Value #B": "B: compared"},
            "indexByName": {names.PART: 0, "Value #A": 1, "Value #B": 2},
        },
    )
    bars = (
        barchart.Panel()
        .title("Milliseconds per step by part: A = $run_a, B = $run_b")
        .datasource(kit.PROMETHEUS)
        .unit("ms")
        .min(0)
        .x_field("part")
        .line_width(1)
        .fill_opacity(80)
        .gradient_mode(common.GraphGradientMode.NONE)
        .orientation(common.VizOrientation.HORIZONTAL)
        .show_value(common.VisibilityMode.AUTO)
        .group_width(0.7)
        .bar_width(0.9)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .with_target(kit.prom(part_ms("A"), "", "A", instant=True, table_format=True))
        .with_target(kit.prom(part_ms("B"), "", "B", instant=True, table_format=True))
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(organize_bars)
    )
    board.with_panel(
        coloured(bars)
        .span(12)
        .height(10)
        .description(
            f"{names.STEP_TIME} by {names.PART} over the range: each part's seconds over the "
            "run's steps, in ms. The parts are disjoint and add up to the step (their sum is "
            "the mean step time above), so a part that grew is where B's time went."
        )
    )
    columns = {
        "Value #A": "A ms/step",
        "Value #B": "B ms/step",
        "Value #C": "B vs A",
        "Value #D": "A share",
        "Value #E": "B share",
    }
    organize_table = model.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "renameByName": {names.PART: "part", **columns},
            "indexByName": {names.PART: 0, **{v: i for i, v in enumerate(columns, start=1)}},
        },
    )
    table = kit.data_table(
        "Parts per step: A, B, change and shares",
        "Per part: milliseconds per step of A and B, B's change against A ((B - A) / A; "
        "empty where A has none of the part), and each run's share of its step time (each "
        "share column adds up to 100%).",
        [
            kit.prom(part_ms("A"), "", "A", instant=True, table_format=True),
            kit.prom(part_ms("B"), "", "B", instant=True, table_format=True),
            kit.prom(f"({part_ms('B')}) / (({part_ms('A')}) > 0) - 1", "", "C", instant=True,
                     table_format=True),
            kit.prom(part_share("A"), "", "D", instant=True, table_format=True),
            kit.prom(part_share("B"), "", "E", instant=True, table_format=True),
        ],
        unit="ms",
        width=12,
        height=10,
        merge=True,
    )
    table = table.with_transformation(organize_table)
    for column, unit in (("A ms/step", "ms"), ("B ms/step", "ms"), ("B vs A", "percentunit"),
                         ("A share", "percentunit"), ("B share", "percentunit")):
        table = table.override_by_name(
            column,
            [model.DynamicConfigValue(id_val="unit", value=unit),
             model.DynamicConfigValue(id_val="decimals", value=1)],
        )
    board.with_panel(table)


def _efficiency(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("Goodput, memory, communication, compile and data wait"))
    buckets = ", ".join(names.GOODPUT_BUCKETS[1:])
    board.with_panel(
        run_bars(
            "Goodput per run",
            f"{names.GOODPUT}: productive over all buckets (the losses: {buckets}), summed "
            "over each run's ranks, at their last sample in the range: the run's goodput "
            "from its start.",
            per_run(goodput, "goodput"),
            unit="percentunit",
        ).max(1)
    )
    board.with_panel(
        run_bars(
            "Peak memory: allocated and reserved, largest rank",
            f"The largest {names.MEMORY_PEAK} and {names.MEMORY_RESERVED} of any rank over "
            "the range.",
            [
                *per_run(lambda run, by=PER_RUN: peak(run, names.MEMORY_PEAK, by),
                         "peak allocated"),
                kit.prom(peak("A", names.MEMORY_RESERVED), f"A: {RUN_LEGEND} reserved", "C",
                         instant=True),
                kit.prom(peak("B", names.MEMORY_RESERVED), f"B: {RUN_LEGEND} reserved", "D",
                         instant=True),
            ],
            unit="bytes",
        )
    )
    board.with_panel(
        run_bars(
            "Communication overlap: median and worst rank",
            f"{names.COMM_OVERLAP}: each rank's median over the range, then the median rank "
            "and the worst (lowest) rank: the share of communication hidden under compute.",
            [
                *per_run(lambda run: overlap(run, "median"), "median rank"),
                kit.prom(overlap("A", "min"), f"A: {RUN_LEGEND} worst rank", "C", instant=True),
                kit.prom(overlap("B", "min"), f"B: {RUN_LEGEND} worst rank", "D", instant=True),
            ],
            unit="percentunit",
        ).max(1)
    )
    board.with_panel(
        run_bars(
            "Compile seconds over the range",
            f"Seconds compiling ({names.COMPILE} sum) over the range, all ranks; 0 for a run "
            "that compiled nothing (eager).",
            per_run(compile_seconds, "compile"),
            unit="s",
        )
    )
    board.with_panel(
        run_bars(
            "Recompiles over the range",
            f"{names.RECOMPILES} over the range, all ranks and reasons (the compile-health "
            "dashboard has them by reason).",
            per_run(recompiles, "recompiles"),
            unit="short",
        )
    )
    board.with_panel(
        run_bars(
            "Data wait share of step time",
            f"The {names.PART_DATA_WAIT} part's share of each run's step time "
            f"({names.STEP_TIME}) over the range: the input pipeline's cost.",
            per_run(data_wait_share, "data wait"),
            unit="percentunit",
        ).max(1)
    )


def _run_link(run: str, uid: str, title: str) -> dash.DashboardLink:
    variables = "&".join(f"${{{v}:queryparam}}" for v in ("ds_prometheus", "ds_tempo", "ds_loki"))
    url = (f"/d/{uid}?${{__url_time_range}}&var-run_id=${{{RUNS[run][1:]}:percentencode}}"
           f"&var-rank=All&{variables}")
    return kit.link(f"Run {run} in {title}", url)


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Compare runs",
        "Two runs by run id, side by side over the time range: step time (mean and p95), "
        "throughput, the step's parts per step, goodput, memory, overlap, compile and data "
        "wait, and B's change against A.",
        run_and_rank=False,
    ).time("now-24h", "now")
    for run, label, what in (("A", "Run A (baseline)", "the baseline"),
                             ("B", "Run B", "the run compared with A")):
        board.with_variable(
            kit.run_variable(RUNS[run][1:], label, f"training_run_id of {what}")
        )
    for run in RUNS:
        board.link(_run_link(run, attribution.UID, "Training attribution"))
    board.with_panel(
        kit.note(
            "How to read",
            "Pick **run A** (the baseline, blue) and **run B** (orange), and a time range "
            "holding both runs: every figure is the run's own over the part of the range "
            "where it reported (ratios of increases, and `*_over_time`), whenever each ran. "
            "The first row is B against A, (B - A) / A.",
            height=3,
        )
    )
    _changes(board)
    _step_time(board)
    _throughput(board)
    _parts(board)
    _efficiency(board)
    return board
