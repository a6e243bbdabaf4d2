"""The NCCL plugin's records of one step, made into collective spans and metric points.

This runs where spans are built: in the exporter process, which receives a step's records as
the plugin wrote them (a tuple of 14 ints each) with the step's context, or on the emitter
thread when export runs in process. The training process pays for the step's context and
the tuples, not for the attributes, spans and points of each collective (docs/overhead.md).
The spans and points are those of the flight-recorder path (docs/collectives.md), with
``collective.source = nccl_profiler``. No torch here: the exporter process never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train import collectives_math as cmath
from otel_train import semconv
from otel_train.nccl import DTYPES, FUNCS

SOURCE = "nccl_profiler"
#: summary mode: a collective this much slower than its group's median (and over
#: ``SLOW_MIN_S``) keeps its own span beside the group's summary
SLOW_FACTOR = 4.0
SLOW_MIN_S = 0.005
_OPS = {"send_recv": "send"}


class StepSpec(NamedTuple):
    """What the expansion needs of a step; plain values, so it pickles small."""

    step: int
    sampled: bool
    summary: bool
    #: the rank-step span as (trace_id, span_id, flags, is_remote): parent and exemplar
    rank_step: tuple[int, int, int, bool]
    #: phase spans (context tuple, start, end), wall-clock ns
    phases: list[tuple[tuple[int, int, int, bool], int, int]]
    offset: int  # perf_counter ns + offset = epoch ns
    base: dict[str, Any]
    #: communicator hash -> (process group name, ranks)
    groups: dict[int, tuple[str, int]]
    #: (comm, seq, func) -> (stalled at, epoch ns; span id; stall timeout in s)
    stalled: dict[tuple[int, int, int], tuple[int, int, float]]


def _ctx(t: tuple[int, int, int, bool]) -> SpanContext:
    return SpanContext(t[0], t[1], t[3], TraceFlags(t[2]))


def op_name(func: int) -> str:
    name = FUNCS[func] if 0 < func < len(FUNCS) else "other"
    return _OPS.get(name, name)


def nccl_tests_bytes(op: str, nccl_bytes: int, nranks: int) -> int:
    """NCCL counts all-gather by its input and reduce-scatter by its output (per rank);
    nccl-tests' size, ours, is the larger side: n x that for both."""
    if op in ("all_gather", "reduce_scatter"):
        return nccl_bytes * max(1, nranks)
    return nccl_bytes


class _Coll:
    __slots__ = ("row", "op", "group", "size", "nbytes", "issue", "done", "gpu_s", "seconds",
                 "parent", "stalled")

    def __init__(self, row: tuple[int, ...], spec: StepSpec) -> None:
        comm, seq, nbytes, t_issue, t_done, g0, g1, func, _, _, _, _, flags, nranks = row
        self.row = row
        self.op = op_name(func)
        self.group, self.size = spec.groups.get(comm, (f"nccl:{comm:016x}", nranks))
        self.nbytes = nccl_tests_bytes(self.op, nbytes, self.size)
        self.issue = t_issue + spec.offset
        self.done = t_done + spec.offset
        self.gpu_s = (g1 - g0) / 1e9 if flags & 1 else None
        self.seconds = self.gpu_s if self.gpu_s is not None else max(0, t_done - t_issue) / 1e9
        self.stalled = spec.stalled.get((comm, seq, func))
        self.parent: Any = None


def expand(spec: StepSpec, rows: Sequence[tuple[int, ...]],
           span: Callable[..., Any], duration: Callable[..., Any],
           size: Callable[..., Any]) -> int:
    """Record every row's duration and size, and (sampled steps) its span or its share of a
    summary span; how many rows."""
    exemplar = (trace.set_span_in_context(NonRecordingSpan(_ctx(spec.rank_step)))
                if spec.sampled else None)
    attrs_of: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    colls = []
    for row in rows:
        coll = _Coll(row, spec)
        attrs = attrs_of.get(coll.op)
        if attrs is None:
            bounded = coll.op if coll.op in semconv.COLLECTIVE_OPS else "other"
            attrs = attrs_of[coll.op] = (
                {**spec.base, semconv.ATTR_COLLECTIVE_OP: bounded,
                 semconv.ATTR_COLLECTIVE_BACKEND: "nccl"},
                {**spec.base, semconv.ATTR_COLLECTIVE_OP: bounded})
        if exemplar is None:
            duration(coll.seconds, attrs[0])
        else:
            duration(coll.seconds, attrs[0], context=exemplar)
        if coll.nbytes:
            size(coll.nbytes, attrs[1])
        colls.append(coll)
    if not spec.sampled or not colls:
        return len(colls)
    rank_step = _ctx(spec.rank_step)
    phases = [(_ctx(c), start, end) for c, start, end in spec.phases]
    for coll in colls:
        coll.parent = rank_step
        for ctx, start, end in phases:
            if start <= coll.issue < end:
                coll.parent = ctx
                break
    if spec.summary:
        _summaries(spec, colls, span)
    else:
        for coll in colls:
            _span(spec, coll, span)
    return len(colls)


