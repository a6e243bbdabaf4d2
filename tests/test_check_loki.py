"""``otel-train check --loki`` against a real Loki (built by tools/loki/install.sh, the single
binary with an in-memory ring and local files, every port a free one on 127.0.0.1).

A real 2-rank demo sends its logs over OTLP straight to Loki (and its traces to a real Jaeger):
`log_fields` passes from Loki's copy, and with `--jaeger` every trace item too. A second real
run, written to files, has its log records stripped of their trace and span ids before being
sent to Loki over OTLP/HTTP: `log_fields` fails naming both. A run id Loki never saw fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT, require_binary
from pipeline_fixtures import (
    Process,
    free_port,
    http_get,
    http_post_json,
    json_lines,
    wait_for,
)
from report_fixtures import break_log_ids, run_demo
from test_check_jaeger import Jaeger, running_jaeger

from otel_train import semconv as sc
from otel_train.check.loki import LokiAPI, run_query
from otel_train.check.model import FAIL, PASS
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS, RANKS = 6, 2
DEFAULT_LOKI = REPO_ROOT / "tools" / "loki" / "bin" / "loki"
LOKI_CONFIG = REPO_ROOT / "tools" / "loki" / "config.yaml"
TRACE_ITEMS = ("trace_coverage", "same_trace_across_ranks", "sampling_consistency")


@dataclass
class Loki:
    process: Process
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_logs(self) -> str:
        return f"{self.url}/otlp/v1/logs"


@pytest.fixture(scope="module")
def loki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loki]:
    binary = require_binary("loki", "OTEL_TRAIN_LOKI_BIN", DEFAULT_LOKI)
    workdir = tmp_path_factory.mktemp("loki")
    port = free_port()
    env = {**os.environ, "LOKI_HTTP_PORT": str(port), "LOKI_GRPC_PORT": str(free_port()),
           "LOKI_DATA_DIR": str(workdir / "data")}
    process = Process("loki", [binary, f"-config.file={LOKI_CONFIG}",
                               "-config.expand-env=true"], env, workdir / "loki.log").start()
    server = Loki(process, port)

    def ready() -> bool:
        if not process.alive():
            raise AssertionError("loki exited" + process.log_tail())
        return http_get(f"{server.url}/ready", timeout=2) == (200, "ready\n")

    try:
        wait_for("loki to be ready", ready, 120, on_timeout=process.log_tail)
        yield server
    finally:
        process.kill()


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    with running_jaeger(tmp_path_factory.mktemp("jaeger")) as server:
        yield server


@pytest.fixture(scope="module")
def live_run_id(loki: Loki, jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A demo sending its logs to Loki and its traces (and metrics, dropped) to Jaeger."""
    workdir = tmp_path_factory.mktemp("live")
    run_id = f"loki-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http,
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": loki.otlp_logs,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    })
    argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS), "--steps",
            str(STEPS), "--no-compile", "--workers", "0", "--run-id", run_id,
            "--output-dir", str(workdir / "runs")]
    done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    wait_for("the run's lines in Loki", lambda: lines(loki, run_id), 60,
             on_timeout=loki.process.log_tail)
    return run_id


def lines(loki: Loki, run_id: str, page: int = 5000) -> list[tuple[int, str, dict]]:
    end = time.time_ns()
    return list(LokiAPI(loki.url, page=page).lines(run_query(run_id), end - 3600 * 10**9, end))


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict]]:
    code = main(["check", *argv, "--json"])
    return code, {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


def test_a_live_run_passes_log_fields(loki: Loki, live_run_id: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--loki", loki.url, "--run-id", live_run_id)
    assert code == 0 and list(checks) == ["log_fields"], checks
    row = checks["log_fields"]
    assert row["status"] == PASS and row["source"] == "loki", row
    assert f"carry {', '.join(sc.LOG_REQUIRED_FIELDS)}" in row["evidence"]
    assert f"timed records carry {sc.LOG_PHASE} and {sc.LOG_DURATION_MS}" in row["evidence"]


def test_jaeger_and_loki_together_pass_traces_and_logs(
        loki: Loki, jaeger: Jaeger, live_run_id: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--loki", loki.url, "--run-id",
                              live_run_id)
    assert code == 0, checks
    for item in (*TRACE_ITEMS, "log_fields"):
        assert checks[item]["status"] == PASS, checks[item]


def test_paging_reads_every_line_once(loki: Loki, live_run_id: str) -> None:
    whole = lines(loki, live_run_id)
    paged = lines(loki, live_run_id, page=7)
    assert len(whole) > 7 * 2
    assert sorted(paged) == sorted(whole) and len(set(map(repr, paged))) == len(paged)


def test_logs_without_ids_fail(loki: Loki, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    run_id = f"loki-broken-{uuid.uuid4().hex[:8]}"
    run_dir = run_demo(tmp_path, run_id, 4)
    break_log_ids(run_dir)
    sent = 0
    for path in sorted(run_dir.glob(sc.LOGS_GLOB)):
        for request in json_lines(path):
            assert http_post_json(loki.otlp_logs, request) in (200, 204)
            sent += 1
    assert sent
    code, checks = check_json(capsys, "--loki", loki.url, "--run-id", run_id)
    row = checks["log_fields"]
    assert code == 1 and row["status"] == FAIL, row
    assert "lack trace_id" in row["evidence"] and "lack span_id" in row["evidence"], row
    assert "lack run_id" not in row["evidence"]


def test_a_run_loki_never_saw_fails(loki: Loki, capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--loki", loki.url, "--run-id", "no-such-run")
    assert code == 1
    assert checks["log_fields"]["status"] == FAIL
    assert "holds no line of run 'no-such-run'" in checks["log_fields"]["evidence"]


def test_loki_without_a_run_id_is_a_usage_error(loki: Loki,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--loki", loki.url]) == 2
    assert "--loki needs --run-id" in capsys.readouterr().err
