"""Training attribution: why was this step slow, and where did the time go?"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from . import kit, names

UID = "otel-train-attribution"
#: the display name of a trace's duration in Tempo's search results (Grafana's Tempo data
#: source: field traceDuration, displayNameFromDS "Duration", in milliseconds)
TEMPO_DURATION = "Duration"
#: traces the slowest-steps table asks Tempo for (its search returns matches, not the slowest)
SLOWEST_LIMIT = 100


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


def part_share() -> str:
    """Each part's share of the selected ranks' step time: the parts are disjoint and add up
    to the step time (training_step_time_seconds_total by training_part; its sum over parts is
    the step histogram's sum). Divided by the parts' own total, not by the histogram's sum:
    a part's series begins when it first holds time, and rate() extrapolates a young series
    differently, so over a short window the two totals can differ by a percent; over the
    parts' total the shares add up to 100% at every instant."""
    s = kit.sel()
    return (
        f"sum by ({names.PART}) ({kit.rate(names.STEP_TIME, s)})"
        f" / ignoring({names.PART}) group_left"
        f" sum({kit.rate(names.STEP_TIME, s)})"
    )


def per_rank_part(part: str, window: str = "$__rate_interval") -> str:
    """A rank's seconds per second in one part; 0 (not absent) where the rank reports parts
    but not this one (a CPU run never blocks on a device)."""
    selector = kit.sel(f'{names.PART}="{part}"')
    return (
        f"(sum by ({names.RANK}) ({kit.rate(names.STEP_TIME, selector, window)})"
        f" or sum by ({names.RANK}) ({kit.rate(names.STEP_TIME, kit.sel(), window)}) * 0)"
    )


def _breakdown(board: dash.Dashboard) -> None:
    s = kit.sel()
    board.with_row(
        dash.Row(
            "Where the time goes: data wait, forward, backward, optimizer, exposed comm, "
            "compile, and the time outside the phases"
        )
    )
    board.with_panel(
        kit.series(
            "Step-time breakdown: share of step time per part (adds up to 100%)",
            "Each step's wall time is split into disjoint parts (training_step_time_seconds_total "
            "by training_part): data_wait, forward, backward, optimizer (the compute phases' own "
            "time, less the exposed communication and compile inside them), exposed_comm, "
            "compile, device_wait (the host blocked on its device), gpu_outside_phases (blocked "
            "while its device ran work queued outside the phases: a loss, metrics, clipping), "
            "host_busy (the host's own work outside the phases) and not_explained (what nothing "
            "holds). Seconds per part "
            "per second, summed over the selected ranks and divided by their sum over parts (their "
            "step seconds): the bands add up to 100%, so a growing data_wait or exposed_comm band is the "
            "attribution.",
            [kit.prom(part_share(), "{{" + names.PART + "}}")],
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
    rank = "rank {{" + names.RANK + "}}"
    board.with_panel(
        kit.series(
            "Outside the phases per rank: host blocked on the device, GPU work outside the "
            "phases, host busy, not explained",
            "The parts of each rank's step time outside every phase, as shares of its step "
            "time (training_step_time_seconds_total, training_part device_wait, "
            "gpu_outside_phases, host_busy and not_explained): blocked on the device is a host "
            "waiting for its GPU, which was still running earlier work (on NCCL, a collective "
            "waiting for a late rank: the report names that rank and its line); GPU work "
            "outside the phases is a host waiting for kernels queued between the phases (a "
            "loss, metrics, clipping, an EMA: the report names the stretch and, where sampled, "
            "the line); host busy is user code while the device had "
            "caught up (its line is in the rank_step span's training.gap events); not explained "
            "is the time no phase or part holds. A rank whose host-busy band rises while the "
            "others' blocked band rises with it is the straggler.",
            [
                kit.prom(f"{per_rank_part(names.PART_DEVICE_WAIT)} / {per_rank_step}",
                         f"{rank} blocked on device", "A"),
                kit.prom(f"{per_rank_part(names.PART_GPU_OUTSIDE_PHASES)} / {per_rank_step}",
                         f"{rank} GPU work outside the phases", "D"),
                kit.prom(f"{per_rank_part(names.PART_HOST_BUSY)} / {per_rank_step}",
                         f"{rank} host busy", "B"),
                kit.prom(f"{per_rank_part(names.PART_NOT_EXPLAINED)} / {per_rank_step}",
                         f"{rank} not explained", "C"),
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
        kit.single_stat(
            "Throughput over the selected range (samples/s, tokens/s)",
            "Samples and tokens per second as users quote them: the increase of "
            "training_samples_total and training_tokens_total over the dashboard's time range "
            "divided by its length, summed over the selected ranks. It excludes nothing (a "
            "range that holds the start-up, a checkpoint or an evaluation counts them); over a "
            "steady stretch of the run it is the steady-state throughput.",
            [
                kit.prom(f"sum({kit.rate(names.SAMPLES, s, '$__range')})", "samples/s", "A",
                         instant=True),
                kit.prom(f"sum({kit.rate(names.TOKENS, s, '$__range')})", "tokens/s", "B",
                         instant=True),
            ],
            unit="short",
            width=6,
            height=8,
        )
    )
    board.with_panel(
        kit.series(
            "Throughput (samples/s and tokens/s, over the rate window)",
            "Samples and tokens per second over the rate window, summed over the selected "
            "ranks: dips are the steps that were slow, stalls and checkpoints.",
            [
                kit.prom(f"sum({kit.rate(names.SAMPLES, s)})", "samples/s", "A"),
                kit.prom(f"sum({kit.rate(names.TOKENS, s)})", "tokens/s", "B"),
            ],
            unit="short",
            width=10,
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
            width=16,
        )
    )


def goodput_ratio(by: str = names.RUN) -> str:
    """Productive time over all of the ranks' time since they started (the goodput buckets
    add up to each rank's time from its start to its last step's end), per ``by``."""
    s = kit.sel()
    productive = kit.sel(f'{names.BUCKET}="{names.GOODPUT_PRODUCTIVE}"')
    return (
        f"sum by ({by}) ({kit.gauge(names.GOODPUT, productive)})"
        f" / sum by ({by}) ({kit.gauge(names.GOODPUT, s)})"
    )


def bucket_share() -> str:
    """Each goodput bucket's share of the selected ranks' time over the rate window."""
    s = kit.sel()
    return (
        f"sum by ({names.BUCKET}) ({kit.rate(names.GOODPUT, s)})"
        f" / ignoring({names.BUCKET}) group_left sum({kit.rate(names.GOODPUT, s)})"
    )


def _goodput(board: dash.Dashboard) -> None:
    s = kit.sel()
    buckets = ", ".join(names.GOODPUT_BUCKETS[1:])
    board.with_row(dash.Row("Goodput: productive time against the losses"))
    board.with_panel(
        kit.single_stat(
            "Goodput per run (productive share of the ranks' time since start)",
            "training_goodput_time_seconds_total: each rank's time from its start to its last "
            "step's end, split into productive (the compute parts of steady steps) and the "
            f"named losses ({buckets}). Productive over all buckets, summed over the selected "
            "ranks: the run's goodput so far, start-up and warm-up included.",
            [kit.prom(goodput_ratio(), "run {{" + names.RUN + "}}", instant=True)],
            unit="percentunit",
            width=6,
            height=8,
            steps=((None, "red"), (0.5, "orange"), (0.8, "green")),
        )
    )
    board.with_panel(
        kit.series(
            "Goodput buckets: share of the ranks' time (over the rate window)",
            "Seconds per goodput bucket per second, over the selected ranks, divided by all "
            "buckets' seconds: the bands add up to 100%. startup is the ranks' start to their "
            "first step; compile and warmup the first steps; between_steps the time between "
            "one step's end and the next one's start (evaluation, checkpoints outside the "
            "step); checkpoint the regions named checkpoint (otel_train.region); "
            "outside_phases the steady steps' host work, the GPU work queued outside the "
            "phases, the other regions and unexplained time.",
            [kit.prom(bucket_share(), "{{" + names.BUCKET + "}}")],
            unit="percentunit",
            width=18,
            stacked=True,
        )
    )
    board.with_panel(
        kit.data_table(
            "Goodput per rank: share of each rank's time by bucket (since start)",
            "One row per rank, one column per goodput bucket: the bucket's share of the rank's "
            "time since it started (training_goodput_time_seconds_total). The productive "
            "column is the rank's goodput; a rank with a larger startup or between_steps share "
            "than the others started late or does work the others do not (rank 0's "
            "checkpoints).",
            [
                kit.prom(
                    f"sum by ({names.RANK}, {names.BUCKET}) ({kit.gauge(names.GOODPUT, s)})"
                    f" / ignoring({names.BUCKET}) group_left"
                    f" sum by ({names.RANK}) ({kit.gauge(names.GOODPUT, s)})",
                    "",
                    instant=True,
                    table_format=True,
                )
            ],
            unit="percentunit",
            width=24,
            matrix=(names.RANK, names.BUCKET),
        )
    )


def _traces_and_logs(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("From the symptom to the trace and the log line"))
    board.with_panel(
        kit.data_table(
            "Slowest sampled steps (Tempo)",
            f"training.step root spans of the run, slowest first: the {SLOWEST_LIMIT} traces "
            "Tempo's search returns, sorted by duration (TraceQL has no order by: a sortBy "
            "transformation and the table's sort do it). A trace id opens the step's trace: "
            "every rank's rank_step, phases and collectives.",
            [
                kit.traceql(
                    f'{{ name = "{names.SPAN_STEP}" && span.{names.ATTR_RUN_ID} = "$run_id" }}'
                    f" | select(span.{names.ATTR_STEP}, duration)",
                    limit=SLOWEST_LIMIT,
                )
            ],
            datasource=kit.TEMPO,
            sort_desc=TEMPO_DURATION,
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
        "Step time as a distribution with exemplars into the step's trace, its breakdown "
        "into disjoint parts that add up to 100%, throughput, MFU, memory, communication "
        "overlap and goodput.",
    )
    board.with_variable(kit.service_variable())
    _step_time(board)
    _breakdown(board)
    _efficiency(board)
    _goodput(board)
    _traces_and_logs(board)
    return board
