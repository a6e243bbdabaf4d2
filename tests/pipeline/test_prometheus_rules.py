"""prometheus/rules.yml and kubernetes-mixin.yml: they load, every alert is unit tested firing
and quiet, routes by namespace, and links a runbook section that exists."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from support import REPO_ROOT
from support.pipeline_fixtures import PROMETHEUS_DIR, promtool_binary

RULES = PROMETHEUS_DIR / "rules.yml"
MIXIN = PROMETHEUS_DIR / "kubernetes-mixin.yml"
RULES_TEST = PROMETHEUS_DIR / "rules_test.yml"
RUNBOOKS = REPO_ROOT / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/otel-train/otel-train/blob/main/docs/runbooks.md#"

#: otel-train's own alerts, by what they watch
EXPECTED_ALERTS = {
    "TrainingRankCPUThrottled",  # training.cpu.throttled.time per step
    "TrainingStragglerRank",  # max over median step time per run
    "TrainingDataStarvation",  # data_wait share of step time
    "TrainingRecompileStorm",
    "TrainingCollectiveSlow",
    "TrainingCollectiveStalled",
    "TrainingStepsStalled",
    "TrainingCommOverlapLow",
    "OtelTrainTelemetryDropped",  # otel_train_telemetry_dropped_total
    "OtelCollectorDroppingTelemetry",  # otelcol_exporter_{send,enqueue}_failed_*
    "OtelCollectorQueueFilling",  # otelcol_exporter_queue_size / _capacity
    "OtelCollectorRefusingData",  # otelcol_receiver_refused_*
    "TrainingRunStoppedReporting",
}
#: cAdvisor throttling: the kubernetes-mixin's alert, for a Prometheus without the stack
MIXIN_ALERTS = {"CPUThrottlingHigh"}


def alerts(path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]
            if "alert" in r]


def alert_names(path=RULES) -> list[str]:
    return [r["alert"] for r in alerts(path)]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


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


def rule_groups() -> list[str]:
    return [g["name"] for path in (RULES, MIXIN)
            for g in yaml.safe_load(path.read_text())["groups"]]


def test_rules_unit_tests_pass():
    result = promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# Prometheus evaluates each rule group on its own timer, so an alert over a recording rule may
# see that rule's newest value or the one before it; promtool, given no group_eval_order,
# picks an order at random (a Go map's), which once made a boundary test pass or fail by luck.
# The unit tests hold in every order.
@pytest.mark.parametrize("order", ["recording first", "alerts first"])
def test_rules_unit_tests_pass_whichever_group_prometheus_evaluates_first(tmp_path, order):
    groups = rule_groups()
    assert {"otel-train.recording", "otel-train.alerts"} <= set(groups), groups
    first, second = (("otel-train.recording", "otel-train.alerts") if order == "recording first"
                     else ("otel-train.alerts", "otel-train.recording"))
    others = [g for g in groups if g not in (first, second)]
    unit = yaml.safe_load(RULES_TEST.read_text())
    unit["rule_files"] = [str(PROMETHEUS_DIR / f) for f in unit["rule_files"]]
    unit["group_eval_order"] = [first, second, *others]
    pinned = tmp_path / "rules_test.yml"
    pinned.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = promtool("test", "rules", str(pinned))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_mixin_file_passes_promtool_check():
    result = promtool("check", "rules", str(MIXIN))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_issue_s_alerts_are_all_there():
    assert set(alert_names()) == EXPECTED_ALERTS
    assert set(alert_names(MIXIN)) == MIXIN_ALERTS


def test_no_otel_train_alert_repeats_the_mixin_s_cadvisor_throttling_alert():
    # kube-prometheus-stack already pages on cAdvisor throttling (CPUThrottlingHigh): a second
    # alert on container_cpu_cfs_* would page twice for one throttled container.
    for rule in alerts(RULES):
        assert "container_cpu_cfs" not in rule["expr"], rule["alert"]
        assert "container:cpu_cfs" not in rule["expr"], rule["alert"]


def test_prometheus_yml_loads_both_rule_files():
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yml", "kubernetes-mixin.yml"]


def test_every_alert_links_a_runbook_section_that_exists():
    anchors = {github_anchor(line.lstrip("#")) for line in RUNBOOKS.read_text().splitlines()
               if line.startswith("#")}
    for rule in alerts(RULES) + alerts(MIXIN):
        url = rule["annotations"].get("runbook_url", "")
        assert url == RUNBOOK_BASE + rule["alert"].lower(), rule["alert"]
        assert rule["alert"].lower() in anchors, f"docs/runbooks.md has no ## {rule['alert']}"
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_every_per_rank_and_per_collector_aggregation_keeps_the_namespace_for_routing():
    # Alertmanager routes a team's alerts by namespace: no rule may aggregate it away.
    # (Run-wide join keys, `by (training_run_id)` matched `on (training_run_id)`, need not.)
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        for clause in re.findall(r"\b(?:max|sum|count) by \(([^)]*)\)", rule["expr"]):
            if any(key in clause for key in ("training_rank", "exporter", "receiver")):
                assert "namespace" in clause, (rule.get("alert") or rule["record"], clause)


def test_every_alert_waits_before_firing():
    # Without `for:` one evaluation pages: a burst, or one scrape where two series disagree.
    for rule in alerts(RULES) + alerts(MIXIN):
        assert re.fullmatch(r"[1-9]\d*[smh]", str(rule.get("for", ""))), rule["alert"]


def test_every_alert_is_tested_both_firing_and_quiet():
    text = RULES_TEST.read_text()
    cases = re.findall(r"- alertname: (\S+)\s+eval_time: \S+.*?\s+exp_alerts:(\s*\[\]|\s*\n\s+- )",
                       text, flags=re.S)
    quiet = {name for name, body in cases if body.strip() == "[]"}
    firing = {name for name, body in cases if body.strip() != "[]"}
    every = EXPECTED_ALERTS | MIXIN_ALERTS
    assert quiet >= every, f"never tested quiet: {every - quiet}"
    assert firing >= every, f"never tested firing: {every - firing}"


def test_unit_tests_catch_a_broken_threshold(tmp_path):
    # The unit tests have teeth: loosen one alert and they fail.
    output = _unit_tests_on_broken_copy(tmp_path, MIXIN, "> ( 25 / 100 )", "> ( 5 / 100 )")
    assert "CPUThrottlingHigh" in output


def test_unit_tests_catch_a_stopped_reporting_alert_that_ignores_finished_runs(tmp_path):
    # Without the "another rank of the run still reports" condition, cleanly finished runs page.
    output = _unit_tests_on_broken_copy(
        tmp_path, RULES,
        "          and on (training_run_id)\n"
        "          max by (training_run_id) (training_step_duration_seconds_count"
        " or histogram_count(training_step_duration_seconds))\n", "")
    assert "run-done" in output


@pytest.mark.parametrize("alert,expr_end,wait", [
    ("TrainingRecompileStorm", "increase10m > 5\n", "15m"),
    ("TrainingCollectiveStalled", "          ) > 0\n", "5m"),
])
def test_unit_tests_catch_an_alert_that_fires_at_once(tmp_path, alert, expr_end, wait):
    # The unit tests prove each `for:` holds the alert back: without it they fail.
    output = _unit_tests_on_broken_copy(tmp_path, RULES, f"{expr_end}        for: {wait}\n",
                                        expr_end)
    assert alert in output


#: recording rules no alert reads yet, each checked by its own promql_expr_test
EXPR_TESTED_RECORDS = (
    "training_run_rank_part:step_time_seconds:share5m",  # the step's disjoint parts
    "training_run:samples:rate5m",  # throughput
    "training_run:tokens:rate5m",
)


def recording_rules() -> dict[str, str]:
    return {r["record"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"] if "record" in r}


def test_the_parts_and_throughput_rules_are_unit_tested():
    records = recording_rules()
    tested = [e["expr"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for e in case.get("promql_expr_test", [])]
    for record in EXPR_TESTED_RECORDS:
        assert record in records, record
        assert any(record in expr for expr in tested), f"no promql_expr_test reads {record}"


def test_no_rule_adds_up_phases():
    # Phase spans overlap (exposed_comm and compile lie inside forward and backward): a sum
    # over phases counts that time twice. Shares that add up come from the parts
    # (training_step_time_seconds_total by training_part).
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        expr = rule["expr"]
        if "phase_duration_seconds" not in expr:
            continue
        for match in re.finditer(r"\b(sum|avg|count)\b\s*(by\s*\(([^)]*)\))?", expr):
            assert match.group(3) and "training_phase" in match.group(3), (
                rule.get("alert") or rule["record"], match.group(0))


def test_the_parts_share_adds_up_to_one_per_rank_and_counts_a_second_path_once(tmp_path):
    # with sum instead of max, the rank's forward series by two paths counts twice
    output = _unit_tests_on_broken_copy(
        tmp_path, RULES,
        "max by (namespace, training_run_id, training_rank, training_part) "
        "(rate(training_step_time_seconds_total[5m]))",
        "sum by (namespace, training_run_id, training_rank, training_part) "
        "(rate(training_step_time_seconds_total[5m]))")
    assert "training_run_rank_part:step_time_seconds:share5m" in output


def test_throughput_counts_a_rank_seen_by_two_paths_once(tmp_path):
    output = _unit_tests_on_broken_copy(
        tmp_path, RULES,
        "max by (namespace, training_run_id, training_rank) (rate(training_samples_total[5m]))",
        "sum by (namespace, training_run_id, training_rank) (rate(training_samples_total[5m]))")
    assert "training_run:samples:rate5m" in output


def _unit_tests_on_broken_copy(tmp_path, broken_file, old: str, new: str) -> str:
    """Run the promtool unit tests on copies of the rule files with ``old`` replaced by
    ``new`` in ``broken_file``; they must fail. Returns promtool's output."""
    for src, name in ((RULES_TEST, "rules_test.yml"), (RULES, "rules.yml"),
                      (MIXIN, "kubernetes-mixin.yml")):
        text = src.read_text()
        if src == broken_file:
            broken = text.replace(old, new)
            assert broken != text
            text = broken
        (tmp_path / name).write_text(text)
    result = subprocess.run([promtool_binary(), "test", "rules", "rules_test.yml"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    return result.stdout + result.stderr
