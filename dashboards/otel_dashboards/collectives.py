"""Collectives: latency by op, message sizes, bus bandwidth against the link, stalls."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as model

from . import kit, names

UID = "otel-train-collectives"

OP_LEGEND = "{{" + names.OP + "}}"
BACKEND_MATCH = f'{names.BACKEND}=~"$backend"'
SPAN_FILTER = f'name = "{names.SPAN_COLLECTIVE}" && span.{names.ATTR_RUN_ID} = "$run_id"'


def _variables(board: dash.Dashboard) -> None:
    board.with_variable(
        dash.QueryVariable("backend")
        .label("Backend")
        .datasource(kit.PROMETHEUS)
        .query(f"label_values({kit.either(names.COLLECTIVE, 'count', '{' + kit.RUN_MATCH + '}')}, {names.BACKEND})")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    board.with_variable(
        dash.TextBoxVariable("link_peak_gbps")
        .label("Link peak (GB/s)")
        .description(
            "Peak bus bandwidth of the interconnect, GB/s (e.g. 450 for H100 NVLink 4 per direction)"
        )
        .default_value("450")
    )
    board.with_variable(
        dash.TextBoxVariable("stall_threshold")
        .label("Stall threshold")
        .description("A collective slower than this is listed as a stall (TraceQL duration)")
        .default_value("1s")
    )


def _latency(board: dash.Dashboard) -> None:
    s = kit.sel(BACKEND_MATCH)
    board.with_row(dash.Row("Latency by op"))
    board.with_panel(
        kit.series(
            "Collective latency p50 and p99 by op",
            "histogram_quantile over training_collective_duration_seconds per collective_op.",
            [
                kit.prom(
                    kit.quantile(0.5, names.COLLECTIVE, s, by=(names.OP,)), OP_LEGEND + " p50", "A"
                ),
                kit.prom(
                    kit.quantile(0.99, names.COLLECTIVE, s, by=(names.OP,)),
                    OP_LEGEND + " p99",
                    "B",
                    exemplar=True,
                ),
            ],
            log_scale=True,
        )
    )
    board.with_panel(
        kit.bucket_heatmap(
            "Collective latency distribution (exemplars open the trace)",
            "Bucket increases of training_collective_duration_seconds over all ops and ranks "
            "selected; exemplars lead to the collective's span.",
            kit.prom(
                kit.bucket_increase(names.COLLECTIVE, s),
                "{{le}}",
                exemplar=True,
                heatmap_format=True,
            ),
        )
    )
    board.with_panel(
        kit.series(
            "Collective p99 by op: slowest rank against the median rank",
            "A collective waits for its slowest participant: if one rank's p99 stands apart "
            "the others are waiting on it (look at its data wait and throttling).",
            [
                kit.prom(
                    f"max by ({names.OP}) ({kit.quantile(0.99, names.COLLECTIVE, s, by=(names.OP, names.RANK))})",
                    OP_LEGEND + " slowest rank",
                    "A",
                ),
                kit.prom(
                    f"quantile by ({names.OP}) (0.5, {kit.quantile(0.99, names.COLLECTIVE, s, by=(names.OP, names.RANK))})",
                    OP_LEGEND + " median rank",
                    "B",
                ),
            ],
            log_scale=True,
        )
    )
    board.with_panel(
        kit.series(
            "Collective calls per second by op and backend",
            "Call rate from the histogram's _count.",
            [
                kit.prom(
                    f"sum by ({names.OP}, {names.BACKEND}) ({kit.rate(names.COLLECTIVE + '_count', s)})",
                    OP_LEGEND + " ({{" + names.BACKEND + "}})",
                )
            ],
            unit="ops",
        )
    )


def _sizes_and_bandwidth(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Message sizes and bandwidth"))
    board.with_panel(
        kit.series(
            "Message size per span: p10, p50, p90 by op (Tempo)",
            "TraceQL metrics over every training.collective span's training.collective.bytes: the real "
            "per-message distribution. Small messages (KiB) are a sharding-granularity smell.",
            [
                kit.traceql_metrics(
                    f"{{ {SPAN_FILTER} }} | quantile_over_time(span.{names.ATTR_COLLECTIVE_BYTES}, 0.1, 0.5, 0.9)"
                    f" by (span.{names.ATTR_COLLECTIVE_OP})"
                )
            ],
            unit="bytes",
        ).datasource(kit.TEMPO)
    )
    board.with_panel(
        kit.series(
            "Bytes per call by op, across ranks (Prometheus)",
            "training_collective_size_bytes_total over collective calls, per rank, shown as the "
            "smallest, median and largest rank per op (the contract has no size histogram).",
            [
                kit.prom(
                    f"min by ({names.OP}) ({_bytes_per_call(s)})",
                    OP_LEGEND + " smallest rank",
                    "A",
                ),
                kit.prom(
                    f"quantile by ({names.OP}) (0.5, {_bytes_per_call(s)})",
                    OP_LEGEND + " median rank",
                    "B",
                ),
                kit.prom(
                    f"max by ({names.OP}) ({_bytes_per_call(s)})", OP_LEGEND + " largest rank", "C"
                ),
            ],
            unit="bytes",
            log_scale=True,
        )
    )
    board.with_panel(
        kit.series(
            "Algorithm bandwidth by op against the link peak",
            "Bytes moved per second of collective time (bytes / duration sums, per op); the "
            "dashed line is $link_peak_gbps GB/s. Bus bandwidth for all_reduce is 2(n-1)/n of it.",
            [
                kit.prom(
                    f"sum by ({names.OP}) ({kit.rate(names.COLLECTIVE_BYTES, s)})"
                    f" / sum by ({names.OP}) ({kit.rate(names.COLLECTIVE + '_sum', s)})",
                    OP_LEGEND,
                    "A",
                ),
                kit.prom("vector($link_peak_gbps * 1e9)", "link peak", "B"),
            ],
            unit="Bps",
        ).override_by_name(
            "link peak",
            [
                model.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                model.DynamicConfigValue(
                    id_val="color", value={"mode": "fixed", "fixedColor": "red"}
                ),
            ],
        )
    )
    board.with_panel(
        kit.series(
            "Bus bandwidth per span: p10 and p50 by op (Tempo)",
            "training.collective.bus_bandwidth_gbps of every training.collective span (nccl-tests busbw "
            "convention), to hold against the link peak.",
            [
                kit.traceql_metrics(
                    f"{{ {SPAN_FILTER} }} | quantile_over_time(span.{names.ATTR_COLLECTIVE_BUS_BW}, 0.1, 0.5)"
                    f" by (span.{names.ATTR_COLLECTIVE_OP})"
                )
            ],
            unit="none",
        ).datasource(kit.TEMPO)
    )


def _bytes_per_call(selector: str) -> str:
    return (
        f"sum by ({names.OP}, {names.RANK}) ({kit.rate(names.COLLECTIVE_BYTES, selector)})"
        f" / sum by ({names.OP}, {names.RANK}) ({kit.rate(names.COLLECTIVE + '_count', selector)})"
    )


def _stalls(board: dash.Dashboard) -> None:
    s = kit.sel(BACKEND_MATCH)
    board.with_row(dash.Row("Stalls"))
    board.with_panel(
        kit.series(
            "Tail amplification by op: p99 / p50",
            "A healthy collective has a tight distribution; a p99 many times its p50 means "
            "some calls stall (a late rank, a congested link, a hung peer).",
            [
                kit.prom(
                    f"{kit.quantile(0.99, names.COLLECTIVE, s, by=(names.OP,))} / {kit.quantile(0.5, names.COLLECTIVE, s, by=(names.OP,))}",
                    OP_LEGEND,
                )
            ],
            unit="none",
        )
    )
    board.with_panel(
        kit.data_table(
            "Stalled collectives (Tempo): slower than $stall_threshold",
            "training.collective spans over the threshold; the trace shows which rank arrived late.",
            [
                kit.traceql(
                    f"{{ {SPAN_FILTER} && duration > $stall_threshold }}"
                    f" | select(span.{names.ATTR_COLLECTIVE_OP}, span.{names.ATTR_RANK}, span.{names.ATTR_COLLECTIVE_BYTES})"
                )
            ],
            datasource=kit.TEMPO,
        )
    )


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Collectives",
        "Collective latency percentiles by op, message-size distribution, bus bandwidth "
        "against the link's peak, and stalls.",
    )
    _variables(board)
    _latency(board)
    _sizes_and_bandwidth(board)
    _stalls(board)
    return board
