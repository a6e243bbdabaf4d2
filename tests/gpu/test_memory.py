"""Memory per step from the allocator, checked against torch.cuda's own readings; OOM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_training  # noqa: E402
from support import otlp_files  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _last(run_dir, name):
    points = otlp_files.metric_points(run_dir, name)
    assert points, name
    return points[-1]["asInt"] if "asInt" in points[-1] else points[-1]["asDouble"]


def test_peak_and_reserved_match_torch_cuda(tmp_path):
    model, opt, data = gpu_training.setup()
    torch.cuda.reset_peak_memory_stats()
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                               console_log_level="warning"):
        gpu_training.train(model, opt, data, 6)
        torch.cuda.synchronize()
        peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert int(_last(run_dir, semconv.METRIC_MEMORY_ALLOCATED_PEAK)) == peak
    assert int(_last(run_dir, semconv.METRIC_MEMORY_RESERVED)) == reserved
    rank_steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    assert all(s["attrs"][semconv.ATTR_MEMORY_ALLOCATED_PEAK] <= peak for s in rank_steps)
    assert all(s["attrs"][semconv.ATTR_MEMORY_FRAGMENTATION] >= 0 for s in rank_steps)


def test_per_step_peaks_when_asked(tmp_path):
    model, opt, data = gpu_training.setup()
    gpu_training.train(model, opt, data, 1)
    torch.cuda.reset_peak_memory_stats()
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                               console_log_level="warning", memory_peak_per_step=True):
        gpu_training.train(model, opt, data, 2)
        # step 1 ends at step 2's first phase: this is step 1's high-water mark
        big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        del big
        gpu_training.train(model, opt, data, 2)
    run_dir = otlp_files.only_run_dir(tmp_path)
    peaks = [s["attrs"][semconv.ATTR_MEMORY_ALLOCATED_PEAK] for s in otlp_files.spans(run_dir)
             if s["name"] == semconv.SPAN_RANK_STEP]
    assert len(peaks) == 4
    assert peaks[0] < 4 << 30 <= peaks[1]  # since-start peaks would stay above 4 GiB
    assert max(peaks[2:]) < 4 << 30


class _Greedy(torch.nn.Module):
    def forward(self, x):
        return torch.empty(1 << 50, dtype=torch.uint8, device=x.device)  # a petabyte


def test_out_of_memory_becomes_an_error_span_and_log_then_propagates(tmp_path):
    model = _Greedy()
    x = torch.ones(1, device="cuda")
    with pytest.raises(torch.OutOfMemoryError):
        with otel_train.instrument(model, output_dir=tmp_path, console_log_level="warning"):
            model(x)
    run_dir = otlp_files.only_run_dir(tmp_path)
    forward = next(s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_FORWARD)
    assert forward["status"]["code"] == 2  # ERROR
    assert "out of memory" in forward["status"]["message"]
    assert forward["attrs"][semconv.ATTR_OOM_REQUESTED] >= 1 << 50
    assert "Allocated memory" in forward["attrs"][semconv.ATTR_OOM_SUMMARY]
    oom_logs = [r for r in otlp_files.logs(run_dir)
                if r.get("body", {}).get("stringValue") == semconv.LOG_OOM]
    assert len(oom_logs) == 1
    assert oom_logs[0]["spanId"] == forward["spanId"]
    assert "Allocated memory" in oom_logs[0]["attrs"]["allocator_summary"]
    assert int(_last(run_dir, semconv.METRIC_MEMORY_OOMS)) == 1
