"""``otel-train report`` and ``otel-train check`` on the real pipeline: a 2-rank demo exports
OTLP to the collector (collector/configs/local.yaml, whose file exporter appends every run to
one traces.jsonl) and a real Prometheus scrapes the collector and the ranks with the
repository's prometheus.yml and alert rules. Half the steps are sampled, rank 1 straggles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO_ROOT
from support.pipeline_fixtures import (
    CONFIGS_DIR,
    Collector,
    Prometheus,
    adjacent_free_ports,
    collector_binary,
    prometheus_binary,
    wait_for,
)

from otel_train import semconv as sc
from otel_train.analysis.build import build_report
from otel_train.check.prometheus import PrometheusAPI, check_prometheus
from otel_train.check.rundir import check_run_dir
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS, RANKS = 40, 2


@dataclass
class Pipeline:
    collector: Collector
    prometheus: Prometheus
    run_id: str


def demo_env(collector: Collector, workdir: Path, prometheus_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BLRP_SCHEDULE_DELAY": "200",
        "OTEL_TRAIN_OUTPUT_DIR": str(workdir / "runs"),
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
        "OTEL_TRAIN_PROMETHEUS_PORT": str(prometheus_port),
    })
    return env




def run_demo(collector: Collector, workdir: Path, run_id: str, rank_port: int) -> None:
    argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS), "--steps",
            str(STEPS), "--no-compile", "--ddp", "--workers", "0", "--run-id", run_id,
            "--output-dir", str(workdir / "runs"), "--slow-rank", "1"]
    done = subprocess.run(argv, env=demo_env(collector, workdir, rank_port), cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    collector_binary()
    prometheus_binary()
    workdir = tmp_path_factory.mktemp("pipeline")
    collector = Collector(CONFIGS_DIR / "local.yaml", workdir)
    rank_port = adjacent_free_ports()
    # a generous scrape interval (and timeout): a loaded CI machine must not miss the scrapes
    prometheus = Prometheus(workdir, scrape_interval="3s", targets={
        "otel-train-collector": [f"127.0.0.1:{collector.ports['prometheus']}"],
        "otelcol": [f"127.0.0.1:{collector.ports['telemetry']}"],
        "otel-train-ranks": [f"127.0.0.1:{rank_port + r}" for r in range(RANKS)],
    })
    run_id = f"check-{uuid.uuid4().hex[:10]}"
    try:
        collector.start()
        prometheus.start()
        run_demo(collector, workdir, run_id, rank_port)
        wait_for("the collector to write everything it received", collector.drained, 60,
                 on_timeout=collector.log_tail)
        wait_for("every rank's step histogram in Prometheus", lambda: len(prometheus.query(
            f'{sc.PROM_STEP_DURATION}_count{{{sc.PROM_RUN_LABEL}="{run_id}"}}')) >= RANKS, 120,
                 on_timeout=prometheus.log_tail)
        wait_for("the run's exemplars in Prometheus", lambda: PrometheusAPI(
            prometheus.url).exemplars(f'{sc.PROM_STEP_DURATION}_bucket'
                                      f'{{{sc.PROM_RUN_LABEL}="{run_id}"}}'), 120)
        yield Pipeline(collector, prometheus, run_id)
    finally:
        prometheus.kill()
        collector.kill()


def test_report_reads_the_collector_output(pipeline: Pipeline) -> None:
    report = build_report(pipeline.collector.output_dir, run_id=pipeline.run_id)
    assert report.ranks == [0, 1] and report.run_id == pipeline.run_id
    assert report.trained_steps == STEPS
    assert 0 < report.sampled_steps < STEPS  # a trace-id ratio of 0.5
    assert {s.rank for s in report.slow_steps if s.step % 5 == 4 and s.step > 0} <= {1}


def test_the_collector_output_passes_the_trace_and_log_items(pipeline: Pipeline) -> None:
    results = {r.id: r for r in check_run_dir(pipeline.collector.output_dir, pipeline.run_id)}
    for item in ("trace_coverage", "same_trace_across_ranks", "sampling_consistency",
                 "exemplars", "log_fields", "per_rank_metrics", "telemetry_complete"):
        assert results[item].status == PASS, (item, results[item].evidence)
    assert results["launcher_context"].status == NOT_APPLICABLE, results["launcher_context"]


def test_live_prometheus_passes_with_the_repository_rules(pipeline: Pipeline) -> None:
    results = {r.id: r for r in check_prometheus(pipeline.prometheus.url, pipeline.run_id)}
    for item in ("exemplars", "per_rank_metrics", "throttling_alert", "telemetry_complete"):
        assert results[item].status == PASS, (item, results[item].evidence)


def test_cli_combines_files_and_prometheus(pipeline: Pipeline,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", str(pipeline.collector.output_dir), "--prometheus",
                 pipeline.prometheus.url, "--run-id", pipeline.run_id, "--json"])
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    failing = sorted(i for i, c in checks.items() if c["status"] == FAIL)
    # the cgroup throttling source is a later issue: until then it is the only failure
    assert failing in ([], ["cpu_throttling_measured"]), [checks[i] for i in failing]
    assert code == (1 if failing else 0)
    # the run's live exemplars were looked up among the collector's spans, and found
    assert set(checks["exemplars"]["source"].split(",")) == {"run dir", "prometheus",
                                                              "prometheus+run dir"}
    assert "Prometheus exemplars of the run name a span in the files" in \
        checks["exemplars"]["evidence"]
