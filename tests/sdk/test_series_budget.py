"""The Prometheus series budget (docs/scaling.md: at most 150 series per rank, one ingestion
path), counted in a real Prometheus after a real run through the shipped default path.

The path is the Kubernetes default: ranks export OTLP to the collector's gateway pipeline
(collector/configs/gateway.yaml, the real collector), whose prometheus_remote_write exporter
writes into a real Prometheus (remote-write receiver and native histograms on). The run is
``otel-train demo`` on several gloo ranks. Two runs: the shipped setting, exponential
histograms (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=
base2_exponential_bucket_histogram``, as the k8s job examples set it) stored as native
histograms; and the fallback where native histograms are not possible, explicit buckets
(``semconv.SECONDS_BUCKETS``). Every series of the run is counted per rank, target_info
included, via /api/v1/series.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT
from support.pipeline_fixtures import (
    CONFIGS_DIR,
    PROMETHEUS_DIR,
    Collector,
    Prometheus,
    collector_binary,
    free_port,
    prometheus_binary,
    wait_for,
)

from otel_train import semconv as sc
from otel_train.check.prometheus import check_prometheus
from otel_train.check.verdicts import PASS

pytestmark = pytest.mark.slow

RANKS, STEPS = 3, 30
BUDGET_PER_RANK = 150  # docs/scaling.md, "Budgets for a 16,384-GPU job"
EXPONENTIAL = "base2_exponential_bucket_histogram"
EXPLICIT = "explicit_bucket_histogram"
HISTOGRAMS = (sc.PROM_STEP_DURATION, sc.PROM_PHASE_DURATION, "training_collective_duration_seconds")


@dataclass
class Run:
    prometheus: Prometheus
    run_id: str
    demo_output: str

    @property
    def selector(self) -> str:
        return f'{{{sc.PROM_RUN_LABEL}="{self.run_id}"}}'

    def series(self) -> list[dict[str, str]]:
        return self.prometheus.api("series", **{"match[]": self.selector})

    def exported_series(self) -> list[dict[str, str]]:
        """What the ranks exported: without the recording rules' outputs (names with a
        colon, by Prometheus' convention), which keep the run label and appear once the
        rules have been evaluated with data (a separate budget, docs/scaling.md)."""
        return [s for s in self.series() if ":" not in s["__name__"]]

    def per_rank(self) -> dict[str, int]:
        return dict(Counter(s.get(sc.PROM_RANK_LABEL, "none") for s in self.exported_series()))


def _demo(collector: Collector, workdir: Path, run_id: str, aggregation: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": aggregation,
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        # a run of seconds exported every half second: rates and exemplars need the points
        # to reach the exporter as often (the default drains every two seconds)
        "OTEL_TRAIN_EMIT_INTERVAL_MS": "200",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BLRP_SCHEDULE_DELAY": "200",
        "OTEL_TRAIN_OUTPUT_DIR": str(workdir / "runs"),
    })
    # rank 0 pauses 0.25 s every fifth step (all ranks wait at its collectives): the steps
    # span several of the half-second exports, so every rank's series rise between samples
    # (a rank whose 30 steps all reached Prometheus in one export has rates of 0 and ratios
    # of 0/0: seen once in clean-clone CI, with a loaded machine's slow exporter start)
    argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS), "--steps",
            str(STEPS), "--no-compile", "--ddp", "--workers", "0", "--run-id", run_id,
            "--output-dir", str(workdir / "runs"), "--slow-rank", "0", "--slow-s", "0.25"]
    done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _run(tmp_path_factory: pytest.TempPathFactory, aggregation: str) -> Iterator[Run]:
    collector_binary()
    prometheus_binary()
    workdir = tmp_path_factory.mktemp(f"budget-{aggregation[:8]}")
    # only the run's own path: no scrape of a rank endpoint or a collector exporter
    prometheus = Prometheus(workdir, targets={"otel-train-collector": [], "otel-train-ranks": [],
                                              "otelcol": []},
                            extra_args=["--web.enable-remote-write-receiver",
                                        "--enable-feature=native-histograms"])
    collector = Collector(CONFIGS_DIR / "gateway.yaml", workdir)
    nowhere = f"127.0.0.1:{free_port()}"  # Tempo and Loki are not part of this test
    run_id = f"budget-{uuid.uuid4().hex[:10]}"
    try:
        prometheus.start()
        collector.extra_env.update({
            "PROMETHEUS_REMOTE_WRITE_ENDPOINT": f"{prometheus.url}/api/v1/write",
            "TEMPO_OTLP_ENDPOINT": nowhere, "LOKI_OTLP_ENDPOINT": f"http://{nowhere}/otlp",
        })
        collector.start()
        output = _demo(collector, workdir, run_id, aggregation)
        run = Run(prometheus, run_id, output)
        steps = (f"({sc.PROM_STEP_DURATION}_count{run.selector} or "
                 f"histogram_count({sc.PROM_STEP_DURATION}{run.selector}))")

        def every_step_arrived() -> bool:
            got = {r["metric"].get(sc.PROM_RANK_LABEL): float(r["value"][1])
                   for r in prometheus.query(steps)}
            return got == {str(r): float(STEPS) for r in range(RANKS)}

        wait_for("every rank's last step in Prometheus", every_step_arrived, 120,
                 on_timeout=lambda: prometheus.log_tail() + collector.log_tail())
        yield run
    finally:
        collector.kill()
        prometheus.kill()


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from _run(tmp_path_factory, EXPONENTIAL)


@pytest.fixture(scope="module")
def classic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from _run(tmp_path_factory, EXPLICIT)


def _assert_within_budget(run: Run, kind: str) -> None:
    per_rank = run.per_rank()
    print(f"\nseries per rank ({kind}, {RANKS} gloo ranks, {STEPS} steps, remote write): "
          f"{dict(sorted(per_rank.items()))}")
    names = Counter((s.get(sc.PROM_RANK_LABEL, "none"), s["__name__"])
                    for s in run.exported_series())
    assert set(per_rank) == {str(r) for r in range(RANKS)}, (per_rank, names)
    assert max(per_rank.values()) <= BUDGET_PER_RANK, \
        f"{kind}: {per_rank} series per rank, budget {BUDGET_PER_RANK}: {names}"


def test_native_histograms_keep_every_rank_within_the_series_budget(native: Run) -> None:
    _assert_within_budget(native, "exponential -> native histograms")


def test_classic_bucket_fallback_keeps_every_rank_within_the_series_budget(classic: Run) -> None:
    _assert_within_budget(classic, "explicit buckets (fallback)")


def test_exponential_histograms_are_stored_as_native_histograms(native: Run) -> None:
    names = {s["__name__"] for s in native.series()}
    assert not {n for n in names if n.endswith(("_bucket", "_count", "_sum"))
                and n.startswith("training_")}, sorted(names)
    for name in HISTOGRAMS:
        result = native.prometheus.query(f"{name}{native.selector}")
        assert result and all("histogram" in r for r in result), (name, result[:1])


def test_native_histogram_exemplars_arrive_by_remote_write(native: Run) -> None:
    data = native.prometheus.api("query_exemplars",
                                 query=f"{sc.PROM_STEP_DURATION}{native.selector}",
                                 start="0", end="9999999999")
    exemplars = [e for series in data for e in series["exemplars"]]
    assert exemplars, "no exemplars on the native step histogram"
    assert all(len(e["labels"].get("trace_id", "")) == 32 for e in exemplars), exemplars[:3]


@pytest.mark.parametrize("record", [
    "training_run_rank:step_duration_seconds:mean5m",
    "training_run_rank_phase:phase_duration_seconds:share5m",
    "training_run_rank:collective_duration_seconds:per_step5m",
    "training_run_op:collective_duration_seconds:p99_5m",
])
def test_recording_rules_evaluate_on_native_histograms(native: Run, record: str) -> None:
    groups = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())["groups"]
    rules = {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}
    # the expression itself, now (the recording group's 30 s interval is not waited for)
    result = [r for r in native.prometheus.query(rules[record])
              if r["metric"].get(sc.PROM_RUN_LABEL) == native.run_id]
    assert result, f"{record} is empty on native histograms"
    if not all(float(r["value"][1]) >= 0 for r in result):
        # each rank's step counts as Prometheus holds them: a rank whose counts never rose
        # in the window gives 0/0
        counts = native.prometheus.query(
            f"histogram_count({sc.PROM_STEP_DURATION}{native.selector})[5m:1s]")
        raise AssertionError(f"{result}\nstep counts by sample: {counts}")


def test_every_rule_expression_evaluates_on_native_histograms(native: Run) -> None:
    groups = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        native.prometheus.query(rule["expr"])  # asserts status "success": no error


def test_otel_train_check_passes_on_native_histograms(native: Run) -> None:
    results = {r.id: r for r in check_prometheus(native.prometheus.url, native.run_id)}
    for item in ("exemplars", "per_rank_metrics", "telemetry_complete"):
        assert results[item].status == PASS, (item, results[item].evidence)
    assert results["per_rank_metrics"].evidence == \
        f"{sc.PROM_STEP_DURATION} series for ranks {list(range(RANKS))}"


def test_dashboard_queries_evaluate_on_native_histograms(native: Run) -> None:
    sys.path.insert(0, str(REPO_ROOT / "dashboards"))
    from otel_dashboards import queries

    # the compare dashboard's two runs: the run against itself
    values = {"run_id": native.run_id, "run_a": native.run_id, "run_b": native.run_id,
              "rank": ".*", "world_size": str(RANKS),
              "backend": ".*", "namespace": ".*", "pod": ".*", "service": "otel-train",
              "link_peak_gbps": "450", "stall_threshold": "1s", "rule_group": ".*",
              "__rate_interval": "2m", "__interval": "30s", "__range": "30m"}
    found = [(q.id, queries.interpolate(q.text, values)) for q in queries.queries()
             if q.lang == "promql"]
    empty = []
    for qid, expr in found:
        result = native.prometheus.query(expr)  # asserts status "success": no error
        if not result and (sc.PROM_STEP_DURATION in expr or sc.PROM_PHASE_DURATION in expr):
            empty.append(qid)
    assert found and empty == [], empty
