"""The Grafana dashboards: generated from code, valid against the SDK's schema, wired right.

Queries are parsed and evaluated in ``test_dashboards_queries.py``; this file checks the
JSON itself and the provisioning next to it.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from support import REPO_ROOT

DASHBOARDS_DIR = REPO_ROOT / "dashboards"
sys.path.insert(0, str(DASHBOARDS_DIR))
from otel_dashboards import checklist, names, queries  # noqa: E402

BOARDS = queries.dashboards()
PROVISIONING = DASHBOARDS_DIR / "provisioning"


def sdk_roundtrip(board: dict) -> dict:
    """Decode with the SDK's typed models for the Grafana 11.6 schema, encode again."""
    plugins.register_default_plugins()
    return json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))


def test_committed_json_is_what_the_code_generates():
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS_DIR / "build.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboards_of_the_issues_exist():
    titles = sorted(board["title"] for board in BOARDS.values())
    assert titles == [
        "otel-train / Collectives",
        "otel-train / Compare runs",
        "otel-train / Compile health",
        "otel-train / Production readiness checklist",
        "otel-train / Ranks and stragglers",
        "otel-train / Training attribution",
    ]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_matches_the_sdk_schema_exactly(name):
    board = BOARDS[name]
    assert board["schemaVersion"] == 41  # Grafana 11.6
    # The decoder keeps only fields the schema knows: a lossless round trip means no unknown
    # or misplaced field anywhere (panels, options, targets, variables).
    assert sdk_roundtrip(board) == board


def test_schema_check_catches_a_field_the_schema_does_not_know():
    board = copy.deepcopy(BOARDS["training-attribution.json"])
    board["panels"][1]["options"]["notAHeatmapOption"] = True
    board["templating"]["list"][0]["notAVariableField"] = 1
    assert sdk_roundtrip(board) != board


#: dashboards of two runs: variables run_a and run_b instead of run_id and rank
COMPARE = "compare-runs.json"


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_has_data_source_run_and_rank_variables(name):
    variables = {v["name"]: v for v in BOARDS[name]["templating"]["list"]}
    assert {variables[n]["query"] for n in ("ds_prometheus", "ds_tempo", "ds_loki")} == {
        "prometheus",
        "tempo",
        "loki",
    }
    if name == COMPARE:
        assert "run_id" not in variables and "rank" not in variables
        for run in ("run_a", "run_b"):
            assert "training_run_id" in variables[run]["query"]
            assert not variables[run].get("multi") and not variables[run].get("includeAll")
        return
    assert "training_run_id" in variables["run_id"]["query"]
    assert "training_rank" in variables["rank"]["query"]
    assert variables["rank"]["includeAll"] and variables["rank"]["allValue"] == ".*"


def test_compare_queries_read_one_run_each_and_colour_a_blue_and_b_orange():
    """Every query of the compare dashboard selects run A, run B or both (a change), by
    equality (test_dashboards_queries.py checks that none returns per-rank series); each panel
    with A and B series colours them by name, A blue and B orange."""
    board = BOARDS[COMPARE]
    found = [q for q in queries.queries() if q.dashboard == COMPARE and q.lang == "promql"]
    assert len(found) > 30
    for q in found:
        runs = set(re.findall(r'training_run_id="\$(run_[ab])"', q.text))
        assert runs and "training_run_id=~" not in q.text, q.id
        # both runs: the changes (the stat row, and the parts table's change column)
        change = q.panel.startswith("B vs A") or (q.panel.startswith("Parts") and q.ref == "C")
        assert (runs == {"run_a", "run_b"}) == change, q.id
    for panel in queries.panels(board):
        legends = [t.get("legendFormat", "") for t in panel.get("targets", [])]
        if any(legend.startswith(("A: ", "B: ")) for legend in legends):
            colours = {
                o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
                for o in panel["fieldConfig"]["overrides"]
                if o["matcher"]["id"] == "byRegexp" and o["properties"][0]["id"] == "color"
            }
            assert colours == {"A: .*": "blue", "B: .*": "orange"}, panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_query_goes_through_a_data_source_variable(name):
    for panel in queries.panels(BOARDS[name]):
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] in (
                "${ds_prometheus}",
                "${ds_tempo}",
                "${ds_loki}",
            ), panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panel_ids_are_unique(name):
    ids = [panel["id"] for panel in queries.panels(BOARDS[name])]
    assert len(ids) == len(set(ids)) and 0 not in ids


