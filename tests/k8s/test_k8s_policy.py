"""Security, resources and wiring of every rendered object, in every kustomization.

One behaviour per test: each security item of issue 9 on every container, RBAC limited to what
k8s_attributes reads, memory limits consistent with memory_limiter, health probes on the
health_check extension, NetworkPolicies that admit OTLP only where it should flow, training
jobs that carry the OTEL_* settings and downward-API identity, and the overlays' promises."""

from __future__ import annotations

import re

import pytest
import yaml
from test_k8s_render import (
    JOBS,
    KUSTOMIZATIONS,
    OBSERVABILITY,
    all_pod_templates,
    containers,
    env_of,
    env_value,
    find,
    mebibytes,
    millicores,
    one,
    render,
)

COLLECTORS = ("DaemonSet/otelcol-agent", "Deployment/otelcol-gateway")


def every_container():
    for kustomization in KUSTOMIZATIONS:
        for workload, template in all_pod_templates(render(kustomization)):
            for container in containers(template):
                yield f"{kustomization}:{workload}:{container['name']}", template, container


def test_there_are_containers_to_check():
    names = [name for name, _, _ in every_container()]
    assert len(names) >= 9  # 3 x (agent, gateway), 2 PyTorchJob replicas, 1 Job
    assert any("PyTorchJob" in n for n in names) and any(":Job/" in n for n in names)


def test_every_container_runs_as_non_root():
    for name, template, container in every_container():
        pod = template["spec"].get("securityContext", {})
        ctx = container.get("securityContext", {})
        assert ctx.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, name
        assert ctx.get("runAsUser", pod.get("runAsUser", 1)) != 0, name


def test_every_container_has_a_read_only_root_filesystem():
    for name, _, container in every_container():
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_no_container_may_escalate_privileges():
    for name, _, container in every_container():
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert container["securityContext"].get("privileged", False) is False, name


def test_every_container_drops_all_capabilities_and_adds_none():
    for name, _, container in every_container():
        capabilities = container["securityContext"]["capabilities"]
        assert capabilities["drop"] == ["ALL"], name
        assert not capabilities.get("add"), name


def test_every_pod_uses_the_runtime_default_seccomp_profile_and_no_host_namespaces():
    for kustomization in KUSTOMIZATIONS:
        for workload, template in all_pod_templates(render(kustomization)):
            spec = template["spec"]
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            for key in ("hostNetwork", "hostPID", "hostIPC"):
                assert not spec.get(key), (workload, key)
            assert not any("hostPath" in v for v in spec.get("volumes", [])), workload
            for container in containers(template):
                assert not any("hostPort" in p for p in container.get("ports", [])), workload


def test_every_container_has_cpu_and_memory_requests_within_limits():
    for name, _, container in every_container():
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request, limit = resources["requests"][resource], resources["limits"][resource]
            convert = millicores if resource == "cpu" else mebibytes
            assert 0 < convert(request) <= convert(limit), (name, resource)


