"""Every query of every dashboard (and every rule) parses, and returns series from a real Prometheus.

- PromQL: parsed by Prometheus's own parser (``dashboards/tools/promqlcheck``, Go), then
  evaluated by a real Prometheus (``/api/v1/query``), which must return series.
- TraceQL and LogQL: parsed by the Lezer grammars Grafana's query editors use
  (``dashboards/tools/querycheck``, Node): a syntax check, no Tempo or Loki runs here.
- The Prometheus holds TEST SERIES: OpenMetrics written below (every series labelled
  ``test_series="otel-train-dashboards-test"``), backfilled with ``promtool tsdb
  create-blocks-from openmetrics``. They stand in for what a production cluster has and this
  machine does not: cAdvisor's container_cpu_cfs_* series of Kubernetes pods, the
  collector's otelcol_* series, collectives over many ranks, compiles, a straggler, a hung
  and a stopped run. A live prometheus-client endpoint adds histogram exemplars, and
  Prometheus scrapes itself (rule and exemplar-storage metrics). The real training metrics
  of a demo run are checked in ``test_dashboards_demo.py``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT
from support.binaries import require_binary
from support.pipeline_fixtures import (
    PROMETHEUS_DIR,
    Prometheus,
    free_port,
    promtool_binary,
    replace_job_targets,
    wait_for,
)

DASHBOARDS_DIR = REPO_ROOT / "dashboards"
sys.path.insert(0, str(DASHBOARDS_DIR))
from otel_dashboards import checklist, names, queries  # noqa: E402

TOOLS = DASHBOARDS_DIR / "tools"
QUERIES = queries.queries()
TEST_LABEL = 'test_series="otel-train-dashboards-test"'
RUN_ID = "dash-test-run"
#: a second run of the same job for the compare dashboard (run A = RUN_ID): every step
#: STEP_SCALE_B times as long, everything else alike
RUN_B = "dash-test-run-b"
STEP_SCALE_B = 1.1
RANKS = 4
STRAGGLER = 3

#: what Grafana would substitute, for the test series (rate interval: 4 x the 30 s spacing)
VALUES = {
    "run_id": RUN_ID,
    "run_a": RUN_ID,
    "run_b": RUN_B,
    "rank": ".*",
    "world_size": str(RANKS),
    "backend": ".*",
    "namespace": ".*",
    "pod": ".*",
    "service": "otel-train",
    "link_peak_gbps": "450",
    "stall_threshold": "1s",
    "rule_group": ".*;otel-train.alerts",
    "__rate_interval": "2m",
    "__interval": "30s",
    "__range": "30m",
}


# --- parsing -----------------------------------------------------------------------------


def _tool(path: Path, build: list[str], needs: str) -> None:
    """Build a checker once when its toolchain is here (CI builds it beforehand)."""
    if not path.exists() and require_binary(needs):
        subprocess.run(build, cwd=path.parent, check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def promqlcheck() -> str:
    default = TOOLS / "promqlcheck" / "promqlcheck"
    if not default.exists():
        _tool(default, [require_binary("go"), "build", "-o", "promqlcheck", "."], "go")
    return require_binary("promqlcheck", "OTEL_TRAIN_PROMQLCHECK_BIN", default)


@pytest.fixture(scope="module")
def querycheck() -> list[str]:
    node = require_binary("node")
    modules = TOOLS / "querycheck" / "node_modules"
    if not modules.exists():
        _tool(modules, [require_binary("npm"), "ci", "--no-audit", "--no-fund"], "npm")
    return [node, str(TOOLS / "querycheck" / "check.mjs")]


def check(argv: list[str], items: list[dict]) -> dict[str, dict]:
    result = subprocess.run(
        argv, input=json.dumps(items), capture_output=True, text=True, timeout=120
    )
    assert result.returncode in (0, 1), result.stderr
    return {r["id"]: r for r in json.loads(result.stdout)}


def failures(results: dict[str, dict]) -> list[str]:
    return [f"{rid}: {r['error']}" for rid, r in results.items() if not r["ok"]]


def rule_expressions() -> list[tuple[str, str, bool]]:
    """(name, expr, is_alert) of every rule in prometheus/rules.yml and kubernetes-mixin.yml."""
    paths = [PROMETHEUS_DIR / name for name in ("rules.yml", "kubernetes-mixin.yml")]
    groups = [g for path in paths if path.exists() for g in yaml.safe_load(path.read_text())["groups"]]
    return [
        (r.get("record") or r["alert"], r["expr"], "alert" in r) for g in groups for r in g["rules"]
    ]


def provisioning_queries() -> list[tuple[str, str, str]]:
    """(id, lang, query) of the queries in the data source provisioning, interpolated."""
    text = (DASHBOARDS_DIR / "provisioning" / "datasources" / "otel-train.yaml").read_text()
    sources = {d["type"]: d for d in yaml.safe_load(text.replace("$$", "$"))["datasources"]}
    tempo = sources["tempo"]["jsonData"]
    found = [
        (
            f"tracesToMetrics / {q['name']}",
            "promql",
            q["query"].replace("$__tags", 'training_run_id="r", training_rank="0"'),
        )
        for q in tempo["tracesToMetrics"]["queries"]
    ]
    logs = tempo["tracesToLogsV2"]["query"]
    for var, value in (
        ('${__span.tags["service.name"]}', "otel-train"),
        ("${__trace.traceId}", "58e63f1d1832e6ac1d749dac8ffd4b47"),
        ("${__span.spanId}", "4172a57fe743ae2a"),
    ):
        logs = logs.replace(var, value)
    found.append(("tracesToLogsV2", "logql", logs))
    return found


def all_promql() -> list[tuple[str, str]]:
    found = [(q.id, queries.interpolate(q.text, VALUES)) for q in QUERIES if q.lang == "promql"]
    for q in QUERIES:
        if q.lang == "variable" and (inner := queries.variable_promql(q.text)):
            found.append((q.id, queries.interpolate(inner, VALUES)))
    found += [(f"rules.yml / {name}", expr) for name, expr, _ in rule_expressions()]
    found += [(qid, text) for qid, lang, text in provisioning_queries() if lang == "promql"]
    return found


def test_every_promql_expression_parses(promqlcheck):
    items = [{"id": qid, "expr": expr} for qid, expr in all_promql()]
    assert len(items) > 60
    results = check([promqlcheck], items)
    assert failures(results) == []
    # panel queries are vectors or scalars that Grafana can draw
    assert {r["type"] for r in results.values()} <= {"vector", "scalar"}


def test_every_traceql_and_logql_query_parses(querycheck):
    items = [
        {"id": q.id, "lang": q.lang, "query": queries.interpolate(q.text, VALUES)}
        for q in QUERIES
        if q.lang in ("traceql", "logql")
    ]
    items += [
        {"id": qid, "lang": lang, "query": text}
        for qid, lang, text in provisioning_queries()
        if lang == "logql"
    ]
    assert {i["lang"] for i in items} == {"traceql", "logql"} and len(items) > 10
    assert failures(check(querycheck, items)) == []


def test_the_parsers_reject_broken_queries(promqlcheck, querycheck):
    broken = check(
        [promqlcheck],
        [
            {"id": "unclosed", "expr": "sum(rate(x[5m])"},
            {"id": "bad by", "expr": "histogram_quantile(0.9, sum by le (x))"},
        ],
    )
    assert not any(r["ok"] for r in broken.values())
    broken = check(
        querycheck,
        [
            {"id": "traceql", "lang": "traceql", "query": '{ name = = "training.step" }'},
            {"id": "logql", "lang": "logql", "query": '{service_name="x" | json'},
        ],
    )
    assert not any(r["ok"] for r in broken.values())


# --- test series -------------------------------------------------------------------------

BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PHASE_SHARE = {
    "data_wait": 0.08,
    "forward": 0.3,
    "backward": 0.4,
    "optimizer": 0.1,
    "exposed_comm": 0.1,
    "compile": 0.02,
}
OPS = {"all_reduce": 0.02, "all_gather": 0.008, "reduce_scatter": 0.012}
TICK = 30  # seconds between samples
#: the step's disjoint parts (training_step_time_seconds_total by training_part) as shares of
#: each rank's step time; forward, backward and optimizer take the rest (PART_COMPUTE)
PART_SHARE = {
    "data_wait": 0.08,
    "exposed_comm": 0.1,
    "compile": 0.02,
    "regions": 0.02,
    "device_wait": 0.1,
    "gpu_outside_phases": 0.03,
    "host_busy": 0.02,
    "not_explained": 0.0,
}
PART_COMPUTE = {"forward": 0.35, "backward": 0.5, "optimizer": 0.15}
#: the rank whose steps hold time nothing explains
UNEXPLAINED_RANK = 1
STARTUP_SECONDS = 90.0  # each rank's start to its first step
BETWEEN_STEPS_SECONDS = 0.5  # per tick: a short evaluation outside the steps
WARMUP_TICKS = 2  # the first ticks' steps are warm-up


def part_shares(rank: int) -> dict[str, float]:
    """A rank's parts as shares of its step time: disjoint, adding up to exactly 1."""
    shares = dict(PART_SHARE)
    if rank == STRAGGLER:  # starved (throttled DataLoader workers), its host busy
        shares.update(data_wait=0.35, host_busy=0.1, device_wait=0.02)
    if rank == 2:  # hides little of its communication
        shares["exposed_comm"] = 0.2
    if rank == UNEXPLAINED_RANK:
        shares["not_explained"] = 0.06
    compute = 1 - sum(shares.values())
    assert compute > 0.2, shares
    shares.update({part: compute * share for part, share in PART_COMPUTE.items()})
    return shares


