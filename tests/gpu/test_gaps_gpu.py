"""Untimed time named to the line of code on a real GPU (issue 19): a compiled model on CUDA,
host work between forward and backward in one step. The phases are timed with CUDA events
(the GPU timeline), the stretch between them is found, sampled and reported."""

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

import otel_train  # noqa: E402
from otel_train import semconv as sc  # noqa: E402
from otel_train.cli import main  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HEAVY_STEP, HEAVY_S = 4, 0.3


def host_metric_loop(seconds: float) -> float:
    """What a stray per-step metric loop on the host looks like."""
    total, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += sum(i * 0.5 for i in range(200))
    return total


def test_a_host_gap_on_a_compiled_cuda_model_is_named_and_located(tmp_path, capsys) -> None:
    model, opt, data = gpu_training.setup(width=1024, depth=2, batch=256)
    compiled = torch.compile(model)
    with otel_train.instrument(compiled, optimizer=opt, output_dir=tmp_path, run_id="gpu-gaps",
                               console_log_level="warning"):
        for step in range(8):
            x, y = data[step % len(data)]
            loss = torch.nn.functional.mse_loss(compiled(x), y)
            if step == HEAVY_STEP:
                host_metric_loop(HEAVY_S)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    run_dir = otlp_files.only_run_dir(tmp_path)
    gaps = [dict(otlp_files.attrs(e), name=e["name"]) for s in otlp_files.spans(run_dir)
            if s["name"] == sc.SPAN_RANK_STEP and s["attrs"][sc.ATTR_STEP] == HEAVY_STEP
            for e in s.get("events", []) if e["name"] == sc.EVENT_GAP]
    gap = max(gaps, key=lambda g: g[sc.ATTR_GAP_DURATION])
    assert gap[sc.ATTR_GAP_SEGMENT] == "between forward and backward", gap
    assert gap[sc.ATTR_GAP_DURATION] >= HEAVY_S * 0.9, gap
    assert "host_metric_loop" in gap[sc.ATTR_CODE_FUNCTION], gap
    assert main(["report", str(run_dir), "--json", "--top", "2"]) == 0
    slow = json.loads(capsys.readouterr().out)["slow_steps"]  # step 0 compiles: the slowest
    assert HEAVY_STEP in [s["step"] for s in slow], slow
    heavy = next(s for s in slow if s["step"] == HEAVY_STEP)
    assert heavy["phase"] == "untimed" and heavy["segment"] == gap[sc.ATTR_GAP_SEGMENT], heavy
    assert heavy["location"].startswith("host_metric_loop() at test_gaps_gpu.py:"), heavy
