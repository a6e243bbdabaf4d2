"""k8s/components/operator: the collector tiers as OpenTelemetry Operator resources.

The variant (``overlays/operator``, and the small and large overlays with the component as
docs/kubernetes.md writes them) renders two ``opentelemetry.io/v1beta1``
OpenTelemetryCollectors that are valid for the operator's CRD (its schema and its Go types),
embed exactly the config the plain tiers run, carry every other field of the plain pod
templates, and are wired to the Services and NetworkPolicies that stay; the plain overlays
render what they rendered before.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from support import REPO_ROOT
from support.pipeline_fixtures import collector_binary
from test_k8s_render import (
    CORE_API_VERSIONS,
    K8S,
    K8S_VERSIONS,
    crd_errors,
    expand,
    find,
    kustomize,
    one,
    operator_pod_template,
    render,
    run_crdcheck,
)
from test_k8s_stack import render_overlay

DOCS = REPO_ROOT / "docs" / "kubernetes.md"
TIERS = {"agent": ("DaemonSet", "daemonset"), "gateway": ("Deployment", "deployment")}
# The operator's own (it mounts the rendered spec.config at /conf and passes --config): not
# copied from the plain pods.
OPERATORS_OWN_VOLUMES = {"config", "tls-config"}


def documented_overlays() -> dict[str, str]:
    """The section's kustomization blocks, by the plain overlay under them."""
    section = DOCS.read_text().split("## With the OpenTelemetry Operator", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    found = {}
    for block in blocks:
        (plain,) = re.findall(r"k8s/(overlays/\w+)", block)
        found[plain] = ("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                        + block)
    return found


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, tuple[list[dict], list[dict]]]:
    """(operator render, plain render under it) for every operator variant."""
    pairs = {"overlays/operator": (render("overlays/operator"), render("base"))}
    for plain, text in documented_overlays().items():
        rendered = render_overlay(tmp_path_factory.mktemp(plain.replace("/", "-")), text)
        pairs[f"docs:{plain}"] = ([o for o in yaml.safe_load_all(rendered) if o], render(plain))
    return pairs


def test_the_documented_variants_cover_small_and_large():
    assert set(documented_overlays()) == {"overlays/small", "overlays/large"}
    assert "operator-gateway-tls" in documented_overlays()["overlays/large"]


def deep_merge(base: dict, over: dict) -> dict:
    """The collector's merge of a second --config file: maps key by key, the rest replaced."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def plain_config(plain: list[dict], tier: str) -> dict:
    """What the plain tier's collector runs: its ConfigMap, with every further --config file
    merged over it in order (the gateway-tls fragments)."""
    kind, _ = TIERS[tier]
    (container,) = one(plain, kind, f"otelcol-{tier}")["spec"]["template"]["spec"]["containers"]
    files = {}
    for config_map in find(plain, "ConfigMap"):
        for key, text in config_map["data"].items():
            files[key] = text
    config: dict = {}
    for arg in container["args"]:
        assert arg.startswith("--config=/etc/otelcol/"), arg
        config = deep_merge(config, yaml.safe_load(files[Path(arg).name]))
    return config


# --- the resources -----------------------------------------------------------------------------


def test_the_variant_renders_both_tiers_as_opentelemetry_collectors(variants):
    for name, (objects, _) in variants.items():
        for tier, (kind, mode) in TIERS.items():
            collector = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")
            assert collector["apiVersion"] == "opentelemetry.io/v1beta1"
            assert collector["metadata"]["namespace"] == "observability"
            assert collector["spec"]["mode"] == mode, name
            assert collector["spec"]["upgradeStrategy"] == "none"
            assert find(objects, kind) == [], (name, kind)
        # the plain tiers' config maps and budget went with them (the operator makes its own)
        assert not [c for c in find(objects, "ConfigMap")
                    if c["metadata"]["name"].startswith("otelcol-")], name
        assert find(objects, "PodDisruptionBudget") == [], name


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_the_documented_variants_validate(variants, k8s_version):
    # overlays/operator is in test_k8s_render.KUSTOMIZATIONS; the documented ones are here
    for name, (objects, _) in variants.items():
        text = yaml.safe_dump_all(objects)
        result = run_crdcheck(text)
        assert result.returncode == 0, result.stdout
        for obj in objects:
            if obj["apiVersion"] in CORE_API_VERSIONS:
                kubernetes_validate.validate(obj, k8s_version, strict=True)
            else:
                assert crd_errors(obj) == [], (name, obj["kind"], obj["metadata"]["name"])


def test_the_crd_checks_reject_a_wrong_field_and_a_wrong_value():
    collector = one(render("overlays/operator"), "OpenTelemetryCollector", "otelcol-gateway")
    assert crd_errors(collector) == []
    wrong = copy.deepcopy(collector)
    wrong["spec"]["replica"] = 2                       # not a field (replicas)
    wrong["spec"]["ports"][0]["containerPort"] = 4317  # a container's field, not a port spec's
    wrong["spec"]["mode"] = "daemon"                   # not one of the modes
    errors = crd_errors(wrong)
    assert any("replica" in e and "'replica'" in e for e in errors), errors
    assert any("containerPort" in e for e in errors), errors
    assert any(e.startswith("spec.mode") for e in errors), errors
    # the Go types (they report the first unknown field; an enum is the schema's business)
    for field, value in (("replica", 2), ("containerPort", 4317)):
        wrong = copy.deepcopy(collector)
        (wrong["spec"]["ports"][0] if field == "containerPort" else wrong["spec"])[field] = value
        result = run_crdcheck(yaml.safe_dump(wrong))
        assert result.returncode == 1
        assert f'unknown field "{field}"' in result.stdout, result.stdout
    # spec.config is typed down to its sections: an unknown one fails the strict decoding
    wrong = copy.deepcopy(collector)
    wrong["spec"]["config"]["exporter"] = wrong["spec"]["config"].pop("exporters")
    assert run_crdcheck(yaml.safe_dump(wrong)).returncode == 1


# --- the config ----------------------------------------------------------------------------------


def test_the_embedded_config_is_the_plain_tier_s_config(variants):
    for name, (objects, plain) in variants.items():
        for tier in TIERS:
            collector = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")
            assert collector["spec"]["config"] == plain_config(plain, tier), (name, tier)


def test_the_embedded_config_is_collector_configs_text_unchanged():
    for tier in TIERS:
        source = (REPO_ROOT / "collector" / "configs" / f"{tier}.yaml").read_text()
        generated = (K8S / "components" / "operator" / "collector" / f"{tier}.yaml").read_text()
        indented = "".join("    " + line if line.strip() else line
                           for line in source.splitlines(keepends=True))
        assert generated.endswith("spec:\n  config:\n" + indented)
        collector = one(render("overlays/operator"), "OpenTelemetryCollector", f"otelcol-{tier}")
        assert collector["spec"]["config"] == yaml.safe_load(source)


@pytest.mark.parametrize("variant", ["overlays/operator", "docs:overlays/large"])
@pytest.mark.parametrize("tier", TIERS)
def test_the_embedded_config_is_valid_for_the_real_collector(variants, variant, tier, tmp_path):
    objects, _ = variants[variant]
    collector = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")
    template = operator_pod_template(collector)
    (container,) = template["spec"]["containers"]
    # what the pod holds: /conf/collector.yaml and the mounted Secret (stand-ins)
    root = tmp_path
    text = yaml.safe_dump(collector["spec"]["config"]).replace("/etc/otelcol/",
                                                               f"{root}/etc/otelcol/")
    (root / "conf").mkdir()
    (root / "conf" / "collector.yaml").write_text(text)
    for mount in container["volumeMounts"]:
        if mount["mountPath"] != "/conf":
            target = root / mount["mountPath"].lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            for stand_in in ("ca.crt", "tls.crt", "tls.key"):
                (target / stand_in).write_text("")
    field_values = {"spec.nodeName": "node-a", "status.podIP": "127.0.0.1"}
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        else:
            env[entry["name"]] = field_values[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    args = [a.replace("/conf/", f"{root}/conf/") for a in container["args"]]
    assert args == [f"--config={root}/conf/collector.yaml"]
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("OTELCOL_")}
    result = subprocess.run([collector_binary(), "validate", *args], env={**clean_env, **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- everything else, from the plain pods ------------------------------------------------------

# What the component copies, as (plain pod template path, resource spec path); checked below
# field by field, and every field of the plain pod templates must be one of these or the
# operator's own.
POD_FIELDS = {"serviceAccountName": "serviceAccount", "securityContext": "podSecurityContext",
              "tolerations": "tolerations",
              "terminationGracePeriodSeconds": "terminationGracePeriodSeconds",
              "topologySpreadConstraints": "topologySpreadConstraints"}
CONTAINER_FIELDS = {"image": "image", "env": "env", "resources": "resources",
                    "securityContext": "securityContext"}
# The operator's own: the pod's token follows the ServiceAccount (checked in test_k8s_policy),
# the container's name, args, the config volume; ports, probes and volumes are checked apart.
POD_OWN = {"automountServiceAccountToken", "containers", "volumes"}
CONTAINER_OWN = {"name", "args", "ports", "startupProbe", "livenessProbe", "readinessProbe",
                 "volumeMounts"}


def test_every_field_of_the_plain_pods_is_carried_over(variants):
    for name, (objects, plain) in variants.items():
        for tier, (kind, _) in TIERS.items():
            workload = one(plain, kind, f"otelcol-{tier}")
            spec = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")["spec"]
            pod = workload["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            assert set(pod) <= set(POD_FIELDS) | POD_OWN, (name, tier, set(pod))
            assert set(container) <= set(CONTAINER_FIELDS) | CONTAINER_OWN, (name, tier)
            for plain_key, key in CONTAINER_FIELDS.items():
                assert spec[key] == container[plain_key], (name, tier, key)
            for plain_key, key in POD_FIELDS.items():
                if plain_key == "topologySpreadConstraints" and plain_key in pod:
                    # the same constraint, selecting the operator's pods (below)
                    ours = [{k: v for k, v in c.items() if k != "labelSelector"}
                            for c in spec[key]]
                    assert ours == [{k: v for k, v in c.items() if k != "labelSelector"}
                                    for c in pod[plain_key]], (name, tier)
                elif plain_key in pod:
                    assert spec[key] == pod[plain_key], (name, tier, key)
                else:
                    assert key not in spec, (name, tier, key)
            strategy = {"DaemonSet": ("updateStrategy", "daemonSetUpdateStrategy"),
                        "Deployment": ("strategy", "deploymentUpdateStrategy")}[kind]
            assert spec[strategy[1]] == workload["spec"][strategy[0]], (name, tier)
            assert spec.get("replicas") == workload["spec"].get("replicas"), (name, tier)


def test_ports_probes_and_volumes_are_the_plain_ones(variants):
    for name, (objects, plain) in variants.items():
        for tier, (kind, _) in TIERS.items():
            pod = one(plain, kind, f"otelcol-{tier}")["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            collector = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")
            (made,) = operator_pod_template(collector)["spec"]["containers"]
            assert made["ports"] == [{"protocol": "TCP", **p} for p in container["ports"]]
            health = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"] == {"path": "/", "port": "health"}
                assert made[probe] == {**container[probe],
                                       "httpGet": {"path": "/", "port": health}}, (name, probe)
            # the plain volumes and mounts but the config files (the operator's /conf), in
            # any order
            def by_name(items):
                return sorted(items, key=lambda item: item["name"])
            volumes = [v for v in pod["volumes"] if v["name"] not in OPERATORS_OWN_VOLUMES]
            mounts = [m for m in container["volumeMounts"]
                      if m["name"] not in OPERATORS_OWN_VOLUMES]
            assert by_name(collector["spec"]["volumes"]) == by_name(volumes), (name, tier)
            assert by_name(collector["spec"]["volumeMounts"]) == by_name(mounts), (name, tier)
            assert {m["mountPath"] for m in made["volumeMounts"]} >= {"/conf"}


def test_the_gateway_budget_is_the_plain_one_and_the_only_one(variants):
    for name, (objects, plain) in variants.items():
        budget = one(plain, "PodDisruptionBudget", "otelcol-gateway")["spec"]
        spec = one(objects, "OpenTelemetryCollector", "otelcol-gateway")["spec"]
        assert spec["podDisruptionBudget"] == {"maxUnavailable": budget["maxUnavailable"]}, name
        assert "podDisruptionBudget" not in one(objects, "OpenTelemetryCollector",
                                                "otelcol-agent")["spec"]


# --- wiring ----------------------------------------------------------------------------------


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_services_policies_and_spread_select_the_operator_s_pods(variants):
    for name, (objects, _) in variants.items():
        pods = {tier: operator_pod_template(one(objects, "OpenTelemetryCollector",
                                                f"otelcol-{tier}"))["metadata"]["labels"]
                for tier in TIERS}
        for service, tier in (("otelcol-agent", "agent"), ("otelcol-gateway", "gateway"),
                              ("otelcol-gateway-headless", "gateway")):
            selector = one(objects, "Service", service)["spec"]["selector"]
            assert selects(selector, pods[tier]), (name, service)
            assert not selects(selector, pods[{"agent": "gateway"}.get(tier, "agent")])
        for tier in TIERS:
            policy = one(objects, "NetworkPolicy", f"otelcol-{tier}-ingress")
            assert selects(policy["spec"]["podSelector"]["matchLabels"], pods[tier])
        # gateways admit OTLP from the agents only
        gateway_policy = one(objects, "NetworkPolicy", "otelcol-gateway-ingress")
        (otlp,) = [r for r in gateway_policy["spec"]["ingress"]
                   if {p["port"] for p in r["ports"]} == {4317}]
        (peer,) = otlp["from"]
        assert set(peer) == {"podSelector"}
        assert selects(peer["podSelector"]["matchLabels"], pods["agent"])
        assert not selects(peer["podSelector"]["matchLabels"], pods["gateway"])
        (spread,) = one(objects, "OpenTelemetryCollector",
                        "otelcol-gateway")["spec"]["topologySpreadConstraints"]
        assert selects(spread["labelSelector"]["matchLabels"], pods["gateway"])
        assert not selects(spread["labelSelector"]["matchLabels"], pods["agent"])


def test_the_service_monitor_still_tells_the_tiers_apart(variants):
    for name, (objects, _) in variants.items():
        (relabel,) = one(objects, "ServiceMonitor", "otelcol")["spec"]["endpoints"][0][
            "relabelings"]
        assert relabel["targetLabel"] == "otelcol_tier", name
        (source,) = relabel["sourceLabels"]
        # the Service's label, not the pod's (the operator's pods all say opentelemetry-collector)
        assert source == "__meta_kubernetes_service_label_app_kubernetes_io_component"
        for service, tier in (("otelcol-agent", "agent"), ("otelcol-gateway", "gateway")):
            labels = one(objects, "Service", service)["metadata"]["labels"]
            assert labels["app.kubernetes.io/component"] == tier


def test_the_collectors_run_under_the_plain_service_accounts(variants):
    for name, (objects, _) in variants.items():
        for tier in TIERS:
            spec = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")["spec"]
            account = one(objects, "ServiceAccount", spec["serviceAccount"])
            assert account["metadata"]["name"] == f"otelcol-{tier}", name
        (binding,) = find(objects, "ClusterRoleBinding")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "otelcol-agent",
                                        "namespace": "observability"}]


def test_a_user_s_images_entry_sets_the_collectors_image(tmp_path):
    text = ("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources:\n  - ../../k8s/base\ncomponents:\n  - ../../k8s/components/operator\n"
            "images:\n  - name: otel/opentelemetry-collector-contrib\n"
            "    newName: registry.example.com/otelcol-train\n    newTag: \"0.161.0\"\n")
    objects = [o for o in yaml.safe_load_all(render_overlay(tmp_path, text)) if o]
    for tier in TIERS:
        assert one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")["spec"]["image"] == \
            "registry.example.com/otelcol-train:0.161.0"


def test_operator_gateway_tls_refuses_a_kustomization_without_gateway_tls(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        "resources:\n  - " + os.path.relpath(K8S / "base", tmp_path) + "\ncomponents:\n"
        + "".join(f"  - {os.path.relpath(K8S / 'components' / c, tmp_path)}\n"
                  for c in ("operator", "operator-gateway-tls")))
    result = subprocess.run([kustomize(), "build", str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "otelcol-tls-config" in result.stderr


# --- the plain manifests ---------------------------------------------------------------------

# What the variant changes in what it keeps: the selectors (above), nothing else.
RESELECTED = {("Service", "otelcol-agent"): ["spec.selector"],
              ("Service", "otelcol-gateway"): ["spec.selector"],
              ("Service", "otelcol-gateway-headless"): ["spec.selector"],
              ("NetworkPolicy", "otelcol-agent-ingress"): ["spec.podSelector"],
              ("NetworkPolicy", "otelcol-gateway-ingress"): ["spec.podSelector",
                                                             "spec.ingress.0.from"],
              ("ServiceMonitor", "otelcol"): ["spec.endpoints.0.relabelings"]}
REPLACED = {("DaemonSet", "otelcol-agent"), ("Deployment", "otelcol-gateway"),
            ("PodDisruptionBudget", "otelcol-gateway")}


def without(obj: dict, paths: list[str]) -> dict:
    obj = copy.deepcopy(obj)
    for path in paths:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = None
        else:
            node.pop(last)
    return obj


def key(obj: dict) -> tuple[str, str]:
    name = obj["metadata"]["name"]
    if obj["kind"] == "ConfigMap" and name.startswith("otelcol-"):
        name = re.sub(r"-[a-z0-9]{10}$", "", name)  # the content hash of the generated maps
    return obj["kind"], name


def test_the_variant_keeps_every_other_plain_object_unchanged(variants):
    for name, (objects, plain) in variants.items():
        ours = {key(o): o for o in objects}
        theirs = {key(o): o for o in plain}
        configs = {("ConfigMap", f"otelcol-{t}-config") for t in TIERS} | {
            ("ConfigMap", "otelcol-tls-config")}
        assert set(ours) == (set(theirs) - REPLACED - configs) | {
            ("OpenTelemetryCollector", f"otelcol-{t}") for t in TIERS}, name
        for k, obj in theirs.items():
            if k in ours:
                paths = RESELECTED.get(k, [])
                assert without(ours[k], paths) == without(obj, paths), (name, k)


def test_the_plain_overlays_render_the_plain_tiers_only():
    for kustomization in ("base", "overlays/small", "overlays/large"):
        objects = render(kustomization)
        assert find(objects, "OpenTelemetryCollector") == [], kustomization
        for tier, (kind, _) in TIERS.items():
            workload = one(objects, kind, f"otelcol-{tier}")
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert labels["app.kubernetes.io/component"] == tier
            selector = one(objects, "Service", f"otelcol-{tier}")["spec"]["selector"]
            assert selector == {"app.kubernetes.io/name": "otelcol",
                                "app.kubernetes.io/component": tier}
        (relabel,) = one(objects, "ServiceMonitor", "otelcol")["spec"]["endpoints"][0][
            "relabelings"]
        assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
    # nothing under k8s/base knows about the operator
    for path in (K8S / "base").rglob("*.yaml"):
        assert "opentelemetry.io/v1beta1" not in path.read_text(), path


def test_a_user_s_patch_over_the_component_keeps_the_numbers_numbers(tmp_path):
    # kustomize v5.8.2 turns a number that a replacement created into a string once a later
    # patch touches the resource; the component declares those fields so that none is created.
    text = ("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources:\n  - ../../k8s/base\ncomponents:\n  - ../../k8s/components/operator\n"
            "patches:\n  - patch: |-\n"
            "      apiVersion: opentelemetry.io/v1beta1\n      kind: OpenTelemetryCollector\n"
            "      metadata: {name: otelcol-gateway, namespace: observability}\n"
            "      spec: {nodeSelector: {pool: observability}}\n")
    rendered = render_overlay(tmp_path, text)
    result = run_crdcheck(rendered)
    assert result.returncode == 0, result.stdout
    spec = one([o for o in yaml.safe_load_all(rendered) if o], "OpenTelemetryCollector",
               "otelcol-gateway")["spec"]
    assert spec["nodeSelector"] == {"pool": "observability"}
    assert isinstance(spec["replicas"], int) and spec["replicas"] == 2
    assert spec["podDisruptionBudget"] == {"maxUnavailable": 1}


def test_the_operator_s_telemetry_default_changes_nothing_the_collectors_run(variants):
    # The operator's webhook (v0.140.0, Service.ApplyDefaults; run on these resources with its
    # own apis/v1beta1 code) cannot read a prometheus reader whose port is an ${env:...}
    # string, and replaces service.telemetry with one reader on 0.0.0.0:8888 and no level.
    # That is what the configs run anyway while the env leaves their defaults alone (and the
    # collector's default level is normal).
    for name, (objects, _) in variants.items():
        for tier in TIERS:
            spec = one(objects, "OpenTelemetryCollector", f"otelcol-{tier}")["spec"]
            env = {e["name"] for e in spec["env"]}
            assert not {"OTELCOL_TELEMETRY_HOST", "OTELCOL_TELEMETRY_PORT"} & env, (name, tier)
            metrics = spec["config"]["service"]["telemetry"]["metrics"]
            assert set(metrics) == {"level", "readers"} and metrics["level"] == "normal"
            (reader,) = metrics["readers"]
            assert reader == {"pull": {"exporter": {"prometheus": {
                "host": "${env:OTELCOL_TELEMETRY_HOST:-0.0.0.0}",
                "port": "${env:OTELCOL_TELEMETRY_PORT:-8888}"}}}}, (name, tier)