def test_namespaces_enforce_the_restricted_pod_security_standard():
    for kustomization in KUSTOMIZATIONS:
        for namespace in find(render(kustomization), "Namespace"):
            labels = namespace["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_no_secret_is_rendered_and_tls_material_is_only_referenced():
    for kustomization in KUSTOMIZATIONS:
        objects = render(kustomization)
        assert find(objects, "Secret") == [], kustomization
        text = yaml.safe_dump_all(objects)
        assert "BEGIN CERTIFICATE" not in text and "PRIVATE KEY" not in text
        for workload, template in all_pod_templates(objects):
            for volume in template["spec"].get("volumes", []):
                if "secret" in volume:
                    assert set(volume["secret"]) <= {"secretName", "items", "defaultMode",
                                                     "optional"}, workload
            for container in containers(template):
                for entry in container.get("env", []):
                    if re.search(r"PASSWORD|TOKEN|SECRET|_KEY$", entry["name"]):
                        assert "value" not in entry, (workload, entry["name"])


def test_large_overlay_encrypts_agent_to_gateway_otlp_with_the_referenced_secret():
    objects = render("overlays/large")
    for workload in COLLECTORS:
        template = one(objects, *workload.split("/"))["spec"]["template"]
        secrets = [v["secret"]["secretName"] for v in template["spec"]["volumes"]
                   if "secret" in v]
        assert secrets == ["otelcol-gateway-tls"], workload
    agent = one(objects, "DaemonSet", "otelcol-agent")["spec"]["template"]
    (tls_volume,) = [v for v in agent["spec"]["volumes"] if "secret" in v]
    assert tls_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert env_value(agent["spec"]["containers"][0], "OTELCOL_GATEWAY_INSECURE") == "false"
    (fragments,) = [c for c in find(objects, "ConfigMap") if "agent-tls.yaml" in c["data"]]
    agent_tls = yaml.safe_load(fragments["data"]["agent-tls.yaml"])
    gateway_tls = yaml.safe_load(fragments["data"]["gateway-tls.yaml"])
    assert agent_tls["exporters"]["load_balancing"]["protocol"]["otlp"]["tls"]["insecure"] is False
    assert gateway_tls["receivers"]["otlp"]["protocols"]["grpc"]["tls"]["key_file"].startswith(
        "/etc/otelcol/tls/")


# --- RBAC --------------------------------------------------------------------------------------


def test_rbac_grants_only_what_k8s_attributes_reads():
    objects = render("base")
    roles = find(objects, "ClusterRole") + find(objects, "Role")
    assert [r["metadata"]["name"] for r in roles] == ["otel-train-otelcol-agent"]
    assert roles[0]["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                  "verbs": ["get", "list", "watch"]}]
    (binding,) = find(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "otelcol-agent",
                                    "namespace": "observability"}]
    # What the agent config extracts needs no other informer (namespace, node, ReplicaSet, Job).
    config = yaml.safe_load(render_config_map(objects, "agent"))
    processor = config["processors"]["k8s_attributes"]
    extract = processor["extract"]
    assert not {"annotations"} & set(extract)
    assert all(label["from"] == "pod" for label in extract["labels"])
    assert not {"k8s.deployment.uid", "k8s.node.uid", "k8s.cluster.uid", "k8s.cronjob.uid",
                "k8s.deployment.name"} & set(extract["metadata"])
    assert processor["filter"]["node_from_env_var"] == "K8S_NODE_NAME"


def test_only_the_agent_mounts_a_service_account_token():
    agents = {"DaemonSet/otelcol-agent", "OpenTelemetryCollector/otelcol-agent"}
    for kustomization in KUSTOMIZATIONS:
        objects = render(kustomization)
        accounts = {a["metadata"]["name"]: a for a in find(objects, "ServiceAccount")}
        for workload, template in all_pod_templates(objects):
            spec = template["spec"]
            # the pod's own setting, else its ServiceAccount's (the operator sets none on pods)
            mounts = spec.get("automountServiceAccountToken")
            if mounts is None and spec.get("serviceAccountName") in accounts:
                mounts = accounts[spec["serviceAccountName"]].get("automountServiceAccountToken")
            assert mounts is (workload in agents), workload


def render_config_map(objects: list[dict], tier: str) -> str:
    (config_map,) = [c for c in find(objects, "ConfigMap")
                     if c["metadata"]["name"].startswith(f"otelcol-{tier}-config-")]
    return config_map["data"][f"{tier}.yaml"]


# --- collectors: memory, probes, wiring ---------------------------------------------------------


def collector_container(objects, workload):
    template = one(objects, *workload.split("/"))["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return container


def config_default(config_text: str, variable: str) -> str:
    return re.search(r"\$\{env:" + variable + r":-([^}]+)\}", config_text).group(1)


@pytest.mark.parametrize("kustomization", OBSERVABILITY)
@pytest.mark.parametrize("workload", COLLECTORS)
def test_memory_limiter_sits_below_the_container_memory_limit(kustomization, workload):
    objects = render(kustomization)
    container = collector_container(objects, workload)
    config = render_config_map(objects, "agent" if "agent" in workload else "gateway")
    limit_mib = float(env_value(container, "OTELCOL_MEMORY_LIMIT_MIB")
                      or config_default(config, "OTELCOL_MEMORY_LIMIT_MIB"))
    spike_mib = float(env_value(container, "OTELCOL_MEMORY_SPIKE_LIMIT_MIB")
                      or config_default(config, "OTELCOL_MEMORY_SPIKE_LIMIT_MIB"))
    container_mib = mebibytes(container["resources"]["limits"]["memory"])
    # Refuse data well before the OOM killer acts, but use most of what was granted.
    assert 0.6 * container_mib <= limit_mib <= 0.85 * container_mib
    assert 0 < spike_mib <= 0.3 * limit_mib
    # The Go runtime collects harder as it nears the same soft limit.
    gomemlimit = env_value(container, "GOMEMLIMIT")
    assert gomemlimit and mebibytes(gomemlimit.replace("B", "")) == limit_mib
    assert mebibytes(container["resources"]["requests"]["memory"]) <= container_mib


@pytest.mark.parametrize("kustomization", OBSERVABILITY)
def test_gateway_queue_directory_is_a_writable_volume_of_the_pod(kustomization):
    # The root filesystem is read-only: file_storage/queue needs a volume at OTELCOL_QUEUE_DIR.
    # An emptyDir keeps the queue across container restarts (not pod deletions:
    # k8s/base/gateway-deployment.yaml says why), bounded so that a full disk cannot evict.
    objects = render(kustomization)
    spec = one(objects, "Deployment", "otelcol-gateway")["spec"]["template"]["spec"]
    container = collector_container(objects, "Deployment/otelcol-gateway")
    config = yaml.safe_load(render_config_map(objects, "gateway"))
    directory = env_value(container, "OTELCOL_QUEUE_DIR") or config_default(
        config["extensions"]["file_storage/queue"]["directory"], "OTELCOL_QUEUE_DIR")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert not mount.get("readOnly", False)
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    # one file per queue, at most max_size each, and room for one compaction copy
    files = sum(1 for e in config["exporters"].values()
                if e.get("sending_queue", {}).get("storage") == "file_storage/queue")
    file_mib = config["extensions"]["file_storage/queue"]["max_size"] / 2**20
    assert files >= 2
    assert mebibytes(volume["emptyDir"]["sizeLimit"]) >= (files + 1) * file_mib


@pytest.mark.parametrize("kustomization", OBSERVABILITY)
@pytest.mark.parametrize("workload", COLLECTORS)
def test_collector_probes_ask_the_health_check_extension(kustomization, workload):
    objects = render(kustomization)
    container = collector_container(objects, workload)
    config = yaml.safe_load(
        render_config_map(objects, "agent" if "agent" in workload else "gateway"))
    assert "health_check" in config["service"]["extensions"]
    endpoint = config["extensions"]["health_check"]["endpoint"]
    health_port = int(config_default(endpoint, "OTELCOL_HEALTH_ENDPOINT").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == health_port == 13133
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/", "port": "health"}, probe


def test_agent_forwards_to_the_headless_gateway_service():
    for kustomization in OBSERVABILITY:
        objects = render(kustomization)
        agent = collector_container(objects, "DaemonSet/otelcol-agent")
        hostname = env_value(agent, "OTELCOL_GATEWAY_HOSTNAME")
        name, namespace = hostname.split(".")[:2]
        headless = one(objects, "Service", name)
        assert headless["spec"]["clusterIP"] == "None" and namespace == "observability"
        assert headless["spec"]["selector"] == one(objects, "Deployment", "otelcol-gateway")[
            "spec"]["selector"]["matchLabels"]
        assert [p["port"] for p in headless["spec"]["ports"]] == [4317]
        endpoint = env_value(agent, "OTELCOL_GATEWAY_ENDPOINT")
        assert one(objects, "Service", endpoint.split(".")[0])["spec"].get("clusterIP") != "None"


def test_agent_service_keeps_otlp_on_the_node():
    service = one(render("base"), "Service", "otelcol-agent")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert {p["port"] for p in service["spec"]["ports"]} == {4317, 4318, 8888}


# --- NetworkPolicies ---------------------------------------------------------------------------


def otlp_rules(policy: dict) -> list[dict]:
    return [rule for rule in policy["spec"]["ingress"]
            if {p["port"] for p in rule.get("ports", [])} & {4317, 4318}]


def test_agents_admit_otlp_only_from_training_pods():
    for kustomization in OBSERVABILITY:
        policy = one(render(kustomization), "NetworkPolicy", "otelcol-agent-ingress")
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from") and rule.get("ports"), "a rule without from/ports admits all"
        (rule,) = otlp_rules(policy)
        assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {
            "matchLabels": {"otel-train.io/otlp-client": "true"}}}]


def test_gateways_admit_otlp_only_from_agents():
    for kustomization in OBSERVABILITY:
        objects = render(kustomization)
        policy = one(objects, "NetworkPolicy", "otelcol-gateway-ingress")
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from") and rule.get("ports")
        (rule,) = otlp_rules(policy)
        agent_labels = one(objects, "DaemonSet", "otelcol-agent")["spec"]["template"][
            "metadata"]["labels"]
        (peer,) = rule["from"]
        assert set(peer) == {"podSelector"}  # same namespace only
        assert peer["podSelector"]["matchLabels"].items() <= agent_labels.items()


def test_every_training_pod_carries_the_label_the_agents_admit():
    for kustomization in JOBS:
        for workload, template in all_pod_templates(render(kustomization)):
            assert template["metadata"]["labels"]["otel-train.io/otlp-client"] == "true", workload


def test_training_pods_accept_only_peers_and_metrics_scrapes():
    for kustomization in JOBS:
        policy = one(render(kustomization), "NetworkPolicy", "otel-train-ranks-ingress")
        peers, scrape = policy["spec"]["ingress"]
        assert peers["from"] == [{"podSelector": {"matchLabels": {"otel-train.io/metrics":
                                                                  "rank"}}}]
        assert scrape["ports"] == [{"port": 9464, "endPort": 9471, "protocol": "TCP"}]


# --- training jobs ----------------------------------------------------------------------------


DOWNWARD = {"K8S_POD_NAME": "metadata.name", "K8S_NAMESPACE_NAME": "metadata.namespace",
            "K8S_NODE_NAME": "spec.nodeName", "K8S_POD_UID": "metadata.uid"}


def training_containers():
    for kustomization in JOBS:
        for workload, template in all_pod_templates(render(kustomization)):
            (container,) = template["spec"]["containers"]
            yield f"{kustomization}:{workload}", template, container


def test_training_containers_pass_pod_identity_through_the_downward_api():
    for name, _, container in training_containers():
        env = env_of(container)
        for variable, field in DOWNWARD.items():
            assert env[variable]["valueFrom"]["fieldRef"]["fieldPath"] == field, (name, variable)
        attributes = dict(pair.split("=", 1) for pair in
                          env_value(container, "OTEL_RESOURCE_ATTRIBUTES").split(","))
        assert attributes == {"k8s.pod.name": "$(K8S_POD_NAME)",
                              "k8s.namespace.name": "$(K8S_NAMESPACE_NAME)",
                              "k8s.node.name": "$(K8S_NODE_NAME)",
                              "k8s.pod.uid": "$(K8S_POD_UID)"}
        # $(VAR) only expands variables defined earlier in the list.
        names = list(env)
        assert all(names.index(v) < names.index("OTEL_RESOURCE_ATTRIBUTES") for v in DOWNWARD)


def test_training_containers_send_otlp_to_their_nodes_agent():
    agent_service = one(render("base"), "Service", "otelcol-agent")
    for name, _, container in training_containers():
        endpoint = env_value(container, "OTEL_EXPORTER_OTLP_ENDPOINT")
        m = re.fullmatch(r"http://([\w-]+)\.([\w-]+)\.svc\.cluster\.local:(\d+)", endpoint)
        assert m, name
        assert (m.group(1), m.group(2)) == ("otelcol-agent", "observability")
        assert int(m.group(3)) in {p["port"] for p in agent_service["spec"]["ports"]
                                   if p["name"] == "otlp-http"}
        assert env_value(container, "OTEL_EXPORTER_OTLP_PROTOCOL") == "http/protobuf"
        assert env_value(container, "OTEL_TRAIN_EXPORTER") == "otlp"
        assert env_value(container, "OTEL_SERVICE_NAME")
        assert env_value(container, "OTEL_TRACES_SAMPLER")


def test_training_containers_send_metrics_one_way_as_exponential_histograms():
    # One ingestion path (docs/scaling.md): OTLP to the agent, remote write from the gateway;
    # exponential histograms, which Prometheus stores as native histograms. No rank endpoint.
    for name, _, container in training_containers():
        env = env_of(container)
        assert env_value(container, "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION") \
            == "base2_exponential_bucket_histogram", name
        assert "OTEL_TRAIN_PROMETHEUS_PORT" not in env, name
        assert not [p for p in container.get("ports", ()) if p["name"].startswith("metrics-")]
    assert not [o for o in render("base") if o["kind"] == "PodMonitor"]


def test_pytorchjob_runs_torchrun_with_one_rank_per_gpu():
    job = one(render("jobs/pytorchjob"), "PyTorchJob", "otel-train-example")
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the operator's required name
        assert container["command"][2:] == ["torchrun", "/workspace/train.py"]
        assert int(job["spec"]["nprocPerNode"]) == int(container["resources"]["limits"][
            "nvidia.com/gpu"])


def test_indexed_job_runs_torchrun_with_the_completion_index_as_node_rank():
    objects = render("jobs/indexed-job")
    job = one(objects, "Job", "otel-train-torchrun")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"]
    template = job["spec"]["template"]
    (container,) = template["spec"]["containers"]
    command = container["command"][-1]
    assert "--node-rank=$JOB_COMPLETION_INDEX" in command
    assert "--nnodes=$(NNODES)" in command and env_value(container, "NNODES") == str(
        job["spec"]["completions"])
    # the rendezvous id comes from launcher-context.sh (PET_RDZV_ID), not the command line
    assert "--rdzv-id" not in command and "--standalone" not in command
    service = one(objects, "Service", template["spec"]["subdomain"])
    assert service["spec"]["clusterIP"] == "None"
    assert f"--master-addr={job['metadata']['name']}-0.{service['metadata']['name']}" in command


# --- monitoring objects -------------------------------------------------------------------------


def test_service_monitor_selects_both_collector_services_on_their_metrics_port():
    objects = render("base")
    monitor = one(objects, "ServiceMonitor", "otelcol")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in find(objects, "Service")
                if s["metadata"].get("labels", {}).items() >= selector.items()]
    assert sorted(s["metadata"]["name"] for s in selected) == ["otelcol-agent",
                                                               "otelcol-gateway"]
    for service in selected:
        assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


# --- overlays -------------------------------------------------------------------------------------


def gateway_settings(kustomization):
    objects = render(kustomization)
    deployment = one(objects, "Deployment", "otelcol-gateway")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return (deployment["spec"]["replicas"],
            float(env_value(container, "OTELCOL_SAMPLING_PERCENTAGE")),
            mebibytes(container["resources"]["limits"]["memory"]))


def test_overlays_scale_gateways_sampling_and_resources():
    small, base, large = (gateway_settings(k) for k in OBSERVABILITY[1:2] + OBSERVABILITY[:1]
                          + OBSERVABILITY[2:])
    assert small[0] < base[0] < large[0]      # gateway replicas
    assert small[1] > base[1] > large[1]      # share of ordinary steps kept
    assert small[2] < base[2] < large[2]      # memory per gateway
