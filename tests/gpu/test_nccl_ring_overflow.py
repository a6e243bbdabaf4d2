"""NCCL's flight recorder is a ring: entries it overwrites before otel-train reads them are
lost. A real overflow (a 64-entry ring, ~500 all-reduces a second, in a subprocess so
that the ring's size is read fresh): every collective issued is either measured or counted as
dropped (signal ``nccl_entries``), none of the overwritten ones is reported as a stall, and
the read interval shortens to the rate of collectives.

Run on the GPU machine: ``pytest tests/gpu/test_nccl_ring_overflow.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPO = Path(__file__).resolve().parents[2]
STEPS, PER_STEP = 40, 50

SCRIPT = r"""
import json, socket, sys, time
import torch, torch.distributed as dist
import otel_train

out, steps, per_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        device_id=torch.device("cuda:0"))
model = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(1024, device="cuda")
with otel_train.instrument(model, optimizer=opt, output_dir=out) as inst:
    ledger = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource").ledger
    for _ in range(steps):
        model(torch.randn(8, 256, device="cuda")).sum().backward()
        for _ in range(per_step):
            dist.all_reduce(x)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        time.sleep(0.1)  # ~500 collectives a second over ~4 s: several reads see the rate
    # the watchdog retires the last entries (their GPU times) before the final read
    from torch._C import _distributed_c10d as c10d
    deadline = time.monotonic() + 30
    while not all(e.get("retired") for e in json.loads(c10d._dump_nccl_trace_json(
            includeCollectives=True, onlyActive=False)).get("entries") or []):
        assert time.monotonic() < deadline, "the watchdog did not retire the last entries"
        time.sleep(0.05)
dist.destroy_process_group()
print(json.dumps({"interval_s": ledger.shortest_interval_s, "lost": ledger.lost,
                  "reads": ledger.reads, "read_s": ledger.read_s}))
"""


def test_an_overflowing_ring_is_counted_never_a_stall(tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    from support import otlp_files

    from otel_train import semconv

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(TORCH_FR_BUFFER_SIZE="64", TORCH_NCCL_TRACE_BUFFER_SIZE="64",
               TORCH_NCCL_ENABLE_TIMING="1", OTEL_TRAIN_EMIT_INTERVAL_MS="50",
               OTEL_TRAIN_NCCL_HARVEST_INTERVAL_S="5", OTEL_TRAIN_STALL_TIMEOUT_S="1",
               OTEL_TRAIN_NCCL_PLUGIN="0",  # the flight recorder's ring, not the plugin
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(STEPS),
                           str(PER_STEP)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    run_dir = otlp_files.only_run_dir(tmp_path)
    measured = 0
    for point in otlp_files.metric_points(run_dir, semconv.METRIC_COLLECTIVE_DURATION):
        if point["attrs"].get(semconv.ATTR_COLLECTIVE_OP) == "all_reduce":
            measured = max(measured, int(point.get("count", 0)))
    dropped = max((int(p.get("asInt", 0)) for p in otlp_files.metric_points(
        run_dir, semconv.METRIC_TELEMETRY_DROPPED)
        if p["attrs"].get(semconv.ATTR_SIGNAL) == semconv.SIGNAL_NCCL_ENTRIES), default=0)
    issued = STEPS * PER_STEP
    # the ring overflowed for real, and nothing vanished unaccounted
    assert dropped > 0 and dropped == result["lost"], (dropped, result)
    assert measured + dropped == issued, (measured, dropped, issued)
    # overwritten entries completed: none is a stall
    stalls = [r for r in otlp_files.logs(run_dir)
              if r["body"].get("stringValue") == semconv.LOG_COLLECTIVE_STALLED]
    assert stalls == []
    # the reads came faster than the configured 5 s: at ~500 a second into 64 entries, the
    # floor (0.25 s)
    assert result["interval_s"] == pytest.approx(0.25), result
    warned = [r for r in otlp_files.logs(run_dir)
              if r["body"].get("stringValue") == "otel_train.nccl_flight_recorder_overflow"]
    assert len(warned) == 1
