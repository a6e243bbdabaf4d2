"""Torch's own compilation records, read incrementally on the emitter thread.

``torch._dynamo.utils.get_compilation_metrics()`` returns the last 64 ``CompilationMetrics``
(a deque in torch): one per frame compilation (``is_forward``), one per lazy backward
compilation (``is_forward=False``) and, on GPUs, runtime records (``is_runtime``: cudagraph
recording, runtime autotuning). Records are new when their object was not seen before; the
seen ones are remembered by identity (with a reference, so an id cannot be reused).
Every field is read with ``getattr``: a field a torch version lacks reads as None, and the
source warns once listing what is missing.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

from otel_train import torch_compat

#: CompilationMetrics fields read here (verified against torch 2.15's torch/_dynamo/utils.py)
FIELDS = (
    "compile_id", "co_name", "co_filename", "co_firstlineno", "cache_size", "guard_count",
    "graph_op_count", "graph_node_shapes", "start_time_us", "duration_us", "fail_type",
    "fail_reason", "restart_reasons", "has_guarded_code", "is_forward", "is_runtime",
    "recompile_reason", "cudagraph_skip_reason", "dynamo_cumulative_compile_time_us",
    "aot_autograd_cumulative_compile_time_us", "inductor_cumulative_compile_time_us",
    "compile_time_autotune_time_us", "backward_cumulative_compile_time_us",
    "inductor_fx_local_cache_hit_count", "inductor_fx_local_cache_miss_count",
    "inductor_fx_remote_cache_hit_count", "inductor_fx_remote_cache_miss_count",
    "aotautograd_local_cache_hit_count", "aotautograd_local_cache_miss_count",
    "aotautograd_remote_cache_hit_count", "aotautograd_remote_cache_miss_count",
)
#: span attribute suffix -> CompilationMetrics field, microseconds
TIME_FIELDS = {
    "dynamo_s": "dynamo_cumulative_compile_time_us",
    "aot_autograd_s": "aot_autograd_cumulative_compile_time_us",
    "inductor_s": "inductor_cumulative_compile_time_us",
    "autotune_s": "compile_time_autotune_time_us",
    "backward_s": "backward_cumulative_compile_time_us",
}
#: span attribute suffix -> the CompilationMetrics fields summed into it
CACHE_FIELDS = {
    "fx_graph.hits": ("inductor_fx_local_cache_hit_count", "inductor_fx_remote_cache_hit_count"),
    "fx_graph.misses": ("inductor_fx_local_cache_miss_count",
                        "inductor_fx_remote_cache_miss_count"),
    "aot_autograd.hits": ("aotautograd_local_cache_hit_count",
                          "aotautograd_remote_cache_hit_count"),
    "aot_autograd.misses": ("aotautograd_local_cache_miss_count",
                            "aotautograd_remote_cache_miss_count"),
}
FORWARD, BACKWARD, RUNTIME = "forward", "backward", "runtime"
_COMPILE_ID = re.compile(r"(\d+)/(\d+)")
_LIMIT_HIT = re.compile(r"recompile limit exceeded|cache_size_limit|recompile_limit",
                        re.IGNORECASE)


@dataclasses.dataclass
class CompileRecord:
    """What one CompilationMetrics says, in the names the spans use."""

    compile_id: str | None
    kind: str
    frame_id: int | None
    frame_compile: int | None  # 0 for a frame's first compilation
    co_name: str | None
    filename: str | None
    line: int | None
    frame: str | None
    start_ns: int | None  # epoch
    duration_ns: int | None
    guard_failure: str | None
    fail_type: str | None
    fail_reason: str | None
    graph_ops: int | None
    guards: int | None
    shapes: str | None
    has_guarded_code: bool
    restart_reasons: list[str]
    cudagraph_skip_reason: str | None
    times: dict[str, float]
    cache: dict[str, int]

    @property
    def recompile_limit_hit(self) -> bool:
        return bool(self.fail_reason) and bool(_LIMIT_HIT.search(self.fail_reason or ""))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def parse(rec: Any) -> CompileRecord:
    get = lambda name: getattr(rec, name, None)  # noqa: E731
    compile_id = str(get("compile_id")) if get("compile_id") is not None else None
    match = _COMPILE_ID.search(compile_id or "")
    if get("is_runtime"):
        kind = RUNTIME
    elif get("is_forward") is False or get("backward_cumulative_compile_time_us") is not None:
        kind = BACKWARD
    else:
        kind = FORWARD
    co_name, filename, line = get("co_name"), get("co_filename"), get("co_firstlineno")
    frame = f"{co_name} ({filename}:{line})" if co_name else None
    start_us, duration_us = _int(get("start_time_us")), _int(get("duration_us"))
    times = {key: us / 1e6 for key, field in TIME_FIELDS.items()
             if (us := _int(get(field))) is not None}
    cache = {key: sum(_int(get(f)) or 0 for f in fields) for key, fields in CACHE_FIELDS.items()}
    restarts = get("restart_reasons")
    return CompileRecord(
        compile_id=compile_id, kind=kind,
        frame_id=int(match.group(1)) if match else None,
        frame_compile=int(match.group(2)) if match else None,
        co_name=co_name, filename=filename, line=_int(line), frame=frame,
        start_ns=start_us * 1000 if start_us is not None else None,
        duration_ns=duration_us * 1000 if duration_us is not None else None,
        guard_failure=get("recompile_reason"), fail_type=get("fail_type"),
        fail_reason=get("fail_reason"), graph_ops=_int(get("graph_op_count")),
        guards=_int(get("guard_count")), shapes=get("graph_node_shapes"),
        has_guarded_code=bool(get("has_guarded_code")),
        restart_reasons=sorted(str(r) for r in restarts) if restarts else [],
        cudagraph_skip_reason=get("cudagraph_skip_reason"), times=times, cache=cache,
    )


def missing_fields() -> list[str]:
    """Fields of FIELDS this torch's CompilationMetrics lacks ([] when it has them all)."""
    names = torch_compat.compilation_metrics_fields()
    if names is None:
        return list(FIELDS)
    return [f for f in FIELDS if f not in names]


class RecordReader:
    """New compilation records since the last read (or since start)."""

    def __init__(self, keep: int = 256) -> None:
        self._keep = keep
        self._seen: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self.possibly_missed = False
        for rec in self._snapshot():  # compilations before instrument() are not ours
            self._remember(rec)

    def _snapshot(self) -> list[Any]:
        return torch_compat.compilation_metrics()

    def _remember(self, rec: Any) -> None:
        self._seen[id(rec)] = rec
        while len(self._seen) > self._keep:
            self._seen.popitem(last=False)

    def read(self) -> list[CompileRecord]:
        records = self._snapshot()
        new = [rec for rec in records if id(rec) not in self._seen]
        limit = torch_compat.compilation_metrics_kept()
        if new and len(new) == len(records) and self._seen and limit == len(records):
            self.possibly_missed = True  # the deque turned over entirely since the last read
        for rec in new:
            self._remember(rec)
        return [parse(rec) for rec in new]
