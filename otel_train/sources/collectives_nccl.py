"""NCCL collectives from the process group's flight recorder, harvested on the emitter thread.

ProcessGroupNCCL records every collective it enqueues (compiled ones included) in a ring
buffer: creation time, sequence id, sizes, dtypes, state and, with
``TORCH_NCCL_ENABLE_TIMING=1``, the GPU duration. Its Work futures complete at enqueue time,
so Python-side timings of NCCL collectives are CPU times; the flight recorder's are the GPU's.
Both variables (and ``TORCH_NCCL_TRACE_BUFFER_SIZE``) are read when the process group is
created: see docs/collectives.md for which ones ``instrument()`` can still set.

Only ``torch._C._distributed_c10d._dump_nccl_trace_json`` holds NCCL entries (the generic
``_dump_fr_trace*`` does not). Each poll reads the whole buffer (bounded by its size) and
keeps what it has not finalized yet, by ``record_id``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist

#: element sizes of the c10 ScalarType names the flight recorder writes
_DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}
_OP_WORDS = (  # first match wins: profiling_name "nccl:<name>" -> collective.op
    ("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
    ("all_gather", "all_gather"), ("allgather", "all_gather"),
    ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"),
    ("all_to_all", "all_to_all"), ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"), ("barrier", "barrier"), ("reduce", "reduce"),
    ("send", "send"), ("recv", "recv"), ("gather", "gather"), ("scatter", "scatter"),
)
_TERMINAL = ("completed",)


def _dump() -> Any:
    from torch._C import _distributed_c10d as c10d

    return getattr(c10d, "_dump_nccl_trace_json", None)


def nccl_groups() -> list[Any]:
    out = []
    for group in list(dist.distributed_c10d._world.pg_map):
        try:
            if "nccl" in str(dist.get_backend(group)):
                out.append(group)
        except Exception:
            continue
    return out


def buffer_size() -> int:
    """TORCH_NCCL_TRACE_BUFFER_SIZE as the process group read it (2000 from torch 2.11)."""
    raw = os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    if raw is None:
        return 2000
    try:
        return int(raw)
    except ValueError:
        return 0


def op_of(profiling_name: str) -> str:
    name = profiling_name.split(":", 1)[-1].lower()
    for word, op in _OP_WORDS:
        if word in name:
            return op
    return "other"


def _bytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        numel = 1
        for d in shape:
            numel *= int(d)
        total += numel * _DTYPE_BYTES.get(dtype, 0)
    return total


def _group_sizes(doc: dict[str, Any]) -> dict[str, int]:
    out = {}
    for name, cfg in (doc.get("pg_config") or {}).items():
        ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
        if isinstance(ranks, str):
            ranks = [r for r in ranks.strip("[]").split(",") if r.strip()]
        if isinstance(ranks, list):
            out[str(name)] = len(ranks)
    return out


class FlightRecorder:
    """Incremental reader of the NCCL flight recorder: entries it has not finalized yet."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._finalized: set[int] = set()
        self._dump = _dump()

    def available(self) -> bool:
        return self._dump is not None and buffer_size() > 0 and bool(nccl_groups())

    def poll(self) -> list[dict[str, Any]]:
        """New or unfinished entries, each with ``op``, ``nbytes``, ``group_size`` added."""
        if self._dump is None:
            return []
        raw = self._dump(includeCollectives=True, onlyActive=False)
        doc = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        entries = doc.get("entries") or []
        sizes = _group_sizes(doc)
        out = []
        lowest = None
        for entry in entries:
            rid = int(entry.get("record_id", -1))
            lowest = rid if lowest is None else min(lowest, rid)
            if rid in self._finalized:
                continue
            group = entry.get("process_group") or ["", ""]
            op = op_of(str(entry.get("profiling_name", "")))
            use_out = op == "all_gather" or op == "recv"
            entry["op"] = op
            entry["group"] = str(group[0])
            entry["group_size"] = sizes.get(str(group[0]), self.world_size)
            entry["nbytes"] = _bytes(
                entry.get("output_sizes" if use_out else "input_sizes") or [],
                entry.get("output_dtypes" if use_out else "input_dtypes") or [])
            entry["terminal"] = entry.get("state") in _TERMINAL
            if entry["terminal"]:
                self._finalized.add(rid)
            out.append(entry)
        if lowest is not None:  # forget what the ring buffer has overwritten
            self._finalized = {r for r in self._finalized if r >= lowest}
        return out