def goodput_increments(shares: dict[str, float], step_seconds: float, first: bool,
                       warmup: bool) -> dict[str, float]:
    """One tick of a rank's time by goodput bucket: startup before its first step, the
    steps' parts (warm-up steps all warmup but compile), and the time between steps."""
    buckets = dict.fromkeys(("productive", "startup", "compile", "warmup", "data_wait",
                             "exposed_comm", "device_wait", "outside_phases", "between_steps"),
                            0.0)
    buckets["startup"] = STARTUP_SECONDS if first else 0.0
    buckets["between_steps"] = BETWEEN_STEPS_SECONDS
    buckets["compile"] = shares["compile"] * step_seconds
    if warmup:
        buckets["warmup"] = (1 - shares["compile"]) * step_seconds
        return buckets
    buckets["productive"] = sum(shares[p] for p in PART_COMPUTE) * step_seconds
    for part in ("data_wait", "exposed_comm", "device_wait"):
        buckets[part] = shares[part] * step_seconds
    buckets["outside_phases"] = (shares["regions"] + shares["gpu_outside_phases"]
                                 + shares["host_busy"] + shares["not_explained"]) * step_seconds
    return buckets


@dataclass
class Series:
    """Cumulative state of one OpenMetrics family's series, sampled every tick."""

    kind: str  # histogram | counter | gauge
    name: str
    lines: dict[str, list[str]]

    @classmethod
    def new(cls, kind: str, name: str) -> Series:
        return cls(kind, name, {})

    def add(self, labels: str, sample: str, value: float, t: float) -> None:
        self.lines.setdefault(f"{sample}{{{labels}}}", []).append(
            f"{sample}{{{labels}}} {value:.6g} {t:.3f}"
        )


