"""Production readiness: the attribution checklist of docs/design.md as live pass/fail panels.

One row per checklist item. Each verdict is computed from live data: a PromQL ``>bool``
check (1 = PASS, 0 = FAIL, mapped to words), or a count of Tempo / Loki results that must
be zero. Every panel links to the dashboard that shows the evidence.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as model

from . import attribution, collectives, compile_health, kit, names, ranks

UID = "otel-train-checklist"

#: alert names read from ALERTS{alertname=...}: the kubernetes-mixin's cAdvisor throttling alert
#: (kube-prometheus-stack's, or prometheus/kubernetes-mixin.yml) and prometheus/rules.yml's
ALERT_THROTTLING = "CPUThrottlingHigh"
ALERT_STRAGGLER = "TrainingStragglerRank"
ALERT_NAMES = (ALERT_THROTTLING, ALERT_STRAGGLER)
#: straggler skew (slowest rank's p50 / median rank's p50) above which item 7 fails
SKEW_LIMIT = 1.25
#: share of a step the other ranks lose waiting for one rank above which item 7 fails
WAIT_LIMIT = names.WAIT_CAUSED_LIMIT

RUN = kit.sel(rank=False)
RUN_SPANS = f'span.{names.ATTR_RUN_ID} = "$run_id"'
RUN_LOGS = f'{{service_name="$service"}} | {names.LOG_RUN_ID}=~"$run_id"'


def _evidence(uid: str, title: str) -> dash.DashboardLink:
    return kit.link(title, kit.dashboard_url(uid))


def _zero_results(title: str, description: str, query, datasource, links, width: int = 8):
    """A stat that counts rows of a Tempo search: 0 rows = PASS."""
    return (
        kit.single_stat(
            title,
            description + " PASS when zero.",
            [query],
            width=width,
            steps=((None, "green"), (1, "red")),
            links=links,
            datasource=datasource,
        )
        .reduce_options(
            kit.common_builders.ReduceDataOptions()
            .calcs(["count"])
            .fields("/^traceID$/")
            .values(False)
        )
        .no_value("0")
    )


def _item_traces(board: dash.Dashboard) -> None:
    board.with_row(
        dash.Row("1. Every step of every rank lives in a trace (entry points inject trace context)")
    )
    board.with_panel(
        kit.single_stat(
            "Ranks reporting steps",
            "Distinct training_rank values with step-time series in the run: the world size "
            "the trace checks compare against.",
            [
                kit.prom(
                    f"count(count by ({names.RANK}) ({kit.either(names.STEP, 'count', RUN)}))",
                    "ranks",
                    instant=True,
                )
            ],
            links=[_evidence(ranks.UID, "Ranks and stragglers")],
        )
    )
    board.with_panel(
        _zero_results(
            "Sampled steps missing a rank's span",
            "Traces of the run whose training.rank_step spans number fewer than the ranks "
            "reporting steps: a rank whose step did not join the shared trace.",
            kit.traceql(
                f'{{ name = "{names.SPAN_RANK_STEP}" && {RUN_SPANS} }} | count() < $world_size',
                limit=100,
            ),
            kit.TEMPO,
            [_evidence(attribution.UID, "Training attribution: slowest sampled steps")],
        )
    )
    board.with_panel(
        kit.data_table(
            "Evidence: sampled steps of the run (Tempo)",
            "training.step roots; each trace holds one training.rank_step per rank.",
            [kit.traceql(f'{{ name = "{names.SPAN_STEP}" && {RUN_SPANS} }}', limit=20)],
            datasource=kit.TEMPO,
            width=10,
            height=5,
        )
    )


def _item_exemplars(board: dash.Dashboard) -> None:
    board.with_row(
        dash.Row("2. Slow collectives and batch fetches resolve to their spans (exemplars)")
    )
    board.with_panel(
        kit.pass_fail(
            "Exemplars stored",
            "Prometheus holds exemplars (exemplar storage on, and the step, phase and "
            "collective histograms carry trace_id exemplars). Needs Prometheus to scrape itself.",
            kit.prom(
                "(sum(prometheus_tsdb_exemplar_exemplars_in_storage) > bool 0) or vector(0)",
                "stored",
                instant=True,
            ),
            [_evidence(attribution.UID, "Step time heatmap with exemplars")],
        )
    )
    board.with_panel(
        kit.series(
            "Evidence: data-wait and collective p99 with exemplars (click one: it must open a trace)",
            "Exemplar dots on these lines are sampled steps; a dot that opens a trace proves "
            "the chain metric -> trace -> span.",
            [
                kit.prom(
                    kit.quantile(0.99, names.PHASE_DURATION, kit.sel(f'{names.PHASE}="data_wait"')),
                    "data_wait p99",
                    "A",
                    exemplar=True,
                ),
                kit.prom(
                    kit.quantile(0.99, names.COLLECTIVE, kit.sel()),
                    "collective p99",
                    "B",
                    exemplar=True,
                ),
            ],
            width=18,
            height=5,
        ).links([_evidence(collectives.UID, "Collectives")])
    )


def _item_throttling(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("3. Container CPU throttling reaches the alert channel"))
    board.with_panel(
        kit.pass_fail(
            "Throttling alert rules loaded",
            "prometheus/rules.yml is loaded: Prometheus reports rules in a group matching "
            "$rule_group (Prometheus self-scrape).",
            kit.prom(
                '(sum(prometheus_rule_group_rules{rule_group=~"$rule_group"}) > bool 0) or vector(0)',
                "loaded",
                instant=True,
            ),
            [_evidence(ranks.UID, "Ranks and stragglers: throttling")],
        )
    )
    board.with_panel(
        kit.pass_fail(
            "cAdvisor throttling series present",
            "container_cpu_cfs_throttled_periods_total exists for the training pods: the "
            "alert has something to fire on.",
            kit.prom(
                f'(count({names.CADVISOR_THROTTLED}{{namespace=~"$namespace"}}) > bool 0) or vector(0)',
                "present",
                instant=True,
            ),
            [_evidence(ranks.UID, "Ranks and stragglers: throttled periods by pod")],
        )
    )
    board.with_panel(
        kit.pass_fail(
            "Per-rank cgroup throttling measured",
            "training_cpu_throttled_time_seconds_total is reported by the run's ranks.",
            kit.prom(
                f"(count({kit.gauge(names.CPU_THROTTLED, RUN)}) > bool 0) or vector(0)",
                "measured",
                instant=True,
            ),
            [_evidence(ranks.UID, "Ranks and stragglers: per-rank throttling")],
        )
    )
    board.with_panel(
        kit.single_stat(
            "Throttling alert state",
            f'ALERTS{{alertname="{ALERT_THROTTLING}"}} in the training namespace (the '
            "kubernetes-mixin's alert): 0 = inactive, 1 = pending, 2 = firing.",
            [
                kit.prom(
                    f'max(2 * (ALERTS{{alertname="{ALERT_THROTTLING}", namespace=~"$namespace", alertstate="firing"}} == 1)'
                    f' or (ALERTS{{alertname="{ALERT_THROTTLING}", namespace=~"$namespace", alertstate="pending"}} == 1)) or vector(0)',
                    "state",
                    instant=True,
                )
            ],
            steps=((None, "green"), (1, "orange"), (2, "red")),
            links=[_evidence(ranks.UID, "Ranks and stragglers")],
        ).mappings(_ALERT_STATES)
    )


_ALERT_STATES = [
    model.ValueMap(
        options={
            "0": model.ValueMappingResult(text="inactive", color="green", index=0),
            "1": model.ValueMappingResult(text="pending", color="orange", index=1),
            "2": model.ValueMappingResult(text="FIRING", color="red", index=2),
        }
    )
]


def _item_launcher(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("4. The launcher's context flows into every rank (TRACEPARENT)"))
    board.with_panel(
        _zero_results(
            "Rank run spans without the launcher's parent",
            "training.run spans of the run that are the root of their trace: the rank did not "
            "receive the launcher's TRACEPARENT (a run started without a launcher span fails here).",
            kit.traceql(
                f'{{ name = "{names.SPAN_RUN}" && {RUN_SPANS} && trace:rootName = "{names.SPAN_RUN}" }}',
                limit=100,
            ),
            kit.TEMPO,
            [_evidence(attribution.UID, "Training attribution")],
            width=12,
        )
    )
    board.with_panel(
        kit.data_table(
            "Evidence: rank run spans and their parents (Tempo)",
            "training.run spans with a parent: one per rank, under the launcher's span.",
            [kit.traceql(f'{{ }} > {{ name = "{names.SPAN_RUN}" && {RUN_SPANS} }}', limit=50)],
            datasource=kit.TEMPO,
            width=12,
            height=5,
        )
    )


def _item_sampling(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("5. Every rank makes the same sampling decision for a step"))
    board.with_panel(
        _zero_results(
            "Sampled steps whose span count differs from the world size",
            "Traces of the run where the number of training.rank_step spans is not $world_size: "
            "ranks sampled the step differently (or the tail sampler split it).",
            kit.traceql(
                f'{{ name = "{names.SPAN_RANK_STEP}" && {RUN_SPANS} }} | count() != $world_size',
                limit=100,
            ),
            kit.TEMPO,
            [_evidence(attribution.UID, "Training attribution: slowest sampled steps")],
            width=24,
        )
    )


def _item_logs(board: dash.Dashboard) -> None:
    board.with_row(dash.Row("6. Logs carry trace_id, span_id, run id, rank and step"))
    required = " or ".join(
        f'{field}=""'
        for field in (names.LOG_TRACE_ID, names.LOG_SPAN_ID, names.LOG_RANK, names.LOG_STEP)
    )
    board.with_panel(
        kit.single_stat(
            "Log lines carrying a trace_id",
            "Share of the run's log lines in Loki with a trace_id (OTLP structured metadata).",
            [
                kit.logql(
                    f'sum(count_over_time({RUN_LOGS} | {names.LOG_TRACE_ID}!="" [$__range]))'
                    f" / sum(count_over_time({RUN_LOGS} [$__range]))"
                )
            ],
            unit="percentunit",
            steps=((None, "red"), (0.99, "green")),
            links=[_evidence(attribution.UID, "Training attribution: logs")],
            datasource=kit.LOKI,
            width=8,
        )
    )
    board.with_panel(
        kit.single_stat(
            "Log lines missing a required field",
            "Lines of the run missing trace_id, span_id, rank or step. PASS when zero.",
            [kit.logql(f"sum(count_over_time({RUN_LOGS} | {required} [$__range])) or vector(0)")],
            steps=((None, "green"), (1, "red")),
            links=[_evidence(attribution.UID, "Training attribution: logs")],
            datasource=kit.LOKI,
            width=8,
        )
    )
    board.with_panel(
        kit.log_panel(
            "Evidence: the run's latest log lines",
            "Open a line: its trace_id is a link into Tempo.",
            kit.logql(RUN_LOGS),
            width=8,
            height=5,
        )
    )


def _item_distributions(board: dash.Dashboard) -> None:
    s = kit.sel(rank=False)
    board.with_row(
        dash.Row("7. An average hides one straggler, a recompile storm or a throttled worker")
    )
    # Two ways to name a straggler, as TrainingStragglerRank does: its step time (ranks that do
    # not wait for each other) and the wait it causes the others in their collectives
    # (synchronous training, where step times equalise). A run without collective series
    # (one rank, or no collectives recorded) passes the second.
    balanced = f"({kit.skew(0.5, names.STEP, s, '$__range')}) < bool {SKEW_LIMIT}"
    unwaited = (
        f"(max(quantile_over_time(0.5, {names.WAIT_CAUSED}{s}[$__range])) <= bool {WAIT_LIMIT})"
        " or vector(1)"
    )
    board.with_panel(
        kit.pass_fail(
            f"No straggler: slowest rank p50 < {SKEW_LIMIT} x median, others wait "
            f"<= {WAIT_LIMIT:.0%} of a step",
            "FAIL when the slowest rank's median step time over the range is 1.25 times the "
            "median rank's or more (the max/median skew panels), or when any rank's median over "
            "the range of the share of a step the others wait for it in collectives "
            f"({names.WAIT_CAUSED}) is above {WAIT_LIMIT:.0%}: in synchronous training step "
            "times equalise and only that wait names the straggler.",
            kit.prom(f"({balanced}) * ({unwaited})", "no straggler", instant=True),
            [_evidence(ranks.UID, "Ranks and stragglers")],
        )
    )
    board.with_panel(
        kit.single_stat(
            "Straggler alert state",
            f'ALERTS{{alertname="{ALERT_STRAGGLER}"}}: 0 = inactive, 1 = pending, 2 = firing.',
            [
                kit.prom(
                    f'max(2 * (ALERTS{{alertname="{ALERT_STRAGGLER}", alertstate="firing"}} == 1)'
                    f' or (ALERTS{{alertname="{ALERT_STRAGGLER}", alertstate="pending"}} == 1)) or vector(0)',
                    "state",
                    instant=True,
                )
            ],
            steps=((None, "green"), (1, "orange"), (2, "red")),
            links=[_evidence(ranks.UID, "Ranks and stragglers")],
        ).mappings(_ALERT_STATES)
    )
    board.with_panel(
        kit.single_stat(
            "Recompiles over the range",
            "A recompile storm shows as a count that keeps climbing after warm-up.",
            [
                kit.prom(
                    f"sum({kit.rate(names.RECOMPILES, s, '$__range', fn='increase')}) or vector(0)",
                    "recompiles",
                    instant=True,
                )
            ],
            steps=((None, "green"), (10, "orange"), (100, "red")),
            links=[_evidence(compile_health.UID, "Compile health")],
        )
    )
    board.with_panel(
        kit.pass_fail(
            "Telemetry pipeline dropped nothing",
            "otel_train_telemetry_dropped_total did not grow over the range (spans, metrics, logs).",
            kit.prom(
                f"(sum({kit.rate(names.DROPPED, s, '$__range', fn='increase')}) or vector(0)) == bool 0",
                "no drops",
                instant=True,
            ),
            [_evidence(attribution.UID, "Training attribution")],
        )
    )


def build() -> dash.Dashboard:
    board = kit.new_dashboard(
        UID,
        "otel-train / Production readiness checklist",
        "The production attribution checklist of docs/design.md, one row per item, each a verdict "
        "computed from live metrics, traces and logs, linked to its evidence.",
    )
    board.with_variable(kit.world_size_variable())
    board.with_variable(kit.service_variable())
    board.with_variable(kit.kubernetes_variables()[0])
    board.with_variable(
        dash.TextBoxVariable("rule_group")
        .label("Rule group (regex)")
        .description(
            'prometheus_rule_group_rules{rule_group} of otel-train\'s rules: "<file>;<group>"'
        )
        .default_value(".*;otel-train.alerts")
    )
    _item_traces(board)
    _item_exemplars(board)
    _item_throttling(board)
    _item_launcher(board)
    _item_sampling(board)
    _item_logs(board)
    _item_distributions(board)
    return board
