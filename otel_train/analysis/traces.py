"""Pass one over the traces: the per-rank step table and the collective and compile tallies.

Only ``training.rank_step`` (its phase totals are attributes), ``training.step``, ``training.run``,
``training.collective`` and ``training.compile`` spans are decoded; the per-micro-batch phase spans
are left for the timeline pass over the few slowest steps. Memory is a few numbers per
(step, rank), not per span.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from operator import add
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.arrivals import ARRIVAL_ATTRIBUTES, ArrivalRows
from otel_train.analysis.otlp import (
    LineIndex,
    RawAttributes,
    Span,
    attribute,
    decode_attributes,
    decode_value,
    iter_span_batches,
    iter_spans,
    paused_gc,
    pick_attributes,
    raw_attributes,
    signal_files,
    skip_damaged,
    start_spans_at,
)
from otel_train.analysis.parallel import Chunk, start_chunks
from otel_train.analysis.step_spans import MARKED, StepMarks
from otel_train.analysis.typed import UNSET, TypedSpan, picked_values

#: a rank's step time that no phase span covers (e.g. user code between the phases): its
#: parts device_wait, host_busy and not_explained, added
UNTIMED = "untimed"
#: the report's columns of a rank step, in the order it shows them: the parts of the step's
#: partition (otel_train/partition.py), disjoint and adding up to the step, with the three
#: parts outside the phases added into ``UNTIMED`` (``StepTable.untimed_parts`` splits it)
PHASES = (*sc.TIMED_PHASES, sc.PART_REGIONS, sc.PHASE_EXPOSED_COMM, sc.PHASE_COMPILE, UNTIMED)
#: the regions users named (otel_train.region): one column, each row's largest named apart
REGIONS = sc.PART_REGIONS
#: phase totals that are not a region's (``training.phase_total.<name>``)
_NOT_REGIONS = frozenset({*sc.TIMED_PHASES, *sc.PARTS, sc.PHASE_EXPOSED_COMM,
                          sc.PHASE_COMPILE})
PASS_ONE_SPANS = frozenset({sc.SPAN_RANK_STEP, sc.SPAN_STEP, sc.SPAN_RUN, sc.SPAN_COLLECTIVE,
                            sc.SPAN_COMPILE})
#: the phase spans pass one notes the start of (StepMarks), decoding none of their attributes
_MARKED_ONLY = frozenset(MARKED) - PASS_ONE_SPANS
#: the attributes of a collective's span that pass one reads: five for the tallies, and
#: those that match it across ranks (of a rank_step's it reads most, so it decodes them all)
COLLECTIVE_ATTRIBUTES = frozenset({sc.ATTR_COLLECTIVE_OP, sc.ATTR_COLLECTIVE_COUNT,
                                   sc.ATTR_COLLECTIVE_TOTAL_S, sc.ATTR_COLLECTIVE_BYTES,
                                   sc.ATTR_COLLECTIVE_BUS_BW, *ARRIVAL_ATTRIBUTES})


#: the rank_step attribute of each timed phase, in ``PHASES`` order (``UNTIMED`` is last)
_PHASE_TOTALS = tuple(sc.ATTR_PHASE_TOTAL_PREFIX + p for p in PHASES if p != UNTIMED)
#: the parts of untimed time (sources/gaps/): the host blocked on the device (while it ran
#: work queued outside the phases: its own part), the host busy; what is left of it is not
#: explained
UNTIMED_PARTS = (sc.PHASE_DEVICE_WAIT, sc.PHASE_GPU_OUTSIDE_PHASES, sc.PHASE_HOST_BUSY)
NOT_EXPLAINED = sc.PART_NOT_EXPLAINED
#: phases whose GPU time a GPU run records on its rank steps (sources/gpu/cuda_timing.py)
GPU_PHASES = (sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER)
#: the GPU column of work queued outside the phases (``StepTable.gpu_phases``, beside them)
GPU_OUTSIDE = sc.PHASE_GPU_OUTSIDE_PHASES
_GPU_KEYS = {**{p: sc.ATTR_PHASE_GPU_TOTAL_PREFIX + p for p in GPU_PHASES},
             GPU_OUTSIDE: sc.ATTR_GPU_OUTSIDE_PHASES}
#: the rank_step attribute of each part of the step's partition
_PART_KEYS = {part: sc.ATTR_RANK_STEP_PART_PREFIX + part for part in sc.PARTS}


def step_parts(attrs: dict[str, Any], duration: float) -> dict[str, float]:
    """A rank step's time as the report's columns (``PHASES``: disjoint, summing to
    ``duration``) and the untimed time's parts (``UNTIMED_PARTS``), from its decoded
    attributes.

    A step recorded with its parts (``training.rank_step.part.*``, otel_train/partition.py)
    is read as it is. One recorded before them has only the phases' totals, in which the
    exposed communication and compile time lie inside the compute phases: the excess of the
    totals over the step is taken out of forward, backward and optimizer in proportion, so
    that the columns still add up to the step."""
    get = attrs.get
    if get(_PART_KEYS[sc.PART_FORWARD]) is not None or get(_PART_KEYS[sc.PART_DATA_WAIT]) \
            is not None:
        parts = {part: float(get(key, 0.0)) for part, key in _PART_KEYS.items()}
        out = {phase: parts[phase] for phase in PHASES if phase != UNTIMED}
        out[UNTIMED] = sum(parts[p] for p in (*UNTIMED_PARTS, NOT_EXPLAINED))
        out.update({p: parts[p] for p in UNTIMED_PARTS})
        return out
    out = {phase: float(get(key, 0.0)) for phase, key in zip(PHASES, _PHASE_TOTALS,
                                                              strict=False)}
    excess = sum(out.values()) - duration
    compute = sum(out[p] for p in GPU_PHASES)
    if excess > 0 and compute > 0:
        keep = max(compute - excess, 0.0) / compute
        for phase in GPU_PHASES:
            out[phase] *= keep
    out[UNTIMED] = max(duration - sum(out.values()), 0.0)
    for part in UNTIMED_PARTS:
        out[part] = float(get(sc.ATTR_PHASE_TOTAL_PREFIX + part, 0.0))
    return out


def _regions_of(attrs: dict[str, Any]) -> tuple[str, float]:
    """A rank step's largest region (by its ``training.phase_total.<name>``) and its seconds
    in regions named ``checkpoint``."""
    prefix = sc.ATTR_PHASE_TOTAL_PREFIX
    totals = {key[len(prefix):]: float(value) for key, value in attrs.items()
              if key.startswith(prefix) and key[len(prefix):] not in _NOT_REGIONS}
    largest = max(totals, key=totals.__getitem__) if totals else sc.REGION_OTHER
    return largest, totals.get(sc.REGION_CHECKPOINT, 0.0)


def _sum(values: array) -> float:
    """``values`` added one after another from 0.0, as a running total would have been
    (``sum`` may compensate rounding, which would change the report's last digits)."""
    return reduce(add, values, 0.0)


@dataclass
class Gap:
    """A ``training.gap`` or ``training.data_wait`` event of a rank's step
    (sources/gaps.py): where untimed time or a long data wait lay, and what was sampled."""

    kind: str  # sc.EVENT_GAP or sc.EVENT_DATA_WAIT
    segment: str
    seconds: float
    samples: int
    function: str | None = None
    file: str | None = None
    line: int | None = None
    worker: int | None = None
    #: when it began (epoch ns), and the seconds of it the host was blocked on the device
    start_ns: int = 0
    device_wait_s: float = 0.0
    #: the step whose samples named it, where it had none of its own (a recurring stretch)
    location_step: int | None = None

    @property
    def host_s(self) -> float:
        """The seconds of it the host was not blocked on the device."""
        return self.seconds - self.device_wait_s

    @property
    def location(self) -> str | None:
        """``heavy() at train.py:87``: the user code sampled most in it, if any."""
        if not self.function:
            return None
        name = self.function
        head, sep, tail = name.rpartition(".<locals>.")
        if sep and tail.startswith("<"):  # a generator expression or lambda: its function
            name = head
        where = f"{name}() at {Path(self.file or '?').name}:{self.line}"
        if self.location_step is not None:
            where += f" (as sampled in step {self.location_step})"
        return where

    @classmethod
    def of_event(cls, event: dict[str, Any]) -> Gap | None:
        name = event.get("name")
        if name not in (sc.EVENT_GAP, sc.EVENT_DATA_WAIT):
            return None
        attrs = decode_attributes(event.get("attributes"))
        line = attrs.get(sc.ATTR_CODE_LINE)
        worker = attrs.get(sc.ATTR_DATA_WORKER)
        carried = attrs.get(sc.ATTR_GAP_LOCATION_STEP)
        return cls(name, str(attrs.get(sc.ATTR_GAP_SEGMENT, sc.PHASE_DATA_WAIT)),
                   float(attrs.get(sc.ATTR_GAP_DURATION, 0.0)),
                   int(attrs.get(sc.ATTR_GAP_SAMPLES, 0)), attrs.get(sc.ATTR_CODE_FUNCTION),
                   attrs.get(sc.ATTR_CODE_FILE), int(line) if line is not None else None,
                   int(worker) if worker is not None else None,
                   int(event.get("timeUnixNano", 0)),
                   float(attrs.get(sc.ATTR_GAP_DEVICE_WAIT, 0.0)),
                   int(carried) if carried is not None else None)


@dataclass
class StepTable:
    """Columns of one row per (sampled step, rank)."""

    steps: array = field(default_factory=lambda: array("q"))
    ranks: array = field(default_factory=lambda: array("l"))
    durations: array = field(default_factory=lambda: array("d"))
    phases: dict[str, array] = field(default_factory=lambda: {p: array("d") for p in PHASES})
    #: seconds the rank's cgroup was CPU-throttled in the step (0 where not measured)
    throttled: array = field(default_factory=lambda: array("d"))
    #: row -> its gap and data-wait events (only rows that have some)
    gaps: dict[int, list[Gap]] = field(default_factory=dict)
    #: the untimed time's parts (``UNTIMED_PARTS``), 0 where not recorded
    untimed_parts: dict[str, array] = field(
        default_factory=lambda: {p: array("d") for p in UNTIMED_PARTS})
    #: GPU time of each of ``GPU_PHASES`` and of the work queued outside them
    #: (``GPU_OUTSIDE``), 0 where not recorded (CPU runs)
    gpu_phases: dict[str, array] = field(
        default_factory=lambda: {p: array("d") for p in _GPU_KEYS})
    #: row -> the stretch that held most of its GPU work outside the phases ("between
    #: forward and backward"; only rows that have some)
    gpu_segments: dict[int, str] = field(default_factory=dict)
    #: row -> (the region that held most of its ``regions`` time, the seconds in regions
    #: named ``checkpoint``); only rows with time in regions
    regions: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: the samples and tokens the rank trained in the step (``training.samples``,
    #: ``training.tokens`` of its rank_step span), -1 where the span does not say
    samples: array = field(default_factory=lambda: array("d"))
    tokens: array = field(default_factory=lambda: array("d"))
    #: the step's model FLOPs utilisation (``training.mfu`` of its rank_step span: where
    #: the FLOPs a step and the peak are known), -1 where the span does not say
    mfu: array = field(default_factory=lambda: array("d"))

    def add(self, attrs: dict[str, Any], resource: dict[str, Any], duration_s: float,
            events: list[dict[str, Any]] | None = None) -> None:
        """One ``training.rank_step`` span: its (decoded) attributes, resource, duration and
        (raw) events."""
        if events:
            gaps = [g for g in map(Gap.of_event, events) if g is not None]
            if gaps:
                self.gaps[len(self.steps)] = gaps
        self.throttled.append(float(attrs.get(sc.ATTR_CPU_THROTTLED, 0.0)))
        self.steps.append(int(attrs.get(sc.ATTR_STEP, -1)))
        self.ranks.append(int(attrs.get(sc.ATTR_RANK, resource.get(sc.RES_RANK, 0))))
        duration = float(attrs.get(sc.ATTR_STEP_DURATION, attrs.get(
            sc.ATTR_LEGACY_NAMES[sc.ATTR_STEP_DURATION], duration_s)))
        self.durations.append(duration)
        parts = step_parts(attrs, duration)
        for phase, column in self.phases.items():
            column.append(parts[phase])
        for part, column in self.untimed_parts.items():
            column.append(parts[part])
        for phase, column in self.gpu_phases.items():
            column.append(float(attrs.get(_GPU_KEYS[phase], 0.0)))
        segment = attrs.get(sc.ATTR_GPU_OUTSIDE_SEGMENT)
        if segment:
            self.gpu_segments[len(self.steps) - 1] = str(segment)
        if parts.get(REGIONS):
            self.regions[len(self.steps) - 1] = _regions_of(attrs)
        self.samples.append(float(attrs.get(sc.ATTR_SAMPLES, -1.0)))
        self.tokens.append(float(attrs.get(sc.ATTR_TOKENS, -1.0)))
        self.mfu.append(float(attrs.get(sc.ATTR_MFU, -1.0)))

    def extend(self, other: StepTable) -> None:
        base = len(self.steps)
        self.gaps.update({base + row: gaps for row, gaps in other.gaps.items()})
        self.gpu_segments.update({base + row: s for row, s in other.gpu_segments.items()})
        self.regions.update({base + row: r for row, r in other.regions.items()})
        self.throttled.extend(other.throttled)
        self.steps.extend(other.steps)
        self.ranks.extend(other.ranks)
        self.durations.extend(other.durations)
        for mine, theirs in ((self.phases, other.phases),
                             (self.untimed_parts, other.untimed_parts),
                             (self.gpu_phases, other.gpu_phases)):
            for name, column in mine.items():
                column.extend(theirs[name])
        self.samples.extend(other.samples)
        self.tokens.extend(other.tokens)
        self.mfu.extend(other.mfu)

    def pad(self) -> StepTable:
        """Zeros for the untimed parts and GPU times of rows added without them, and -1
        (not said) for their samples, tokens and MFU (tables built column by column)."""
        for columns in (self.untimed_parts, self.gpu_phases):
            for column in columns.values():
                column.extend([0.0] * (len(self.steps) - len(column)))
        for column in (self.samples, self.tokens, self.mfu):
            column.extend([-1.0] * (len(self.steps) - len(column)))
        return self

    def not_explained(self, row: int) -> float:
        """The row's untimed seconds that neither of its parts holds."""
        held = sum(column[row] for column in self.untimed_parts.values())
        return max(self.phases[UNTIMED][row] - held, 0.0)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class CollectiveTally:
    count: int = 0
    bytes: int = 0
    bw_count: int = 0
    bw_max: float = 0.0
    #: each span's seconds, and its bus bandwidth times its count: summed in span order
    #: when read, so merging files' tallies gives the sums of reading them in one pass
    seconds: array = field(default_factory=lambda: array("d"))
    bw_weighted: array = field(default_factory=lambda: array("d"))

    @property
    def total_s(self) -> float:
        return _sum(self.seconds)

    @property
    def bw_sum(self) -> float:
        return _sum(self.bw_weighted)

    def add(self, values: dict[str, Any], duration_s: float) -> None:
        """One collective's span, or a summary span of ``training.collective.count`` of them
        (``values``: its decoded attributes, those of ``COLLECTIVE_ATTRIBUTES`` at least)."""
        get = values.get
        count = int(get(sc.ATTR_COLLECTIVE_COUNT, 1))
        self.count += count
        self.seconds.append(float(get(sc.ATTR_COLLECTIVE_TOTAL_S, duration_s)))
        self.bytes += int(get(sc.ATTR_COLLECTIVE_BYTES, 0))
        bw = get(sc.ATTR_COLLECTIVE_BUS_BW)
        if bw is not None:
            self.bw_weighted.append(float(bw) * count)
            self.bw_count += count
            self.bw_max = max(self.bw_max, float(bw))

    def merge(self, other: CollectiveTally) -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.bw_count += other.bw_count
        self.bw_max = max(self.bw_max, other.bw_max)
        self.seconds.extend(other.seconds)
        self.bw_weighted.extend(other.bw_weighted)


@dataclass
class CompileTally:
    count: int = 0
    graph_breaks: int = 0
    reasons: Counter = field(default_factory=Counter)
    seconds: array = field(default_factory=lambda: array("d"))

    @property
    def total_s(self) -> float:
        return _sum(self.seconds)

    def add(self, attrs: RawAttributes, duration_s: float) -> None:
        self.count += 1
        self.seconds.append(duration_s)
        self.graph_breaks += int(attribute(attrs, sc.ATTR_COMPILE_GRAPH_BREAKS, 0))
        self.reasons[str(attribute(attrs, sc.ATTR_COMPILE_REASON, "unknown"))] += 1

    def merge(self, other: CompileTally) -> None:
        self.count += other.count
        self.graph_breaks += other.graph_breaks
        self.reasons.update(other.reasons)
        self.seconds.extend(other.seconds)


@dataclass
class TraceDigest:
    table: StepTable = field(default_factory=StepTable)
    step_spans: dict[int, tuple[str, float]] = field(default_factory=dict)  # step: (trace, s)
    step_trace: dict[int, str] = field(default_factory=dict)
    collectives: dict[str, CollectiveTally] = field(default_factory=dict)
    compiles: CompileTally = field(default_factory=CompileTally)
    #: each collective's arrival, to match it across ranks (arrivals.py)
    arrivals: ArrivalRows = field(default_factory=ArrivalRows)
    run_spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank: (start, end)
    #: rank: its training.run spans, one an attempt (a launcher's restart under the run id)
    attempts: dict[int, int] = field(default_factory=dict)
    #: rank: where its first attempt's goodput account began (its process start), epoch ns
    account_starts: dict[int, int] = field(default_factory=dict)
    #: rank: (training.status, status message, steps, end ns) of its training.run span
    run_ends: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)
    #: rank: (step, end ns) of its last training.rank_step
    last_steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: rank: (step, start ns) of its first training.rank_step
    first_steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    run_ids: set[str] = field(default_factory=set)
    world_size: int = 0
    #: pass one's files and where each trace's spans are in them (pass two reads only those)
    files: list[Path] = field(default_factory=list)
    lines: LineIndex = field(default_factory=dict)
    #: file index -> the ranks its resources name (None: a resource that names none)
    file_ranks: dict[int, set[int | None]] = field(default_factory=dict)
    #: each rank's phase starts and collective seconds in each step (the blame's evidence)
    marks: StepMarks = field(default_factory=StepMarks)

    def add(self, raw: dict[str, Any], resource: dict[str, Any]) -> None:
        """One raw span of ``PASS_ONE_SPANS`` (:func:`~otel_train.analysis.otlp.
        iter_span_batches`; :func:`read_trace_files` leaves the others out): only the
        attributes read are decoded."""
        if raw.__class__ is TypedSpan:  # its fields read directly (get is a Python call)
            name, start, end = raw.name, raw.startTimeUnixNano, raw.endTimeUnixNano
            start_ns = int(0 if start is UNSET else start)
            end_ns = int(0 if end is UNSET else end)
        else:
            name = raw.get("name")
            start_ns = int(raw.get("startTimeUnixNano", 0))
            end_ns = int(raw.get("endTimeUnixNano", 0))
        if name == sc.SPAN_RANK_STEP:
            self._add_rank_step(raw, resource, (end_ns - start_ns) / 1e9)
            rank, step = self.table.ranks[-1], self.table.steps[-1]
            if step >= self.last_steps.get(rank, (-1, 0))[0]:
                self.last_steps[rank] = (step, end_ns)
            first = self.first_steps.get(rank)
            if first is None or step < first[0]:
                self.first_steps[rank] = (step, start_ns)
        else:
            self._add_other(name, raw, resource, start_ns, end_ns)
        run_id = resource.get(sc.RES_RUN_ID)
        if run_id:
            self.run_ids.add(str(run_id))

    def _add_rank_step(self, raw: dict[str, Any], resource: dict[str, Any],
                       duration_s: float) -> None:
        attrs = decode_attributes(raw.get("attributes"))  # most are read: all decoded at once
        self.table.add(attrs, resource, duration_s, raw.get("events"))
        self.step_trace.setdefault(int(attrs.get(sc.ATTR_STEP, -1)), raw.get("traceId", ""))
        self.world_size = max(self.world_size, int(attrs.get(
            sc.ATTR_WORLD_SIZE, resource.get(sc.RES_WORLD_SIZE, 0))))

    def _add_other(self, name: str, raw: dict[str, Any], resource: dict[str, Any],
                   start_ns: int, end_ns: int) -> None:
        duration_s = (end_ns - start_ns) / 1e9
        if name == sc.SPAN_COLLECTIVE:
            self._add_collective(raw, resource, start_ns, end_ns)
            return
        attrs = raw_attributes(raw.get("attributes"))
        if name == sc.SPAN_STEP:
            step = int(attribute(attrs, sc.ATTR_STEP, -1))
            self.step_spans[step] = (raw.get("traceId", ""), duration_s)
        elif name == sc.SPAN_COMPILE:
            self.compiles.add(attrs, duration_s)
            self.marks.phase(name, _trace_id(raw), int(attribute(
                attrs, sc.ATTR_RANK, resource.get(sc.RES_RANK, 0))), start_ns)
        elif name == sc.SPAN_RUN:
            rank = int(attribute(attrs, sc.ATTR_RANK, resource.get(sc.RES_RANK, 0)))
            # a rank restarted under the same run id has a run span an attempt: its run is
            # the first's start to the last's end, its attempts counted
            known = self.run_spans.get(rank, (start_ns, end_ns))
            self.run_spans[rank] = (min(known[0], start_ns), max(known[1], end_ns))
            self.attempts[rank] = self.attempts.get(rank, 0) + 1
            account = attribute(attrs, sc.ATTR_GOODPUT_START)
            if account is not None:
                self.account_starts[rank] = min(int(account),
                                                self.account_starts.get(rank, int(account)))
            if end_ns >= self.run_ends.get(rank, ("", "", 0, 0))[3]:  # the last attempt's
                self.run_ends[rank] = (str(attribute(attrs, sc.ATTR_STATUS, "ok")),
                                       str((raw.get("status") or {}).get("message", "")),
                                       int(attribute(attrs, sc.ATTR_STEPS, 0)), end_ns)

    def _add_collective(self, raw: dict[str, Any], resource: dict[str, Any], start_ns: int,
                        end_ns: int) -> None:
        """A collective's span: the tallies, its arrival, its rank's seconds in its step.
        The most numerous spans: only the attributes read are decoded, typed by msgspec
        where it read the line."""
        values = None
        if raw.__class__ is TypedSpan:
            values = picked_values(raw.attributes, COLLECTIVE_ATTRIBUTES)
        if values is None:
            values = {key: decode_value(value) for key, value in pick_attributes(
                raw.get("attributes"), COLLECTIVE_ATTRIBUTES).items()}
        duration_s = (end_ns - start_ns) / 1e9
        get = values.get
        op = str(get(sc.ATTR_COLLECTIVE_OP, "unknown"))
        self.collectives.setdefault(op, CollectiveTally()).add(values, duration_s)
        self.arrivals.add(values, resource, op, start_ns, end_ns)
        seconds = get(sc.ATTR_COLLECTIVE_GPU_DURATION)
        if seconds is None:
            seconds = get(sc.ATTR_COLLECTIVE_TOTAL_S, duration_s)
        self.marks.collective(_trace_id(raw), int(get(sc.ATTR_RANK, resource.get(
            sc.RES_RANK, 0))), float(seconds))

    def mark(self, raw: dict[str, Any], resource: dict[str, Any]) -> None:
        """A phase span of ``_MARKED_ONLY``: its rank's start of it in its step (the rank
        its resource names: reading its attributes for it would cost more than the rest of
        pass one's work on it)."""
        if raw.__class__ is TypedSpan:
            name, start = raw.name, raw.startTimeUnixNano
            start_ns = int(0 if start is UNSET else start)
        else:
            name, start_ns = raw.get("name"), int(raw.get("startTimeUnixNano", 0))
        rank = resource.get(sc.RES_RANK)
        if rank is None:
            rank = attribute(pick_attributes(raw.get("attributes"), _RANK), sc.ATTR_RANK, 0)
        self.marks.phase(name, _trace_id(raw), int(rank), start_ns)

    def merge(self, other: TraceDigest) -> None:
        """Take in the digest of the next files: the same as reading them after these."""
        self.table.extend(other.table)
        self.marks.merge(other.marks)
        for index, ranks in other.file_ranks.items():
            self.file_ranks.setdefault(index, set()).update(ranks)
        self.step_spans.update(other.step_spans)
        for step, trace_id in other.step_trace.items():
            self.step_trace.setdefault(step, trace_id)
        for op, tally in other.collectives.items():
            self.collectives.setdefault(op, CollectiveTally()).merge(tally)
        self.compiles.merge(other.compiles)
        self.arrivals.merge(other.arrivals)
        for rank, (start, end) in other.run_spans.items():
            known = self.run_spans.get(rank, (start, end))
            self.run_spans[rank] = (min(known[0], start), max(known[1], end))
        for rank, n in other.attempts.items():
            self.attempts[rank] = self.attempts.get(rank, 0) + n
        for rank, start in other.account_starts.items():
            self.account_starts[rank] = min(start, self.account_starts.get(rank, start))
        for rank, end in other.run_ends.items():
            if end[3] >= self.run_ends.get(rank, ("", "", 0, 0))[3]:
                self.run_ends[rank] = end
        for rank, last in other.last_steps.items():
            if last[0] >= self.last_steps.get(rank, (-1, 0))[0]:
                self.last_steps[rank] = last
        for rank, first in other.first_steps.items():
            if rank not in self.first_steps or first[0] < self.first_steps[rank][0]:
                self.first_steps[rank] = first
        self.run_ids |= other.run_ids
        self.world_size = max(self.world_size, other.world_size)
        for trace_id, where in other.lines.items():
            self.lines.setdefault(trace_id, []).extend(where)


def _trace_id(raw: dict[str, Any]) -> str:
    """A raw span's trace id, "" where it has none (as json's dict's ``get`` says)."""
    if raw.__class__ is TypedSpan:
        trace_id = raw.traceId
        return "" if trace_id is UNSET else trace_id
    return raw.get("traceId", "")


_RANK = frozenset({sc.ATTR_RANK})
_NO_START = 1 << 63  # later than any start: a span whose start is damaged sets no origin


def _start_ns(value: Any) -> int:
    """A span's start (epoch ns) for its trace's origin; a damaged one damages no line here
    (pass one reads no other field of a span of another kind)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return _NO_START


def _resource_rank(resource: dict[str, Any]) -> int | None:
    """The rank a resource names, None where it names none (or not as a number)."""
    try:
        return int(resource[sc.RES_RANK])
    except (KeyError, TypeError, ValueError):
        return None


def read_traces(run_dir: Path, run_id: str | None = None,
                workers: int | None = None) -> TraceDigest:
    """Pass one over every traces file, the files split over ``workers`` processes (None: as
    many as pay off, :func:`~otel_train.analysis.parallel.worker_count`)."""
    return start_reading_traces(run_dir, run_id, workers)()


def start_reading_traces(run_dir: Path, run_id: str | None = None,
                         workers: int | None = None) -> Callable[[], TraceDigest]:
    """:func:`read_traces` started in the workers; the function returned waits for it."""
    files = signal_files(run_dir, sc.TRACES_GLOB)
    results = start_chunks(read_trace_files, files, run_id, workers=workers)

    def digest() -> TraceDigest:
        parts: list[TraceDigest | None] = list(results())
        merged = parts[0]
        assert merged is not None
        for k in range(1, len(parts)):
            merged.merge(parts[k])  # type: ignore[arg-type]
            parts[k] = None  # freed once merged: the workers' digests are large
        merged.files = files
        return merged

    return digest


def read_trace_files(files: Chunk, run_id: str | None = None) -> TraceDigest:
    """Pass one over (index in the run's files, path) ``files``, one after another."""
    digest = TraceDigest()
    lines = digest.lines
    with paused_gc():
        for file_index, path in files:
            for offset, resource, spans in iter_span_batches(path, run_id):
                part = TraceDigest()  # a field of the wrong type leaves out its line only
                origins: dict[str, int] = {}  # trace id -> its earliest start here
                with skip_damaged(path, offset):
                    if spans and spans[0].__class__ is TypedSpan:  # a line's are all, or none
                        for raw in spans:  # fields read directly: get is a Python call
                            name = raw.name
                            if name in PASS_ONE_SPANS:
                                part.add(raw, resource)
                            elif name in _MARKED_ONLY:
                                part.mark(raw, resource)
                            trace_id, start = raw.traceId, raw.startTimeUnixNano
                            if trace_id is UNSET:  # no trace id: json's dict says "" (get's)
                                trace_id = ""
                            start = _start_ns(0 if start is UNSET else start)
                            first = origins.get(trace_id)
                            if first is None or start < first:
                                origins[trace_id] = start
                    else:
                        for raw in spans:
                            name = raw.get("name")
                            if name in PASS_ONE_SPANS:
                                part.add(raw, resource)
                            elif name in _MARKED_ONLY:
                                part.mark(raw, resource)
                            trace_id = raw.get("traceId", "")
                            start = _start_ns(raw.get("startTimeUnixNano", 0))
                            first = origins.get(trace_id)
                            if first is None or start < first:
                                origins[trace_id] = start
                    for trace_id, start in origins.items():
                        if start != _NO_START:
                            part.marks.origin(trace_id, start)
                    part.file_ranks[file_index] = {_resource_rank(resource)}
                    digest.merge(part)
                    for trace_id in origins:
                        where = lines.setdefault(trace_id, [])
                        if not where or where[-1] != (file_index, offset):
                            where.append((file_index, offset))
    return digest


def spans_of_traces(run_dir: Path, trace_ids: set[str], run_id: str | None = None,
                    digest: TraceDigest | None = None,
                    workers: int | None = None) -> list[Span]:
    """Pass two: every span of a few traces. With pass one's ``digest``, only the lines
    that hold them are read (by offset, the files split over ``workers`` processes); else
    lines holding none of them are not parsed."""
    return start_spans_of_traces(run_dir, trace_ids, run_id, digest, workers)()


def start_spans_of_traces(run_dir: Path, trace_ids: set[str], run_id: str | None = None,
                          digest: TraceDigest | None = None,
                          workers: int | None = None) -> Callable[[], list[Span]]:
    """:func:`spans_of_traces` started (in the workers, with a ``digest``); the function
    returned waits for it."""
    if not trace_ids:
        return list
    if digest is not None and digest.files:
        return start_spans_at(digest.files, digest.lines, trace_ids, run_id, workers)
    needles = tuple(trace_ids)
    return lambda: [s for s in iter_spans(signal_files(run_dir, sc.TRACES_GLOB),
                                          line_filter=needles, run_id=run_id)
                    if s.trace_id in trace_ids]
