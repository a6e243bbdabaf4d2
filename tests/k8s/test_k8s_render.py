"""k8s/: every kustomization renders with a real kustomize, and every rendered object is valid.

- core kinds: offline against the Kubernetes OpenAPI schemas (``kubernetes-validate``, strict:
  unknown fields are errors), for the oldest and newest Kubernetes versions we support;
- custom resources (PodMonitor, ServiceMonitor, PrometheusRule, PyTorchJob,
  OpenTelemetryCollector): strictly decoded
  into the operators' real Go API types (``k8s/tools/crdcheck``), and validated against the
  openAPIV3Schema of their CRDs as shipped in the operators' Go modules (fetched through the Go
  module proxy into the module cache by ``k8s/tools/install-crdcheck.sh``; module, version,
  path and sha256 recorded in ``k8s/tools/crdcheck/crds.json``);
- the collectors: each rendered container's args, env and mounted ConfigMaps are given to the
  real collector (``otelcol-train validate``), built from the same release as the image.

Binaries: kustomize (``k8s/tools/install-kustomize.sh``, OTEL_TRAIN_KUSTOMIZE_BIN), crdcheck
(``k8s/tools/install-crdcheck.sh``, OTEL_TRAIN_CRDCHECK_BIN), the collector (collector/build.sh,
OTEL_TRAIN_COLLECTOR_BIN). Helpers here are shared by the other test_k8s_* files.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support import REPO_ROOT
from support.binaries import require_binary
from support.pipeline_fixtures import collector_binary

K8S = REPO_ROOT / "k8s"
TOOLS_BIN = K8S / "tools" / ".bin"
# Every kustomization a user applies; the others (base/grafana, jobs/common, components/*) are
# included by these.
KUSTOMIZATIONS = ("base", "overlays/small", "overlays/large", "overlays/operator",
                  "jobs/pytorchjob", "jobs/indexed-job")
INCLUDED = ("base/grafana", "jobs/common", "components/gateway-tls",
            "components/kube-prometheus-stack", "components/rank-endpoints",
            "components/operator", "components/operator-gateway-tls")
OBSERVABILITY = ("base", "overlays/small", "overlays/large")
JOBS = ("jobs/pytorchjob", "jobs/indexed-job")
# Oldest and newest Kubernetes minor versions the manifests are checked against.
K8S_VERSIONS = ("1.30.0", "1.37.0")
CORE_API_VERSIONS = {"v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1",
                     "networking.k8s.io/v1", "policy/v1"}
CRDS_LOCK = K8S / "tools" / "crdcheck" / "crds.json"


# --- shared helpers ---------------------------------------------------------------------------


def kustomize() -> str:
    return require_binary("kustomize", "OTEL_TRAIN_KUSTOMIZE_BIN", TOOLS_BIN / "kustomize")


def crdcheck() -> str:
    return require_binary("crdcheck", "OTEL_TRAIN_CRDCHECK_BIN", TOOLS_BIN / "crdcheck")


@functools.cache
def render_text(kustomization: str) -> str:
    result = subprocess.run([kustomize(), "build", str(K8S / kustomization)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kustomize build {kustomization}: {result.stderr}"
    return result.stdout


def render(kustomization: str) -> list[dict]:
    """The rendered objects (a fresh copy each call: tests may modify what they get)."""
    return [copy.deepcopy(d) for d in yaml.safe_load_all(render_text(kustomization)) if d]


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def operator_pod_template(collector: dict) -> dict:
    """The pod template the OpenTelemetry Operator makes of an OpenTelemetryCollector, as far
    as these tests read it (v0.140.0, internal/manifests/collector: container.go, daemonset.go,
    deployment.go, volume.go; manifestutils/labels.go): the CR's labels under the operator's
    own, one container otc-container with spec.config mounted at /conf, the probes from the
    health_check extension with spec's timings."""
    meta, spec = collector["metadata"], collector["spec"]
    name = meta["name"]
    config = spec["config"]
    health = config.get("extensions", {}).get("health_check")
    probes = {}
    if health is not None and "health_check" in config["service"].get("extensions", []):
        # the operator takes the first ":<digits>" of the endpoint (components.PortFromEndpoint)
        port = int(re.search(r":([0-9]+)", health.get("endpoint", ":13133")).group(1))
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            probes[probe] = {"httpGet": {"path": health.get("path", "/"), "port": port},
                             **spec.get(probe, {})}
    container = {
        "name": "otc-container",
        "image": spec.get("image", "(the operator's default collector image)"),
        "args": ["--config=/conf/collector.yaml"]
        + sorted(f"--{k}={v}" for k, v in spec.get("args", {}).items() if k != "config"),
        "env": spec.get("env", []),
        "ports": [{"name": p["name"], "containerPort": p["port"],
                   "protocol": p.get("protocol", "TCP")} for p in spec.get("ports", [])],
        "resources": spec.get("resources", {}),
        "securityContext": spec.get("securityContext", {}),
        "volumeMounts": [{"name": "otc-internal", "mountPath": "/conf"}]
        + spec.get("volumeMounts", []),
        **probes,
    }
    pod = {
        "serviceAccountName": spec.get("serviceAccount") or f"{name}-collector",
        "securityContext": spec.get("podSecurityContext", {}),
        "containers": [container],
        "volumes": [{"name": "otc-internal",
                     "configMap": {"name": f"{name}-collector",
                                   "items": [{"key": "collector.yaml",
                                              "path": "collector.yaml"}]}}]
        + spec.get("volumes", []),
    }
    for key in ("tolerations", "terminationGracePeriodSeconds", "topologySpreadConstraints",
                "nodeSelector", "affinity", "priorityClassName"):
        if key in spec:
            pod[key] = spec[key]
    labels = dict(meta.get("labels", {}))
    labels.update({"app.kubernetes.io/managed-by": "opentelemetry-operator",
                   "app.kubernetes.io/instance": f"{meta['namespace']}.{name}",
                   "app.kubernetes.io/part-of": "opentelemetry",
                   "app.kubernetes.io/component": "opentelemetry-collector"})
    labels.setdefault("app.kubernetes.io/name", f"{name}-collector")
    return {"metadata": {"labels": labels}, "spec": pod}


