"""``otel-train check --jaeger`` against a real Jaeger v2 (built by tools/jaeger/install.sh,
in-memory storage, every port a free one on 127.0.0.1).

A real 2-rank demo, launched under a TRACEPARENT with a trace-id ratio sampler, exports OTLP
straight to Jaeger while a real Prometheus scrapes its rank endpoints: the trace items and the
exemplars pass from the live data. A second real run, written to files, loses one rank's spans
of every other step (as a per-rank sampler would) before being sent to Jaeger over OTLP/HTTP:
sampling consistency fails with the missing rank named. A run id Jaeger never saw fails every
trace item, saying so.
"""

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
from support.jaeger import Jaeger, running_jaeger
from support.pipeline_fixtures import (
    Prometheus,
    adjacent_free_ports,
    free_port,
    http_post_json,
    json_lines,
    prometheus_binary,
    wait_for,
)
from support.report_fixtures import break_rank_sampling, run_demo

from otel_train import semconv as sc
from otel_train.check.jaeger import ITEMS, JaegerAPI, check_jaeger
from otel_train.check.prometheus import live_exemplar_ids
from otel_train.check.verdicts import FAIL, PASS
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS, RANKS = 60, 2
LAUNCHER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{LAUNCHER_SPAN}-01"
@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    with running_jaeger(tmp_path_factory.mktemp("jaeger")) as server:
        yield server


@dataclass
class LiveRun:
    run_id: str
    prometheus_url: str


@pytest.fixture(scope="module")
def live_run(jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A demo exporting OTLP to Jaeger, its rank endpoints scraped by Prometheus."""
    prometheus_binary()
    workdir = tmp_path_factory.mktemp("live")
    rank_port = adjacent_free_ports()
    prometheus = Prometheus(workdir, targets={
        "otel-train-ranks": [f"127.0.0.1:{rank_port + r}" for r in range(RANKS)]})
    run_id = f"jaeger-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
        "OTEL_TRAIN_PROMETHEUS_PORT": str(rank_port),
        "TRACEPARENT": TRACEPARENT,
    })
    argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS), "--steps",
            str(STEPS), "--no-compile", "--workers", "0", "--run-id", run_id,
            "--output-dir", str(workdir / "runs"),
            # a straggler keeps the rank endpoints up for seconds of 1 s scrapes
            "--slow-rank", "1"]
    try:
        prometheus.start()
        done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        wait_for("the run's exemplars in Prometheus",
                 lambda: live_exemplar_ids(prometheus.url, run_id), 60,
                 on_timeout=prometheus.log_tail)
        yield LiveRun(run_id, prometheus.url)
    finally:
        prometheus.kill()


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict]]:
    code = main(["check", *argv, "--json"])
    return code, {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


def test_a_live_run_passes_the_trace_items(jaeger: Jaeger, live_run: LiveRun,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--run-id", live_run.run_id)
    assert code == 0, checks
    assert set(checks) == set(ITEMS)
    for item in ITEMS:
        assert checks[item]["status"] == PASS, checks[item]
        assert checks[item]["source"] == "jaeger"
    sampled = int(checks["trace_coverage"]["evidence"].split()[0])
    assert 0 < sampled < STEPS, checks["trace_coverage"]  # a trace-id ratio of 0.5
    assert f"all {RANKS} ranks each" in checks["sampling_consistency"]["evidence"]
    assert LAUNCHER_SPAN in checks["launcher_context"]["evidence"]


def test_live_exemplars_resolve_to_jaeger_traces(jaeger: Jaeger, live_run: LiveRun,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--prometheus",
                              live_run.prometheus_url, "--run-id", live_run.run_id)
    exemplars = checks["exemplars"]
    assert exemplars["status"] == PASS, exemplars
    assert "prometheus+jaeger" in exemplars["source"].split(",")
    assert "Prometheus exemplars of the run name a span held by Jaeger" in exemplars["evidence"]
    for item in ITEMS:  # Jaeger's pass outranks Prometheus's "traces are not in Prometheus"
        assert checks[item]["status"] == PASS, checks[item]


def test_an_exemplar_naming_no_stored_span_fails(jaeger: Jaeger, live_run: LiveRun) -> None:
    real = live_exemplar_ids(live_run.prometheus_url, live_run.run_id)
    unknown = ("0123456789abcdef0123456789abcdef", "0123456789abcdef")
    rows = {r.id: r for r in check_jaeger(jaeger.url, live_run.run_id,
                                          frozenset(real | {unknown}))}
    assert rows["exemplars"].status == FAIL
    assert f"{len(real)} of {len(real) + 1} Prometheus exemplars" in rows["exemplars"].evidence


def test_a_rank_sampling_differently_fails(jaeger: Jaeger, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run_id = f"jaeger-broken-{uuid.uuid4().hex[:8]}"
    run_dir = run_demo(tmp_path, run_id, 8)
    break_rank_sampling(run_dir, rank=1)
    sent = 0
    for path in sorted(run_dir.glob(sc.TRACES_GLOB)):
        for request in json_lines(path):
            assert http_post_json(f"{jaeger.otlp_http}/v1/traces", request) == 200
            sent += 1
    assert sent
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--run-id", run_id)
    assert code == 1
    sampling = checks["sampling_consistency"]
    assert sampling["status"] == FAIL and "step 1 backward: ranks [1] missing" in \
        sampling["evidence"], sampling
    assert "trace-id ratio sampler" in sampling["fix"]
    assert checks["same_trace_across_ranks"]["status"] == PASS


def test_a_run_jaeger_never_saw_fails_every_trace_item(
        jaeger: Jaeger, capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--run-id", "no-such-run")
    assert code == 1
    for item in ITEMS:
        assert checks[item]["status"] == FAIL
        assert "holds no span of run 'no-such-run'" in checks[item]["evidence"]


def test_jaeger_without_a_run_id_is_a_usage_error(jaeger: Jaeger,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--jaeger", jaeger.url]) == 2
    assert "--jaeger needs --run-id" in capsys.readouterr().err


def test_by_id_lookup_leaves_unknown_traces_out(jaeger: Jaeger, live_run: LiveRun) -> None:
    trace_id = next(iter(live_exemplar_ids(live_run.prometheus_url, live_run.run_id)))[0]
    found = JaegerAPI(jaeger.url).traces_by_id([trace_id, "0" * 31 + "1"])
    assert [t["traceID"].rjust(32, "0") for t in found] == [trace_id]


def test_an_unreachable_jaeger_is_a_source_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--jaeger", f"http://127.0.0.1:{free_port()}", "--run-id", "x"]) == 2
    assert "otel-train check:" in capsys.readouterr().err

