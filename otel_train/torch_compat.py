"""Every private torch API otel-train touches, in one place.

Private names move between torch releases. Each one otel-train needs is reached through a
function here that says why no public API does the job, and that degrades (None, an empty
result, a no-op) where the installed torch lacks it; callers then warn and go on without
that part of the telemetry. :data:`PROBES` lists them, and ``tests/sdk/test_torch_compat.py``
asserts each against the installed torch, so a release that moves one fails a test here
rather than a run in the field.

The supported torch range is :data:`MIN_TORCH` and later (``pyproject.toml`` and the README
say the same; a test keeps them in step).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

#: the oldest torch otel-train supports
MIN_TORCH = (2, 6)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch; (0, 0) if it cannot be read."""
    parts = torch.__version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return (0, 0)


# --- dynamo ----------------------------------------------------------------------------------

def dynamo_disable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` kept out of dynamo: a callback C++ calls while a compiled graph runs (a process
    group hook, a future's callback) would otherwise be a new frame to compile. Public as
    ``torch.compiler.disable`` only from 2.x without ``recursive``; this is the same call."""
    import torch._dynamo

    return torch._dynamo.disable(fn, recursive=True)


def dynamo_module() -> Any:
    """``torch._dynamo``: its ``reset()`` clears the compile callbacks (re-registered after)."""
    import torch._dynamo

    return torch._dynamo


def compile_callback_handler() -> Any | None:
    """Dynamo's compile start/end callbacks (no public API places a compilation in a step):
    ``torch._dynamo.callback.callback_handler``, None where missing."""
    import torch._dynamo

    handler = getattr(getattr(torch._dynamo, "callback", None), "callback_handler", None)
    return handler if hasattr(handler, "register_start_callback") else None


def dynamo_counters() -> Any:
    """``torch._dynamo.utils.counters``: graph breaks and graphs compiled (no public
    counter)."""
    from torch._dynamo.utils import counters

    return counters


def compilation_metrics() -> list[Any]:
    """Dynamo's last compilation records (``get_compilation_metrics``: times, reasons, graph
    breaks of each compilation; no public API). [] where missing."""
    from torch._dynamo import utils

    get = getattr(utils, "get_compilation_metrics", None)
    return list(get()) if get is not None else []


def compilation_metrics_kept() -> int | None:
    """How many compilation records dynamo keeps (its deque's length): a read that finds
    only new ones, that many, may have missed some. None where unknown."""
    from torch._dynamo import utils

    return getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)


def compilation_metrics_fields() -> set[str] | None:
    """The fields of ``CompilationMetrics`` in this torch (they change between releases);
    None where the class is missing."""
    import dataclasses

    try:
        from torch._dynamo.utils import CompilationMetrics
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(CompilationMetrics)}


def recompile_limit() -> int | None:
    """Dynamo's recompile limit (``recompile_limit``, ``cache_size_limit`` before 2.7): the
    recompiles a frame may make before dynamo falls back to eager. Config is per thread in
    recent torch: read it on the training thread."""
    from torch._dynamo import config

    for name in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def optimized_module_class() -> type | None:
    """The class of ``torch.compile(module)``'s wrapper (``OptimizedModule``), to find
    compiled parts of a model; None where missing."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:
        return None
    return OptimizedModule


#: the attribute of otel-train's forward wrapper that holds what ``model.compile()`` had
#: installed (None where the module was not compiled so)
WRAPPED_COMPILED_CALL = "_otel_train_compiled_call"


def compiled_call_impl(module: torch.nn.Module) -> Any | None:
    """What ``module.compile()`` installed (``_compiled_call_impl``), None where the module
    was not compiled so: forward hooks on such a module would run inside the compiled graph,
    so the step tracker wraps this instead. The step tracker's own wrapper is looked through
    (it holds what it wraps)."""
    fn = installed_call_impl(module)
    return getattr(fn, WRAPPED_COMPILED_CALL, fn)


def installed_call_impl(module: torch.nn.Module) -> Any | None:
    """The instance's ``_compiled_call_impl`` as it is, otel-train's wrapper included."""
    return module.__dict__.get("_compiled_call_impl")


def set_compiled_call_impl(module: torch.nn.Module, fn: Any) -> None:
    """Set the slot ``nn.Module.__call__`` (``_wrapped_call_impl``) calls instead of
    ``_call_impl`` when it is not None: the step tracker's forward timing, one Python frame a
    forward where module hooks would take ``_call_impl``'s slow path (no public API times a
    module's whole call)."""
    module._compiled_call_impl = fn


def calls_through_call_impl_slot(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` reaches ``_compiled_call_impl``: its class keeps
    ``nn.Module.__call__`` (``_wrapped_call_impl``, which reads the slot) or, like
    ``torch.compile``'s ``OptimizedModule``, calls it through ``super().__call__``."""
    call = type(module).__call__
    optimized = optimized_module_class()
    return (call is torch.nn.Module.__call__
            or (optimized is not None and isinstance(module, optimized)
                and call is optimized.__call__)) and _call_reads_slot()