class Families:
    def __init__(self) -> None:
        self.families: dict[str, Series] = {}
        self.state: dict[tuple, list[float]] = {}

    def _family(self, kind: str, name: str) -> Series:
        return self.families.setdefault(name, Series.new(kind, name))

    def histogram(self, name: str, labels: str, t: float, observations: list[float]) -> None:
        family = self._family("histogram", name)
        state = self.state.setdefault((name, labels), [0.0] * (len(BUCKETS) + 3))
        for value in observations:
            for i, bound in enumerate(BUCKETS):
                state[i] += value <= bound
            state[len(BUCKETS)] += 1  # +Inf
            state[len(BUCKETS) + 1] += 1  # count
            state[len(BUCKETS) + 2] += value  # sum
        for i, bound in enumerate((*BUCKETS, math.inf)):
            le = "+Inf" if bound == math.inf else f"{bound}"
            family.add(f'{labels},le="{le}"', f"{name}_bucket", state[i], t)
        family.add(labels, f"{name}_count", state[len(BUCKETS) + 1], t)
        family.add(labels, f"{name}_sum", state[len(BUCKETS) + 2], t)

    def counter(self, name: str, labels: str, t: float, increment: float) -> None:
        state = self.state.setdefault((name, labels), [0.0])
        state[0] += increment
        self._family("counter", name).add(labels, f"{name}_total", state[0], t)

    def gauge(self, name: str, labels: str, t: float, value: float) -> None:
        self._family("gauge", name).add(labels, name, value, t)

    def openmetrics(self) -> str:
        out = []  # OpenMetrics has no free comments: HELP says what these are
        for family in self.families.values():
            out.append(f"# TYPE {family.name} {family.kind}")
            out.append(
                f"# HELP {family.name} Test series of tests/dashboards/test_dashboards_queries.py, not real telemetry."
            )
            for series_lines in family.lines.values():
                out.extend(series_lines)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def rank_labels(run: str, rank: int) -> str:
    return f'{TEST_LABEL},training_run_id="{run}",training_rank="{rank}"'


def step_mean(rank: int, step_scale: float = 1.0) -> float:
    """A rank's mean step time: the straggler's 1.6 times the others'."""
    return 0.5 * step_scale * (1.6 if rank == STRAGGLER else 1.0)


def steps_per_tick(rank: int, step_scale: float = 1.0) -> int:
    return int(TICK / step_mean(rank, step_scale))


