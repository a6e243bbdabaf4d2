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


#: the span names whose first start on each rank pass one notes (:class:`StepMarks`)
MARKED = tuple(SPAN_PHASE)
_MARK = {name: code for code, name in enumerate(MARKED)}
#: a :class:`StepMarks` row of a collective span (its seconds), not of a phase's start
_COLLECTIVE = -1


@dataclass
class StepMarks:
    """What the slow steps' blame reads of every step's spans, noted by pass one as it reads
    them (traces.py), so that no second pass reads the slowest steps for it: a row per phase
    span (:data:`MARKED`: its rank's start) and per collective span (its rank's seconds:
    GPU time where the span has it), columns of numbers; and each trace's earliest span
    start (the timeline's origin). :meth:`steps` folds the rows of a few steps into
    :class:`OneStep` as pass two did (the bars apart: those are read for the timelines)."""

    traces: array = field(default_factory=lambda: array("l"))  # index in ``trace_ids``
    ranks: array = field(default_factory=lambda: array("q"))
    kinds: array = field(default_factory=lambda: array("b"))  # index in MARKED, or -1
    starts: array = field(default_factory=lambda: array("q"))  # a phase's start, epoch ns
    seconds: array = field(default_factory=lambda: array("d"))  # a collective's seconds
    trace_ids: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)
    #: trace id -> the earliest start of any span of it, epoch ns
    origins: dict[str, int] = field(default_factory=dict)

    def _code(self, trace_id: str) -> int:
        code = self.codes.get(trace_id)
        if code is None:
            code = self.codes[trace_id] = len(self.trace_ids)
            self.trace_ids.append(trace_id)
        return code

    def phase(self, name: str, trace_id: str, rank: int, start_ns: int) -> None:
        """A span of :data:`MARKED` (``name``) began at ``start_ns`` on ``rank``."""
        self._row(self._code(trace_id), rank, _MARK[name], start_ns, 0.0)

    def collective(self, trace_id: str, rank: int, seconds: float) -> None:
        """A collective span of ``seconds`` on ``rank``."""
        self._row(self._code(trace_id), rank, _COLLECTIVE, 0, seconds)

    def _row(self, code: int, rank: int, kind: int, start: int, seconds: float) -> None:
        held = len(self.kinds)
        try:
            self.ranks.append(rank)
            self.starts.append(start)
        except OverflowError:  # a damaged span's number: the row is left out, whole
            del self.ranks[held:], self.starts[held:]
            return
        self.traces.append(code)
        self.kinds.append(kind)
        self.seconds.append(seconds)

    def origin(self, trace_id: str, start_ns: int) -> None:
        known = self.origins.get(trace_id)
        if known is None or start_ns < known:
            self.origins[trace_id] = start_ns

    def merge(self, other: StepMarks) -> None:
        """Take in the marks of the next files: the same as reading them after these."""
        remap = [self._code(trace_id) for trace_id in other.trace_ids]
        self.traces.extend(remap[code] for code in other.traces)
        self.ranks.extend(other.ranks)
        self.kinds.extend(other.kinds)
        self.starts.extend(other.starts)
        self.seconds.extend(other.seconds)
        for trace_id, start in other.origins.items():
            self.origin(trace_id, start)

    def steps(self, step_of: dict[str, int]) -> dict[int, OneStep]:
        """The steps of ``step_of``'s traces (trace id -> step): each rank's first start of
        each phase, its seconds in collectives (added in the order read) and the origin."""
        wanted = {self.codes[t]: step for t, step in step_of.items() if t in self.codes}
        out = {step: OneStep(origin=self.origins.get(t)) for t, step in step_of.items()}
        if not wanted:
            return out
        for row, code in enumerate(self.traces):
            step = wanted.get(code)
            if step is None:
                continue
            one, rank, kind = out[step], self.ranks[row], self.kinds[row]
            if kind == _COLLECTIVE:
                one.collective_s[rank] = one.collective_s.get(rank, 0.0) + self.seconds[row]
            else:
                ranks = one.starts.setdefault(MARKED[kind], {})
                start = self.starts[row]
                ranks[rank] = min(ranks.get(rank, start), start)
        return out


class StepSpans:
    """The steps of some traces (trace id -> step), each folded into a :class:`OneStep`;
    where ``shown`` names a step's ranks, only theirs are its bars (a timeline of 16,384
    ranks shows some)."""

    def __init__(self, step_of: dict[str, int],
                 shown: dict[int, frozenset[int]] | None = None) -> None:
        self.step_of = step_of
        self.shown = shown or {}
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
        shown = self.shown.get(step)
        if shown is not None and rank not in shown:
            return
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
    """``StepSpans(step_of, shown)`` as a picklable factory (the workers make their own)."""

    def __init__(self, step_of: dict[str, int],
                 shown: dict[int, frozenset[int]] | None) -> None:
        self.step_of = step_of
        self.shown = shown

    def __call__(self) -> StepSpans:
        return StepSpans(self.step_of, self.shown)


def start_step_spans(run_dir: Path, step_of: dict[str, int], run_id: str | None,
                     files: list[Path], lines: dict[str, list[tuple[int, int]]],
                     workers: int | None, shown: dict[int, frozenset[int]] | None = None,
                     file_ranks: dict[int, set[int | None]] | None = None
                     ) -> Callable[[], StepSpans]:
    """Pass two started: the steps of ``step_of``'s traces (trace id -> step), read from the
    lines pass one indexed (``files``, ``lines``: its digest's) in the workers, or from every
    traces file where pass one indexed none; the function returned waits for it. ``shown``:
    step -> the ranks whose bars it keeps; ``file_ranks`` (file index -> the ranks of its
    resources, None for one that names none) then leaves out the files of other ranks."""
    make = _NewStepSpans(step_of, shown)
    if not step_of:
        return make
    if files:
        if shown is not None and file_ranks is not None and set(shown) >= set(
                step_of.values()):
            wanted = set().union(*shown.values())
            keep = {i for i, ranks in file_ranks.items()
                    if None in ranks or not ranks.isdisjoint(wanted)}
            lines = {t: [at for at in lines.get(t, ()) if at[0] in keep] for t in step_of}
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