def call_impl(module: torch.nn.Module) -> Any:
    """The module's own ``_call_impl`` (forward with its hooks): what the step tracker's
    forward timing calls for a module not compiled by ``module.compile()``."""
    return module._call_impl


@functools.cache
def _call_reads_slot() -> bool:
    try:
        return ("_compiled_call_impl" in _source(torch.nn.Module._wrapped_call_impl)
                and callable(getattr(torch.nn.Module, "_call_impl", None)))
    except (OSError, TypeError, AttributeError):  # no source shipped: hooks instead
        return False


# --- torch.distributed -----------------------------------------------------------------------

def default_group() -> Any:
    """The default process group object (``group=None`` in a call means it); public
    ``dist.group.WORLD`` is a sentinel in some releases, not the group."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group()


def process_groups() -> list[Any]:
    """Every process group that exists now (to hook each, or find NCCL ones): no public
    list of groups."""
    import torch.distributed as dist

    world = getattr(dist.distributed_c10d, "_world", None)
    return list(getattr(world, "pg_map", {}) or {})


def default_store() -> Any | None:
    """The default process group's store (``_get_default_store``: no public accessor), for
    the compile fingerprints' exchange between ranks; None where it cannot be had."""
    try:
        return _c10d()._get_default_store()
    except Exception:
        return None


def object_collective_device() -> str | None:
    """Where the default group's object collectives put their tensors
    (``_get_object_coll_device``: the rule ``broadcast_object_list`` follows; no public
    API); None where missing."""
    pick = getattr(_c10d(), "_get_object_coll_device", None)
    return str(pick()) if pick is not None else None


def ddp_comm_hook_registered(module: Any) -> bool:
    """Whether a DDP module has a comm hook already, Python (``_comm_hooks``) or built in
    (``_get_ddp_logging_data()["comm_hook"]``): no public API says so, and a second
    ``register_comm_hook`` raises."""
    if getattr(module, "_comm_hooks", None):
        return True
    try:
        return bool(module._get_ddp_logging_data().get("comm_hook"))
    except Exception:
        return False


def nccl_trace_dumps() -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """The NCCL flight recorder's dumps (pickle, JSON): the only way to read what NCCL
    collectives ran and how long they took on the GPU without a plugin. (None, None) where
    torch was built without them."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None, None
    return getattr(c10d, "_dump_nccl_trace", None), getattr(c10d, "_dump_nccl_trace_json", None)


# --- data ------------------------------------------------------------------------------------

def dataloader_iter_class() -> type:
    """The base of every DataLoader iterator: its ``__next__`` is the one place every batch
    passes (the multi-process iterator overrides only ``_next_data``)."""
    from torch.utils.data import dataloader

    return dataloader._BaseDataLoaderIter


def waited_worker(it: Any) -> int | None:
    """The DataLoader worker a multi-process iterator waits for: the one its next batch in
    order was sent to (``_task_info[_rcvd_idx]`` holds ``(worker id,)`` until the batch
    arrives). None for single-process iterators and unknown layouts."""
    try:
        info = it._task_info.get(it._rcvd_idx)
    except Exception:
        return None
    if isinstance(info, tuple) and len(info) == 1 and isinstance(info[0], int):
        return info[0]
    return None


# --- CUDA caching allocator ------------------------------------------------------------------

def cuda_memory_stats(device: int) -> dict[str, Any]:
    """The allocator's statistics in one C call (``torch.cuda.memory_stats`` flattens them
    in Python: ~10x dearer, on the training thread at every step end)."""
    return torch._C._cuda_memoryStats(device)


def reset_peak_memory_stats(device: int) -> None:
    """Peaks per step (``torch.cuda.reset_peak_memory_stats`` without its Python)."""
    torch._C._cuda_resetPeakMemoryStats(device)


def event_recorder() -> Callable[[Any], None]:
    """``record(event)``: what ``event.record()`` does (the event marked on the current
    stream of the current device), without ``torch.cuda.current_stream()``'s Python: that
    builds a new ``Stream`` object at every call and finds the device through three more
    frames, about three times this way's cost on the training thread, which records several
    events a step (docs/gpu.md, bench/bench_cuda_hooks.py). The streams are kept by what
    ``_cuda_getCurrentStream`` returns (stream id, device index, device type: a stream's id
    names it for its life). Falls back to ``event.record()`` where those bindings moved."""
    try:
        get_device, get_stream = torch._C._cuda_getDevice, torch._C._cuda_getCurrentStream
        record = torch._C._CudaEventBase.record
    except AttributeError:
        return _record_default
    streams: dict[Any, Any] = {}

    def record_on_current(event: Any) -> None:
        key = get_stream(get_device())
        stream = streams.get(key)
        if stream is None:
            if len(streams) >= 64:  # streams made and dropped by the dozen: keep few
                streams.clear()
            stream = streams[key] = torch.cuda.Stream(
                stream_id=key[0], device_index=key[1], device_type=key[2])
        record(event, stream)

    return record_on_current


def _record_default(event: Any) -> None:
    event.record()


def stream_capturing() -> Callable[[], bool]:
    """Whether the current stream is being captured into a CUDA graph, as
    ``torch.cuda.is_current_stream_capturing`` (its C binding, a frame less)."""
    return getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                   torch.cuda.is_current_stream_capturing)


def attach_oom_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """An allocator observer called before an out-of-memory error is raised (no public
    API): the OOM becomes an error span and log with the allocator's state."""
    torch._C._cuda_attach_out_of_memory_observer(observer)


