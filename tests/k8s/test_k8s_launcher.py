"""Both example jobs hand every rank the launcher's context (docs/design.md's checklist item "the
job launcher's context flows into ranks"): a TRACEPARENT that every pod of one job shares, and
the job's id as torchrun's rendezvous id, which torchrun hands every rank as
TORCHELASTIC_RUN_ID, otel-train's run id (no broadcast). k8s/jobs/common/launcher-context.sh
does it from two downward-API variables, LAUNCHER_JOB_ID and LAUNCHER_TRACEPARENT.

The rendered containers are run the way the kubelet would start them in simulated pods (their
env resolved from the pod's labels, annotations and namespace, `$(VAR)` expanded), first with
a command that prints what the script exported, then with a real torchrun (gloo, 2 ranks)
through each example's own command line, whose run passes `otel-train check`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT
from support.pipeline_fixtures import free_port
from test_k8s_render import JOBS, K8S, env_of, one, render

from otel_train import identity

SCRIPT = K8S / "jobs" / "common" / "launcher-context.sh"
MOUNT = "/etc/otel-train"
JOB_UID = "3f1c2b9e-8d4a-4f6e-9b1a-0c2d3e4f5a6b"
SUBMITTER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: what torchrun_train.py, a user's script, stands in for
TRAIN = REPO_ROOT / "tests" / "support" / "torchrun_train.py"


def pods_of(kustomization: str, job_uid: str = JOB_UID, job_name: str | None = None,
            annotations: dict[str, str] | None = None) -> list[tuple[dict, dict]]:
    """(container, simulated pod) for two pods of one job, labelled as its controller does:
    an indexed Job's pods 0 and 1, a PyTorchJob's Master and Worker."""
    objects = render(kustomization)
    replicas = []  # (template, pod name, controller labels)
    for job in objects:
        if job["kind"] == "Job":
            replicas += [(job["spec"]["template"], f"{job['metadata']['name']}-{i}",
                          {"batch.kubernetes.io/controller-uid": job_uid,
                           "batch.kubernetes.io/job-completion-index": str(i)})
                         for i in range(2)]
        elif job["kind"] == "PyTorchJob":
            name = job_name or job["metadata"]["name"]
            replicas += [(spec["template"], f"{name}-{kind.lower()}-0",
                          {"training.kubeflow.org/job-name": name,
                           "training.kubeflow.org/replica-type": kind.lower()})
                         for kind, spec in job["spec"]["pytorchReplicaSpecs"].items()]
    found = []
    for template, pod_name, labels in replicas:
        pod = {"metadata": {"name": pod_name, "namespace": "training", "uid": f"uid-{pod_name}",
                            "labels": template["metadata"].get("labels", {}) | labels,
                            "annotations": dict(annotations or {})},
               "spec": {"nodeName": f"node-of-{pod_name}"}}
        (container,) = template["spec"]["containers"]
        found.append((container, pod))
    return found


def field(pod: dict, path: str) -> str:
    """A downward-API fieldPath as the kubelet resolves it (a missing key is empty)."""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return pod["metadata"][m.group(1)].get(m.group(2), "")
    section, key = path.split(".", 1)
    return pod[section][key]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: variables defined earlier in the list."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def pod_env(container: dict, pod: dict) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        else:
            env[entry["name"]] = field(pod, entry["valueFrom"]["fieldRef"]["fieldPath"])
    return env


def clean_env(**extra: str) -> dict[str, str]:
    """This machine's environment without anything a launcher or otel-train reads."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TORCHELASTIC_", "PET_", "LAUNCHER_"))
           and k not in ("TRACEPARENT", "TRACESTATE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])
    return env | extra


def rendered_script(kustomization: str, tmp_path: Path) -> Path:
    config_map = one(render(kustomization), "ConfigMap", "otel-train-launcher")
    path = tmp_path / "launcher-context.sh"
    path.write_text(config_map["data"]["launcher-context.sh"])
    return path


def launched(kustomization: str, tmp_path: Path, **pods_kw) -> list[tuple[str, str]]:
    """(TRACEPARENT, PET_RDZV_ID) that the script exports in each simulated pod."""
    script = rendered_script(kustomization, tmp_path)
    seen = []
    for container, pod in pods_of(kustomization, **pods_kw):
        env = pod_env(container, pod)
        launcher = {k: v for k, v in env.items() if k.startswith("LAUNCHER_")}
        out = subprocess.run(["sh", str(script), "sh", "-c", 'echo "$TRACEPARENT $PET_RDZV_ID"'],
                             env=clean_env(**launcher), capture_output=True, text=True,
                             timeout=30, check=True)
        traceparent, run_id = out.stdout.split()
        seen.append((traceparent, run_id))
    return seen


# --- what is rendered ---------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", JOBS)
def test_every_rank_container_starts_its_launcher_through_the_rendered_script(kustomization):
    config_map = one(render(kustomization), "ConfigMap", "otel-train-launcher")
    assert config_map["data"] == {"launcher-context.sh": SCRIPT.read_text()}
    for container, _ in pods_of(kustomization):
        assert container["command"][:2] == ["sh", f"{MOUNT}/launcher-context.sh"]
        assert "torchrun" in " ".join(container["command"][2:])
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == MOUNT]
        assert mount["readOnly"] is True


