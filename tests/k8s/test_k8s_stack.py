"""k8s/ drops into a kube-prometheus-stack cluster: the component puts the stack's `release`
label on exactly the objects its Prometheus selects by, the shipped Grafana data sources do
not fight the stack's default, and the Helm values docs/kubernetes.md gives set what it says."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT
from test_k8s_render import K8S, crdcheck, kustomize, run_crdcheck

COMPONENT = K8S / "components" / "kube-prometheus-stack"
DATASOURCES = REPO_ROOT / "dashboards" / "provisioning" / "datasources"
DOCS = REPO_ROOT / "docs" / "kubernetes.md"
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def render_overlay(tmp_path: Path, kustomization: str) -> str:
    """kustomize build of a user's overlay in tmp_path; `../../k8s/` in it means this repo's k8s/
    (kustomize wants relative paths)."""
    (tmp_path / "kustomization.yaml").write_text(
        kustomization.replace("../../k8s/", os.path.relpath(K8S, tmp_path) + "/"))
    result = subprocess.run([kustomize(), "build", str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def documented_yaml_blocks() -> list[str]:
    section = DOCS.read_text().split("## Into a kube-prometheus-stack cluster", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, flags=re.S)


def overlay_with_the_component(release_patch: bool = False) -> str:
    text = documented_yaml_blocks()[0]
    if not release_patch:
        text = text.split("patches:", 1)[0]
    return "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + text


def releases(text: str) -> dict[str, str | None]:
    return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("labels", {}).get("release")
            for o in yaml.safe_load_all(text) if o}


def test_the_component_labels_exactly_the_objects_the_stack_s_prometheus_selects(tmp_path):
    labelled = releases(render_overlay(tmp_path, overlay_with_the_component()))
    monitoring = {k for k in labelled if k.split("/")[0] in MONITORING_KINDS}
    assert monitoring == {"ServiceMonitor/otelcol", "PrometheusRule/otel-train"}
    assert {labelled[k] for k in monitoring} == {"kube-prometheus-stack"}
    assert [k for k in labelled if k not in monitoring and labelled[k]] == []


def test_the_opt_in_rank_endpoints_get_the_release_label_when_listed_first(tmp_path):
    text = overlay_with_the_component().replace(
        "components:\n", "components:\n  - ../../k8s/components/rank-endpoints\n", 1)
    labelled = releases(render_overlay(tmp_path, text))
    assert labelled["PodMonitor/otel-train-ranks"] == "kube-prometheus-stack"


def test_the_documented_patch_renames_the_release(tmp_path):
    labelled = releases(render_overlay(tmp_path, overlay_with_the_component(release_patch=True)))
    assert {v for k, v in labelled.items() if k.split("/")[0] in MONITORING_KINDS} == {
        "my-release"}


def test_labelled_monitoring_objects_still_decode_strictly(tmp_path):
    crdcheck()
    result = run_crdcheck(render_overlay(tmp_path, overlay_with_the_component()))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", sorted(DATASOURCES.glob("*.yaml")), ids=lambda p: p.name)
def test_no_shipped_data_source_claims_grafana_s_default(path):
    # Grafana refuses a second default per organisation, and kube-prometheus-stack's Grafana
    # provisions its own Prometheus as the default.
    for source in yaml.safe_load(path.read_text())["datasources"]:
        assert source.get("isDefault", False) is False, source["name"]


def test_the_documented_helm_values_enable_remote_write_and_exemplars():
    values = yaml.safe_load(documented_yaml_blocks()[1])
    spec = values["prometheus"]["prometheusSpec"]
    assert spec["enableRemoteWriteReceiver"] is True
    assert "exemplar-storage" in spec["enableFeatures"]
    # the ranks' exponential histograms arrive as native histograms (Prometheus < 3.8)
    assert "native-histograms" in spec["enableFeatures"]
    assert spec["exemplars"]["maxSize"] > 0


def test_the_documented_helm_values_let_grafana_s_sidecars_find_the_config_maps():
    sidecar = yaml.safe_load(documented_yaml_blocks()[1])["grafana"]["sidecar"]
    grafana = yaml.safe_load((K8S / "base" / "grafana" / "kustomization.yaml").read_text())
    labels = {k: v for g in grafana["configMapGenerator"] for k, v in g["options"]["labels"].items()}
    for kind in ("dashboards", "datasources"):
        assert sidecar[kind]["enabled"] is True
        assert sidecar[kind]["searchNamespace"] == "ALL"  # the maps live in observability
        assert labels[sidecar[kind]["label"]] == sidecar[kind]["labelValue"]
    folder = grafana["generatorOptions"]["annotations"]
    assert sidecar["dashboards"]["folderAnnotation"] in folder
    assert sidecar["dashboards"]["provider"]["foldersFromFilesStructure"] is True
