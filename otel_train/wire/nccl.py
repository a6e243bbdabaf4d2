"""The NCCL profiler plugin's records: their layout, and what a step's records become
(collective spans and metric points).

The plugin (``nccl/profiler.c``) writes one fixed-size record per collective and
point-to-point operation (:data:`RECORD`). A step's records travel as the plugin wrote them,
with the step's context (:class:`StepSpec`), to where spans are built (the exporter process
by default), so the training process pays for the context and the bytes, not for the
attributes, spans and points of each collective (docs/overhead.md). They become the rows
every source of collectives produces (``wire/collectives.py``), with
``training.collective.source = nccl_profiler``. No torch here: the exporter process never imports it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from otel_train.wire import CtxTuple, collectives

#: struct otp_record (profiler.c): comm, seq, bytes, t_issue, t_done, gpu_start, gpu_stop,
#: func, dtype, algo, proto, nchannels, flags, nranks
RECORD = struct.Struct("<QQQqqQQBBBBBBH")
FUNCS = ("other", "all_gather", "all_reduce", "all_to_all", "broadcast", "gather", "recv",
         "reduce", "reduce_scatter", "scatter", "send_recv", "send")
#: profiler.c's TYPES ids -> the flight recorder's (c10) dtype names
DTYPES = ("", "Char", "Byte", "Int", "UInt32", "Long", "UInt64", "Half", "Float", "Double",
          "BFloat16", "Float8_e4m3fn", "Float8_e5m2")

SOURCE = "nccl_profiler"
_OPS = {"send_recv": "send"}


class StepSpec(NamedTuple):
    """What the expansion needs of a step; plain values, so it pickles small."""

    step: int
    sampled: bool
    summary: bool
    #: the rank-step span as (trace_id, span_id, flags, is_remote): parent and exemplar
    rank_step: CtxTuple
    #: phase spans (context tuple, start, end), wall-clock ns
    phases: list[tuple[CtxTuple, int, int]]
    offset: int  # perf_counter ns + offset = epoch ns
    base: dict[str, Any]
    #: communicator hash -> (process group name, ranks)
    groups: dict[int, tuple[str, int]]
    #: (comm, seq, func) -> (stalled at, epoch ns; span id; stall timeout in s)
    stalled: dict[tuple[int, int, int], tuple[int, int, float]]


def op_name(func: int) -> str:
    name = FUNCS[func] if 0 < func < len(FUNCS) else "other"
    return _OPS.get(name, name)


def nccl_tests_bytes(op: str, nccl_bytes: int, nranks: int) -> int:
    """NCCL counts all-gather by its input and reduce-scatter by its output (per rank);
    nccl-tests' size, ours, is the larger side: n x that for both."""
    if op in ("all_gather", "reduce_scatter"):
        return nccl_bytes * max(1, nranks)
    return nccl_bytes


def pack(rows: Sequence[tuple[int, ...]]) -> bytes:
    """A step's records as the plugin wrote them (64 bytes each): they pickle at memcpy
    speed, where 14 mostly 64-bit ints a record cost ~2x more to pickle than to pack."""
    pack_one = RECORD.pack
    return b"".join([pack_one(*r) for r in rows])


def count(rows: Sequence[Any] | bytes) -> int:
    """How many collectives: records as tuples, rows, or the plugin's bytes (64 each)."""
    if isinstance(rows, (bytes, bytearray, memoryview)):
        return len(rows) // RECORD.size
    return len(rows)


def to_rows(spec: StepSpec, rows: Sequence[tuple[int, ...]] | bytes
            ) -> list[collectives.Row]:
    """The plugin's records (tuples, or :func:`pack`'s bytes) as the collective rows every
    source of collectives produces."""
    if isinstance(rows, (bytes, bytearray)):
        rows = list(RECORD.iter_unpack(rows))
    out: list[collectives.Row] = []
    offset, groups, stalled_of = spec.offset, spec.groups, spec.stalled
    for comm, seq, nbytes, t_issue, t_done, g0, g1, func, dtype, _, _, _, flags, nranks in rows:
        op = op_name(func)
        group, size = groups.get(comm, (f"nccl:{comm:016x}", nranks))
        stalled = stalled_of.get((comm, seq, func)) if stalled_of else None
        out.append((
            op, "nccl:" + (FUNCS[func] if func < len(FUNCS) else "other"), "nccl", group, size,
            nccl_tests_bytes(op, nbytes, size), DTYPES[dtype] if dtype < len(DTYPES) else "",
            None, True, t_issue + offset, t_done + offset, True, seq, SOURCE,
            (g1 - g0) / 1e9 if flags & 1 else None,
            (stalled[0], stalled[2]) if stalled is not None else None, None,
            stalled[1] if stalled is not None else 0))
    return out


def generic_spec(spec: StepSpec) -> collectives.Spec:
    return collectives.Spec(spec.step, spec.sampled, spec.summary, spec.rank_step,
                                spec.phases, spec.base)


def expand(spec: StepSpec, rows: Sequence[tuple[int, ...]] | bytes,
           span: Callable[..., Any], duration: Callable[..., Any],
           size: Callable[..., Any]) -> int:
    """Record every record's duration and size, and (sampled steps) its span or its share of
    a summary span (export/collectives.py); how many records."""
    return collectives.expand(generic_spec(spec), to_rows(spec, rows), span, duration,
                                  size)


def lost(spec: StepSpec, rows: Sequence[tuple[int, ...]] | bytes) -> tuple[int, int]:
    """(spans, metric points) the records would have made."""
    return collectives.lost(generic_spec(spec), to_rows(spec, rows))
