"""The profiler source's trace analysis: overlap as HolisticTraceAnalysis defines it.

The agreement proof on a real GPU trace is in ``bench/bench_gpu.py`` and
``tests/gpu/test_profiler_windows.py``; here the same arithmetic runs on traces with known
answers, and against HTA itself on a trace in Kineto's format.
"""

from __future__ import annotations

import json
import random

import pytest
from support.binaries import binaries_required

from otel_train.sources.gpu import kineto as gpu_trace


def _kernel(name, ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": {"device": 0, "stream": stream, "correlation": 1}}


def _cpu_op(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": 1}}


NCCL = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"


def test_kernels_are_classified_as_hta_does():
    assert gpu_trace.kernel_type(NCCL) == gpu_trace.COMM
    assert gpu_trace.kernel_type(GEMM) == gpu_trace.COMPUTE
    assert gpu_trace.kernel_type("Memcpy DtoD (Device -> Device)") == gpu_trace.MEMORY
    assert gpu_trace.kernel_type("Memset (Device)") == gpu_trace.MEMORY
    assert gpu_trace.kernel_type("cudaStreamSync") == gpu_trace.OTHER


def test_overlap_exposed_comm_and_idle_of_a_known_trace():
    events = [
        _kernel(NCCL, 0, 100, 20), _kernel(NCCL, 300, 100, 20),  # 200 µs of communication
        _kernel(GEMM, 50, 100, 7), _kernel(GEMM, 120, 60, 7),  # merged 50-180: 50 overlapped
        _kernel(GEMM, 350, 20, 7),  # 20 overlapped
        _cpu_op("aten::mm", 0, 1000),  # host side: not a GPU event
    ]
    result = gpu_trace.analyse(events, steps=2)
    assert result["overlap"] == pytest.approx(70 / 200)
    assert result["exposed_comm_s"] == pytest.approx(130e-6)
    assert result["exposed_comm_per_step_s"] == pytest.approx(65e-6)
    # busy: 0-180 and 300-400 over the window 0-400
    assert result["gpu_idle"] == pytest.approx(1 - 280 / 400)
    assert result["top_kernels"][0]["name"] == NCCL
    assert result["comm_kernels"] == 2


def test_no_communication_means_no_overlap_figure():
    result = gpu_trace.analyse([_kernel(GEMM, 0, 10, 7)])
    assert result["overlap"] is None and result["exposed_comm_s"] == 0.0


def _random_trace(seed: int) -> list[dict]:
    rng = random.Random(seed)
    events, t = [], 1_000_000.0
    for _ in range(400):
        t += rng.uniform(0, 40)
        stream = rng.choice([7, 7, 7, 20, 24])
        if stream == 7:
            name = rng.choice([GEMM, "triton_poi_fused_add_0", "Memcpy DtoD (Device -> Device)"])
        else:
            name = rng.choice([NCCL, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)"])
        events.append(_kernel(name, round(t, 3), round(rng.uniform(1, 120), 3), stream))
        events.append(_cpu_op("aten::mm", round(t - 5, 3), 3.0))
    return events


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlap_agrees_with_holistic_trace_analysis(tmp_path, seed):
    if not binaries_required():  # CI installs HTA (scripts/setup.sh): there it must be here
        pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    events = _random_trace(seed)
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0,
                                                    "world_size": 1},
           "traceEvents": events}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    hta = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    ours = gpu_trace.analyse(gpu_trace.load_events(tmp_path / "rank0.json"))
    # HTA reports the percentage rounded to two decimals
    hta_pct = float(hta["comp_comm_overlap_pctg"].iloc[0])
    assert 0 < hta_pct < 100
    assert 100 * ours["overlap"] == pytest.approx(hta_pct, abs=0.005 + 1e-9)