BARE_MEAN = re.compile(r"\bavg(_over_time)?\s*\(|_sum\b[^/]*/[^/]*_count\b")


def test_no_latency_panel_shows_a_bare_mean():
    """A mean of a histogram only beside a percentile of it, in the same panel (the compare
    dashboard's step time: the mean and the p95 of both runs)."""
    found = queries.queries()
    with_percentile = {
        (q.dashboard, q.panel) for q in found if "histogram_quantile(" in q.text
    }
    means = [
        q.id
        for q in found
        if q.lang == "promql" and BARE_MEAN.search(q.text)
        and (q.dashboard, q.panel) not in with_percentile
    ]
    assert means == []
    assert any(BARE_MEAN.search(q.text) for q in found if q.dashboard == COMPARE)


def test_every_latency_histogram_is_shown_as_a_distribution():
    promql = [q.text for q in queries.queries() if q.lang == "promql"]
    for histogram in (
        "training_step_duration_seconds",
        "training_phase_duration_seconds",
        "training_collective_duration_seconds",
        "training_compile_duration_seconds",
    ):
        assert any("histogram_quantile(0.99, sum by (le" in t and histogram in t for t in promql), (
            histogram
        )
    heatmaps = [
        panel
        for board in BOARDS.values()
        for panel in queries.panels(board)
        if panel["type"] == "heatmap" and panel["targets"][0].get("format") == "heatmap"
    ]
    assert {
        re.search(r"(training_\w+)_bucket", p["targets"][0]["expr"]).group(1) for p in heatmaps
    } >= {
        "training_step_duration_seconds",
        "training_collective_duration_seconds",
    }
    skew = [
        t
        for t in promql
        if t.startswith("max(histogram_quantile") and "/ quantile(0.5, histogram_quantile" in t
    ]
    assert skew, "no per-rank max / median skew panel"


def test_step_time_heatmap_shows_exemplars():
    board = BOARDS["training-attribution.json"]
    heatmap = next(p for p in queries.panels(board) if p["type"] == "heatmap")
    assert heatmap["targets"][0]["exemplar"] is True
    assert "training_step_duration_seconds_bucket" in heatmap["targets"][0]["expr"]


def test_checklist_has_one_row_per_design_checklist_item():
    design = (REPO_ROOT / "docs" / "design.md").read_text()
    table = design.split("## The production attribution checklist, for training")[1].split(
        "## The rules of instrumentation"
    )[0]
    items = [
        line
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith(("| ---", "| checklist item"))
    ]
    rows = [p for p in BOARDS["production-readiness.json"]["panels"] if p["type"] == "row"]
    assert len(rows) == len(items) == 7


def test_checklist_verdict_panels_link_to_their_evidence():
    board = BOARDS["production-readiness.json"]
    verdicts = [p for p in queries.panels(board) if p["type"] == "stat"]
    assert len(verdicts) >= 12
    for panel in verdicts:
        urls = [link["url"] for link in panel.get("links", [])]
        assert urls and all(url.startswith("/d/otel-train-") for url in urls), panel["title"]
    uids = {b["uid"] for b in BOARDS.values()}
    linked = {
        re.match(r"/d/([\w-]+)", link["url"]).group(1) for p in verdicts for link in p["links"]
    }
    assert linked <= uids