def simulate_rank(
    f: Families, rng: random.Random, run: str, rank: int, t: float, minutes_left: float,
    ticks_done: int = 0, step_scale: float = 1.0,
) -> None:
    labels = rank_labels(run, rank)
    mean = step_mean(rank, step_scale)
    steps = [rng.lognormvariate(math.log(mean), 0.15)
             for _ in range(steps_per_tick(rank, step_scale))]
    f.histogram("training_step_duration_seconds", labels, t, steps)
    for phase, share in PHASE_SHARE.items():
        if rank == STRAGGLER and phase == "data_wait":
            share = 0.35  # the straggler starves: its DataLoader workers are throttled
        if rank == 2 and phase == "exposed_comm":
            share = 0.2  # rank 2 hides little of its communication (overlap 0.3 below)
        f.histogram(
            "training_phase_duration_seconds",
            f'{labels},training_phase="{phase}"',
            t,
            [s * share for s in steps],
        )
    # the step's parts: disjoint, summing to the step histogram's sum
    shares = part_shares(rank)
    for part, share in shares.items():
        f.counter("training_step_time_seconds", f'{labels},training_part="{part}"', t,
                  sum(steps) * share)
    warmup = ticks_done < WARMUP_TICKS
    for bucket, seconds in goodput_increments(shares, sum(steps), ticks_done == 0,
                                              warmup).items():
        f.counter("training_goodput_time_seconds", f'{labels},training_goodput_bucket="{bucket}"',
                  t, seconds)
    f.counter("training_samples", labels, t, 32 * len(steps))
    f.counter("training_tokens", labels, t, 32 * 2048 * len(steps))
    # Synchronous training: the others wait for the straggler inside their collectives, and
    # the straggler, arriving last, hardly waits: its collective seconds per step are a quarter
    # of theirs (the share of a step the others lose to it comes out near 0.25).
    arrives_last = 0.25 if rank == STRAGGLER else 1.0
    for op, mean in OPS.items():
        durations = [
            arrives_last * rng.lognormvariate(math.log(mean), 0.3) for _ in range(4 * len(steps))
        ]
        if op == "all_reduce" and rank == 2 and minutes_left < 1:
            durations.append(75.0)  # a stalled all_reduce in the last minute
        if op == "reduce_scatter" and rank == 2 and minutes_left < 5:
            durations += [15.0] * 30  # and slow reduce_scatters: p99 above 10 s
        op_labels = f'{labels},training_collective_op="{op}",training_collective_backend="nccl"'
        f.histogram("training_collective_duration_seconds", op_labels, t, durations)
        f.counter(
            "training_collective_size_bytes",
            f'{labels},training_collective_op="{op}"',
            t,
            len(durations) * 64 * 2**20,
        )
    f.gauge("training_comm_overlap_ratio", labels, t, 0.3 if rank == 2 else 0.85)
    f.gauge("training_mfu_ratio", labels, t, 0.25 if rank == STRAGGLER else 0.42)
    f.gauge("training_memory_peak_allocated_bytes", labels, t, (60 + rank) * 2**30)
    f.gauge("training_memory_reserved_bytes", labels, t, (70 + rank) * 2**30)
    storm = rank == 0  # rank 0 recompiles every tick: a recompile storm
    f.histogram(
        "training_compile_duration_seconds", labels, t, [rng.uniform(2, 8)] if storm else []
    )
    f.counter(
        "training_compile_graph_breaks",
        f'{labels},training_compile_reason="data_dependent_branch"',
        t,
        1 if storm else 0,
    )
    f.counter(
        "training_compile_recompiles",
        f'{labels},training_compile_reason="guard_failed_shape"',
        t,
        2 if storm else 0,
    )
    f.counter(
        "training_compile_recompiles",
        f'{labels},training_compile_reason="cache_size_limit"',
        t,
        1 if storm else 0,
    )
    f.counter(
        "training_cpu_throttled_time_seconds",
        labels,
        t,
        TICK * (0.5 if rank == STRAGGLER else 0.01),
    )
    # the time outside the phases (an NCCL run: the waiting ranks' hosts block on their GPU)
    for part, share in (("device_wait", 0.05 if rank == STRAGGLER else 0.3),
                        ("host_busy", 0.3 if rank == STRAGGLER else 0.01)):
        f.counter("training_untimed_time_seconds", f'{labels},training_untimed_part="{part}"',
                  t, sum(steps) * share)
    f.counter("otel_train_telemetry_dropped", f'{labels},otel_train_signal="spans"', t, 3 if rank == 1 else 0)


def write_test_series(end: float) -> str:
    """30 minutes of a 4-rank run with a straggler, the same run with slower steps (RUN_B,
    its own random stream: RUN_ID's series are what they were without it), a hung run, a run
    with a stopped rank, cAdvisor and collector (failing sends, a full queue, refused data)."""
    rng = random.Random(7)
    rng_b = random.Random(8)
    f = Families()
    ticks = [end - TICK * i for i in range(60, -1, -1)]
    for ticks_done, t in enumerate(ticks):
        minutes_left = (end - t) / 60
        for rank in range(RANKS):
            simulate_rank(f, rng, RUN_ID, rank, t, minutes_left, ticks_done)
            simulate_rank(f, rng_b, RUN_B, rank, t, minutes_left, ticks_done,
                          step_scale=STEP_SCALE_B)
            pod = f'{TEST_LABEL},namespace="otel-train-dashboards-test",pod="dash-test-trainer-{rank}",container="trainer"'
            f.counter("container_cpu_cfs_periods", pod, t, TICK * 10)
            f.counter(
                "container_cpu_cfs_throttled_periods",
                pod,
                t,
                TICK * 10 * (0.6 if rank == STRAGGLER else 0.02),
            )
        for rank in range(2):  # a hung run: still reporting, no step for the last 20 minutes
            steps = [0.5] * 60 if minutes_left > 20 else []
            f.histogram(
                "training_step_duration_seconds", rank_labels("dash-test-hung", rank), t, steps
            )
        for rank in range(2):  # a run whose rank 1 stopped reporting 10 minutes ago
            if rank == 0 or minutes_left > 10:
                f.histogram(
                    "training_step_duration_seconds",
                    rank_labels("dash-test-stopped", rank),
                    t,
                    [0.5] * 60,
                )
        collector = f'{TEST_LABEL},job="otelcol",instance="collector-test:8888"'
        f.counter(
            "otelcol_exporter_send_failed_spans",
            f'{collector},exporter="otlp_grpc/tempo"',
            t,
            5,
        )
        # the Tempo exporter's queue nearly full, and the receiver refusing spans
        queue = f'{collector},exporter="otlp_grpc/tempo",data_type="traces"'
        f.gauge("otelcol_exporter_queue_size", queue, t, 4900)
        f.gauge("otelcol_exporter_queue_capacity", queue, t, 5000)
        f.counter(
            "otelcol_receiver_refused_spans",
            f'{collector},receiver="otlp",transport="grpc"',
            t,
            50,
        )
    return f.openmetrics()


