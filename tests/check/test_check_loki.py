"""``otel-train check --loki``: an HTTP client of the user's Loki, and the log fields end to end
through the real collector.

No real Loki runs here (AGPL-3.0, and the registries mark its module not to be used): the
client is tested against ``tests/support/loki_standin.py``, which implements Loki's documented
``query_range`` API and OTLP ingestion (the subset the client uses) and refuses any other LogQL.

A real 2-rank demo exports its logs and metrics over OTLP to the real collector
(collector/configs/local.yaml, file exporter) and its traces to a real Jaeger. The collector's
output file is read back: ``otel-train check`` over it passes ``log_fields``, and the same
records, pushed to the stand-in the way the gateway's OTLP/HTTP exporter pushes them to Loki,
pass ``log_fields`` through ``--loki`` with the same evidence (and with ``--jaeger``, every
trace item too). A second real run, written to files, has its log records stripped of their
trace and span ids before being pushed: ``log_fields`` fails naming both. A run id Loki never
saw fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO_ROOT
from support.loki_standin import LokiStandin, RunningStandin, parse_query, running_loki_standin
from support.pipeline_fixtures import (
    CONFIGS_DIR,
    Collector,
    http_post_json,
    json_lines,
    read_logs,
    running_collector,
    wait_for,
)
from support.report_fixtures import break_log_ids, run_demo
from test_check_jaeger import Jaeger, running_jaeger

from otel_train import semconv as sc
from otel_train.check.loki import LokiAPI, run_query
from otel_train.check.verdicts import FAIL, PASS
from otel_train.cli import main

STEPS, RANKS = 6, 2
TRACE_ITEMS = ("trace_coverage", "same_trace_across_ranks", "sampling_consistency")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with running_collector(CONFIGS_DIR / "local.yaml",
                           tmp_path_factory.mktemp("collector")) as running:
        yield running


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    with running_jaeger(tmp_path_factory.mktemp("jaeger")) as server:
        yield server


def logs_written(collector: Collector) -> int:
    """Log records the collector accepted, once its file exporter has written every one."""
    samples = collector.telemetry()
    accepted = sum(v for name, _, v in samples
                   if name.startswith("otelcol_receiver_accepted_log_records"))
    sent = sum(v for name, labels, v in samples
               if name.startswith("otelcol_exporter_sent_log_records")
               and labels.get("exporter") == "file/logs")
    written = len(read_logs(collector.output_dir / "logs.jsonl"))
    return int(written) if accepted and accepted == sent == written else 0


@pytest.fixture(scope="module")
def live_run_id(collector: Collector, jaeger: Jaeger,
                tmp_path_factory: pytest.TempPathFactory) -> str:
    """A demo sending logs and metrics to the collector, traces to Jaeger."""
    workdir = tmp_path_factory.mktemp("live")
    run_id = f"loki-{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.otlp_http,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http}/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    })
    argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS), "--steps",
            str(STEPS), "--no-compile", "--workers", "0", "--run-id", run_id,
            "--output-dir", str(workdir / "runs")]
    done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    wait_for("the collector to write every log record it accepted",
             lambda: logs_written(collector), 60, on_timeout=collector.log_tail)
    return run_id


@pytest.fixture(scope="module")
def loki(collector: Collector, live_run_id: str) -> Iterator[RunningStandin]:
    """The stand-in, holding the collector's output as Loki would after the gateway's push."""
    with running_loki_standin() as server:
        for request in json_lines(collector.output_dir / "logs.jsonl"):
            assert http_post_json(server.otlp_logs, request) == 200
        yield server


def lines(url: str, run_id: str, page: int = 5000) -> list[tuple[int, str, dict]]:
    end = time.time_ns()
    return list(LokiAPI(url, page=page).lines(run_query(run_id), end - 3600 * 10**9, end))


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict]]:
    code = main(["check", *argv, "--json"])
    return code, {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


# --- end to end: the real collector's output --------------------------------------------


@pytest.mark.slow
def test_the_collector_s_output_carries_every_log_field(
        collector: Collector, live_run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, checks = check_json(capsys, str(collector.output_dir), "--run-id", live_run_id)
    row = checks["log_fields"]
    assert row["status"] == PASS, row
    assert f"carry {', '.join(sc.LOG_REQUIRED_FIELDS)}" in row["evidence"]
    assert f"timed records carry {sc.LOG_PHASE} and {sc.LOG_DURATION}" in row["evidence"]


@pytest.mark.slow
def test_loki_s_copy_of_the_collector_s_output_passes_log_fields_with_the_same_evidence(
        collector: Collector, loki: RunningStandin, live_run_id: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, from_files = check_json(capsys, str(collector.output_dir), "--run-id", live_run_id)
    code, checks = check_json(capsys, "--loki", loki.url, "--run-id", live_run_id)
    assert code == 0 and list(checks) == ["log_fields"], checks
    row = checks["log_fields"]
    assert row["status"] == PASS and row["source"] == "loki", row
    assert row["evidence"] == from_files["log_fields"]["evidence"]


@pytest.mark.slow
def test_jaeger_and_loki_together_pass_traces_and_logs(
        loki: RunningStandin, jaeger: Jaeger, live_run_id: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, checks = check_json(capsys, "--jaeger", jaeger.url, "--loki", loki.url, "--run-id",
                              live_run_id)
    assert code == 0, checks
    for item in (*TRACE_ITEMS, "log_fields"):
        assert checks[item]["status"] == PASS, checks[item]


@pytest.mark.slow
def test_paging_reads_every_line_once(loki: RunningStandin, live_run_id: str) -> None:
    whole = lines(loki.url, live_run_id)
    paged = lines(loki.url, live_run_id, page=7)
    assert len(whole) > 7 * 2
    assert sorted(paged) == sorted(whole) and len(set(map(repr, paged))) == len(paged)


@pytest.mark.slow
def test_logs_without_ids_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = f"loki-broken-{uuid.uuid4().hex[:8]}"
    run_dir = run_demo(tmp_path, run_id, 4)
    break_log_ids(run_dir)
    with running_loki_standin() as server:
        sent = 0
        for path in sorted(run_dir.glob(sc.LOGS_GLOB)):
            for request in json_lines(path):
                assert http_post_json(server.otlp_logs, request) == 200
                sent += 1
        assert sent
        code, checks = check_json(capsys, "--loki", server.url, "--run-id", run_id)
    row = checks["log_fields"]
    assert code == 1 and row["status"] == FAIL, row
    assert "lack trace_id" in row["evidence"] and "lack span_id" in row["evidence"], row
    assert "lack run_id" not in row["evidence"]


# --- the client against the stand-in ------------------------------------------------------


def test_a_run_loki_never_saw_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with running_loki_standin() as server:
        code, checks = check_json(capsys, "--loki", server.url, "--run-id", "no-such-run")
    assert code == 1
    assert checks["log_fields"]["status"] == FAIL
    assert "holds no line of run 'no-such-run'" in checks["log_fields"]["evidence"]


def test_loki_without_a_run_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--loki", "http://127.0.0.1:9"]) == 2
    assert "--loki needs --run-id" in capsys.readouterr().err


def test_the_client_s_query_is_one_the_standin_implements() -> None:
    matchers = parse_query(run_query("run-1"))
    assert [(m.name, m.op, m.value) for m in matchers] == [
        ("service_name", "=~", ".+"), ("training_run_id", "=", "run-1")]


# --- the stand-in follows Loki's documented behaviour ---------------------------------------


def otlp_record(run_id: str, ts: int, body: str = "step done") -> dict:
    return {"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "otel-train"}},
            {"key": "training.run.id", "value": {"stringValue": run_id}}]},
        "scopeLogs": [{"scope": {"name": "otel_train"}, "logRecords": [{
            "timeUnixNano": str(ts), "body": {"stringValue": body},
            "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
            "severityText": "INFO",
            "attributes": [{"key": "rank", "value": {"intValue": "1"}}]}]}]}]}


def test_the_standin_stores_otlp_as_loki_s_otlp_ingestion_does() -> None:
    store = LokiStandin()
    store.push_otlp(otlp_record("run-1", 1000))
    ((ts, line, labels),) = store.entries
    assert (ts, line) == (1000, "step done")
    assert labels == {"service_name": "otel-train", "training_run_id": "run-1",
                      "scope_name": "otel_train", "trace_id": "0af7651916cd43dd8448eb211c80319c",
                      "span_id": "b7ad6b7169203331", "severity_text": "INFO", "rank": "1"}


def test_the_standin_honours_limit_direction_and_a_half_open_range() -> None:
    store = LokiStandin()
    for ts in (10, 20, 30, 40):
        store.push_otlp(otlp_record("run-1", ts, body=f"line {ts}"))
    query = run_query("run-1")

    def bodies(**kw) -> list[str]:
        data = store.query_range(query, **kw)
        assert data["resultType"] == "streams"
        return [v[1] for s in data["result"] for v in s["values"]]

    assert bodies(start_ns=10, end_ns=40, limit=2, direction="forward") == ["line 10", "line 20"]
    assert bodies(start_ns=10, end_ns=40, limit=2) == ["line 30", "line 20"]  # backward
    assert bodies(start_ns=0, end_ns=100, limit=100) == ["line 40", "line 30", "line 20", "line 10"]


def test_the_standin_answers_400_to_logql_it_does_not_implement() -> None:
    with running_loki_standin() as server:
        api = LokiAPI(server.url)
        for query in ('{service_name=~".+"} |= "step"', 'sum(count_over_time({a="b"}[1m]))',
                      '{service_name=~".+"} | json'):
            with pytest.raises(OSError, match=f"Loki at {server.url} answered HTTP 400 to "
                               "/loki/api/v1/query_range: parse error"):
                api.get("/loki/api/v1/query_range", query=query, start="0", end="1")
