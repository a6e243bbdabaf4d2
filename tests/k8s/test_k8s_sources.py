"""k8s/ has one source for each thing it ships: the collector configs, the alert rules and the
dashboards in k8s/base are byte-for-byte copies (k8s/tools/sync.py) of collector/configs,
prometheus/rules.yml and dashboards/, and what kustomize renders from them equals the source."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from support import REPO_ROOT
from test_k8s_render import OBSERVABILITY, find, one, render

SYNC = REPO_ROOT / "k8s" / "tools" / "sync.py"
BASE = REPO_ROOT / "k8s" / "base"


def test_sync_check_finds_every_copy_current():
    result = subprocess.run([sys.executable, str(SYNC), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_collector_configs_in_k8s_are_byte_copies_of_collector_configs():
    for tier in ("agent", "gateway"):
        assert (BASE / "collector" / f"{tier}.yaml").read_bytes() == (
            REPO_ROOT / "collector" / "configs" / f"{tier}.yaml").read_bytes()


def test_rendered_collector_config_maps_equal_collector_configs():
    for kustomization in OBSERVABILITY:
        objects = render(kustomization)
        for tier in ("agent", "gateway"):
            source = (REPO_ROOT / "collector" / "configs" / f"{tier}.yaml").read_text()
            maps = [c for c in find(objects, "ConfigMap")
                    if c["metadata"]["name"].startswith(f"otelcol-{tier}-config-")]
            assert len(maps) == 1
            assert maps[0]["data"] == {f"{tier}.yaml": source}


def test_prometheus_rule_spec_equals_prometheus_rules_file():
    rules = yaml.safe_load((REPO_ROOT / "prometheus" / "rules.yml").read_text())
    for kustomization in OBSERVABILITY:
        rule = one(render(kustomization), "PrometheusRule", "otel-train")
        assert rule["spec"] == rules
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 5


def test_grafana_dashboards_render_one_labelled_config_map_per_dashboard_json():
    sources = sorted((REPO_ROOT / "dashboards" / "json").glob("*.json"))
    assert len(sources) >= 5
    for kustomization in OBSERVABILITY:
        maps = [c for c in find(render(kustomization), "ConfigMap")
                if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        by_key = {key: text for c in maps for key, text in c["data"].items()}
        assert sorted(by_key) == [p.name for p in sources]
        for path in sources:
            assert by_key[path.name] == path.read_text()
            assert json.loads(by_key[path.name])["uid"]
        for c in maps:
            assert c["metadata"]["annotations"]["grafana_folder"] == "otel-train"
            assert len(json.dumps(c["data"])) < 900_000  # a ConfigMap holds at most 1 MiB


def test_grafana_datasources_render_from_the_provisioning_file():
    source = REPO_ROOT / "dashboards" / "provisioning" / "datasources" / "otel-train.yaml"
    for kustomization in OBSERVABILITY:
        maps = [c for c in find(render(kustomization), "ConfigMap")
                if c["metadata"].get("labels", {}).get("grafana_datasource") == "1"]
        assert [list(c["data"]) for c in maps] == [["otel-train.yaml"]]
        assert maps[0]["data"]["otel-train.yaml"] == source.read_text()
        uids = {d["uid"] for d in yaml.safe_load(source.read_text())["datasources"]}
        assert {"otel-train-prometheus", "otel-train-tempo", "otel-train-loki"} <= uids


def test_sync_check_reports_a_stale_copy(tmp_path, monkeypatch):
    sys.path.insert(0, str(SYNC.parent))
    try:
        import sync
    finally:
        sys.path.remove(str(SYNC.parent))
    copy = tmp_path / "base"
    subprocess.run(["cp", "-r", str(BASE), str(copy)], check=True)
    monkeypatch.setattr(sync, "BASE", copy)
    assert sync.stale_files() == []
    (copy / "collector" / "agent.yaml").write_text("# edited in place\n")
    (copy / "grafana" / "dashboards" / "stray.json").write_text("{}")
    assert sync.stale_files() == sorted([copy / "collector" / "agent.yaml",
                                         copy / "grafana" / "dashboards" / "stray.json"])
    assert sync.main(["--check"]) == 1
    sync.write()
    assert sync.stale_files() == []
