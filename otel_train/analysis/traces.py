"""Pass one over the traces: the per-rank step table and the collective and compile tallies.

Only ``train.rank_step`` (its phase totals are attributes), ``train.step``, ``train.run``,
``train.collective`` and ``train.compile`` spans are decoded; the per-micro-batch phase spans
are left for the timeline pass over the few slowest steps. Memory is a few numbers per
(step, rank), not per span.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from otel_train import semconv as sc
from otel_train.analysis.otlp import LineIndex, Span, iter_spans, signal_files, spans_at

#: a rank's step time that no phase span covers (e.g. user code between the phases)
UNTIMED = "untimed"
#: phases in the order the report shows them
PHASES = (*sc.TIMED_PHASES, sc.PHASE_EXPOSED_COMM, sc.PHASE_COMPILE, UNTIMED)
PASS_ONE_SPANS = frozenset({sc.SPAN_RANK_STEP, sc.SPAN_STEP, sc.SPAN_RUN, sc.SPAN_COLLECTIVE,
                            sc.SPAN_COMPILE})


@dataclass
class StepTable:
    """Columns of one row per (sampled step, rank)."""

    steps: array = field(default_factory=lambda: array("q"))
    ranks: array = field(default_factory=lambda: array("l"))
    durations: array = field(default_factory=lambda: array("d"))
    phases: dict[str, array] = field(default_factory=lambda: {p: array("d") for p in PHASES})

    def add(self, span: Span) -> None:
        attrs = span.attributes
        self.steps.append(int(attrs.get(sc.ATTR_STEP, -1)))
        self.ranks.append(int(attrs.get(sc.ATTR_RANK, span.resource.get(sc.RES_RANK, 0))))
        duration = float(attrs.get(sc.ATTR_STEP_DURATION, span.duration_s))
        self.durations.append(duration)
        timed = 0.0
        for phase, column in self.phases.items():
            if phase != UNTIMED:
                seconds = float(attrs.get(sc.ATTR_PHASE_TOTAL_PREFIX + phase, 0.0))
                column.append(seconds)
                timed += seconds
        # below a millisecond it is clock noise, not work nobody timed
        untimed = duration - timed
        self.phases[UNTIMED].append(untimed if untimed > 1e-3 else 0.0)

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class CollectiveTally:
    count: int = 0
    total_s: float = 0.0
    bytes: int = 0
    bw_sum: float = 0.0
    bw_count: int = 0
    bw_max: float = 0.0

    def add(self, span: Span) -> None:
        """One collective's span, or a summary span of ``collective.count`` of them."""
        attrs = span.attributes
        count = int(attrs.get(sc.ATTR_COLLECTIVE_COUNT, 1))
        self.count += count
        self.total_s += float(attrs.get(sc.ATTR_COLLECTIVE_TOTAL_S, span.duration_s))
        self.bytes += int(attrs.get(sc.ATTR_COLLECTIVE_BYTES, 0))
        bw = attrs.get(sc.ATTR_COLLECTIVE_BUS_BW)
        if bw is not None:
            self.bw_sum += float(bw) * count
            self.bw_count += count
            self.bw_max = max(self.bw_max, float(bw))


@dataclass
class CompileTally:
    count: int = 0
    total_s: float = 0.0
    graph_breaks: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, span: Span) -> None:
        self.count += 1
        self.total_s += span.duration_s
        self.graph_breaks += int(span.attributes.get(sc.ATTR_COMPILE_GRAPH_BREAKS, 0))
        self.reasons[str(span.attributes.get(sc.ATTR_COMPILE_REASON, "unknown"))] += 1


@dataclass
class TraceDigest:
    table: StepTable = field(default_factory=StepTable)
    step_spans: dict[int, tuple[str, float]] = field(default_factory=dict)  # step: (trace, s)
    step_trace: dict[int, str] = field(default_factory=dict)
    collectives: dict[str, CollectiveTally] = field(default_factory=dict)
    compiles: CompileTally = field(default_factory=CompileTally)
    run_spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank: (start, end)
    run_ids: set[str] = field(default_factory=set)
    world_size: int = 0
    #: pass one's files and where each trace's spans are in them (pass two reads only those)
    files: list[Path] = field(default_factory=list)
    lines: LineIndex = field(default_factory=dict)

    def add(self, span: Span) -> None:
        if span.name == sc.SPAN_RANK_STEP:
            self.table.add(span)
            self.step_trace.setdefault(int(span.attributes.get(sc.ATTR_STEP, -1)), span.trace_id)
            self.world_size = max(self.world_size, int(span.attributes.get(
                sc.ATTR_WORLD_SIZE, span.resource.get(sc.RES_WORLD_SIZE, 0))))
        elif span.name == sc.SPAN_STEP:
            step = int(span.attributes.get(sc.ATTR_STEP, -1))
            self.step_spans[step] = (span.trace_id, span.duration_s)
        elif span.name == sc.SPAN_COLLECTIVE:
            op = str(span.attributes.get(sc.ATTR_COLLECTIVE_OP, "unknown"))
            self.collectives.setdefault(op, CollectiveTally()).add(span)
        elif span.name == sc.SPAN_COMPILE:
            self.compiles.add(span)
        elif span.name == sc.SPAN_RUN:
            rank = int(span.attributes.get(sc.ATTR_RANK, span.resource.get(sc.RES_RANK, 0)))
            self.run_spans[rank] = (span.start_ns, span.end_ns)
        run_id = span.resource.get(sc.RES_RUN_ID)
        if run_id:
            self.run_ids.add(str(run_id))


def read_traces(run_dir: Path, run_id: str | None = None) -> TraceDigest:
    digest = TraceDigest()
    digest.files = signal_files(run_dir, sc.TRACES_GLOB)
    for span in iter_spans(digest.files, names=PASS_ONE_SPANS, run_id=run_id,
                           index=digest.lines):
        digest.add(span)
    return digest


def spans_of_traces(run_dir: Path, trace_ids: set[str], run_id: str | None = None,
                    digest: TraceDigest | None = None) -> list[Span]:
    """Pass two: every span of a few traces. With pass one's ``digest``, only the lines
    that hold them are read (by offset); else lines holding none of them are not parsed."""
    if not trace_ids:
        return []
    if digest is not None and digest.files:
        return list(spans_at(digest.files, digest.lines, trace_ids, run_id))
    needles = tuple(trace_ids)
    return [s for s in iter_spans(signal_files(run_dir, sc.TRACES_GLOB), line_filter=needles,
                                  run_id=run_id) if s.trace_id in trace_ids]
