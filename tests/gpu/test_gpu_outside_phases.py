"""GPU work queued between the phases, on a real GPU (issue 53, item 1): a step whose code
launches kernels between forward and backward (a metric), its host not delayed. The CUDA
events the phases already record bracket that work; the rank step carries its GPU seconds and
stretch, the host's wait for it is the part ``gpu_outside_phases``, and the report names it.
A host that computes between the phases (the GPU idle meanwhile) is not taken for GPU work."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
import gpu_training  # noqa: E402
from support import otlp_files  # noqa: E402
from support.step_parts import assert_parts_add_up  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv as sc  # noqa: E402
from otel_train.cli import main  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU_STEP, HOST_STEP, STEPS = 6, 9, 14
HOST_S = 0.3


def gpu_metric(n: int) -> torch.Tensor:
    """A metric that launches ``n`` large matmuls: GPU work, no host time to speak of."""
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(n):
        a = torch.tanh(a @ a)
    return a.sum()


def host_metric(seconds: float) -> float:
    total, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += sum(i * 0.5 for i in range(200))
    return total


def matmuls_for(seconds: float) -> tuple[int, float]:
    """How many of gpu_metric's matmuls take about ``seconds`` on this GPU, and their time."""
    gpu_metric(2)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    gpu_metric(10)
    end.record()
    end.synchronize()
    per = begin.elapsed_time(end) / 1e3 / 10
    n = max(int(seconds / per), 1)
    return n, n * per


def test_gpu_work_between_forward_and_backward_is_measured_and_named(tmp_path, capsys) -> None:
    n, expected_s = matmuls_for(0.5)
    model, opt, data = gpu_training.setup(width=1024, depth=2, batch=256)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="gpu-between",
                               console_log_level="warning"):
        for step in range(STEPS):
            x, y = data[step % len(data)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == GPU_STEP:
                gpu_metric(n)
            if step == HOST_STEP:
                host_metric(HOST_S)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()  # the loss logged: where the host waits for its GPU
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert_parts_add_up(run_dir, {0})
    steps = {s["attrs"][sc.ATTR_STEP]: s["attrs"] for s in otlp_files.spans(run_dir)
             if s["name"] == sc.SPAN_RANK_STEP}
    gpu = steps[GPU_STEP]
    assert gpu[sc.ATTR_GPU_OUTSIDE_PHASES] >= 0.8 * expected_s, (gpu, expected_s)
    assert gpu[sc.ATTR_GPU_OUTSIDE_SEGMENT] == "between forward and backward", gpu
    # the host waited for that work at its loss.item(), after the optimizer's step: in the
    # next step (steps are contiguous), as the part gpu_outside_phases, not device_wait
    after = steps[GPU_STEP + 1]
    waited = after[sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_GPU_OUTSIDE_PHASES]
    assert waited >= 0.8 * expected_s, after
    assert after[sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_DEVICE_WAIT] < 0.2 * expected_s, after
    # the host's own work between the phases is not GPU work
    host = steps[HOST_STEP]
    assert host[sc.ATTR_GPU_OUTSIDE_PHASES] < 0.1 * HOST_S, host
    assert host[sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_HOST_BUSY] >= 0.8 * HOST_S, host
    typical = sorted(a[sc.ATTR_GPU_OUTSIDE_PHASES] for s, a in steps.items()
                     if s not in (0, GPU_STEP, HOST_STEP))
    assert typical[len(typical) // 2] < 0.05 * expected_s, typical
    assert main(["report", str(run_dir), "--json", "--top", "3"]) == 0
    slow = {s["step"]: s for s in json.loads(capsys.readouterr().out)["slow_steps"]}
    assert (slow[GPU_STEP]["phase"], slow[GPU_STEP]["on_gpu"], slow[GPU_STEP]["segment"]) == (
        sc.PHASE_GPU_OUTSIDE_PHASES, True, "between forward and backward"), slow[GPU_STEP]
    assert "of GPU work queued between forward and backward" in slow[GPU_STEP]["cause"]
    assert slow[HOST_STEP]["phase"] == "untimed", slow[HOST_STEP]
    assert slow[HOST_STEP]["location"].startswith("host_metric() at "), slow[HOST_STEP]


def test_a_region_is_timed_on_the_gpu_and_its_work_is_not_outside_the_phases(tmp_path) -> None:
    """GPU work inside ``otel_train.region("metric")`` is the region's: its span carries the
    GPU's times, ``training.phase_gpu_total.metric`` holds the work, and the stretches between
    the phases do not."""
    n, expected_s = matmuls_for(0.3)
    model, opt, data = gpu_training.setup(width=1024, depth=2, batch=256)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="gpu-region",
                               console_log_level="warning"):
        for step in range(8):
            x, y = data[step % len(data)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == 5:
                with otel_train.region("metric"):
                    gpu_metric(n)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert_parts_add_up(run_dir, {0})
    spans = otlp_files.spans(run_dir)
    (region,) = [s for s in spans if s["name"] == sc.SPAN_REGION]
    assert region["attrs"][sc.ATTR_PHASE] == "metric"
    assert region["attrs"][sc.ATTR_TIMING] == sc.TIMING_GPU, region["attrs"]
    step = next(s["attrs"] for s in spans if s["name"] == sc.SPAN_RANK_STEP
                and s["attrs"][sc.ATTR_STEP] == 5)
    assert step[sc.ATTR_PHASE_GPU_TOTAL_PREFIX + "metric"] >= 0.8 * expected_s, step
    assert step[sc.ATTR_GPU_OUTSIDE_PHASES] < 0.2 * expected_s, step
