"""Compile health: compile time, graph breaks and recompiles by reason, cross-rank drift."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from . import kit, names

UID = "otel-train-compile"

REASON_LEGEND = "{{" + names.REASON + "}}"
RANK_LEGEND = "rank {{" + names.RANK + "}}"
#: training.compile.reason values that mean dynamo hit its recompile limit and fell back to eager
RECOMPILE_LIMIT_REASONS = ".*limit.*"
LIMIT_SEL = kit.sel(f'{names.REASON}=~"{RECOMPILE_LIMIT_REASONS}"')


def _compile_time(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Compile time"))
    board.with_panel(
        kit.bucket_heatmap(
            "Compile time distribution",
            "Bucket increases of training_compile_duration_seconds; exemplars open the "
            "training.compile span (with training.compile.reason).",
            kit.prom(
                kit.bucket_increase(names.COMPILE, s),
                "{{le}}",
                exemplar=True,
                heatmap_format=True,
            ),
        )
    )
    board.with_panel(
        kit.series(
            "Compile time p50 / p99",
            "Percentiles of training_compile_duration_seconds: first compiles are long, a "
            "healthy run stops compiling after warm-up.",
            [
                kit.prom(kit.quantile(0.5, names.COMPILE, s), "compile p50", "A"),
                kit.prom(kit.quantile(0.99, names.COMPILE, s), "compile p99", "B"),
            ],
        )
    )
    board.with_panel(
        kit.bars(
            "Compile seconds per rank over the range",
            "Total seconds each rank spent compiling in the selected range.",
            [
                kit.prom(
                    f"sum by ({names.RANK}) ({kit.rate(names.COMPILE + '_sum', s, '$__range', fn='increase')})",
                    RANK_LEGEND,
                    instant=True,
                )
            ],
            unit="s",
        )
    )
    board.with_panel(
        kit.bars(
            "Compilations per rank over the range",
            "Compilations each rank ran in the selected range: the count of "
            "training_compile_duration_seconds, one per compilation (a first compile or a "
            "recompile) whatever the number of graphs it produced (graph breaks split a frame "
            "into several graphs, counted by training_compile_graphs_total).",
            [
                kit.prom(
                    f"sum by ({names.RANK}) ({kit.rate(names.COMPILE + '_count', s, '$__range', fn='increase')})",
                    RANK_LEGEND,
                    instant=True,
                )
            ],
            unit="short",
        )
    )


def _breaks_and_recompiles(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Graph breaks and recompiles"))
    board.with_panel(
        kit.series(
            "Graph breaks by reason",
            "New graph breaks per interval by training_compile_reason, summed over selected ranks.",
            [
                kit.prom(
                    f"sum by ({names.REASON}) ({kit.rate(names.GRAPH_BREAKS, s, fn='increase')})",
                    REASON_LEGEND,
                )
            ],
            unit="short",
            stacked=True,
        )
    )
    board.with_panel(
        kit.series(
            "Recompiles by reason",
            "Recompiles per interval by guard-failure reason; a steady stream is a recompile "
            "storm (dynamic shapes, changing Python values).",
            [
                kit.prom(
                    f"sum by ({names.REASON}) ({kit.rate(names.RECOMPILES, s, fn='increase')})",
                    REASON_LEGEND,
                )
            ],
            unit="short",
            stacked=True,
        )
    )
    board.with_panel(
        kit.series(
            "Cross-rank inconsistency: compilations and recompiles, max rank minus min rank",
            "Ranks of one job should compile the same graphs as often; a rank that compiles "
            "more has diverged (different shapes or control flow) and will stall the "
            "collectives.",
            [
                kit.prom(
                    f"max(sum by ({names.RANK}) ({kit.gauge(names.COMPILE + '_count', s)})) - min(sum by ({names.RANK}) ({kit.gauge(names.COMPILE + '_count', s)}))",
                    "compilations: max - min rank",
                    "A",
                ),
                kit.prom(
                    f"max(sum by ({names.RANK}) ({kit.gauge(names.RECOMPILES, s)})) - min(sum by ({names.RANK}) ({kit.gauge(names.RECOMPILES, s)}))",
                    "recompiles: max - min rank",
                    "B",
                ),
            ],
            unit="short",
        )
    )
    board.with_panel(
        kit.series(
            "Recompile-limit fallbacks per rank",
            f'Recompiles whose training_compile_reason matches "{RECOMPILE_LIMIT_REASONS}": dynamo gave '
            "up on the frame and runs it eagerly from then on.",
            [
                kit.prom(
                    f"sum by ({names.RANK}) ({kit.rate(names.RECOMPILES, LIMIT_SEL, fn='increase')})",
                    RANK_LEGEND,
                )
            ],
            unit="short",
        )
    )
    board.with_panel(
        kit.data_table(
            "Recent compiles (Tempo)",
            "training.compile spans of the run with their reason and graph breaks.",
            [
                kit.traceql(
                    f'{{ name = "{names.SPAN_COMPILE}" && span.{names.ATTR_RUN_ID} = "$run_id" }}'
                    f" | select(span.{names.ATTR_COMPILE_REASON}, span.{names.ATTR_COMPILE_GRAPH_BREAKS}, span.{names.ATTR_RANK})"
                )
            ],
            datasource=kit.TEMPO,
            width=24,
        )
    )


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Compile health",
        "torch.compile time, graph breaks and recompiles by reason, compilations per rank, "
        "cross-rank inconsistency and recompile-limit fallbacks.",
    )
    _compile_time(board)
    _breaks_and_recompiles(board)
    return board