def pod_templates(obj: dict) -> list[dict]:
    """The pod templates of a workload: Deployment, DaemonSet, Job, PyTorchJob, and the one the
    OpenTelemetry Operator makes of an OpenTelemetryCollector."""
    kind = obj["kind"]
    if kind == "OpenTelemetryCollector":
        return [operator_pod_template(obj)]
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        return [obj["spec"]["template"]]
    if kind == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]]
    if kind == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if kind == "Pod":
        return [obj]
    return []


def all_pod_templates(objects: list[dict]) -> list[tuple[str, dict]]:
    return [(f"{o['kind']}/{o['metadata']['name']}", t) for o in objects
            for t in pod_templates(o)]


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container: dict, name: str) -> str | None:
    entry = env_of(container).get(name)
    return None if entry is None else entry.get("value")


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024,
             "K": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", str(quantity))
    assert m, f"unparsed quantity {quantity!r}"
    return float(m.group(1)) * (units[m.group(2)] if m.group(2) else 1 / 2**20)


def millicores(quantity: str) -> float:
    q = str(quantity)
    return float(q[:-1]) if q.endswith("m") else float(q) * 1000


# --- rendering ----------------------------------------------------------------------------------


def test_every_kustomization_in_k8s_is_rendered_by_these_tests():
    found = {str(p.parent.relative_to(K8S)) for p in K8S.rglob("kustomization.yaml")
             if ".bin" not in p.parts}
    assert found == set(KUSTOMIZATIONS) | set(INCLUDED)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_renders_with_real_kustomize(kustomization):
    objects = render(kustomization)
    assert objects
    version = subprocess.run([kustomize(), "version"], capture_output=True, text=True,
                             check=True).stdout
    assert "v5." in version
    for obj in objects:
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name"), obj
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"].get("namespace") in ("observability", "training"), obj