# --- a real Prometheus over the test series ----------------------------------------------


class DashboardPrometheus(Prometheus):
    """The repo's prometheus.yml, rules.yml and kubernetes-mixin.yml; its self-scrape job (rule
    and exemplar metrics) pointed at this instance's port."""

    def write_config(self) -> Path:
        path = super().write_config()
        # prometheus.yml also loads the kubernetes-mixin's CPUThrottlingHigh (the checklist's
        # throttling alert): put it beside rules.yml
        shutil.copy(PROMETHEUS_DIR / "kubernetes-mixin.yml", path.parent / "kubernetes-mixin.yml")
        jobs = [job["job_name"] for job in yaml.safe_load(path.read_text())["scrape_configs"]]
        assert "prometheus" in jobs, jobs
        path.write_text(replace_job_targets(path.read_text(), "prometheus",
                                            [f"127.0.0.1:{self.port}"]))
        return path


def exemplar_endpoint() -> tuple[int, object]:
    """A live prometheus-client endpoint with a step histogram carrying trace exemplars."""
    from prometheus_client import CollectorRegistry, Histogram, start_http_server

    registry = CollectorRegistry()
    step = Histogram(
        "training_step_duration_seconds",
        "Test series: step time with exemplars.",
        ["training_rank", "training_run_id", "test_series"],
        registry=registry,
        buckets=BUCKETS,
    )
    for i, seconds in enumerate(BUCKETS):  # one exemplar per bucket (the client keeps the last)
        step.labels("0", "dash-test-live", "otel-train-dashboards-test").observe(
            seconds, {"trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}"}
        )
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return port, server


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[Prometheus]:
    promtool = promtool_binary()
    workdir = tmp_path_factory.mktemp("dash-prometheus")
    series = workdir / "test-series.om.txt"
    series.write_text(write_test_series(end=time.time() - 5))
    data = workdir / "prometheus" / "data"
    data.mkdir(parents=True)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(series), str(data)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    port, exporter = exemplar_endpoint()
    server = DashboardPrometheus(
        workdir,
        {"otel-train-ranks": [f"127.0.0.1:{port}"], "otel-train-collector": [], "otelcol": []},
    )
    try:
        server.start()
        wait_for(
            "exemplars scraped, rules evaluated, self-scrape",
            lambda: (
                server.query(f'ALERTS{{alertname="{checklist.ALERT_THROTTLING}"}}')
                # the recording group has run (the throttling alert does not read it)
                and server.query("training_run_rank:collective_wait_caused:share_of_step5m")
                and server.query("prometheus_tsdb_exemplar_exemplars_in_storage > 0")
                and server.query("prometheus_rule_group_rules")
            ),
            timeout=150,
            interval=1,
            on_timeout=server.log_tail,
        )
        yield server
    finally:
        server.kill()
        exporter.shutdown()


def evaluate(server: Prometheus, expr: str) -> list[dict]:
    return server.query(expr)


def test_the_test_series_are_loaded_and_labelled_as_such(prometheus):
    loaded = evaluate(
        prometheus,
        'count by (training_run_id) (count_over_time(training_step_duration_seconds_count{test_series!=""}[30m]))',
    )
    assert {r["metric"]["training_run_id"] for r in loaded} >= {
        RUN_ID,
        RUN_B,
        "dash-test-hung",
        "dash-test-stopped",
    }
    assert evaluate(prometheus, 'count(container_cpu_cfs_periods_total{test_series=""})') == []


def test_every_dashboard_promql_returns_series(prometheus):
    empty = [
        qid
        for qid, expr in all_promql()
        if not qid.startswith(("rules.yml", "tracesToMetrics")) and not evaluate(prometheus, expr)
    ]
    assert empty == []


def test_every_rule_returns_series(prometheus):
    rules = rule_expressions()
    assert rules, "prometheus/rules.yml holds no rules"

    def all_answer() -> list[str] | bool:
        missing = [name for name, expr, _ in rules if not evaluate(prometheus, expr)]
        return not missing or missing

    # recording rules feed alerts: give the 30 s recording group time for two evaluations
    deadline = time.monotonic() + 90
    missing = all_answer()
    while missing is not True and time.monotonic() < deadline:
        time.sleep(2)
        missing = all_answer()
    assert missing is True, f"rules returning no series: {missing}"


def test_provisioned_trace_to_metrics_queries_return_series(prometheus):
    for qid, lang, text in provisioning_queries():
        if lang == "promql":
            text = text.replace(
                'training_run_id="r", training_rank="0"',
                f'training_run_id="{RUN_ID}", training_rank="0"',
            )
            assert evaluate(prometheus, text), qid


def verdict(server: Prometheus, title: str) -> float:
    board = queries.dashboards()["production-readiness.json"]
    panel = next(p for p in queries.panels(board) if p["title"].startswith(title))
    result = evaluate(server, queries.interpolate(panel["targets"][0]["expr"], VALUES))
    assert len(result) == 1, (title, result)
    return float(result[0]["value"][1])


