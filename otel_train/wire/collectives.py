"""A step's collectives as rows, and what they become: ``training.collective`` spans and
duration and size points.

Every source of collectives produces these rows: the gloo wrappers, the process-group hooks
and NCCL's flight recorder (``sources/collectives/``) directly, otel-train's NCCL profiler
plugin through ``wire/nccl.py``. They travel as plain tuples (:data:`Row`) with the step's
context (:class:`Spec`) to where spans are built (the exporter process by default), so the
training process pays for the tuples, not for each collective's attribute dict, span and
points (docs/overhead.md). No torch here.

Policy (docs/collectives.md): every collective records its duration and size; in a sampled
step each is its own span under the phase that issued it, or, when the step is summarised, one
span per (phase, op, group, backend, source) while the stalled, failed, unfinished and slow
ones (over ``SLOW_FACTOR`` x their group's median and ``SLOW_MIN_S``) keep their own spans.
Which sampled steps are summarised is decided where the step's collectives are known, by
:class:`SpanBudget` (the default, ``OTEL_TRAIN_COLLECTIVE_SPANS=auto``): a step's collectives
are their own spans while the rank stays within ``collective_span_rate`` spans a second, so
the exporter keeps up at any collective rate; ``all`` and ``summary`` force one or the other.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_train import collectives_math, semconv
from otel_train.wire import CtxTuple, context_of

SLOW_FACTOR = 4.0
SLOW_MIN_S = 0.005

#: One collective: (op, api, backend, group, group size, bytes, dtype, shape or None,
#: async, issued (wall ns), ended (wall ns: done, or where it was last seen unfinished),
#: done, seq, source, GPU seconds or None, stalled (at wall ns, stall timeout s) or None,
#: error or None, preset span id or 0)
Row = tuple[str, str, str, str, int, int, str, "tuple[int, ...] | None", bool, int, int, bool,
            int, str, "float | None", "tuple[int, float] | None", "str | None", int]


#: a Row's fields by position: ``row[ISSUE]`` is when it was issued (rows stay plain tuples,
#: which build and pickle at a fraction of a NamedTuple's cost, once per collective)
(OP, API, BACKEND, GROUP, GROUP_SIZE, NBYTES, DTYPE, SHAPE, ASYNC, ISSUE, END, DONE, SEQ, SOURCE,
 GPU_S, STALLED, ERROR, SPAN_ID) = range(18)


class Spec(NamedTuple):
    """What the expansion needs of the step the collectives belong to; plain values."""

    step: int
    sampled: bool
    summary: bool
    #: the rank-step span: parent of what no phase issued, and the points' exemplar
    rank_step: CtxTuple
    #: phase spans (context, start, end), wall-clock ns: a collective's parent is the phase
    #: it was issued in
    phases: list[tuple[CtxTuple, int, int]]
    base: dict[str, Any]  # rank, run id
    #: record the duration and size points (False: spans only, for collectives that never
    #: finished, whose points are not known)
    points: bool = True


class SpanBudget:
    """How many collectives may be their own spans: a token bucket of ``per_s`` spans a
    second, holding at most ``burst_s`` seconds' worth, on the steps' own clock (their end,
    wall-clock ns), so steps released together after a hold are judged by when they ran.

    A sampled step's collectives are all their own spans if the bucket holds enough for all
    of them, and the step is summarised otherwise (a trace never mixes the two by chance);
    the summarised step spends nothing. A step with more collectives than the bucket can
    ever hold is always summarised."""

    def __init__(self, per_s: float, burst_s: float = 1.0) -> None:
        if per_s <= 0 or burst_s <= 0:
            raise ValueError("a span budget needs a positive rate and burst")
        self.per_ns = per_s / 1e9
        self.capacity = per_s * burst_s
        self.tokens = self.capacity
        self.last_ns: int | None = None

    def summarise(self, n: int, now_ns: int) -> bool:
        """True if a step of ``n`` collectives ending at ``now_ns`` is to be summarised;
        otherwise its spans are taken from the budget."""
        if self.last_ns is None:
            self.last_ns = now_ns
        elif now_ns > self.last_ns:  # an older step neither refills nor turns the clock back
            self.tokens = min(self.capacity,
                              self.tokens + (now_ns - self.last_ns) * self.per_ns)
            self.last_ns = now_ns
        if n > self.tokens:
            return True
        self.tokens -= n
        return False


def seconds(row: Row) -> float:
    """GPU time where measured, else host time from issue to done (0 if never done)."""
    if row[GPU_S] is not None:
        return row[GPU_S]
    return max(0, row[END] - row[ISSUE]) / 1e9 if row[DONE] else 0.0


def expand(spec: Spec, rows: Sequence[Row], span: Callable[..., Any],
           duration: Callable[..., Any], size: Callable[..., Any]) -> int:
    """Record every row's duration and size and, in a sampled step, its span or its share of
    a summary span, with a Pipeline's ``span`` and the duration histogram's ``record`` and
    the size counter's ``add``; returns how many rows."""
    if spec.points and rows:
        _points(spec, rows, duration, size)
    if not spec.sampled or not rows:
        return len(rows)
    rank_step = context_of(spec.rank_step)
    phases = [(context_of(c), start, end) for c, start, end in spec.phases]
    parented = []
    for row in rows:
        parent = rank_step
        for ctx, start, end in phases:
            if start <= row[ISSUE] < end:
                parent = ctx
                break
        parented.append((row, parent))
    if spec.summary:
        _summaries(spec, parented, span)
    else:
        for row, parent in parented:
            _span(spec, row, parent, span)
    return len(rows)