def _c10d() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d


def _ddp_hook_state() -> bool:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return (hasattr(DDP, "_get_ddp_logging_data")
            and "_comm_hooks" in _source(DDP.register_comm_hook))


#: name -> (why, whether the installed torch has it): tests/sdk/test_torch_compat.py asserts each
PROBES: dict[str, tuple[str, Callable[[], bool]]] = {
    "dynamo_disable": ("keep C++ callbacks out of dynamo",
                       lambda: callable(getattr(dynamo_module(), "disable", None))),
    "dynamo_reset": ("re-register compile callbacks after reset()",
                     lambda: callable(getattr(dynamo_module(), "reset", None))),
    "compile_callback_handler": ("compilations placed in steps",
                                 lambda: compile_callback_handler() is not None),
    "dynamo_counters": ("graph breaks and graphs",
                        lambda: hasattr(dynamo_counters(), "__getitem__")),
    "compilation_metrics": ("compile times and reasons",
                            lambda: isinstance(compilation_metrics(), list)
                            and compilation_metrics_fields() is not None),
    "compilation_metrics_kept": ("missed compile records noticed",
                                 lambda: compilation_metrics_kept() is not None),
    "recompile_limit": ("recompile-limit fallbacks named", lambda: recompile_limit() is not None),
    "optimized_module_class": ("compiled parts of a model",
                               lambda: optimized_module_class() is not None),
    "compiled_call_impl": ("model.compile() timed outside the graph",
                           lambda: "_compiled_call_impl" in _source(torch.nn.Module.compile)),
    "call_impl_slot": ("forward timed in one frame, without module hooks", _call_reads_slot),
    "default_group": ("group=None resolved", lambda: hasattr(_c10d(), "_get_default_group")),
    "process_groups": ("every process group hooked or read",
                       lambda: hasattr(getattr(_c10d(), "_world", None), "pg_map")),
    "default_store": ("compile fingerprints compared across ranks",
                      lambda: hasattr(_c10d(), "_get_default_store")),
    "object_collective_device": ("the run id broadcast on the default group's device",
                                 lambda: hasattr(_c10d(), "_get_object_coll_device")),
    "ddp_comm_hook_registered": ("a DDP module's own comm hook kept", _ddp_hook_state),
    "nccl_trace_dumps": ("NCCL collectives from the flight recorder",
                         lambda: any(f is not None for f in nccl_trace_dumps())),
    "dataloader_iter_class": ("data waits timed",
                              lambda: callable(dataloader_iter_class().__next__)),
    "waited_worker": ("the DataLoader worker a data wait waits for",
                      lambda: all(n in _multiprocess_iter_reset() for n in
                                  ("_task_info", "_rcvd_idx"))),
    "cuda_memory_stats": ("memory per step", lambda: hasattr(torch._C, "_cuda_memoryStats")),
    "reset_peak_memory_stats": ("peaks per step",
                                lambda: hasattr(torch._C, "_cuda_resetPeakMemoryStats")),
    "event_recorder": ("phase timing events recorded without building a Stream",
                       lambda: event_recorder() is not _record_default),
    "attach_oom_observer": ("out of memory as a span",
                            lambda: hasattr(torch._C, "_cuda_attach_out_of_memory_observer")),
}
#: probes that only a CUDA build of torch has
CUDA_ONLY = frozenset({"cuda_memory_stats", "reset_peak_memory_stats", "attach_oom_observer",
                       "nccl_trace_dumps", "event_recorder"})


def _source(fn: Any) -> str:
    import inspect

    return inspect.getsource(fn)


def _multiprocess_iter_reset() -> str:
    """The source of the multi-process DataLoader iterator's reset, where ``_task_info`` and
    ``_rcvd_idx`` are set (read as text: making one needs worker processes)."""
    from torch.utils.data import dataloader

    return _source(dataloader._MultiProcessingDataLoaderIter._reset)