def _span(spec: StepSpec, coll: _Coll, span: Callable[..., Any]) -> None:
    comm, seq, _, _, _, _, _, func, dtype, _, _, nch, _, _ = coll.row
    attrs: dict[str, Any] = {
        **spec.base, semconv.ATTR_STEP: spec.step,
        semconv.ATTR_COLLECTIVE_OP: coll.op, semconv.ATTR_COLLECTIVE_BACKEND: "nccl",
        semconv.ATTR_COLLECTIVE_BYTES: coll.nbytes,
        semconv.ATTR_COLLECTIVE_GROUP_SIZE: coll.size,
        semconv.ATTR_COLLECTIVE_SEQ: seq,
        semconv.ATTR_COLLECTIVE_DTYPE: DTYPES[dtype] if dtype < len(DTYPES) else "",
        semconv.ATTR_COLLECTIVE_GROUP: coll.group,
        semconv.ATTR_COLLECTIVE_API: "nccl:" + (FUNCS[func] if func < len(FUNCS) else "other"),
        semconv.ATTR_COLLECTIVE_ASYNC: True,
        semconv.ATTR_COLLECTIVE_SOURCE: SOURCE,
    }
    bus = cmath.bus_bandwidth_gbps(coll.op, coll.nbytes, coll.seconds, coll.size)
    if bus is not None:
        attrs[semconv.ATTR_COLLECTIVE_BUS_BW] = bus
    if coll.gpu_s is not None:
        attrs[semconv.ATTR_COLLECTIVE_GPU_DURATION] = coll.gpu_s
    events = []
    span_id = 0
    if coll.stalled is not None:
        stalled_at, span_id, timeout_s = coll.stalled
        attrs[semconv.ATTR_COLLECTIVE_STALLED] = True
        events.append((semconv.EVENT_COLLECTIVE_STALLED, stalled_at, {
            semconv.ATTR_COLLECTIVE_OP: coll.op, semconv.ATTR_COLLECTIVE_SEQ: seq,
            semconv.ATTR_COLLECTIVE_GROUP: coll.group,
            semconv.ATTR_COLLECTIVE_BYTES: coll.nbytes, "timeout_s": timeout_s}))
    span(semconv.SPAN_COLLECTIVE, coll.parent, coll.issue, coll.done, attrs,
         span_id=span_id, events=events)


def _summaries(spec: StepSpec, colls: list[_Coll], span: Callable[..., Any]) -> None:
    """One span per (parent phase, op, group) of the step; stalled and slow ones (over
    ``SLOW_FACTOR`` x the group's median and ``SLOW_MIN_S``) keep their own spans too."""
    groups: dict[tuple[Any, ...], list[_Coll]] = {}
    for coll in colls:
        groups.setdefault((coll.parent.span_id, coll.op, coll.group), []).append(coll)
    for members in groups.values():
        seconds = sorted(c.seconds for c in members)
        slow = max(SLOW_MIN_S, SLOW_FACTOR * seconds[len(seconds) // 2])
        rest = []
        for coll in members:
            if coll.stalled is not None or coll.seconds > slow:
                _span(spec, coll, span)
            else:
                rest.append(coll)
        if len(rest) == 1:
            _span(spec, rest[0], span)
        elif rest:
            _summary_span(spec, rest, span)


def _summary_span(spec: StepSpec, members: list[_Coll], span: Callable[..., Any]) -> None:
    first = min(members, key=lambda c: c.issue)
    end = max(c.done for c in members)
    nbytes = sum(c.nbytes for c in members)
    gpu = [c.gpu_s for c in members if c.gpu_s is not None]
    dtypes = {c.row[8] for c in members}
    dtype = first.row[8]
    seqs = [c.row[1] for c in members]
    attrs: dict[str, Any] = {
        **spec.base, semconv.ATTR_STEP: spec.step,
        semconv.ATTR_COLLECTIVE_OP: first.op, semconv.ATTR_COLLECTIVE_BACKEND: "nccl",
        semconv.ATTR_COLLECTIVE_BYTES: nbytes,
        semconv.ATTR_COLLECTIVE_GROUP_SIZE: first.size,
        semconv.ATTR_COLLECTIVE_SEQ: min(seqs), semconv.ATTR_COLLECTIVE_SEQ_LAST: max(seqs),
        semconv.ATTR_COLLECTIVE_DTYPE: (DTYPES[dtype] if dtype < len(DTYPES) else "")
        if len(dtypes) == 1 else "mixed",
        semconv.ATTR_COLLECTIVE_GROUP: first.group,
        semconv.ATTR_COLLECTIVE_API: "nccl:" + FUNCS[first.row[7]]
        if first.row[7] < len(FUNCS) else "nccl:other",
        semconv.ATTR_COLLECTIVE_ASYNC: True,
        semconv.ATTR_COLLECTIVE_SOURCE: SOURCE,
        semconv.ATTR_COLLECTIVE_COUNT: len(members),
        semconv.ATTR_COLLECTIVE_TOTAL_S: sum(max(0, c.done - c.issue) for c in members) / 1e9,
    }
    bus = cmath.bus_bandwidth_gbps(first.op, nbytes, sum(c.seconds for c in members),
                                   first.size)
    if bus is not None:
        attrs[semconv.ATTR_COLLECTIVE_BUS_BW] = bus
    if gpu:
        attrs[semconv.ATTR_COLLECTIVE_GPU_DURATION] = sum(gpu)
    span(semconv.SPAN_COLLECTIVE, first.parent, first.issue, end, attrs)
