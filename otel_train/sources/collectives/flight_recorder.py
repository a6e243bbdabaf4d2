"""NCCL collectives from the process group's flight recorder, harvested on the emitter thread.

ProcessGroupNCCL records every collective it enqueues (compiled ones included) in a ring
buffer: creation time, sequence id, sizes, dtypes, state and, with
``TORCH_NCCL_ENABLE_TIMING=1``, the GPU duration. Its Work futures complete at enqueue time,
so Python-side timings of NCCL collectives are CPU times; the flight recorder's are the GPU's.
Both variables (and ``TORCH_NCCL_TRACE_BUFFER_SIZE``) are read when the process group is
created: see docs/collectives.md for which ones ``instrument()`` can still set.

Only ``torch._C._distributed_c10d._dump_nccl_trace`` (pickle, read first: cheaper) or its
JSON twin ``_dump_nccl_trace_json`` holds NCCL entries (the generic ``_dump_fr_trace*`` does
not). Each poll reads the whole buffer (bounded by its size) and keeps what it has not
finalized yet, by ``record_id``. The ring overwrites its oldest entries, so its route reads
before it fills and counts what was lost anyway (fr_route.py). Entries recorded before
instrumentation began belong to no step and are skipped.

The dump's shape is torch's, not ours: a poll that cannot read it, or an entry of an unknown
shape, is counted and skipped (``errors``, ``skipped``, ``last_error``), never raised; the
first entry's keys are kept in ``seen_keys`` for diagnosis.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from typing import Any

import torch.distributed as dist

from otel_train import torch_compat

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
#: other spellings of dtypes seen in dumps ("torch.float32", "float32") -> c10 names
_DTYPE_ALIASES = {
    "float32": "Float", "float": "Float", "float64": "Double", "double": "Double",
    "float16": "Half", "half": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "long": "Long", "int32": "Int", "int": "Int", "int16": "Short", "int8": "Char",
    "uint8": "Byte", "bool": "Bool",
}


def _dump() -> Any:
    """A function returning the flight recorder as a dict: the pickle dump without stack
    traces, else the JSON one. Both hold the same entries; on an H200 with 2000 entries the
    pickle dump and its parse took 16 ms, the JSON ones 39 ms (bench/multigpu/fr_read_cost.py),
    with the GIL held, on the emitter thread, at every read."""
    as_pickle, as_json = torch_compat.nccl_trace_dumps()

    def read_json() -> Any:
        raw = as_json(includeCollectives=True, onlyActive=False)
        return json.loads(raw.decode() if isinstance(raw, bytes) else raw)

    if as_pickle is None:
        return read_json if as_json is not None else None
    use_json = False

    def read() -> Any:
        nonlocal use_json
        if use_json:
            return read_json()
        try:
            raw = as_pickle(includeCollectives=True, includeStackTraces=False,
                            onlyActive=False)
        except TypeError:  # another signature in another torch: the JSON dump from now on
            if as_json is None:
                raise
            use_json = True
            return read_json()
        return pickle.loads(raw)

    return read


def dtype_bytes(dtype: Any) -> int:
    name = str(dtype)
    if name in _DTYPE_BYTES:
        return _DTYPE_BYTES[name]
    name = name.removeprefix("torch.")
    return _DTYPE_BYTES.get(_DTYPE_ALIASES.get(name.lower(), name), 0)


def nccl_groups() -> list[Any]:
    out = []
    for group in torch_compat.process_groups():
        try:
            if "nccl" in str(dist.get_backend(group)):
                out.append(group)
        except Exception:
            continue
    return out


def buffer_size() -> int:
    """The flight recorder's ring size as the process group read it: TORCH_FR_BUFFER_SIZE,
    else its older name TORCH_NCCL_TRACE_BUFFER_SIZE (2000 from torch 2.11)."""
    raw = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
    if raw is None:
        return 2000
    try:
        return int(raw)
    except ValueError:
        return 0


def read_interval_s(configured_s: float, buffer: int, entries_per_s: float,
                    tick_s: float = 0.0, fill_share: float = 0.8, floor_s: float = 0.25
                    ) -> float:
    """How long to wait before the next read: ``configured_s``, shortened so that the ring
    buffer fills at most ``fill_share`` between reads at the rate seen (entries overwritten
    before a read are lost; reads happen on the emitter's ticks, up to ``tick_s`` late), never
    below ``floor_s`` (each read dumps the whole buffer)."""
    if buffer <= 0 or entries_per_s <= 0:
        return configured_s
    return max(floor_s, min(configured_s, fill_share * buffer / entries_per_s - tick_s))


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
        total += numel * dtype_bytes(dtype)
    return total


def _group_sizes(doc: dict[str, Any]) -> dict[str, int]:
    out = {}
    config = doc.get("pg_config")
    for name, cfg in (config.items() if isinstance(config, dict) else ()):
        ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
        if isinstance(ranks, str):
            ranks = [r for r in ranks.strip("[]").split(",") if r.strip()]
        if isinstance(ranks, list):
            out[str(name)] = len(ranks)
    return out


def _int(value: Any) -> int:
    """An int from the dump's numbers, strings or nulls (0 for none)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _group_name(entry: dict[str, Any]) -> str:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    if group is not None:
        return str(group)
    return str(entry.get("pg_id", ""))


class FlightRecorder:
    """Incremental reader of the NCCL flight recorder: entries it has not finalized yet."""

    def __init__(self, world_size: int, since_ns: int | None = None) -> None:
        self.world_size = world_size
        self.since_ns = time.time_ns() if since_ns is None else since_ns
        self._finalized: set[int] = set()
        self._dump = _dump()
        self.errors = 0
        self.skipped = 0
        self.last_error = ""
        self.seen_keys: list[str] = []
        #: record ids of the last dump (None before one had entries); entries below
        #: ``lowest`` are gone from the ring
        self.lowest: int | None = None
        self.highest: int | None = None
        #: entries overwritten before any read saw them (gaps in the record ids)
        self.unseen = 0

    def available(self) -> bool:
        return self._dump is not None and buffer_size() > 0 and bool(nccl_groups())

    def baseline(self) -> None:
        """Learn the newest record id before instrumentation, so that entries overwritten
        before the first read are counted too (one whole-buffer read, at start)."""
        try:
            entries = (self._dump() or {}).get("entries") or []
            ids = [int(e["record_id"]) for e in entries if isinstance(e, dict)
                   and "record_id" in e]
        except Exception as err:  # torch's format, not ours
            self.errors += 1
            self.last_error = repr(err)[:300]
            return
        self.highest = max(ids) if ids else -1

    def poll(self) -> list[dict[str, Any]]:
        """New or unfinished entries, each with ``op``, ``nbytes``, ``group_size``, ``group``
        and ``terminal`` added; [] when the dump cannot be read."""
        if self._dump is None:
            return []
        try:
            doc = self._dump()
            entries = doc.get("entries") or []
            sizes = _group_sizes(doc)
        except Exception as err:  # torch's format, not ours: never let it stop the emitter
            self.errors += 1
            self.last_error = repr(err)[:300]
            return []
        out = []
        lowest = highest = None
        finalized = self._finalized
        for entry in entries:
            # most of a ring is finalized already: skip it before any other work (a read of
            # 20000 entries spent 70 ms building entries it then dropped, on an H200)
            rid = entry.get("record_id") if isinstance(entry, dict) else None
            if type(rid) is int and rid in finalized:
                lowest = rid if lowest is None or rid < lowest else lowest
                highest = rid if highest is None or rid > highest else highest
                continue
            try:
                item = self._entry(entry, sizes)
            except Exception as err:
                self.skipped += 1
                self.last_error = repr(err)[:300]
                continue
            if item is None:
                continue
            rid = item["record_id"]
            lowest = rid if lowest is None else min(lowest, rid)
            highest = rid if highest is None else max(highest, rid)
            if not isinstance(item, _Final):
                out.append(item)
        if lowest is not None:  # forget what the ring buffer has overwritten
            self._finalized = {r for r in self._finalized if r >= lowest}
            if self.highest is not None and lowest > self.highest + 1:
                self.unseen += lowest - self.highest - 1
            self.lowest, self.highest = lowest, highest
        return out

    def _entry(self, entry: Any, sizes: dict[str, int]) -> Any:
        if not isinstance(entry, dict) or "record_id" not in entry:
            self.skipped += 1
            return None
        if not self.seen_keys:
            self.seen_keys = sorted(str(k) for k in entry)
        rid = int(entry["record_id"])
        entry["record_id"] = rid
        if rid in self._finalized:
            return _Final(rid)
        # "completed" comes from the dump's own event query; the GPU duration only once the
        # watchdog retired the entry: wait for that, or the duration is lost
        terminal = entry.get("state") in _TERMINAL and (
            entry.get("duration_ms") is not None or bool(entry.get("retired", True)))
        if terminal and _int(entry.get("time_created_ns")) < self.since_ns:
            self._finalized.add(rid)  # before instrumentation: no step of ours owns it
            return _Final(rid)
        op = op_of(str(entry.get("profiling_name", "")))
        use_out = op == "all_gather" or op == "recv"
        group = _group_name(entry)
        entry["op"] = op
        entry["group"] = group
        entry["group_size"] = sizes.get(group, self.world_size)
        entry["nbytes"] = _bytes(
            entry.get("output_sizes" if use_out else "input_sizes") or [],
            entry.get("output_dtypes" if use_out else "input_dtypes") or [])
        entry["terminal"] = terminal
        if terminal:
            self._finalized.add(rid)
        return entry


class _Final(dict):
    """An entry already finalized: counts for the ring buffer's low mark, emits nothing."""

    def __init__(self, rid: int) -> None:
        super().__init__(record_id=rid)