def test_checklist_verdicts_follow_the_live_data(prometheus):
    assert verdict(prometheus, "Exemplars stored") == 1
    assert verdict(prometheus, "Throttling alert rules loaded") == 1
    assert verdict(prometheus, "cAdvisor throttling series present") == 1
    assert verdict(prometheus, "Per-rank cgroup throttling measured") == 1
    assert verdict(prometheus, "Ranks reporting steps") == RANKS
    assert verdict(prometheus, "No straggler") == 0  # rank 3: 1.6x the median, others wait
    assert verdict(prometheus, "Telemetry pipeline dropped nothing") == 0  # rank 1 drops spans
    assert verdict(prometheus, "Recompiles over the range") > 10  # rank 0's storm
    assert verdict(prometheus, "Throttling alert state") >= 1  # pending (for: 15m) or firing


def per_rank(server: Prometheus, dashboard: str, title: str) -> dict[int, float]:
    """The latest value per rank of a per-rank panel's query (its first target)."""
    panel = next(p for p in queries.panels(queries.dashboards()[dashboard]) if p["title"] == title)
    result = evaluate(server, queries.interpolate(panel["targets"][0]["expr"], VALUES))
    return {int(r["metric"]["training_rank"]): float(r["value"][1]) for r in result}


def test_the_straggler_is_named_by_the_wait_it_causes(prometheus):
    board = "ranks-and-stragglers.json"
    wait = per_rank(prometheus, board, "Others wait for this rank (share of step)")
    collective = per_rank(prometheus, board, "Collective seconds per step")
    assert set(wait) == set(collective) == set(range(RANKS))
    assert max(wait, key=wait.get) == STRAGGLER and wait[STRAGGLER] > checklist.WAIT_LIMIT, wait
    assert min(collective, key=collective.get) == STRAGGLER, collective


def test_either_straggler_signal_alone_fails_the_checklist(prometheus):
    """The straggler verdict fails on step-time skew and on collective wait, each on its own."""
    skew = f"< bool {checklist.SKEW_LIMIT}"
    wait = f"<= bool {checklist.WAIT_LIMIT}"
    board = queries.dashboards()["production-readiness.json"]
    panel = next(p for p in queries.panels(board) if p["title"].startswith("No straggler"))
    expr = queries.interpolate(panel["targets"][0]["expr"], VALUES)
    assert expr.count(skew) == expr.count(wait) == 1
    for limit, lenient in ((skew, "< bool 100"), (wait, "<= bool 100")):
        result = evaluate(prometheus, expr.replace(limit, lenient))
        assert [float(r["value"][1]) for r in result] == [0], (limit, result)
    result = evaluate(prometheus, expr.replace(skew, "< bool 100").replace(wait, "<= bool 100"))
    assert [float(r["value"][1]) for r in result] == [1], result  # negative control


def test_checklist_alert_names_are_rules_prometheus_loaded(prometheus):
    loaded = {
        rule["name"]
        for group in prometheus.api("rules")["groups"]
        for rule in group["rules"]
        if rule["type"] == "alerting"
    }
    assert set(checklist.ALERT_NAMES) <= loaded


def test_exemplars_carry_trace_ids(prometheus):
    now = time.time()
    found = prometheus.api(
        "query_exemplars",
        query="training_step_duration_seconds_bucket",
        start=str(now - 600),
        end=str(now),
    )
    trace_ids = {e["labels"]["trace_id"] for series in found for e in series["exemplars"]}
    assert trace_ids == {f"{i + 1:032x}" for i in range(len(BUCKETS))}


def panel_expr(dashboard: str, title: str, ref: str = "A") -> str:
    """A panel's query as Grafana runs it on the test series (the title's start names it)."""
    board = queries.dashboards()[dashboard]
    panel = next(p for p in queries.panels(board) if p["title"].startswith(title))
    target = next(t for t in panel["targets"] if t["refId"] == ref)
    return queries.interpolate(target["expr"], VALUES)


def last_sample(server: Prometheus) -> float:
    """The time of the test run's last sample (the tests run a while after it)."""
    found = evaluate(server, f'max(timestamp(training_samples_total{{training_run_id="{RUN_ID}"}}))')
    return float(found[0]["value"][1])


def over_time(server: Prometheus, expr: str, minutes: int = 20) -> dict[str, dict[float, float]]:
    """The series of a range query over the last ``minutes`` of the test series, every
    minute: {the series' one label's value: {timestamp: value}}."""
    end = last_sample(server)
    result = server.api("query_range", query=expr, start=f"{end - 60 * minutes:.3f}",
                        end=f"{end:.3f}", step="60")["result"]
    return {
        next(iter(r["metric"].values()), ""): {float(ts): float(v) for ts, v in r["values"]}
        for r in result
    }


