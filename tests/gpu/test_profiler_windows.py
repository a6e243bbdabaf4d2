"""Profiler windows on a real GPU: the span, its trace, and overlap as HTA computes it.

A one-rank NCCL group: NCCL runs its one-rank kernel (no ``nccl...Kernel`` name, so no
communication for HTA's rules) on its stream while matrix products run on the default one.
The agreement with HTA is checked on the trace as it is and on the same trace with the
one-rank kernels named as NCCL's ring kernels are.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import gpu_training  # noqa: E402
from support import otlp_files  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.sources.gpu import kineto as gpu_trace  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def nccl_group():
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


def _train_with_comm(model, opt, data, steps, grads_bucket):
    for i in range(steps):
        x, y = data[i % len(data)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        work = dist.all_reduce(grads_bucket, op=dist.ReduceOp.AVG, async_op=True)
        model(x)  # computation while the all-reduce runs
        work.wait()
        opt.step()
        opt.zero_grad(set_to_none=True)


def test_window_span_overlap_agrees_with_hta(tmp_path, nccl_group):
    model, opt, data = gpu_training.setup()
    bucket = torch.randn(64 << 20, device="cuda", dtype=torch.bfloat16)
    _train_with_comm(model, opt, data, 2, bucket)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                               console_log_level="warning", profile_every=4, profile_steps=2,
                               shutdown_timeout_s=120):
        _train_with_comm(model, opt, data, 8, bucket)
    run_dir = otlp_files.only_run_dir(tmp_path)
    window = next(s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_PROFILE)
    attrs = window["attrs"]
    trace = Path(attrs[semconv.ATTR_PROFILE_TRACE])
    assert trace.is_file() and attrs[semconv.ATTR_PROFILE_STEPS] == 2
    ours = gpu_trace.analyse(gpu_trace.load_events(trace), steps=2)
    print("kernels:", [k["name"][:60] for k in ours["top_kernels"]],
          "comm kernels:", ours["comm_kernels"], "overlap:", ours["overlap"],
          "unrounded:", ours["overlap_unrounded"], "idle:", ours["gpu_idle"])
    assert attrs[semconv.ATTR_GPU_IDLE] == pytest.approx(ours["gpu_idle"])
    assert attrs[semconv.ATTR_TOP_KERNELS]
    hta = pytest.importorskip("hta.trace_analysis")

    def hta_pct(path: Path) -> float:
        folder = path.parent / f"hta-{path.stem}"
        folder.mkdir()
        (folder / path.name).symlink_to(path)
        frame = hta.TraceAnalysis(trace_dir=str(folder)).get_comm_comp_overlap(visualize=False)
        return float(frame["comp_comm_overlap_pctg"].iloc[0])

    if ours["comm_kernels"] == 0:  # one rank: NCCL runs its one-rank kernel, no nccl*Kernel
        assert semconv.ATTR_COMM_OVERLAP not in attrs
        assert math.isnan(hta_pct(trace))  # undefined for HTA too
    else:
        assert attrs[semconv.ATTR_COMM_OVERLAP] == pytest.approx(ours["overlap"])
        assert 100 * ours["overlap"] == pytest.approx(hta_pct(trace), abs=3.0)
    # the same real trace with NCCL's one-rank kernels named as its ring kernels are
    doc = json.loads(trace.read_text())
    assert gpu_trace.relabel_one_rank_kernels(doc) > 0
    relabelled = tmp_path / "relabelled.json"
    relabelled.write_text(json.dumps(doc))
    ours = gpu_trace.analyse(gpu_trace.load_events(relabelled), steps=2)
    theirs = hta_pct(relabelled)
    print("relabelled: ours", 100 * ours["overlap"], "HTA", theirs)
    # agreement, whatever the overlap of this one-GPU workload is (it varies between runs:
    # 0% and 62.6% on torch 2.11 / NCCL 2.28.9, both equal to HTA's); the comparison on real
    # ring kernels strictly between 5% and 95%, each rank its own window, is
    # bench/multigpu/hta_call.sh (bench/results/hta-h200x2/: 45.26% and 61.43%, both equal)
    assert 0 <= theirs <= 100
    assert 100 * ours["overlap"] == pytest.approx(theirs, abs=3.0)