def test_observability_overlays_hold_the_whole_path():
    for kustomization in OBSERVABILITY:
        kinds = {(o["kind"], o["metadata"]["name"]) for o in render(kustomization)}
        for expected in [("DaemonSet", "otelcol-agent"), ("Deployment", "otelcol-gateway"),
                         ("Service", "otelcol-agent"), ("Service", "otelcol-gateway"),
                         ("Service", "otelcol-gateway-headless"),
                         ("ServiceAccount", "otelcol-agent"),
                         ("ClusterRole", "otel-train-otelcol-agent"),
                         ("ClusterRoleBinding", "otel-train-otelcol-agent"),
                         ("NetworkPolicy", "otelcol-agent-ingress"),
                         ("NetworkPolicy", "otelcol-gateway-ingress"),
                         ("ServiceMonitor", "otelcol"), ("PrometheusRule", "otel-train")]:
            assert expected in kinds, (kustomization, expected)
        # one ingestion path for the ranks' metrics: remote write from the gateways, no
        # PodMonitor on the ranks' own endpoints (k8s/components/rank-endpoints opts in)
        assert "PodMonitor" not in {kind for kind, _ in kinds}, kustomization


# --- core kinds against the Kubernetes schemas ------------------------------------------------


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_core_objects_validate_against_kubernetes_schemas(kustomization, k8s_version):
    core = [o for o in render(kustomization) if o["apiVersion"] in CORE_API_VERSIONS]
    assert core
    for obj in core:
        try:
            kubernetes_validate.validate(obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({k8s_version}): {e.message} "
                        f"at {'.'.join(map(str, e.path))}")


def test_every_rendered_api_version_is_checked_by_one_validator():
    custom = {c["apiVersion"] + "/" + c["kind"]
              for c in json.loads(CRDS_LOCK.read_text())["crds"]}
    for kustomization in KUSTOMIZATIONS:
        for obj in render(kustomization):
            assert (obj["apiVersion"] in CORE_API_VERSIONS
                    or f"{obj['apiVersion']}/{obj['kind']}" in custom), obj["kind"]


def test_kubernetes_schema_validation_rejects_an_unknown_field():
    deployment = one(render("base"), "Deployment", "otelcol-gateway")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


# --- custom resources: the operators' Go types, strictly -------------------------------------