def test_the_step_time_breakdown_adds_up_to_100_percent_with_its_not_explained_part(prometheus):
    """The stacked share panel reads the disjoint parts: at every timestamp the shares add up
    to 100% (the phase spans, which overlap, added up to ~130% here), and not_explained is
    the part itself, non-zero where a rank's steps hold unexplained time."""
    expr = panel_expr("training-attribution.json", "Step-time breakdown")
    shares = over_time(prometheus, expr)
    assert set(shares) == set(names.PARTS), shares.keys()
    timestamps = set.intersection(*(set(series) for series in shares.values()))
    assert len(timestamps) >= 15, timestamps
    for ts in timestamps:
        total = sum(series[ts] for series in shares.values())
        assert total == pytest.approx(1.0, abs=0.01), (ts, {p: s[ts] for p, s in shares.items()})
    unexplained = shares[names.PART_NOT_EXPLAINED]
    # one rank of four: 6% of its step time, ~1.5% of the ranks' (every rank's steps fill
    # about the same seconds: the straggler's are longer and fewer)
    assert all(0.01 < unexplained[ts] < 0.02 for ts in timestamps), unexplained
    # and the straggler's starvation shows as data_wait: (3 x 8% + 35%) / 4
    assert all(0.13 < shares["data_wait"][ts] < 0.165 for ts in timestamps), shares["data_wait"]


def test_outside_the_phases_per_rank_names_the_rank_with_unexplained_time(prometheus):
    expr = panel_expr("training-attribution.json", "Outside the phases per rank", "C")
    unexplained = {int(r["metric"][names.RANK]): float(r["value"][1])
                   for r in evaluate(prometheus, expr)}
    assert set(unexplained) == set(range(RANKS)), unexplained
    assert unexplained[UNEXPLAINED_RANK] == pytest.approx(0.06, abs=0.005), unexplained
    assert all(v == 0 for r, v in unexplained.items() if r != UNEXPLAINED_RANK), unexplained


def test_each_rank_s_parts_add_up_to_its_step_time(prometheus):
    expr = panel_expr("ranks-and-stragglers.json", "Where each rank's step time goes")
    rows: dict[int, dict[str, float]] = {}
    for r in evaluate(prometheus, expr):
        rows.setdefault(int(r["metric"][names.RANK]), {})[r["metric"][names.PART]] = float(
            r["value"][1])
    assert set(rows) == set(range(RANKS))
    for rank, parts in rows.items():
        assert set(parts) == set(names.PARTS), parts
        assert sum(parts.values()) == pytest.approx(1.0, abs=0.01), (rank, parts)
        assert parts == pytest.approx(part_shares(rank), abs=0.01), rank


def test_goodput_is_productive_time_over_all_buckets(prometheus):
    ratio = evaluate(prometheus, panel_expr("training-attribution.json", "Goodput per run"))
    assert [r["metric"][names.RUN] for r in ratio] == [RUN_ID], ratio
    # each rank: productive = the compute parts of its steady steps, against all its time
    # since start (start-up, warm-up and the losses included)
    compute = [sum(part_shares(rank)[p] for p in PART_COMPUTE) for rank in range(RANKS)]
    goodput = float(ratio[0]["value"][1])
    assert 0.4 < goodput < max(compute), (goodput, compute)
    buckets = over_time(prometheus, panel_expr("training-attribution.json", "Goodput buckets"))
    assert set(buckets) >= {"productive", "data_wait", "exposed_comm", "between_steps"}
    timestamps = set.intersection(*(set(series) for series in buckets.values()))
    for ts in timestamps:
        assert sum(s[ts] for s in buckets.values()) == pytest.approx(1.0, abs=0.01), ts
    per_rank: dict[int, float] = {}
    for r in evaluate(prometheus, panel_expr("training-attribution.json", "Goodput per rank")):
        rank = int(r["metric"][names.RANK])
        per_rank[rank] = per_rank.get(rank, 0.0) + float(r["value"][1])
    assert per_rank == pytest.approx(dict.fromkeys(range(RANKS), 1.0), abs=0.01), per_rank


def test_throughput_over_the_range_is_the_samples_per_second(prometheus):
    expr = panel_expr("training-attribution.json", "Throughput over")
    samples = prometheus.api("query", query=expr, time=f"{last_sample(prometheus):.3f}")["result"]
    # 32 samples a step: 60 steps per 30 s on the ranks of 0.5 s steps, 37 on the straggler's
    expected = 32 * (3 * int(TICK / 0.5) + int(TICK / 0.8)) / TICK
    assert float(samples[0]["value"][1]) == pytest.approx(expected, rel=0.02), samples


# --- the compare dashboard: run B (every step 10% longer) against run A ------------------

COMPARE = "compare-runs.json"


def at_last_sample(server: Prometheus, expr: str) -> list[dict]:
    """An instant query at the test runs' last sample: the 30 min range holds all of them."""
    return server.api("query", query=expr, time=f"{last_sample(server):.3f}")["result"]


def one_value(server: Prometheus, title: str, ref: str) -> float:
    result = at_last_sample(server, panel_expr(COMPARE, title, ref))
    assert len(result) == 1 and result[0]["metric"] == {}, (title, ref, result)
    return float(result[0]["value"][1])


def per_run_value(server: Prometheus, title: str, ref: str) -> float:
    result = at_last_sample(server, panel_expr(COMPARE, title, ref))
    run = {"A": RUN_ID, "B": RUN_B}[ref]
    assert [r["metric"] for r in result] == [{names.RUN: run}], (title, ref, result)
    return float(result[0]["value"][1])


def mean_step(step_scale: float) -> float:
    """The run's mean step time over all its ranks' steps, as the series imply it (less the
    lognormal's mean factor, the same in both runs): the straggler's longer steps are fewer."""
    counts = {rank: steps_per_tick(rank, step_scale) for rank in range(RANKS)}
    return sum(n * step_mean(rank, step_scale) for rank, n in counts.items()) / sum(
        counts.values())


