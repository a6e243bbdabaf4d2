"""The no-sync rule on a real GPU: instrumentation adds no host-device synchronisation.

Two checks, because ``set_sync_debug_mode`` sees blocking copies and stream syncs but not
``Event.synchronize()`` or ``torch.cuda.synchronize()``: (1) instrumented steps under
``set_sync_debug_mode("error")``; (2) the CUDA runtime's synchronising calls, from every
thread, counted in a profiler trace of bare and of instrumented steps: equal counts. The
emitter's event reads go to the CUDA driver directly (``_fastpath.c``), below the runtime
calls a trace shows: which driver calls that code can make at all is checked where no GPU is
needed (tests/sdk/test_cuda_driver_route.py).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from support.waits import emitter_passes

sys.path.insert(0, str(Path(__file__).parent))
import gpu_training  # noqa: E402

import otel_train  # noqa: E402
from otel_train import internal_errors  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
SETTINGS = {"console_log_level": "warning", "emit_interval_s": 0.01, "memory_peak_per_step": True}


def _errors_under_sync_error_mode(tmp_path: Path) -> dict[str, int]:
    """Instrumented steps under ``set_sync_debug_mode("error")``: the internal errors they
    counted. A sync in a hook raises there, and the hook swallows it to protect training, so
    the count is what shows it."""
    model, opt, data = gpu_training.setup()
    gpu_training.train(model, opt, data, 2)
    torch.cuda.synchronize()
    before = internal_errors.snapshot()
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, **SETTINGS) as inst:
        torch.cuda.set_sync_debug_mode("error")
        try:
            gpu_training.train(model, opt, data, 8)
            emitter_passes(inst, 2)  # the emitter resolves the events, under the same mode
        finally:
            torch.cuda.set_sync_debug_mode(0)
    after = internal_errors.snapshot()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_instrumented_steps_pass_sync_debug_mode_error(tmp_path):
    assert _errors_under_sync_error_mode(tmp_path) == {}


def test_a_sync_planted_in_a_hook_is_caught(tmp_path, monkeypatch):
    """The check above proves itself: an ``.item()`` planted in the CUDA-timing hook (the
    training thread's, at every phase boundary) must show up as counted errors."""
    from otel_train.sources.gpu import cuda_timing

    original = cuda_timing.EventPool.take

    def take_with_a_sync(self):
        torch.ones(1, device="cuda").sum().item()  # the planted host-device sync
        return original(self)

    monkeypatch.setattr(cuda_timing.EventPool, "take", take_with_a_sync)
    assert _errors_under_sync_error_mode(tmp_path).get("cuda_timing", 0) > 0


def _sync_calls(trace: Path) -> Counter[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return Counter(e["name"] for e in events
                   if e.get("cat") == "cuda_runtime" and e.get("name") in SYNC_CALLS)


def _profiled(model, opt, data, path: Path, inst=None) -> Counter[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        gpu_training.train(model, opt, data, 8)
        if inst is not None:  # the emitter pumps (resolves events, reads stats) in the trace
            emitter_passes(inst, 2)
    prof.export_chrome_trace(str(path))
    return _sync_calls(path)


def test_sync_calls_in_a_profiler_trace_are_the_same_bare_and_instrumented(tmp_path):
    model, opt, data = gpu_training.setup()
    gpu_training.train(model, opt, data, 3)
    torch.cuda.synchronize()
    bare = _profiled(model, opt, data, tmp_path / "bare.json")
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path / "runs",
                               **SETTINGS) as inst:
        gpu_training.train(model, opt, data, 3)
        instrumented = _profiled(model, opt, data, tmp_path / "instrumented.json", inst)
        source = next(s for s in inst._sources if type(s).__name__ == "CudaTimingSource")
    print("sync calls: bare", dict(bare), "instrumented", dict(instrumented))
    assert instrumented == bare
    runtime = Counter(e["name"] for e in json.loads(
        (tmp_path / "instrumented.json").read_text())["traceEvents"]
        if e.get("cat") == "cuda_runtime")
    # it did run: timing events recorded on the training thread, read by the emitter. The
    # emitter reads them through the driver (cuEventQuery, cuEventElapsedTime: _fastpath.c),
    # which the trace's runtime calls do not show; that C code resolves no synchronising
    # driver call (tests/sdk/test_cuda_driver_route.py holds it to that list). Where the
    # driver route is off, torch's cudaEventQuery shows in the trace instead.
    assert sum(n for name, n in runtime.items() if name.startswith("cudaEventRecord")) > 0
    if source._driver is not None:
        assert source._driver_checked, "the emitter read no step's events through the driver"
    else:
        assert runtime["cudaEventQuery"] > 0