def _points(spec: Spec, rows: Sequence[Row], duration: Callable[..., Any],
            size: Callable[..., Any]) -> None:
    """Every row's duration; the bytes summed per attribute set (one counter addition each:
    the same sum as one per row, at a fraction of the SDK's per-measurement cost, ~8 us here).
    In a sampled step the slowest row of each attribute set carries the step's exemplar: the
    one a histogram's tail links to, without the exemplar machinery for every row."""
    attrs_of: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        key = (row[OP], row[BACKEND])
        entry = attrs_of.get(key)
        if entry is None:
            entry = attrs_of[key] = [[], 0, -1.0, -1]  # durations, bytes, slowest, its index
        secs = seconds(row)
        durations = entry[0]
        if secs > entry[2]:
            entry[2], entry[3] = secs, len(durations)
        durations.append(secs)
        entry[1] += row[NBYTES]
    exemplar = (trace.set_span_in_context(NonRecordingSpan(context_of(spec.rank_step)))
                if spec.sampled else None)
    for (op, backend), (durations, nbytes, _, slowest) in attrs_of.items():
        bounded = op if op in semconv.COLLECTIVE_OPS else "other"
        attrs = {**spec.base, semconv.ATTR_COLLECTIVE_OP: bounded,
                 semconv.ATTR_COLLECTIVE_BACKEND: backend}
        for i, secs in enumerate(durations):
            if exemplar is not None and i == slowest:
                duration(secs, attrs, context=exemplar)
            else:
                duration(secs, attrs)
        if nbytes:
            size(nbytes, {**spec.base, semconv.ATTR_COLLECTIVE_OP: bounded})


def lost(spec: Spec, rows: Sequence[Row]) -> tuple[int, int]:
    """(spans, metric points) the rows would have made: counted when they are lost."""
    made = [0, 0]

    def one_span(*args: Any, **kwargs: Any) -> None:
        made[0] += 1

    def one_point(*args: Any, **kwargs: Any) -> None:
        made[1] += 1

    expand(spec, rows, one_span, one_point, one_point)
    return made[0], made[1]


def _span(spec: Spec, row: Row, parent: SpanContext, span: Callable[..., Any]) -> None:
    (op, api, backend, group, group_size, nbytes, dtype, shape, async_op, issue, end, done,
     seq, source, gpu_s, stalled, error, span_id) = row
    attrs: dict[str, Any] = {
        **spec.base, semconv.ATTR_STEP: spec.step,
        semconv.ATTR_COLLECTIVE_OP: op, semconv.ATTR_COLLECTIVE_BACKEND: backend,
        semconv.ATTR_COLLECTIVE_BYTES: nbytes,
        semconv.ATTR_COLLECTIVE_GROUP_SIZE: group_size,
        semconv.ATTR_COLLECTIVE_SEQ: seq, semconv.ATTR_COLLECTIVE_DTYPE: dtype,
        semconv.ATTR_COLLECTIVE_GROUP: group, semconv.ATTR_COLLECTIVE_API: api,
        semconv.ATTR_COLLECTIVE_ASYNC: async_op,
    }
    if shape is not None:
        attrs[semconv.ATTR_COLLECTIVE_SHAPE] = list(shape)
    attrs[semconv.ATTR_COLLECTIVE_SOURCE] = source
    bus = collectives_math.bus_bandwidth_gbps(op, nbytes, seconds(row), group_size)
    if bus is not None and done:
        attrs[semconv.ATTR_COLLECTIVE_BUS_BW] = bus
    if gpu_s is not None:
        attrs[semconv.ATTR_COLLECTIVE_GPU_DURATION] = gpu_s
    events = []
    if stalled is not None:
        stalled_at, timeout_s = stalled
        attrs[semconv.ATTR_COLLECTIVE_STALLED] = True
        events.append((semconv.EVENT_COLLECTIVE_STALLED, stalled_at, {
            semconv.ATTR_COLLECTIVE_OP: op, semconv.ATTR_COLLECTIVE_SEQ: seq,
            semconv.ATTR_COLLECTIVE_GROUP: group, semconv.ATTR_COLLECTIVE_BYTES: nbytes,
            "timeout_s": timeout_s}))
    if not done:
        attrs[semconv.ATTR_COLLECTIVE_COMPLETED] = False
        error = error or "the collective had not completed when instrumentation ended"
    span(semconv.SPAN_COLLECTIVE, parent, issue, end, attrs, span_id=span_id, error=error,
         events=events)