def test_compare_step_time_change_is_the_planted_10_percent(prometheus):
    planted = mean_step(STEP_SCALE_B) / mean_step(1.0) - 1
    # ~10%: every step 10% longer (the straggler's share of the steps moves a little)
    assert planted == pytest.approx(0.10, abs=0.005)
    change = one_value(prometheus, "B vs A: step time", "A")
    assert change == pytest.approx(planted, abs=0.005), (change, planted)
    # and it is B's mean over A's, as the runs' own panel shows them
    a = per_run_value(prometheus, "Step time over the range", "A")
    b = per_run_value(prometheus, "Step time over the range", "B")
    assert a == pytest.approx(mean_step(1.0), rel=0.02), a  # lognormal(0, 0.15): +1.1%
    assert change == pytest.approx(b / a - 1, abs=1e-9)
    # the p95 moves the same way, less: interpolated inside the 0.5-1 s bucket, which holds
    # both runs' p95 (of the straggler's steps), it moves with the count of steps above 0.5 s
    assert 0.01 < one_value(prometheus, "B vs A: step time", "B") < 0.2


def test_compare_throughput_change_follows_the_step_time(prometheus):
    # per second of step time each rank does 1 / its step time: B's 1 / 1.1 of A's
    planted = 1 / STEP_SCALE_B - 1
    for ref in ("A", "B"):  # samples/s, tokens/s
        change = one_value(prometheus, "B vs A: throughput", ref)
        assert change == pytest.approx(planted, abs=0.005), (ref, change, planted)
    a = per_run_value(prometheus, "Throughput over the range: samples/s", "A")
    b = per_run_value(prometheus, "Throughput over the range: samples/s", "B")
    # 32 samples a step on every rank: 32 / its mean step (lognormal mean factor: ~1.1%)
    expected = sum(32 / step_mean(rank) for rank in range(RANKS))
    assert a == pytest.approx(expected, rel=0.02), (a, expected)
    assert one_value(prometheus, "B vs A: throughput", "A") == pytest.approx(b / a - 1, abs=1e-9)


def test_compare_goodput_and_memory_changes_are_b_over_a(prometheus):
    a = per_run_value(prometheus, "Goodput per run", "A")
    b = per_run_value(prometheus, "Goodput per run", "B")
    assert 0.4 < a < 1 and 0.4 < b < 1, (a, b)
    assert one_value(prometheus, "B vs A: goodput", "A") == pytest.approx(b / a - 1, abs=1e-9)
    assert one_value(prometheus, "B vs A: peak memory", "A") == 0  # the same gauges


def test_compare_parts_add_up_to_each_run_s_step_and_shares_to_100_percent(prometheus):
    title = "Parts per step"

    def by_part(ref: str) -> dict[str, float]:
        result = at_last_sample(prometheus, panel_expr(COMPARE, title, ref))
        return {r["metric"][names.PART]: float(r["value"][1]) for r in result}

    ms = {run: by_part(run) for run in ("A", "B")}
    for run, step_ref in (("A", "A"), ("B", "B")):
        assert set(ms[run]) == set(names.PARTS), ms[run].keys()
        mean_ms = 1e3 * per_run_value(prometheus, "Step time over the range", step_ref)
        assert sum(ms[run].values()) == pytest.approx(mean_ms, rel=1e-4), run  # %.6g
    for ref in ("D", "E"):
        assert sum(by_part(ref).values()) == pytest.approx(1.0, abs=1e-9), ref
    # every part ~10% longer per step in B; not_explained, absent on 3 ranks of 4, too
    change = by_part("C")
    assert set(change) == set(names.PARTS), change
    planted = mean_step(STEP_SCALE_B) / mean_step(1.0) - 1
    for part, value in change.items():
        assert value == pytest.approx(planted, abs=0.02), (part, value)
        assert value == pytest.approx(ms["B"][part] / ms["A"][part] - 1, abs=1e-9), part


def test_compare_compile_and_overlap_panels_read_each_run(prometheus):
    for title in ("Compile seconds", "Recompiles", "Communication overlap", "Data wait share",
                  "Peak memory"):
        a = per_run_value(prometheus, title, "A")
        b = per_run_value(prometheus, title, "B")
        assert a > 0 and b > 0, (title, a, b)
    # overlap: 0.85 on three ranks, 0.3 on rank 2, in both runs
    assert per_run_value(prometheus, "Communication overlap", "A") == pytest.approx(0.85)
    # data wait: (3 x 8% + 35%) of the ranks' step time, about the same seconds per rank
    assert 0.13 < per_run_value(prometheus, "Data wait share", "B") < 0.165


def test_compare_queries_return_series_per_run_not_per_rank(prometheus):
    for q in QUERIES:
        if q.dashboard == COMPARE and q.lang == "promql":
            result = at_last_sample(prometheus, queries.interpolate(q.text, VALUES))
            assert result, q.id
            assert not any(names.RANK in r["metric"] for r in result), q.id
            assert {r["metric"].get(names.RUN) for r in result} <= {RUN_ID, RUN_B, None}, q.id
