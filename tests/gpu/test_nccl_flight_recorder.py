"""NCCL on one GPU: collective spans from the flight recorder, with GPU durations.

Run on the GPU machine: ``pytest tests/gpu/test_nccl_flight_recorder.py``. The flight
recorder's variables are set before the process group exists, as the docs require.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch

import otel_train
from otel_train import semconv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPO = Path(__file__).resolve().parents[2]


def _all_retired() -> bool:
    import json

    from torch._C import _distributed_c10d as c10d

    doc = json.loads(c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False))
    return all(e.get("retired") for e in doc.get("entries") or [])


def _one_rank_nccl_group() -> None:
    """The NCCL process group of this one process on cuda:0, bound eagerly (``device_id``),
    on a free local port: the flight recorder's variables must be set before it."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda:0"))


def test_nccl_collectives_come_from_the_flight_recorder_with_gpu_durations(tmp_path,
                                                                          monkeypatch):
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    import torch.distributed as dist
    from support import otlp_files

    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    monkeypatch.setenv("OTEL_TRAIN_EMIT_INTERVAL_MS", "50")
    monkeypatch.setenv("OTEL_TRAIN_NCCL_PLUGIN", "0")  # the flight recorder, not the plugin
    monkeypatch.setenv("OTEL_TRAIN_NCCL_HARVEST_INTERVAL_S", "1")
    _one_rank_nccl_group()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path) as inst:
            for _ in range(4):
                loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                extra = torch.ones(1 << 20, device="cuda")
                dist.all_reduce(extra)
            torch.cuda.synchronize()  # the test's own wait, outside any instrumented step
            deadline = time.monotonic() + 10
            while not _all_retired() and time.monotonic() < deadline:
                time.sleep(0.05)  # the watchdog computes GPU durations when it retires
            source = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource")
            assert "nccl_flight_recorder" in source.mechanisms
            while source.ledger.pending and time.monotonic() < deadline:
                time.sleep(0.05)  # poll: the emitter harvests on its own schedule
    finally:
        dist.destroy_process_group()
    spans = [s for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path))
             if s["name"] == semconv.SPAN_COLLECTIVE]
    assert spans
    assert {s["attrs"][semconv.ATTR_COLLECTIVE_SOURCE] for s in spans} == {"nccl_flight_recorder"}
    assert {s["attrs"][semconv.ATTR_COLLECTIVE_BACKEND] for s in spans} == {"nccl"}
    big = [s for s in spans if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] == 4 << 20]
    assert big and all(s["attrs"][semconv.ATTR_COLLECTIVE_OP] == "all_reduce" for s in big)
    assert all(s["attrs"].get(semconv.ATTR_COLLECTIVE_GPU_DURATION, 0) > 0 for s in big)
    assert os.environ.get("TORCH_NCCL_ENABLE_TIMING") == "1"


def test_steps_held_for_the_flight_recorder_leave_at_the_first_read_after_them(tmp_path,
                                                                               monkeypatch):
    """A step waits for the first flight-recorder read that began after it ended, and then
    goes, with every step that ended before that read: reads every second, twelve steps out
    within a few seconds (the gate once let one held step go per read, so twelve steps took
    twelve reads, and a run's last steps waited the final second)."""
    import torch.distributed as dist

    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    monkeypatch.setenv("OTEL_TRAIN_NCCL_PLUGIN", "0")
    monkeypatch.setenv("OTEL_TRAIN_NCCL_HARVEST_INTERVAL_S", "1")
    _one_rank_nccl_group()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path) as inst:
            source = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource")
            assert "nccl_flight_recorder" in source.mechanisms
            for _ in range(13):  # the 13th begins, so the 12th ends
                model(torch.randn(32, 256, device="cuda")).square().mean().backward()
                opt.step()
                opt.zero_grad()
            model(torch.randn(32, 256, device="cuda")).sum()
            torch.cuda.synchronize()
            reads_before = source.ledger.reads
            deadline = time.monotonic() + 4.5  # four reads at most
            while inst.emitter.steps_emitted < 12 and time.monotonic() < deadline:
                time.sleep(0.05)  # poll: the emitter reads on its own schedule
            emitted, reads = inst.emitter.steps_emitted, source.ledger.reads - reads_before
    finally:
        dist.destroy_process_group()
    assert emitted >= 12, f"{emitted} of 12 steps out after {reads} reads"
