"""Ranks and stragglers: which rank is slow, since when, and is it starved or throttled?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from . import kit, names

UID = "otel-train-ranks"

RANK_LEGEND = "rank {{" + names.RANK + "}}"


def _stragglers(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Per-rank step time"))
    board.with_panel(
        kit.rank_heatmap(
            "Per-rank step time p50 (one row per rank)",
            "Each row is a rank, each cell its median step time in the interval: a straggler "
            "is a hot row, a cluster-wide slowdown a hot column.",
            kit.prom(kit.per_rank_quantile(0.5, names.STEP, s), RANK_LEGEND),
        )
    )
    board.with_panel(
        kit.series(
            "Straggler skew: slowest rank / median rank",
            "max over ranks of the per-rank p50 step time divided by the median rank's p50 "
            "(1.0 = balanced); p99 alongside catches intermittent stalls.",
            [
                kit.prom(kit.skew(0.5, names.STEP, s), "skew of p50", "A"),
                kit.prom(kit.skew(0.99, names.STEP, s), "skew of p99", "B"),
            ],
            unit="none",
        )
    )
    board.with_panel(
        kit.series(
            "Others wait for this rank (share of step)",
            "In synchronous training (DDP, FSDP) every rank's step lasts as long as the "
            "slowest one's, so step time cannot name the straggler; waiting can. Per rank: the "
            "run's median rank's collective seconds per step minus this rank's, over the median "
            "step time (training_run_rank:collective_wait_caused:share_of_step5m, 5 min). The "
            "straggler arrives last and hardly waits: its line is the highest. Above the "
            f"{names.WAIT_CAUSED_LIMIT:.0%} line for 10 minutes TrainingStragglerRank fires "
            '(straggler_signal="collective_wait"); below zero is a rank that waits more than '
            "the median.",
            [kit.prom(kit.gauge(names.WAIT_CAUSED, s), RANK_LEGEND)],
            unit="percentunit",
            threshold=names.WAIT_CAUSED_LIMIT,
        )
    )
    board.with_panel(
        kit.series(
            "Collective seconds per step",
            "Seconds each rank spends inside collectives per step, all ops together "
            "(training_run_rank:collective_duration_seconds:per_step5m, 5 min): the victims of "
            "a straggler wait here, the straggler's own line is the lowest.",
            [kit.prom(kit.gauge(names.COLLECTIVE_PER_STEP, s), RANK_LEGEND)],
        )
    )
    board.with_panel(
        kit.series(
            "Arrives after the earliest rank (seconds per step)",
            "How much later each rank reaches its collectives than the earliest rank, per "
            "step (training_run_rank:collective_arrival_lag_seconds:per_step5m, 5 min): every "
            "rank leaves a synchronous collective at about the same time, so the longest "
            "collective time in the run less this rank's is how much later it arrived. The "
            "straggler's line is the highest, the earliest rank sits at 0. otel-train report "
            "measures the same per collective from the spans (which rank arrived last at "
            "which all_gather, by how much).",
            [kit.prom(kit.gauge(names.ARRIVAL_LAG, s), RANK_LEGEND)],
        )
    )
    board.with_panel(
        kit.series(
            "Per-rank p99 step time",
            "Every rank's own p99; the slowest line is the straggler.",
            [kit.prom(kit.per_rank_quantile(0.99, names.STEP, s), RANK_LEGEND)],
            width=12,
        )
    )
    board.with_panel(
        kit.data_table(
            "Slowest ranks over the selected range",
            "Top 10 ranks by p99 step time over the whole range, with their p50, data-wait "
            "p99 and CPU-throttled seconds per second.",
            [
                kit.prom(
                    f"topk(10, {kit.per_rank_quantile(0.99, names.STEP, s, '$__range')})",
                    "",
                    "A",
                    instant=True,
                    table_format=True,
                ),
                kit.prom(
                    kit.per_rank_quantile(0.5, names.STEP, s, "$__range"),
                    "",
                    "B",
                    instant=True,
                    table_format=True,
                ),
                kit.prom(
                    kit.per_rank_quantile(
                        0.99,
                        names.PHASE_DURATION,
                        kit.sel(f'{names.PHASE}="data_wait"'),
                        "$__range",
                    ),
                    "",
                    "C",
                    instant=True,
                    table_format=True,
                ),
                kit.prom(
                    f"sum by ({names.RANK}) ({kit.rate(names.CPU_THROTTLED, s, '$__range')})",
                    "",
                    "D",
                    instant=True,
                    table_format=True,
                ),
            ],
            merge=True,
        )
    )
    board.with_panel(
        kit.data_table(
            "Where each rank's step time goes over the range (share per part)",
            "One row per rank, one column per part of its step time "
            "(training_step_time_seconds_total by training_part, over the selected range, "
            "divided by the rank's step seconds): the parts are disjoint, so a row adds up to "
            "100%. The straggler's own time goes to data_wait or host_busy; the ranks that wait "
            "for it show it as exposed_comm or device_wait.",
            [
                kit.prom(
                    f"sum by ({names.RANK}, {names.PART}) ({kit.rate(names.STEP_TIME, s, '$__range')})"
                    f" / ignoring({names.PART}) group_left"
                    f" sum by ({names.RANK}) ({kit.rate(names.STEP + '_sum', s, '$__range')})",
                    "",
                    instant=True,
                    table_format=True,
                )
            ],
            unit="percentunit",
            width=24,
            matrix=(names.RANK, names.PART),
        )
    )


def _starved_or_throttled(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Is the slow rank starved (data wait) or throttled (CPU)?"))
    board.with_panel(
        kit.series(
            "Per-rank data wait p90",
            "Time blocked on the next batch, per rank: a rank whose DataLoader workers are "
            "throttled or too few shows here first.",
            [
                kit.prom(
                    kit.per_rank_quantile(
                        0.9, names.PHASE_DURATION, kit.sel(f'{names.PHASE}="data_wait"')
                    ),
                    RANK_LEGEND,
                )
            ],
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "Per-rank CPU throttling (cgroup cpu.stat)",
            "Seconds throttled per second, from each rank's own cgroup "
            "(training_cpu_throttled_time_seconds_total).",
            [kit.prom(f"sum by ({names.RANK}) ({kit.rate(names.CPU_THROTTLED, s)})", RANK_LEGEND)],
            unit="percentunit",
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "Throttled CFS periods by pod (cAdvisor)",
            "container_cpu_cfs_throttled_periods_total / container_cpu_cfs_periods_total per "
            "pod of the selected namespace: the signal the throttling alert fires on.",
            [
                kit.prom(
                    f'sum by (namespace, pod) (rate({names.CADVISOR_THROTTLED}{{namespace=~"$namespace", pod=~"$pod", container!=""}}[$__rate_interval]))'
                    f' / sum by (namespace, pod) (rate({names.CADVISOR_PERIODS}{{namespace=~"$namespace", pod=~"$pod", container!=""}}[$__rate_interval]))',
                    "{{pod}}",
                )
            ],
            unit="percentunit",
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "Per-rank exposed communication p90",
            "Communication not hidden under compute, per rank: the victim of a straggler waits "
            "here, in its collectives.",
            [
                kit.prom(
                    kit.per_rank_quantile(
                        0.9, names.PHASE_DURATION, kit.sel(f'{names.PHASE}="exposed_comm"')
                    ),
                    RANK_LEGEND,
                )
            ],
        )
    )
    board.with_panel(
        kit.series(
            "Per-rank peak allocated memory",
            "training_memory_peak_allocated_bytes per rank.",
            [kit.prom(f"max by ({names.RANK}) ({kit.gauge(names.MEMORY_PEAK, s)})", RANK_LEGEND)],
            unit="bytes",
        )
    )


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Ranks and stragglers",
        "Per-rank step-time heatmap, max/median skew, the collective wait each rank causes "
        "the others, the slowest ranks, each rank's step time by part, and per-rank data wait "
        "against CPU throttling.",
    )
    for variable in kit.kubernetes_variables():
        board.with_variable(variable)
    _stragglers(board)
    _starved_or_throttled(board)
    return board
