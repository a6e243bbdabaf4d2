"""Pass two over the traces: the spans of a few steps (the slowest, the warm-up) folded, as
the workers read them, into what the report uses of them (:class:`StepSpans`): each rank's
first start of each phase, its seconds in collectives, and the step's timeline bars. Memory
is a few numbers per (step, rank, phase) and a tuple per bar, never a span object: a step of
16,384 ranks holds no more than its bars."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from otel_train import semconv as sc
from otel_train.analysis.otlp import Span, iter_spans, signal_files, start_fold_at

#: a phase span's name -> its phase (the timeline's kinds); a collective is "collective"
SPAN_PHASE = {span: phase for phase, span in sc.PHASE_SPAN.items()}
SPAN_PHASE[sc.SPAN_COMPILE] = sc.PHASE_COMPILE

#: (rank, kind, label, start ns, end ns): one span on a step's timeline
BarTuple = tuple[int, str, str, int, int]


def _extend(column: array | list[int], values: Iterable[int]) -> array | list[int]:
    """``column`` with ``values`` appended: an array of int64 while they fit (epoch ns
    do), else a list (a damaged span's number, which a list holds whatever its size)."""
    held = len(column)
    try:
        column.extend(values)
        return column
    except OverflowError:  # an array extends item by item: what it took before is dropped
        return [*column[:held], *values]


@dataclass
class OneStep:
    """What the report uses of one step's spans."""

    #: the earliest start of any of its spans (the timeline's origin), epoch ns
    origin: int | None = None
    #: phase span name -> rank -> the rank's first start of it, epoch ns
    starts: dict[str, dict[int, int]] = field(default_factory=dict)
    #: rank -> seconds in the step's collectives (GPU time where the span has it)
    collective_s: dict[int, float] = field(default_factory=dict)
    #: the step's timeline bars column by column (:attr:`bars`): a tuple each held four times
    #: the memory, and a step of 16,384 ranks has some 200,000 bars
    bar_ranks: array | list[int] = field(default_factory=lambda: array("q"))
    bar_kinds: list[str] = field(default_factory=list)  # interned: one string each
    bar_labels: list[str] = field(default_factory=list)
    bar_starts: array | list[int] = field(default_factory=lambda: array("q"))
    bar_ends: array | list[int] = field(default_factory=lambda: array("q"))

    @property
    def bars(self) -> list[BarTuple]:
        """The timeline's bars, in the order their spans were read."""
        return list(zip(self.bar_ranks, self.bar_kinds, self.bar_labels, self.bar_starts,
                        self.bar_ends, strict=True))

    def add_bar(self, rank: int, kind: str, label: str, start: int, end: int) -> None:
        held = len(self.bar_kinds)
        try:
            self.bar_ranks.append(rank)
            self.bar_starts.append(start)
            self.bar_ends.append(end)
        except OverflowError:  # lists from here on (see _extend)
            self.bar_ranks, self.bar_starts, self.bar_ends = (
                [*column[:held], value] for column, value in
                ((self.bar_ranks, rank), (self.bar_starts, start), (self.bar_ends, end)))
        self.bar_kinds.append(kind)
        self.bar_labels.append(label)

    def phase_starts(self, phase: str) -> dict[int, int]:
        return self.starts.get(sc.PHASE_SPAN.get(phase, ""), {})

    def merge(self, other: OneStep) -> OneStep:
        if other.origin is not None and (self.origin is None or other.origin < self.origin):
            self.origin = other.origin
        for name, ranks in other.starts.items():
            mine = self.starts.setdefault(name, {})
            for rank, start in ranks.items():
                mine[rank] = min(mine.get(rank, start), start)
        for rank, seconds in other.collective_s.items():
            self.collective_s[rank] = self.collective_s.get(rank, 0.0) + seconds
        self.bar_ranks = _extend(self.bar_ranks, other.bar_ranks)
        self.bar_kinds += other.bar_kinds
        self.bar_labels += other.bar_labels
        self.bar_starts = _extend(self.bar_starts, other.bar_starts)
        self.bar_ends = _extend(self.bar_ends, other.bar_ends)
        return self


class StepSpans:
    """The steps of some traces (trace id -> step), each folded into a :class:`OneStep`."""

    def __init__(self, step_of: dict[str, int]) -> None:
        self.step_of = step_of
        self.steps: dict[int, OneStep] = {}

    def add(self, span: Span) -> None:
        step = self.step_of.get(span.trace_id)
        if step is None:
            return
        one = self.steps.get(step)
        if one is None:
            one = self.steps[step] = OneStep()
        if one.origin is None or span.start_ns < one.origin:
            one.origin = span.start_ns
        name = span.name
        kind = SPAN_PHASE.get(name) or ("collective" if name == sc.SPAN_COLLECTIVE else "")
        if not kind:
            return
        rank = _rank(span)
        if name == sc.SPAN_COLLECTIVE:
            attrs = span.attributes
            seconds = attrs.get(sc.ATTR_COLLECTIVE_GPU_DURATION,
                                attrs.get(sc.ATTR_COLLECTIVE_TOTAL_S, span.duration_s))
            one.collective_s[rank] = one.collective_s.get(rank, 0.0) + float(seconds)
        else:
            ranks = one.starts.setdefault(name, {})
            ranks[rank] = min(ranks.get(rank, span.start_ns), span.start_ns)
        label = sys.intern(str(span.attributes.get(sc.ATTR_COLLECTIVE_OP, name)))
        one.add_bar(rank, kind, label, span.start_ns, span.end_ns)

    def merge(self, other: StepSpans) -> StepSpans:
        for step, one in other.steps.items():
            mine = self.steps.get(step)
            self.steps[step] = one if mine is None else mine.merge(one)
        return self

    def get(self, step: int) -> OneStep:
        return self.steps.get(step) or OneStep()


class _NewStepSpans:
    """``StepSpans(step_of)`` as a picklable factory (the workers make their own)."""

    def __init__(self, step_of: dict[str, int]) -> None:
        self.step_of = step_of

    def __call__(self) -> StepSpans:
        return StepSpans(self.step_of)


def start_step_spans(run_dir: Path, step_of: dict[str, int], run_id: str | None,
                     files: list[Path], lines: dict[str, list[tuple[int, int]]],
                     workers: int | None) -> Callable[[], StepSpans]:
    """Pass two started: the steps of ``step_of``'s traces (trace id -> step), read from the
    lines pass one indexed (``files``, ``lines``: its digest's) in the workers, or from every
    traces file where pass one indexed none; the function returned waits for it."""
    make = _NewStepSpans(step_of)
    if not step_of:
        return make
    if files:
        return start_fold_at(files, lines, set(step_of), make, run_id, workers)
    needles = tuple(step_of)

    def read_all() -> StepSpans:
        out = make()
        for span in iter_spans(signal_files(run_dir, sc.TRACES_GLOB), line_filter=needles,
                               run_id=run_id):
            out.add(span)
        return out

    return read_all


def _rank(span: Span) -> int:
    return int(span.attributes.get(sc.ATTR_RANK, span.resource.get(sc.RES_RANK, 0)))