def run_crdcheck(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([crdcheck()], input=text, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_custom_resources_decode_strictly_into_operator_types(kustomization):
    result = run_crdcheck(render_text(kustomization))
    assert result.returncode == 0, result.stdout + result.stderr
    custom = [o for o in render(kustomization) if o["apiVersion"] not in CORE_API_VERSIONS]
    ok_lines = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(ok_lines) == len(custom)
    assert custom or kustomization == "jobs/indexed-job"


def test_crdcheck_rejects_a_misplaced_field():
    monitor = one(render("base"), "ServiceMonitor", "otelcol")
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "30s"  # not a field
    result = run_crdcheck(yaml.safe_dump(monitor))
    assert result.returncode == 1
    assert 'unknown field "scrapeInterval"' in result.stdout


# --- custom resources: the CRDs' openAPIV3Schema ----------------------------------------------


def module_dir(module: str, version: str) -> Path:
    """The module's directory in Go's module cache (downloaded through the proxy if needed)."""
    go = require_binary("go")
    result = subprocess.run([go, "mod", "download", "-json", f"{module}@{version}"],
                            capture_output=True, text=True, timeout=300,
                            cwd=K8S / "tools" / "crdcheck")
    assert result.returncode == 0, result.stdout + result.stderr
    return Path(json.loads(result.stdout)["Dir"])


def structural(schema: dict) -> dict:
    """An openAPIV3Schema as a JSON Schema, with the API server's pruning made an error:
    an object that lists its properties and does not preserve unknown fields admits no other."""
    schema = dict(schema)
    if schema.get("nullable") and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    if "properties" in schema:
        schema["properties"] = {k: structural(v) for k, v in schema["properties"].items()}
        if ("additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = structural(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [structural(s) for s in schema[key]]
    return schema


@functools.cache
def crd_validators() -> dict[str, jsonschema.Draft7Validator]:
    validators = {}
    for entry in json.loads(CRDS_LOCK.read_text())["crds"]:
        path = module_dir(entry["module"], entry["module_version"]) / entry["path"]
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{path} changed"
        crd = yaml.safe_load(data)
        group, version = entry["apiVersion"].split("/")
        assert crd["kind"] == "CustomResourceDefinition"
        assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == entry["kind"]
        served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
        schema = structural(served[version]["schema"]["openAPIV3Schema"])
        validators[entry["apiVersion"] + "/" + entry["kind"]] = jsonschema.Draft7Validator(schema)
    return validators


def crd_errors(obj: dict) -> list[str]:
    validator = crd_validators()[obj["apiVersion"] + "/" + obj["kind"]]
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_custom_resources_validate_against_their_crd_schemas(kustomization):
    custom = [o for o in render(kustomization) if o["apiVersion"] not in CORE_API_VERSIONS]
    assert custom or kustomization == "jobs/indexed-job"
    for obj in custom:
        assert crd_errors(obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


def test_crd_schema_validation_rejects_a_wrong_type_and_an_unknown_field():
    job = one(render("jobs/pytorchjob"), "PyTorchJob", "otel-train-example")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    job["spec"]["runPolicy"]["cleanupPolicy"] = "None"
    errors = crd_errors(job)
    assert any("replicas" in e and "'two'" in e for e in errors), errors
    assert any("cleanupPolicy" in e for e in errors), errors


# --- the collectors' rendered configuration, on the real collector ----------------------------


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def collector_invocation(objects: list[dict], workload: dict, root: Path) -> tuple[list, dict]:
    """The container's args and env, with its ConfigMap and Secret volumes laid under root."""
    spec = workload["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "otelcol"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
            for key, text in config_map["data"].items():
                (target / key).write_text(text.replace("/etc/otelcol/", f"{root}/etc/otelcol/"))
        elif "secret" in volume:
            # Referenced, never rendered: stand-ins, only so that paths exist.
            items = volume["secret"].get("items") or [{"path": p} for p in
                                                       ("ca.crt", "tls.crt", "tls.key")]
            for item in items:
                (target / item["path"]).write_text("")
    field_values = {"spec.nodeName": "node-a", "status.podIP": "127.0.0.1"}
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        else:
            env[entry["name"]] = field_values[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    args = [a.replace("/etc/otelcol/", f"{root}/etc/otelcol/") for a in container["args"]]
    return args, env


@pytest.mark.parametrize("kustomization", OBSERVABILITY)
@pytest.mark.parametrize("workload", ["DaemonSet/otelcol-agent", "Deployment/otelcol-gateway"])
def test_rendered_collector_configuration_is_valid_for_the_real_collector(
        kustomization, workload, tmp_path):
    objects = render(kustomization)
    args, env = collector_invocation(objects, one(objects, *workload.split("/")), tmp_path)
    assert args and all(a.startswith("--config=") for a in args)
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("OTELCOL_")}
    result = subprocess.run([collector_binary(), "validate", *args], env={**clean_env, **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_real_collector_rejects_a_broken_rendered_configuration(tmp_path):
    objects = render("overlays/large")
    gateway = one(objects, "Deployment", "otelcol-gateway")
    (tls,) = [c for c in find(objects, "ConfigMap") if "gateway-tls.yaml" in c["data"]]
    tls["data"]["gateway-tls.yaml"] = tls["data"]["gateway-tls.yaml"].replace(
        "cert_file", "certificate_file")
    args, env = collector_invocation(objects, gateway, tmp_path)
    result = subprocess.run([collector_binary(), "validate", *args], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "certificate_file" in result.stderr
