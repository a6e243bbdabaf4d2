"""Several gloo ranks, real processes: one trace per step shared by every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from support import otlp_files

from otel_train import identity, semconv

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TORCHELASTIC_")) and k not in ("TRACEPARENT",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    env.update(extra)
    return env


def run_demo(tmp_path: Path, *args: str, **env: str) -> Path:
    out = subprocess.run(
        [sys.executable, "-m", "otel_train.cli", "demo", "--output-dir", str(tmp_path), *args],
        env=_env(**env), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dropped"] == {}
    return Path(result["run_dir"])


def assert_one_trace_per_step(run_dir: Path, world: int, steps: set[int] | None = None) -> None:
    spans = otlp_files.spans(run_dir)
    run_ids = {s["resource"][semconv.RES_RUN_ID] for s in spans}
    assert run_ids == {run_dir.name}, "every rank agreed on the run id"
    roots = {s["attrs"][semconv.ATTR_STEP]: s for s in spans if s["name"] == semconv.SPAN_STEP}
    assert {s["resource"][semconv.RES_RANK] for s in roots.values()} == {0}
    rank_steps = defaultdict(list)
    for s in spans:
        if s["name"] == semconv.SPAN_RANK_STEP:
            rank_steps[s["attrs"][semconv.ATTR_STEP]].append(s)
    assert set(rank_steps) == set(roots) and roots
    if steps is not None:
        assert set(roots) == steps
    for step, members in rank_steps.items():
        assert sorted(s["attrs"][semconv.ATTR_RANK] for s in members) == list(range(world))
        assert {s["traceId"] for s in members} == {roots[step]["traceId"]}
        assert {s["parentSpanId"] for s in members} == {roots[step]["spanId"]}
    phases = defaultdict(lambda: defaultdict(set))
    for s in spans:
        if s["name"] in semconv.PHASE_SPAN.values():
            phases[s["attrs"][semconv.ATTR_STEP]][s["name"]].add(s["attrs"][semconv.ATTR_RANK])
    for step in roots:
        for name in semconv.PHASE_SPAN.values():
            assert phases[step][name] == set(range(world)), (step, name)
    keys = {(s["traceId"], s["spanId"]) for s in spans}
    exemplars = [e for p in otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)
                 for e in p.get("exemplars", [])]
    assert exemplars and all((e["traceId"], e["spanId"]) in keys for e in exemplars)
    ranks_with_points = {p["attrs"][semconv.ATTR_RANK]
                         for p in otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)}
    assert ranks_with_points == set(range(world))


def assert_logs_point_into_traces(run_dir: Path) -> None:
    keys = {(s["traceId"], s["spanId"]) for s in otlp_files.spans(run_dir)}
    loss_logs = [r for r in otlp_files.logs(run_dir) if r["body"]["stringValue"] == "demo.loss"]
    assert loss_logs
    for record in loss_logs:
        assert (record["traceId"], record["spanId"]) in keys
        assert set(semconv.LOG_REQUIRED_FIELDS) - {"trace_id", "span_id"} <= set(record["attrs"])


def test_fsdp2_compiled_two_ranks(tmp_path):
    run_dir = run_demo(tmp_path, "--ranks", "2", "--steps", "6")
    assert_one_trace_per_step(run_dir, 2, steps=set(range(6)))
    assert_logs_point_into_traces(run_dir)


def test_ddp_compiled_two_ranks(tmp_path):
    run_dir = run_demo(tmp_path, "--ranks", "2", "--steps", "5", "--ddp", "--backend",
                       "aot_eager", "--workers", "0")
    assert_one_trace_per_step(run_dir, 2, steps=set(range(5)))


def test_ddp_four_ranks_sample_the_same_steps(tmp_path):
    run_dir = run_demo(tmp_path, "--ranks", "4", "--steps", "12", "--ddp", "--no-compile",
                       "--workers", "1", OTEL_TRACES_SAMPLER="traceidratio",
                       OTEL_TRACES_SAMPLER_ARG="0.5")
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    sampler = TraceIdRatioBased(0.5)
    expected = {s for s in range(12) if sampler.should_sample(
        None, identity.step_trace_id(run_dir.name, s), "x").decision.is_sampled()}
    assert 0 < len(expected) < 12
    assert_one_trace_per_step(run_dir, 4, steps=expected)
    counts = {p["attrs"][semconv.ATTR_RANK]: int(p["count"])
              for p in otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)}
    assert counts == {0: 12, 1: 12, 2: 12, 3: 12}, "metrics count every step, sampled or not"


def test_torchrun_launcher_context_reaches_every_rank(tmp_path):
    launcher_trace = "0af7651916cd43dd8448eb211c80319c"
    env = _env(TRACEPARENT=f"00-{launcher_trace}-b7ad6b7169203331-01")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO / "tests" / "support" / "torchrun_train.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = otlp_files.only_run_dir(tmp_path)
    spans = otlp_files.spans(run_dir)
    runs = [s for s in spans if s["name"] == semconv.SPAN_RUN]
    assert sorted(s["attrs"][semconv.ATTR_RANK] for s in runs) == [0, 1]
    assert all(s["traceId"] == launcher_trace and s["parentSpanId"] == "b7ad6b7169203331"
               for s in runs)
    assert_one_trace_per_step(run_dir, 2, steps=set(range(4)))
