"""otel-train's NCCL profiler plugin under real NCCL: every collective NCCL ran is one
record, the same count as torch's flight recorder saw, each a span with GPU-clock timing
(on two or more GPUs, where NCCL runs kernels with channels), and nothing is lost.

Two ways the plugin gets named: by the launcher (``NCCL_PROFILER_PLUGIN=$(otel-train
nccl-plugin)``) before the process group exists, as docs/collectives.md says, with the process
group created eagerly (``device_id``), which is what makes that necessary; and by
``instrument()`` itself (``nccl_plugin="auto"``, the default) when the process group is
created lazily and no NCCL operation ran before it. Run on the GPU machine:
``pytest tests/gpu/test_nccl_profiler_plugin.py``.
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
STEPS, EXTRA = 6, 5

SCRIPT = r"""
import json, os, pickle, sys, time
import torch, torch.distributed as dist
import otel_train

out, steps, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
lazy = os.environ.get("LAZY") == "1"  # no NCCL operation before instrument()
if lazy:
    dist.init_process_group("nccl")
    model = torch.nn.Linear(512, 512).cuda()  # gradients all-reduced by hand below
else:
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(1 << 20, device="cuda")
from torch._C import _distributed_c10d as c10d
def fr_entries():
    doc = pickle.loads(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False,
                                             onlyActive=False))
    return doc.get("entries") or []
def fr_ids():
    return {e["record_id"] for e in fr_entries()}
if not lazy:
    dist.barrier()
torch.cuda.synchronize()
before = fr_ids()
with otel_train.instrument(model, optimizer=opt, output_dir=out) as inst:
    source = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource")
    for _ in range(steps):
        model(torch.randn(64, model.weight.shape[1] if lazy else 1024,
                          device="cuda")).square().mean().backward()
        if lazy:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        for _ in range(extra):
            dist.all_reduce(x)
    torch.cuda.synchronize()
    if int(os.environ["WORLD_SIZE"]) == 1:  # the flight recorder's source: an operation is
        deadline = time.monotonic() + 10    # read once its watchdog retired it (GPU time)
        while time.monotonic() < deadline and not all(e.get("retired", True)
                                                      for e in fr_entries()):
            time.sleep(0.05)
issued = len(fr_ids() - before)
ledger = source.ledger
print(json.dumps({"rank": rank, "mechanisms": source.mechanisms, "issued": issued,
                  "lost": ledger.lost, "errors": ledger.errors,
                  "plugin": None if ledger.plugin is None else "loaded",
                  "totals": ledger.plugin.totals() if ledger.plugin else None}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("named_by", ["launcher", "instrument"])
def test_every_nccl_collective_is_one_plugin_record_and_span(tmp_path, named_by):
    sys.path.insert(0, str(REPO / "tests"))
    from support import otlp_files

    from otel_train import nccl, semconv

    world = min(2, torch.cuda.device_count())
    env = {**os.environ, "TORCH_NCCL_ENABLE_TIMING": "1", "OTEL_TRAIN_EMIT_INTERVAL_MS": "50",
           "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop("OTEL_TRAIN_NCCL_PLUGIN", None)  # the default: auto
    if named_by == "launcher":
        env[nccl.ENV_NCCL] = str(nccl.plugin_path())
    else:
        env.pop(nccl.ENV_NCCL, None)
        env["LAZY"] = "1"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(script), str(tmp_path / "out"), str(STEPS),
         str(EXTRA)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == world
    if world == 1:
        _one_rank(tmp_path / "out", results[0], named_by)
        return
    for res in results:
        assert "nccl_profiler_plugin" in res["mechanisms"], res
        assert res["lost"] == 0 and res["errors"] == 0, res
        assert res["totals"]["overwritten"] == 0 and res["totals"]["unrecorded"] == 0, res
        # auto (the default): CUDA events on one node (every communicator within it)
        assert res["totals"]["timing"] == os.environ.get("OTEL_TRAIN_NCCL_TIMING", "events")
        if world > 1:  # every kernel launch timed by its CUDA events
            assert res["totals"]["untimed"] == 0, res
    spans = [s for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path / "out"))
             if s["name"] == semconv.SPAN_COLLECTIVE]
    for res in results:
        mine = [s for s in spans if s["attrs"][semconv.ATTR_RANK] == res["rank"]]
        # exact: what NCCL ran inside instrument() (the flight recorder's count) is what
        # the duration histogram counted, and what became spans (every step is sampled by
        # default) but the last loop's extra all-reduces, which ran after the last step
        last = {}  # cumulative points: the last export of each series
        for p in otlp_files.metric_points(otlp_files.only_run_dir(tmp_path / "out"),
                                          semconv.METRIC_COLLECTIVE_DURATION):
            if (p["attrs"].get(semconv.ATTR_RANK) == res["rank"]
                    and p["attrs"].get(semconv.ATTR_COLLECTIVE_BACKEND) == "nccl"):
                last[tuple(sorted(p["attrs"].items()))] = int(p["count"])
        counted = sum(last.values())
        assert counted == res["issued"] >= STEPS * (EXTRA + 1), (counted, res)
        assert len(mine) == res["issued"] - EXTRA, (len(mine), res)
        assert {s["attrs"][semconv.ATTR_COLLECTIVE_SOURCE] for s in mine} == {"nccl_profiler"}
        big = [s for s in mine if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] == 4 << 20]
        assert len(big) == (STEPS - 1) * EXTRA
        assert all(s["attrs"][semconv.ATTR_COLLECTIVE_OP] == "all_reduce" for s in big)
        if world > 1:  # kernels with channels: GPU-clock timing on every collective
            assert all(s["attrs"].get(semconv.ATTR_COLLECTIVE_GPU_DURATION, 0) > 0
                       for s in mine)


def _one_rank(out, res, named_by):
    """One GPU: NCCL makes the plugin's context for a one-rank communicator and then runs its
    operations without calling the plugin (call 30: every collective was lost). ``auto``
    leaves NCCL to the flight recorder from the start; a plugin the launcher named is given
    up for the flight recorder once it has seen no operation start (here at the flush: the
    run is shorter than the once-a-second check, so what it reads then ran after the last
    step emitted: points, no spans). The script waits for the flight recorder's watchdog to
    retire every operation before the flush, as test_nccl_flight_recorder does: then every
    collective is counted."""
    sys.path.insert(0, str(REPO / "tests"))
    from support import otlp_files

    from otel_train import semconv

    assert res["plugin"] is None and res["errors"] == 0, res  # the flight recorder it is
    run_dir = otlp_files.only_run_dir(out)
    last = {}
    for p in otlp_files.metric_points(run_dir, semconv.METRIC_COLLECTIVE_DURATION):
        if p["attrs"].get(semconv.ATTR_COLLECTIVE_BACKEND) == "nccl":
            last[tuple(sorted(p["attrs"].items()))] = int(p["count"])
    assert sum(last.values()) == res["issued"] >= STEPS * (EXTRA + 1), (last, res)
    spans = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_COLLECTIVE]
    assert {s["attrs"][semconv.ATTR_COLLECTIVE_SOURCE] for s in spans} <= {
        "nccl_flight_recorder"}
    if named_by == "instrument":  # auto declined: the flight recorder from the start
        assert "nccl_flight_recorder" in res["mechanisms"], res
        assert "nccl_profiler_plugin" not in res["mechanisms"], res
        assert spans