def _summaries(spec: Spec, parented: list[tuple[Row, SpanContext]],
               span: Callable[..., Any]) -> None:
    groups: dict[tuple[Any, ...], list[tuple[Row, SpanContext]]] = {}
    for row, parent in parented:
        key = (parent.span_id, row[OP], row[GROUP], row[BACKEND], row[SOURCE])
        groups.setdefault(key, []).append((row, parent))
    for members in groups.values():
        times = sorted(seconds(r) for r, _ in members)
        slow = max(SLOW_MIN_S, SLOW_FACTOR * times[len(times) // 2])
        rest = []
        for row, parent in members:
            if row[STALLED] is not None or row[ERROR] or not row[DONE] or seconds(row) > slow:
                _span(spec, row, parent, span)  # on its own: what someone will want to open
            else:
                rest.append((row, parent))
        if len(rest) == 1:
            _span(spec, rest[0][0], rest[0][1], span)
        elif rest:
            _summary_span(spec, rest, span)


def _summary_span(spec: Spec, members: list[tuple[Row, SpanContext]],
                  span: Callable[..., Any]) -> None:
    rows = [r for r, _ in members]
    first, parent = min(members, key=lambda m: m[0][ISSUE])
    nbytes = sum(r[NBYTES] for r in rows)
    gpu = [r[GPU_S] for r in rows if r[GPU_S] is not None]
    dtypes = {r[DTYPE] for r in rows}
    seqs = [r[SEQ] for r in rows]
    attrs: dict[str, Any] = {
        **spec.base, semconv.ATTR_STEP: spec.step,
        semconv.ATTR_COLLECTIVE_OP: first[OP], semconv.ATTR_COLLECTIVE_BACKEND: first[BACKEND],
        semconv.ATTR_COLLECTIVE_BYTES: nbytes,
        semconv.ATTR_COLLECTIVE_GROUP_SIZE: first[GROUP_SIZE],
        semconv.ATTR_COLLECTIVE_SEQ: min(seqs), semconv.ATTR_COLLECTIVE_SEQ_LAST: max(seqs),
        semconv.ATTR_COLLECTIVE_DTYPE: first[DTYPE] if len(dtypes) == 1 else "mixed",
        semconv.ATTR_COLLECTIVE_GROUP: first[GROUP], semconv.ATTR_COLLECTIVE_API: first[API],
        semconv.ATTR_COLLECTIVE_ASYNC: any(r[ASYNC] for r in rows),
        semconv.ATTR_COLLECTIVE_SOURCE: first[SOURCE],
        semconv.ATTR_COLLECTIVE_COUNT: len(rows),
        semconv.ATTR_COLLECTIVE_TOTAL_S: sum(max(0, r[END] - r[ISSUE]) for r in rows) / 1e9,
    }
    bus = collectives_math.bus_bandwidth_gbps(first[OP], nbytes, sum(seconds(r) for r in rows),
                                              first[GROUP_SIZE])
    if bus is not None:
        attrs[semconv.ATTR_COLLECTIVE_BUS_BW] = bus
    if gpu:
        attrs[semconv.ATTR_COLLECTIVE_GPU_DURATION] = sum(gpu)
    span(semconv.SPAN_COLLECTIVE, parent, first[ISSUE], max(r[END] for r in rows), attrs)
