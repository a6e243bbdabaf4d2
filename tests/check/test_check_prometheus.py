"""``otel-train check --prometheus`` against a real Prometheus (Debian's), scraping the SDK's
own per-rank endpoints (prometheus-client, OpenMetrics with exemplars) on loopback ports.

Two runs share one Prometheus: "healthy" (2 ranks, exemplars on every sampled step) and
"broken" (no exemplars, dropped spans); ``--run-id`` picks which one is checked. A second,
rule-less Prometheus shows the throttling-alert item failing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO_ROOT
from support.binaries import require_binary
from support.report_fixtures import RunSpec, write_run

from otel_train import semconv as sc
from otel_train.check.prometheus import CADVISOR_THROTTLED, PrometheusAPI, check_prometheus
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS
from otel_train.cli import main
from otel_train.export.prometheus import PrometheusEndpoint

TEST_RULES = f"""groups:
  - name: otel-train-test
    rules:
      - alert: TrainingPodCPUThrottled
        expr: rate({CADVISOR_THROTTLED}[5m]) > 0
        for: 5m
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def repo_rule_files() -> list[Path]:
    """The repository's Prometheus rules (prometheus/rules.yml), once they exist."""
    rules = REPO_ROOT / "prometheus" / "rules.yml"
    return [rules] if rules.is_file() else []


def feed(run_id: str, ranks: int, exemplars: bool, dropped: int) -> list[PrometheusEndpoint]:
    endpoints = []
    for rank in range(ranks):
        endpoint = PrometheusEndpoint("127.0.0.1", free_port(), rank, run_id)
        for step in range(20):
            ids = {"trace_id": f"{step + 1:032x}", "span_id": f"{rank + 1:016x}"}
            endpoint.observe_step(0.1 + 0.01 * rank, {sc.PHASE_FORWARD: 0.05}, 8, 512,
                                  ids if exemplars else None)
        if dropped:
            endpoint.add_dropped(sc.SIGNAL_SPANS, dropped)
        endpoints.append(endpoint)
    return endpoints


def start_prometheus(tmp: Path, targets: list[int], rule_files: list[Path]
                     ) -> tuple[subprocess.Popen, str]:
    """A Prometheus on a free loopback port; a second try if another process took the port."""
    for attempt in range(2):
        port = free_port()
        log = tmp / f"prometheus-{port}.log"
        proc = _spawn_prometheus(tmp, port, targets, rule_files, log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _ready(proc, url, log), 120, "Prometheus ready")  # noqa: B023
            return proc, url
        except RuntimeError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def _ready(proc: subprocess.Popen, url: str, log: Path) -> bool:
    if proc.poll() is not None:  # exited: say why, from its log
        raise RuntimeError(log.read_text(encoding="utf-8")[-3000:])
    return urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200


def _spawn_prometheus(tmp: Path, port: int, targets: list[int], rule_files: list[Path],
                      log: Path) -> subprocess.Popen:
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "otel-train", "static_configs": [
            {"targets": [f"127.0.0.1:{t}" for t in targets]}]}],
    }))
    with open(log, "w", encoding="utf-8") as err:
        return subprocess.Popen(
            [require_binary("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={tmp / f'data-{port}'}",
             f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
            stdout=subprocess.DEVNULL, stderr=err)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}",
                                timeout=5) as response:
        return json.load(response)["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus")
    rules = repo_rule_files()
    if not rules:
        rules = [tmp / "rules.yml"]
        rules[0].write_text(TEST_RULES)
    endpoints = feed("healthy", 2, exemplars=True, dropped=0) + feed("broken", 1, False, 3)
    proc, url = start_prometheus(tmp, [e.port for e in endpoints], rules)
    try:
        wait_for(lambda: len(query(url, f"{sc.PROM_STEP_DURATION}_count")) == 3, 120,
                 "all three ranks scraped")
        wait_for(lambda: query(url, f"{sc.PROM_TELEMETRY_DROPPED}"), 120, "the dropped counter")
        wait_for(lambda: PrometheusAPI(url).exemplars(f"{sc.PROM_STEP_DURATION}_bucket"), 120,
                 "exemplars stored")
        yield url
    finally:
        stop(proc)
        for endpoint in endpoints:
            endpoint.close()


def verdicts(url: str, run_id: str) -> dict[str, tuple[str, str]]:
    return {r.id: (r.status, r.evidence) for r in check_prometheus(url, run_id)}


def test_healthy_run_has_exemplars_per_rank_series_and_no_drops(prometheus: str) -> None:
    results = verdicts(prometheus, "healthy")
    assert results["exemplars"][0] == PASS and "exemplars with a trace_id" in results["exemplars"][1]
    assert results["per_rank_metrics"] == (PASS, f"{sc.PROM_STEP_DURATION}_count series for "
                                                 "ranks [0, 1]")
    assert results["telemetry_complete"][0] == PASS


def test_the_loaded_throttling_alert_is_found(prometheus: str) -> None:
    status, evidence = verdicts(prometheus, "healthy")["throttling_alert"]
    assert status == PASS and evidence.startswith("loaded: ")


def test_no_throttling_series_fails(prometheus: str) -> None:
    status, evidence = verdicts(prometheus, "healthy")["cpu_throttling_measured"]
    assert status == FAIL and CADVISOR_THROTTLED in evidence


def test_trace_and_log_items_are_not_applicable_live(prometheus: str) -> None:
    results = verdicts(prometheus, "healthy")
    for item in ("trace_coverage", "sampling_consistency", "log_fields"):
        assert results[item][0] == NOT_APPLICABLE


def test_a_run_without_exemplars_fails(prometheus: str) -> None:
    status, evidence = verdicts(prometheus, "broken")["exemplars"]
    assert status == FAIL and evidence.startswith("no exemplars")


def test_dropped_telemetry_fails(prometheus: str) -> None:
    assert verdicts(prometheus, "broken")["telemetry_complete"] == (FAIL, "dropped: spans 3")


def test_cli_live_json_and_exit_status(prometheus: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--prometheus", prometheus, "--run-id", "healthy", "--json"]) == 1
    failing = [c["id"] for c in json.loads(capsys.readouterr().out)["checks"]
               if c["status"] == FAIL]
    assert failing == ["cpu_throttling_measured"]


def test_live_exemplars_naming_spans_not_in_the_files_fail(
        prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The files of a run called "healthy" whose spans are not the ones Prometheus's
    exemplars name (the fed endpoints made their ids up)."""
    run_dir = write_run(RunSpec(ranks=2, steps=10, run_id="healthy", spike_steps=()), tmp_path)
    assert main(["check", str(run_dir), "--prometheus", prometheus, "--json"]) == 1
    row = next(c for c in json.loads(capsys.readouterr().out)["checks"]
               if c["id"] == "exemplars")
    assert row["status"] == FAIL and row["source"] == "prometheus+run dir"
    assert row["evidence"].startswith("[prometheus+run dir] 0 of ")


def test_prometheus_without_the_rule_fails_the_alert_item(tmp_path: Path) -> None:
    proc, url = start_prometheus(tmp_path, [], [])
    try:
        status, evidence = verdicts(url, "healthy")["throttling_alert"]
    finally:
        stop(proc)
    assert status == FAIL and evidence == "no alerting rule reads CPU throttling"


def test_unreachable_prometheus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "otel-train check:" in capsys.readouterr().err
