"""The dashboards on real training telemetry: a Prometheus scraping an ``otel-train demo`` run.

The demo's ranks serve their metrics through prometheus-client (``OTEL_TRAIN_PROMETHEUS_PORT``);
a real Prometheus scrapes them every second. Every panel query over the metrics the demo
exposes must return series for the demo's run, and the step histogram's exemplars must be
traces that the run actually exported.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO_ROOT
from support.pipeline_fixtures import (
    Process,
    Prometheus,
    adjacent_free_ports,
    read_spans,
    wait_for,
)

sys.path.insert(0, str(REPO_ROOT / "dashboards"))
from otel_dashboards import queries  # noqa: E402

pytestmark = pytest.mark.slow

RANKS = 2
STEPS = 300




@dataclass
class DemoRun:
    prometheus: Prometheus
    run_id: str
    run_dir: Path
    last_scrape: float  # the last time Prometheus has the run's samples

    def query(self, expr: str) -> list[dict]:
        return self.prometheus.api("query", query=expr, time=f"{self.last_scrape:.3f}")["result"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[DemoRun]:
    workdir = tmp_path_factory.mktemp("dash-demo")
    port = adjacent_free_ports()
    run_id = f"dash-demo-{os.getpid()}"
    prometheus = Prometheus(
        workdir,
        {
            "otel-train-ranks": [f"127.0.0.1:{port + r}" for r in range(RANKS)],
            "otel-train-collector": [],
            "otelcol": [],
        },
    )
    env = dict(
        os.environ, OTEL_TRAIN_PROMETHEUS_PORT=str(port), OTEL_TRAIN_PROMETHEUS_ADDR="127.0.0.1"
    )
    argv = [
        sys.executable,
        "-m",
        "otel_train.cli",
        "demo",
        "--ranks",
        str(RANKS),
        "--steps",
        str(STEPS),
    ]
    argv += ["--no-compile", "--output-dir", str(workdir / "runs"), "--run-id", run_id]
    run = Process("demo", argv, env, workdir / "demo.log")
    try:
        prometheus.start()
        run.start()
        assert run.proc is not None
        assert run.proc.wait(timeout=400) == 0, run.log_tail()
        selector = f'training_step_duration_seconds_count{{training_run_id="{run_id}"}}'
        last = wait_for(
            "the demo's samples in Prometheus",
            lambda: prometheus.query(f"max(max_over_time(timestamp({selector})[10m:1s]))"),
            timeout=30,
            on_timeout=prometheus.log_tail,
        )
        yield DemoRun(prometheus, run_id, workdir / "runs" / run_id, float(last[0]["value"][1]))
    finally:
        run.kill()
        prometheus.kill()


def exposed_metrics(demo: DemoRun) -> set[str]:
    names = demo.query(f'count by (__name__) ({{training_run_id="{demo.run_id}"}})')
    found = {r["metric"]["__name__"] for r in names}
    # the dashboards read a histogram in either form (the classic one `or` the native one,
    # whose series has the histogram's own name); this demo's Prometheus holds the classic
    return found | {n.removesuffix("_bucket") for n in found if n.endswith("_bucket")}


METRIC = re.compile(r"\b((?:training|otel_train)_[a-z_]+)(?=\{)")  # a metric: its selector follows


def test_panels_over_the_demos_metrics_return_series(demo):
    exposed = exposed_metrics(demo)
    assert {
        "training_step_duration_seconds_bucket",
        "training_phase_duration_seconds_bucket",
    } <= exposed
    values = {
        "run_id": demo.run_id,
        "run_a": demo.run_id,  # the compare dashboard: the run against itself
        "run_b": demo.run_id,
        "rank": ".*",
        "world_size": str(RANKS),
        "__rate_interval": "1m",
        "__range": "10m",
        "__interval": "15s",
    }
    phase_count = f'training_phase_duration_seconds_count{{training_run_id="{demo.run_id}"}}'
    phases = {
        r["metric"]["training_phase"]
        for r in demo.query(f"count by (training_phase) ({phase_count})")
    }
    assert {"data_wait", "forward", "backward", "optimizer"} <= phases
    checked, empty = [], []
    for q in queries.queries():
        if (
            q.lang != "promql"
            or not set(METRIC.findall(q.text))
            or not set(METRIC.findall(q.text)) <= exposed
        ):
            continue
        if not set(re.findall(r"\$\{?(\w+)", q.text)) <= set(values):
            continue  # needs Kubernetes or Prometheus-internal series: test_dashboards_queries.py
        if not set(re.findall(r'training_phase="(\w+)"', q.text)) <= phases:
            continue  # a phase this demo does not have (exposed_comm needs overlapped collectives)
        checked.append(q.id)
        if not demo.query(queries.interpolate(q.text, values)):
            empty.append(q.id)
    assert empty == []
    for panel in (
        "Step time distribution",
        "Step time percentiles",
        "Step-time breakdown",
        "Phase p90 by phase",
        "Throughput",
        "Per-rank step time p50",
        "Straggler skew",
        "Per-rank data wait p90",
        "B vs A: step time",
        "Parts per step",
    ):
        assert any(panel in qid for qid in checked), panel


def test_a_run_compared_with_itself_changes_by_nothing(demo):
    board = queries.dashboards()["compare-runs.json"]
    panel = next(p for p in queries.panels(board) if p["title"].startswith("B vs A: step time"))
    values = {"run_a": demo.run_id, "run_b": demo.run_id, "__range": "10m"}
    for target in panel["targets"]:  # mean and p95
        result = demo.query(queries.interpolate(target["expr"], values))
        assert [float(r["value"][1]) for r in result] == [0], (target["refId"], result)


def test_the_step_time_breakdown_adds_up_to_100_percent_on_the_demo(demo):
    """The share panel over a real run: the parts the SDK emits add up to its step time."""
    board = queries.dashboards()["training-attribution.json"]
    panel = next(p for p in queries.panels(board) if p["title"].startswith("Step-time breakdown"))
    values = {"run_id": demo.run_id, "rank": ".*", "__rate_interval": "1m"}
    shares = {
        r["metric"]["training_part"]: float(r["value"][1])
        for r in demo.query(queries.interpolate(panel["targets"][0]["expr"], values))
    }
    assert {"data_wait", "forward", "backward", "optimizer"} <= set(shares), shares
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01), shares


def test_step_time_exemplars_open_traces_the_run_exported(demo):
    found = demo.prometheus.api(
        "query_exemplars",
        query=f'training_step_duration_seconds_bucket{{training_run_id="{demo.run_id}"}}',
        start=f"{demo.last_scrape - 900:.3f}",
        end=f"{demo.last_scrape + 1:.3f}",
    )
    exemplar_traces = {e["labels"]["trace_id"] for series in found for e in series["exemplars"]}
    spans = [s for path in demo.run_dir.glob("traces*.jsonl") for s in read_spans(path)]
    step_traces = {s["traceId"] for s in spans if s["name"] == "training.step"}
    assert exemplar_traces, "no exemplars on the step histogram"
    assert exemplar_traces <= step_traces
    # and the trace is the whole step: every rank's rank_step span is in it
    trace = next(iter(exemplar_traces))
    ranks = {
        s["attrs"]["training.rank"]
        for s in spans
        if s["traceId"] == trace and s["name"] == "training.rank_step"
    }
    assert ranks == set(range(RANKS))
