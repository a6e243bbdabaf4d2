"""The CUDA timing source's route to the driver's event calls (sources/gpu/cuda_timing.py,
``_fastpath.cuda_elapsed``), where no GPU is: the C call refuses to load a driver torch has
not loaded, and the source goes back to torch's calls for the run on any driver error or on
a first read unlike torch's. The driver's errors and a wrong read cannot be caused for real
here: the events and the driver below are stand-ins, and say so. The real reads, against
torch's on an H200: tests/gpu/test_cuda_timing.py."""

from __future__ import annotations

import re
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


# --- the no-sync rule for the driver route, where no GPU is ------------------------------
#: the driver calls the emitter may make: neither waits for the GPU (CUDA driver API:
#: cuEventQuery returns CUDA_ERROR_NOT_READY for unfinished work, cuEventElapsedTime too)
NON_SYNCHRONISING = {"cuEventQuery", "cuEventElapsedTime"}
_FASTPATH_C = Path(__file__).resolve().parents[2] / "otel_train" / "_fastpath.c"


def _driver_calls(source: str) -> set[str]:
    """Every CUDA driver symbol the C source names: resolved (``dlsym``) or written as an
    identifier (``cuXxx(``), and any library it opens besides libcuda."""
    named = set(re.findall(r'dlsym\([^,]+,\s*"(\w+)"\)', source))
    called = set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", source))
    opened = set(re.findall(r'dlopen\(\s*"([^"]+)"', source)) - {"libcuda.so.1"}
    return named | called | {f"dlopen:{lib}" for lib in opened}


def test_the_c_code_makes_no_synchronising_driver_call():
    """The emitter's event reads bypass the runtime calls a profiler trace shows (the GPU
    no-sync test counts those): the C source itself may name no driver call but the two
    that never wait."""
    source = _FASTPATH_C.read_text()
    assert _driver_calls(source) == NON_SYNCHRONISING


def test_the_driver_call_check_sees_a_planted_sync():
    """The check above proves itself: a synchronising driver call added to the source, by
    ``dlsym`` or by a direct call, or another library opened, makes it fail."""
    source = _FASTPATH_C.read_text()
    for planted in ('cu_sync = dlsym(lib, "cuEventSynchronize");',
                    "rc = cuCtxSynchronize();",
                    'void* rt = dlopen("libcudart.so.12", RTLD_LAZY);'):
        assert _driver_calls(source + "\n" + planted + "\n") != NON_SYNCHRONISING, planted
