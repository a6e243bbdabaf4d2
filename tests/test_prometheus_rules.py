"""prometheus/rules.yml: it loads, every alert is unit tested firing and quiet, and runbooks."""

from __future__ import annotations

import re
import shutil
import subprocess

from pipeline_fixtures import PROMETHEUS_DIR, promtool_binary

RULES = PROMETHEUS_DIR / "rules.yml"
RULES_TEST = PROMETHEUS_DIR / "rules_test.yml"

#: the alerts the pipeline issue asks for, by what they watch
EXPECTED_ALERTS = {
    "ContainerCPUThrottlingHigh",  # cAdvisor CFS throttling > 25%
    "TrainingRankCPUThrottled",  # training.cpu.throttled.time per step
    "TrainingStragglerRank",  # max over median step time per run
    "TrainingDataStarvation",  # data_wait share of step time
    "TrainingRecompileStorm",
    "TrainingCollectiveSlow",
    "TrainingCollectiveStalled",
    "TrainingStepsStalled",
    "TrainingCommOverlapLow",
    "OtelTrainTelemetryDropped",  # otel_train_telemetry_dropped_total
    "OtelCollectorDroppingTelemetry",
    "TrainingRunStoppedReporting",
}


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\S+)\s*$", RULES.read_text(), flags=re.M)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool_binary(), *args], capture_output=True, text=True,
                          timeout=120, cwd=PROMETHEUS_DIR)


def test_rules_pass_promtool_check():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_scrape_config_passes_promtool_check():
    result = promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_unit_tests_pass():
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_issue_s_alerts_are_all_there():
    assert set(alert_names()) == EXPECTED_ALERTS


def test_every_alert_has_a_runbook_line():
    blocks = re.split(r"^\s*- (?=alert:|record:)", RULES.read_text(), flags=re.M)
    alerts = [b for b in blocks if b.startswith("alert:")]
    assert len(alerts) == len(EXPECTED_ALERTS)
    for block in alerts:
        name = block.split()[1]
        runbook = re.search(r"^\s*runbook: \"(.+)\"$", block, flags=re.M)
        assert runbook, f"{name} has no runbook annotation"
        assert f"docs/pipeline.md#{name.lower()}" in runbook.group(1)


def test_every_alert_is_tested_both_firing_and_quiet():
    text = RULES_TEST.read_text()
    cases = re.findall(r"- alertname: (\S+)\s+eval_time: \S+.*?\s+exp_alerts:(\s*\[\]|\s*\n\s+- )",
                       text, flags=re.S)
    quiet = {name for name, body in cases if body.strip() == "[]"}
    firing = {name for name, body in cases if body.strip() != "[]"}
    assert quiet >= EXPECTED_ALERTS, f"never tested quiet: {EXPECTED_ALERTS - quiet}"
    assert firing >= EXPECTED_ALERTS, f"never tested firing: {EXPECTED_ALERTS - firing}"


def test_unit_tests_catch_a_broken_threshold(tmp_path):
    # The unit tests have teeth: loosen one alert and they fail.
    shutil.copy(RULES_TEST, tmp_path / "rules_test.yml")
    text = RULES.read_text()
    broken = text.replace("container:cpu_cfs_throttled_periods:ratio5m > 0.25",
                          "container:cpu_cfs_throttled_periods:ratio5m > 0.05")
    assert broken != text
    (tmp_path / "rules.yml").write_text(broken)
    result = subprocess.run([promtool_binary(), "test", "rules", "rules_test.yml"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "ContainerCPUThrottlingHigh" in result.stdout + result.stderr