@pytest.mark.parametrize("kustomization", JOBS)
def test_every_rank_container_reads_the_job_id_and_the_submitter_s_context(kustomization):
    for container, _ in pods_of(kustomization):
        env = env_of(container)
        assert env["LAUNCHER_TRACEPARENT"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['otel-train.io/traceparent']"
        job_id = env["LAUNCHER_JOB_ID"]
        if kustomization == "jobs/indexed-job":
            assert job_id["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.labels['batch.kubernetes.io/controller-uid']"
        else:  # the operator labels pods with the job's name only (no uid)
            assert job_id["value"] == "$(PYTORCHJOB_NAMESPACE).$(PYTORCHJOB_NAME)"
            assert env["PYTORCHJOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.labels['training.kubeflow.org/job-name']"
        # $(VAR) only expands variables defined earlier in the list
        assert list(env).index("LAUNCHER_JOB_ID") > max(
            [list(env).index(n) for n in ("PYTORCHJOB_NAME", "PYTORCHJOB_NAMESPACE") if n in env],
            default=-1)


# --- what the kubelet would start ---------------------------------------------------------


@pytest.mark.parametrize("kustomization", JOBS)
def test_every_pod_of_one_job_gets_the_same_sampled_traceparent_and_the_job_id_as_run_id(
        kustomization, tmp_path):
    seen = launched(kustomization, tmp_path)
    assert len(seen) >= 2 and len(set(seen)) == 1, seen
    traceparent, run_id = seen[0]
    context = identity.launcher_context({"TRACEPARENT": traceparent})
    assert context is not None and context.trace_flags.sampled
    assert run_id == (JOB_UID if kustomization == "jobs/indexed-job"
                      else "training.otel-train-example")


@pytest.mark.parametrize("kustomization", JOBS)
def test_another_job_gets_another_traceparent_and_run_id(kustomization, tmp_path):
    first = launched(kustomization, tmp_path)[0]
    other = launched(kustomization, tmp_path, job_uid="9a8b7c6d-0000-4000-8000-000000000001",
                     job_name="otel-train-example-2")[0]
    assert first[0] != other[0] and first[1] != other[1]


@pytest.mark.parametrize("kustomization", JOBS)
def test_the_submitter_s_annotated_context_wins(kustomization, tmp_path):
    seen = launched(kustomization, tmp_path,
                    annotations={"otel-train.io/traceparent": SUBMITTER})
    assert {traceparent for traceparent, _ in seen} == {SUBMITTER}


def test_the_script_refuses_to_start_without_a_job_id(tmp_path):
    out = subprocess.run(["sh", str(SCRIPT), "true"], env=clean_env(), capture_output=True,
                         text=True, timeout=30)
    assert out.returncode != 0 and "LAUNCHER_JOB_ID" in out.stderr


# --- a real torchrun through each example's command ---------------------------------------


def local_command(container: dict, script: Path, out_dir: Path, port: int) -> list[str]:
    """The container's command for one node on this machine: torchrun as a module, the test's
    training script in place of /workspace/train.py, the rendezvous on loopback."""
    torchrun = f"{sys.executable} -m torch.distributed.run"
    command = []
    for part in [str(script), *container["command"][2:]]:
        part = (part.replace("exec torchrun", f"exec {torchrun}")
                .replace("/workspace/train.py", f"{TRAIN} {out_dir}")
                .replace("otel-train-torchrun-0.otel-train-torchrun", "127.0.0.1")
                .replace("--master-port=29500", f"--master-port={port}"))
        command += torchrun.split() if part == "torchrun" else (
            part.split() if part.startswith(str(TRAIN)) else [part])
    return ["sh", *command]


@pytest.mark.slow
@pytest.mark.parametrize("kustomization", JOBS)
def test_a_run_started_by_the_example_s_command_passes_the_checklist(kustomization, tmp_path):
    script = rendered_script(kustomization, tmp_path)
    container, pod = pods_of(kustomization)[0]
    launcher = {k: v for k, v in pod_env(container, pod).items() if k.startswith("LAUNCHER_")}
    port = free_port()
    # what the Job controller (index) or the training operator (PET_*) would add, on one node
    node = ({"NNODES": "1", "JOB_COMPLETION_INDEX": "0"} if kustomization == "jobs/indexed-job"
            else {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "0",
                  "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
    command = [expand(part, node) for part in local_command(container, script, tmp_path, port)]
    run = subprocess.run(command, env=clean_env(**launcher, **node), capture_output=True,
                         text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-4000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run_dir.name == launcher["LAUNCHER_JOB_ID"]  # the run id, without a broadcast
    check = subprocess.run([sys.executable, "-m", "otel_train.cli", "check", str(run_dir),
                            "--json"], env=clean_env(), capture_output=True, text=True,
                           timeout=300)
    checks = {c["id"]: c for c in json.loads(check.stdout)["checks"]}
    assert check.returncode == 0, checks
    assert checks["launcher_context"]["status"] == "pass", checks["launcher_context"]