def test_checklist_reads_alerts_that_the_rules_files_define():
    # rules.yml, and kubernetes-mixin.yml for the mixin's CPUThrottlingHigh
    files = [REPO_ROOT / "prometheus" / name for name in ("rules.yml", "kubernetes-mixin.yml")]
    alerts = {
        rule["alert"]
        for path in files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    texts = [q.text for q in queries.queries() if q.dashboard == "production-readiness.json"]
    read = {name for text in texts for name in re.findall(r'ALERTS\{alertname="(\w+)"', text)}
    assert read == set(checklist.ALERT_NAMES)
    assert read <= alerts


def test_recording_rules_the_dashboards_read_are_in_the_rules_file():
    rules_file = REPO_ROOT / "prometheus" / "rules.yml"
    assert rules_file.exists()
    rules = [
        rule
        for group in yaml.safe_load(rules_file.read_text())["groups"]
        for rule in group["rules"]
    ]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    read = {
        name
        for q in queries.queries()
        if q.lang == "promql"
        for name in re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", q.text)
    }
    assert {names.COLLECTIVE_PER_STEP, names.WAIT_CAUSED, names.ARRIVAL_LAG} <= read
    assert read <= recorded
    # the wait-share line and the checklist verdict use the alert's own threshold
    straggler = next(rule for rule in rules if rule.get("alert") == checklist.ALERT_STRAGGLER)
    assert f"{names.WAIT_CAUSED} > {names.WAIT_CAUSED_LIMIT}" in straggler["expr"]
    assert checklist.WAIT_LIMIT == names.WAIT_CAUSED_LIMIT


# --- provisioning ------------------------------------------------------------------------


def provisioned(path) -> dict:
    """A provisioning file as Grafana reads it: ``$$`` is a literal ``$``, ``$X`` an env var."""
    text = path.read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"(?<!\$)\$(?!\$)", code.replace("$$", "")), (
        "unescaped $: Grafana would expand it"
    )
    return yaml.safe_load(text.replace("$$", "$"))


DATASOURCES = {
    d["type"]: d
    for d in provisioned(PROVISIONING / "datasources" / "otel-train.yaml")["datasources"]
}


def test_prometheus_exemplars_link_to_tempo_by_trace_id():
    destinations = DATASOURCES["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destinations == [
        {
            "name": "trace_id",
            "datasourceUid": DATASOURCES["tempo"]["uid"],
            "urlDisplayLabel": "Open the step's trace",
        }
    ]


def test_tempo_links_spans_to_loki_logs_by_trace_and_span_id():
    logs = DATASOURCES["tempo"]["jsonData"]["tracesToLogsV2"]
    assert logs["datasourceUid"] == DATASOURCES["loki"]["uid"]
    assert logs["filterByTraceID"] and logs["filterBySpanID"]
    assert (
        'trace_id="${__trace.traceId}"' in logs["query"]
        and 'span_id="${__span.spanId}"' in logs["query"]
    )


def test_tempo_links_spans_to_the_ranks_metrics():
    metrics = DATASOURCES["tempo"]["jsonData"]["tracesToMetrics"]
    assert metrics["datasourceUid"] == DATASOURCES["prometheus"]["uid"]
    assert {t["value"] for t in metrics["tags"]} == {"training_run_id", "training_rank"}
    assert all("$__tags" in q["query"] for q in metrics["queries"])


def test_loki_turns_trace_id_into_a_tempo_link():
    fields = DATASOURCES["loki"]["jsonData"]["derivedFields"]
    assert {f["datasourceUid"] for f in fields} == {DATASOURCES["tempo"]["uid"]}
    assert all(f["url"] == "${__value.raw}" for f in fields)
    by_label = next(f for f in fields if f["matcherType"] == "label")
    assert by_label["matcherRegex"] == "trace_id"
    by_regex = next(f for f in fields if f["matcherType"] == "regex")
    line = json.dumps(
        {
            "event": "x",
            "trace_id": "58e63f1d1832e6ac1d749dac8ffd4b47",
            "span_id": "4172a57fe743ae2a",
        }
    )
    assert re.search(by_regex["matcherRegex"], line).group(1) == "58e63f1d1832e6ac1d749dac8ffd4b47"


def test_dashboard_provider_loads_the_generated_json():
    providers = provisioned(PROVISIONING / "dashboards" / "otel-train.yaml")["providers"]
    assert [(p["type"], p["folder"], p["allowUiUpdates"]) for p in providers] == [
        ("file", "otel-train", False)
    ]


def test_the_dashboards_import_the_package_contract_and_not_torch():
    # names.py takes the names from otel_train.semconv itself (no copy loaded by path), and
    # building the dashboards never imports torch or the OpenTelemetry SDK
    code = (f"import sys; sys.path.insert(0, {str(DASHBOARDS_DIR)!r})\n"
            "import otel_dashboards\n"
            "from otel_dashboards import names\n"
            "import otel_train.semconv\n"
            "assert names.semconv is otel_train.semconv\n"
            "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
            " or m.startswith('opentelemetry.sdk'))\n"
            "assert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
