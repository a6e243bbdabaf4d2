"""Training attribution: why was this step slow, and where did the time go?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from . import kit, names

UID = "otel-train-attribution"


def _step_time(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Step time: distribution, not the mean"))
    board.with_panel(
        kit.bucket_heatmap(
            "Step time distribution (click an exemplar to open the step's trace)",
            "Increase of training_step_duration_seconds buckets per interval, all selected "
            "ranks. Exemplars are sampled steps: each opens the step's trace in Tempo "
            "(trace_id exemplar label, linked by the Prometheus data source).",
            kit.prom(
                kit.bucket_increase(names.STEP, s),
                legend="{{le}}",
                exemplar=True,
                heatmap_format=True,
            ),
        )
    )
    board.with_panel(
        kit.series(
            "Step time percentiles, and the slowest rank",
            "p50/p90/p99 of step time over the selected ranks, and the slowest rank's own "
            "p99: when that line leaves the p99 of all ranks, one rank is the straggler.",
            [
                kit.prom(kit.quantile(0.5, names.STEP, s), "p50", "A"),
                kit.prom(kit.quantile(0.9, names.STEP, s), "p90", "B"),
                kit.prom(kit.quantile(0.99, names.STEP, s), "p99", "C", exemplar=True),
                kit.prom(
                    f"max({kit.per_rank_quantile(0.99, names.STEP, s)})", "slowest rank p99", "D"
                ),
            ],
        )
    )


def _breakdown(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(
        dash.Row(
            "Where the time goes: data wait, forward, backward, optimizer, exposed comm, compile"
        )
    )
    board.with_panel(
        kit.series(
            "Step-time breakdown: share of wall time per phase",
            "Seconds spent in each phase per second of wall time, summed over selected "
            "ranks and divided by the ranks' step seconds: a share of total time, so a "
            "growing data_wait or exposed_comm band is the attribution.",
            [
                kit.prom(
                    f"sum by ({names.PHASE}) ({kit.rate(names.PHASE_DURATION + '_sum', s)})"
                    f" / ignoring({names.PHASE}) group_left"
                    f" sum({kit.rate(names.STEP + '_sum', s)})",
                    "{{" + names.PHASE + "}}",
                )
            ],
            unit="percentunit",
            stacked=True,
        )
    )
    board.with_panel(
        kit.series(
            "Phase p90 by phase",
            "p90 of training_phase_duration_seconds per phase across selected ranks.",
            [
                kit.prom(
                    kit.quantile(0.9, names.PHASE_DURATION, s, by=(names.PHASE,)),
                    "{{" + names.PHASE + "}} p90",
                )
            ],
            log_scale=True,
        )
    )
    board.with_panel(
        kit.series(
            "Phase p99: slowest rank against the median rank",
            "Per phase, the slowest rank's p99 and the median rank's p99: the gap is what a "
            "mean would hide.",
            [
                kit.prom(
                    f"max by ({names.PHASE}) ({kit.quantile(0.99, names.PHASE_DURATION, s, by=(names.PHASE, names.RANK))})",
                    "{{" + names.PHASE + "}} slowest rank",
                    "A",
                ),
                kit.prom(
                    f"quantile by ({names.PHASE}) (0.5, {kit.quantile(0.99, names.PHASE_DURATION, s, by=(names.PHASE, names.RANK))})",
                    "{{" + names.PHASE + "}} median rank",
                    "B",
                ),
            ],
            width=24,
            log_scale=True,
        )
    )
    per_rank_step = f"sum by ({names.RANK}) ({kit.rate(names.STEP + '_sum', s)})"
    per_rank_phases = f"sum by ({names.RANK}) ({kit.rate(names.PHASE_DURATION + '_sum', s)})"

    def part(name: str) -> str:
        selector = kit.sel(f'{names.UNTIMED_PART}="{name}"')
        return f"sum by ({names.RANK}) ({kit.rate(names.UNTIMED, selector)})"

    board.with_panel(
        kit.series(
            "Untimed time per rank: host blocked on the device, host busy, not explained",
            "The time outside every phase, as a share of each rank's step time, split "
            "(training_untimed_time_seconds_total by training_untimed_part): blocked on the "
            "device is a host waiting for its GPU, which was still running earlier work (on "
            "NCCL, a collective waiting for a late rank: the report names that rank and its "
            "line); host busy is user code while the device had caught up (its line is in "
            "the rank_step span's training.gap events); not explained is what no phase or "
            "part holds. A rank whose host-busy band rises while the others' blocked band "
            "rises with it is the straggler.",
            [
                # a CPU run never blocks on a device: 0, not an empty panel
                kit.prom(f"({part('device_wait')} or {part('host_busy')} * 0) / {per_rank_step}",
                         "rank {{" + names.RANK + "}} blocked on device", "A"),
                kit.prom(f"{part('host_busy')} / {per_rank_step}",
                         "rank {{" + names.RANK + "}} host busy", "B"),
                kit.prom(
                    f"clamp_min(1 - ({per_rank_phases} + ({part('device_wait')} or "
                    f"{part('host_busy')} * 0) + {part('host_busy')}) / {per_rank_step}, 0)",
                    "rank {{" + names.RANK + "}} not explained", "C"),
            ],
            unit="percentunit",
            width=24,
        )
    )
    board.with_panel(
        kit.series(
            "CPU throttling: share of each rank's step time (a cause, not a phase)",
            "Seconds each rank's own cgroup was CPU-throttled (cpu.stat, CFS quota) per second "
            "of its step time. A throttled rank runs late into every collective, so the "
            "others wait: the report names it as the cause of its slow steps and the "
            "TrainingRankCPUThrottled alert fires above 25% for 10 minutes.",
            [
                kit.prom(
                    f"sum by ({names.RANK}) ({kit.rate(names.CPU_THROTTLED, s)})"
                    f" / sum by ({names.RANK}) ({kit.rate(names.STEP + '_sum', s)})",
                    "rank {{" + names.RANK + "}}",
                )
            ],
            unit="percentunit",
            width=24,
            threshold=0.25,
        )
    )


def _efficiency(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(dash.Row("Throughput and efficiency"))
    board.with_panel(
        kit.series(
            "Throughput",
            "Samples and tokens per second, summed over the selected ranks.",
            [
                kit.prom(f"sum({kit.rate(names.SAMPLES, s)})", "samples/s", "A"),
                kit.prom(f"sum({kit.rate(names.TOKENS, s)})", "tokens/s", "B"),
            ],
            unit="short",
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "MFU: worst, median and best rank",
            "Model FLOPs utilisation (training_mfu_ratio) where FLOPs per step are known.",
            [
                kit.prom(f"min({kit.gauge(names.MFU, s)})", "worst rank", "A"),
                kit.prom(f"quantile(0.5, {kit.gauge(names.MFU, s)})", "median rank", "B"),
                kit.prom(f"max({kit.gauge(names.MFU, s)})", "best rank", "C"),
            ],
            unit="percentunit",
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "Communication overlap: worst and median rank",
            "Fraction of communication hidden under computation (training_comm_overlap_ratio); "
            "the worst rank is the one exposing its collectives.",
            [
                kit.prom(f"min({kit.gauge(names.COMM_OVERLAP, s)})", "worst rank", "A"),
                kit.prom(f"quantile(0.5, {kit.gauge(names.COMM_OVERLAP, s)})", "median rank", "B"),
            ],
            unit="percentunit",
            width=8,
        )
    )
    board.with_panel(
        kit.series(
            "Peak allocated and reserved memory: largest and median rank",
            "Allocator statistics per rank; a rank far above the median is an imbalanced shard.",
            [
                kit.prom(
                    f"max({kit.gauge(names.MEMORY_PEAK, s)})", "peak allocated, largest rank", "A"
                ),
                kit.prom(
                    f"quantile(0.5, {kit.gauge(names.MEMORY_PEAK, s)})",
                    "peak allocated, median rank",
                    "B",
                ),
                kit.prom(
                    f"max({kit.gauge(names.MEMORY_RESERVED, s)})", "reserved, largest rank", "C"
                ),
            ],
            unit="bytes",
            width=24,
        )
    )


def _traces_and_logs(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("From the symptom to the trace and the log line"))
    board.with_panel(
        kit.data_table(
            "Slowest sampled steps (Tempo)",
            "train.step root spans of the run, slowest first; a trace id opens the step's "
            "trace: every rank's rank_step, phases and collectives.",
            [
                kit.traceql(
                    f'{{ name = "{names.SPAN_STEP}" && span.{names.ATTR_RUN_ID} = "$run_id" }}'
                    f" | select(span.{names.ATTR_STEP}, duration)"
                )
            ],
            datasource=kit.TEMPO,
        )
    )
    board.with_panel(
        kit.log_panel(
            "Logs of the selected run and ranks (trace_id opens the trace)",
            "Log records in the context of their step (trace_id, span_id) carrying "
            "training.run.id, training.rank and training.step (in Loki: training_run_id, ...); "
            "the Loki data source turns trace_id into a Tempo link.",
            kit.logql(
                f'{{service_name="$service"}} | {names.LOG_RUN_ID}=~"$run_id" | {names.LOG_RANK}=~"$rank"'
            ),
            width=12,
        )
    )


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Training attribution",
        "Step time as a distribution with exemplars into the step's trace, the breakdown "
        "by phase, throughput, MFU, memory and communication overlap.",
    )
    board.with_variable(kit.service_variable())
    _step_time(board)
    _breakdown(board)
    _efficiency(board)
    _traces_and_logs(board)
    return board
