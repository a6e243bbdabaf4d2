"""The CUDA timing source's route to the driver's event calls (sources/gpu/cuda_timing.py,
``_fastpath.cuda_elapsed``), where no GPU is: the C call refuses to load a driver torch has
not loaded, and the source goes back to torch's calls for the run on any driver error or on
a first read unlike torch's. The driver's errors and a wrong read cannot be caused for real
here: the events and the driver below are stand-ins, and say so. The real reads, against
torch's on an H200: tests/gpu/test_cuda_timing.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_train import internal_errors
from otel_train.sources.gpu import cuda_timing

fastpath = pytest.importorskip("otel_train._fastpath")


def _libcuda_loaded() -> bool:
    return "libcuda.so" in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only")
def test_the_c_call_loads_no_driver_of_its_own():
    if _libcuda_loaded():
        pytest.skip("a CUDA driver is loaded in this process")
    with pytest.raises(RuntimeError, match="libcuda.so.1 is not loaded"):
        fastpath.cuda_elapsed(1, (2, 3), True)
    assert not _libcuda_loaded()


class StandInEvent:
    """A stand-in for a completed torch.cuda.Event at ``ms`` on the GPU's clock."""

    def __init__(self, ms: float, handle: int) -> None:
        self.ms, self.cuda_event = ms, handle

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: StandInEvent) -> float:
        return other.ms - self.ms


def _source(driver) -> cuda_timing.CudaTimingSource:
    source = cuda_timing.CudaTimingSource()
    source.clock = cuda_timing.GpuClock()
    source._driver = driver
    return source


def _entries(step: int) -> list[tuple]:
    ms = [0.0, 1.5, 2.0, 4.25]  # forward, backward: begin and end on the GPU
    events = [StandInEvent(m, 100 + i) for i, m in enumerate(ms)]
    return [(step, "forward", 1, events[0], events[1], 0, 1),
            (step, "backward", 2, events[2], events[3], 1, 2)]


def _driver_like_torch(base: int, handles: tuple[int, ...], query: bool):
    by_handle = {e.cuda_event: e for e in _entries(0)[0][3:5] + _entries(0)[1][3:5]}
    return tuple(by_handle[h].ms - by_handle[base].ms for h in handles)


def test_a_read_through_the_driver_gives_the_phases_times():
    source = _source(_driver_like_torch)
    source._pending[0] = _entries(0)
    assert source._ready(0)
    assert source._relative[0] == [(0.0, 1.5e6), (2.0e6, 4.25e6)]
    assert source._driver is not None and source._driver_checked


@pytest.mark.parametrize("fault", ["error", "unlike_torch"])
def test_a_driver_error_or_a_wrong_read_puts_the_run_back_on_torchs_calls(fault):
    def driver(base, handles, query):
        if fault == "error":
            raise RuntimeError("cuEventElapsedTime: CUDA error 201")
        return tuple(2.0 * t for t in _driver_like_torch(base, handles, query))

    before = internal_errors.snapshot().get("cuda_timing", 0)
    source = _source(driver)
    source._pending[0] = _entries(0)
    assert source._ready(0)  # read through torch's calls instead
    assert source._driver is None
    assert source._relative[0] == [(0.0, 1.5e6), (2.0e6, 4.25e6)]
    assert internal_errors.snapshot().get("cuda_timing", 0) == before + 1
