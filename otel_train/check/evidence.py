"""What a run directory shows about the checklist, gathered in one streaming pass per signal.

Per sampled step only a few small numbers are kept (trace ids, rank bitmasks per phase), so
memory grows with the number of sampled steps, never with the number of spans.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.metrics import MetricsDigest, read_metrics
from otel_train.analysis.otlp import (
    Damage,
    FileDamage,
    Span,
    decode_value,
    iter_log_records,
    iter_span_batches,
    links_of,
    paused_gc,
    pick_attributes,
    signal_files,
    skip_damaged,
)
from otel_train.analysis.parallel import Chunk, start_chunks
from otel_train.analysis.typed import TypedSpan, decode_raw, picked_values

SPAN_PHASE = {span: phase for phase, span in sc.PHASE_SPAN.items()}
#: the span kinds whose ranks and counts are checked per step
SPAN_KIND = {**SPAN_PHASE, sc.SPAN_RANK_STEP: "rank_step"}
#: the only span attributes the checks read
READ_ATTRIBUTES = frozenset({sc.ATTR_RANK, sc.ATTR_WORLD_SIZE, sc.ATTR_STEP})
#: and, of a training.run span, how the rank's run ended
RUN_ATTRIBUTES = frozenset({sc.ATTR_RANK, sc.ATTR_STATUS, sc.ATTR_STEPS})
#: the signals of a run directory, as its files' names begin
SIGNALS = ("traces", "metrics", "logs")
#: a rank's own file of one signal, as the embedded file exporter names it
RANK_FILE = re.compile(r"(traces|metrics|logs)\.rank-(\d+)\.jsonl")


#: name, trace id, span id, parent id, links, rank, world size, step (the last three as
#: decoded, None where the span has none)
SpanRow = tuple[str, str, str, str, list[tuple[str, str]], Any, Any, Any]


@dataclass
class RunSpan:
    trace_id: str
    parent_id: str
    links: list[tuple[str, str]]


@dataclass
class TraceEvidence:
    spans: int = 0
    world_size: int = 0
    ranks: set[int] = field(default_factory=set)
    step_trace: dict[int, str] = field(default_factory=dict)  # the first trace id seen
    extra_traces: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    roots: dict[int, str] = field(default_factory=dict)  # step: training.step span id
    rank_step_parents: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: (step, phase or "rank_step"): bitmask of the ranks seen, and the number of spans
    rank_masks: dict[tuple[int, str], int] = field(default_factory=dict)
    span_counts: dict[tuple[int, str], int] = field(default_factory=dict)
    run_spans: dict[int, RunSpan] = field(default_factory=dict)
    #: how each rank's run ended, as analysis/fates.py reads it: rank -> (training.status,
    #: status message, steps, end ns) of its training.run span, and rank -> (step, end ns) of
    #: its last training.rank_step
    run_ends: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)
    last_steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    resolved: set[tuple[str, str]] = field(default_factory=set)  # exemplar targets found
    traces_seen_of_targets: set[str] = field(default_factory=set)
    #: the traces files' lines that could not be read whole
    damage: Damage = field(default_factory=Damage)

    def add(self, span: Span, targets: set[tuple[str, str]], target_traces: set[str]) -> None:
        attrs = span.attributes
        rank = attrs.get(sc.ATTR_RANK, span.resource.get(sc.RES_RANK))
        # Jaeger's copy of the OTLP status message is the otel.status_description tag
        self._note_fate(span.name, rank, attrs.get(sc.ATTR_STEP), attrs.get(sc.ATTR_STATUS),
                        attrs.get("otel.status_description", ""), attrs.get(sc.ATTR_STEPS),
                        span.end_ns)
        self._add_rows([(span.name, span.trace_id, span.span_id, span.parent_id, span.links,
                         rank,
                         attrs.get(sc.ATTR_WORLD_SIZE, span.resource.get(sc.RES_WORLD_SIZE)),
                         attrs.get(sc.ATTR_STEP))], targets, target_traces)

    def add_batch(self, spans: list[dict[str, Any]], resource: dict[str, Any],
                  targets: set[tuple[str, str]], target_traces: set[str]) -> None:
        """:meth:`add` of each span of one batch as it is in the file
        (:func:`~otel_train.analysis.otlp.iter_span_batches`), decoding only the three
        attributes read."""
        resource_rank = resource.get(sc.RES_RANK)
        resource_size = resource.get(sc.RES_WORLD_SIZE)
        key_rank, key_size, key_step, run, rank_step = (
            sc.ATTR_RANK, sc.ATTR_WORLD_SIZE, sc.ATTR_STEP, sc.SPAN_RUN, sc.SPAN_RANK_STEP)
        rows = []
        fast = bool(spans) and spans[0].__class__ is TypedSpan  # a line's are all, or none
        for raw in spans:
            values = None
            if fast:  # its fields read directly, its attributes decoded here (typed.py)
                name, trace_id, span_id, parent_id = raw.ids()
                encoded = raw.attributes
                values = picked_values(encoded, READ_ATTRIBUTES)
                if values is None:  # a value msgspec does not type: json's way, below
                    attrs = pick_attributes(decode_raw(encoded), READ_ATTRIBUTES)
            else:
                attrs = pick_attributes(raw.get("attributes"), READ_ATTRIBUTES)
                name, trace_id, span_id, parent_id = (
                    raw.get("name", ""), raw.get("traceId", ""), raw.get("spanId", ""),
                    raw.get("parentSpanId", "") or "")
            if values is None:
                values = {key: decode_value(value) for key, value in attrs.items()}
            get = values.get
            rank = get(key_rank, resource_rank)
            step = get(key_step)
            if name == run or name == rank_step:
                self._fate_of(name, raw, rank, step)
            rows.append((name, trace_id, span_id, parent_id,
                         links_of(raw) if name == run else [], rank,
                         get(key_size, resource_size), step))
        self._add_rows(rows, targets, target_traces)

    def _fate_of(self, name: str, raw: dict[str, Any], rank: Any, step: Any) -> None:
        """:meth:`_note_fate` of a raw OTLP span, its values still encoded."""
        status = steps = None
        if name == sc.SPAN_RUN:
            attrs = pick_attributes(raw.get("attributes"), RUN_ATTRIBUTES)
            status, steps = attrs.get(sc.ATTR_STATUS), attrs.get(sc.ATTR_STEPS)
        self._note_fate(name, rank, step,
                        None if status is None else decode_value(status),
                        (raw.get("status") or {}).get("message", ""),
                        None if steps is None else decode_value(steps),
                        int(raw.get("endTimeUnixNano", 0)))

    def _note_fate(self, name: str, rank: Any, step: Any, status: Any, message: Any,
                   steps: Any, end_ns: int) -> None:
        """What a training.run or training.rank_step span says of how its rank's run ended."""
        if rank is None:
            return
        if name == sc.SPAN_RUN:
            self.run_ends[int(rank)] = ("ok" if status is None else str(status),
                                        str(message or ""), int(steps or 0), end_ns)
        elif name == sc.SPAN_RANK_STEP and step is not None:
            self._last_step(int(rank), int(step), end_ns)

    def _last_step(self, rank: int, step: int, end_ns: int) -> None:
        if step >= self.last_steps.get(rank, (-1, 0))[0]:
            self.last_steps[rank] = (step, end_ns)

    def _add_rows(self, rows: list[SpanRow], targets: set[tuple[str, str]],
                  target_traces: set[str]) -> None:
        """One loop over many spans, with what it touches in locals (it runs once for every
        span of the run: a method call per span cost more than the work it did)."""
        ranks, step_trace, masks, counts = (self.ranks, self.step_trace, self.rank_masks,
                                            self.span_counts)
        world, run, step_root, rank_step = (self.world_size, sc.SPAN_RUN, sc.SPAN_STEP,
                                            sc.SPAN_RANK_STEP)
        self.spans += len(rows)
        for name, trace_id, span_id, parent_id, links, rank, size, step in rows:
            if rank is not None:
                rank = int(rank)
                ranks.add(rank)
            if size is not None and int(size) > world:
                world = int(size)
            if trace_id in target_traces:
                self.traces_seen_of_targets.add(trace_id)
                if (trace_id, span_id) in targets:
                    self.resolved.add((trace_id, span_id))
            if name == run and rank is not None:
                self.run_spans[rank] = RunSpan(trace_id, parent_id, links)
            if step is None:
                continue
            step = int(step)
            if step_trace.setdefault(step, trace_id) != trace_id:
                self.extra_traces[step].add(trace_id)
            if name == step_root:
                self.roots[step] = span_id
                continue
            kind = SPAN_KIND.get(name)
            if kind is None or rank is None:
                continue
            if name == rank_step:
                self.rank_step_parents[step].add(parent_id)
            key = (step, kind)
            masks[key] = masks.get(key, 0) | 1 << rank
            counts[key] = counts.get(key, 0) + 1
        self.world_size = world

    def merge(self, other: TraceEvidence) -> None:
        """Take in the evidence of the next files: the same as reading their spans after
        this evidence's."""
        self.spans += other.spans
        self.world_size = max(self.world_size, other.world_size)
        self.ranks |= other.ranks
        for step, first in other.step_trace.items():
            mine = self.step_trace.setdefault(step, first)
            seen = {first} | other.extra_traces.get(step, set())
            if seen - {mine}:
                self.extra_traces[step] |= seen - {mine}
        self.roots.update(other.roots)
        for step, parents in other.rank_step_parents.items():
            self.rank_step_parents[step] |= parents
        masks, counts = self.rank_masks, self.span_counts
        for key, mask in other.rank_masks.items():
            masks[key] = masks.get(key, 0) | mask
        for key, count in other.span_counts.items():
            counts[key] = counts.get(key, 0) + count
        self.run_spans.update(other.run_spans)
        self.run_ends.update(other.run_ends)
        for rank, (step, end_ns) in other.last_steps.items():
            self._last_step(rank, step, end_ns)
        self.resolved |= other.resolved
        self.traces_seen_of_targets |= other.traces_seen_of_targets
        self.damage.merge(other.damage)


def read_trace_files(files: Chunk, run_id: str | None, targets: set[tuple[str, str]],
                     target_traces: set[str]) -> TraceEvidence:
    """The evidence of (index, path) ``files``, read one after another (a worker's share of
    :func:`gather`)."""
    evidence = TraceEvidence()
    damage = evidence.damage
    with paused_gc():
        for _, path in files:
            for offset, resource, spans in iter_span_batches(path, run_id, damage):
                # a field of the wrong type damages its line only: each line is added to
                # a part of its own, merged once all of it was read
                part = TraceEvidence()
                with skip_damaged(path, offset, damage):
                    part.add_batch(spans, resource, targets, target_traces)
                    evidence.merge(part)
    return evidence


@dataclass
class LogEvidence:
    records: int = 0
    missing: Counter = field(default_factory=Counter)  # field: records without it
    timed: int = 0  # records with phase
    timed_without_duration: int = 0
    example_missing: dict[str, str] = field(default_factory=dict)

    def add(self, trace_id: str, span_id: str, attrs: dict, body: object) -> None:
        """One record: its context's ids and its attributes, by their OpenTelemetry names, as
        Loki stores them (dots as underscores) or by their names before 0.2.0."""
        self.records += 1
        present = {sc.LOG_TRACE_ID: bool(trace_id.strip("0") or attrs.get(sc.LOG_TRACE_ID)),
                   sc.LOG_SPAN_ID: bool(span_id.strip("0") or attrs.get(sc.LOG_SPAN_ID))}
        for name in sc.LOG_REQUIRED_FIELDS:
            if not present.get(name, log_field(attrs, name) not in (None, "")):
                self.missing[name] += 1
                self.example_missing.setdefault(name, str(body)[:80])
        if log_field(attrs, sc.LOG_PHASE) is not None:
            self.timed += 1
            if log_field(attrs, sc.LOG_DURATION) is None:
                self.timed_without_duration += 1


def log_field(attrs: dict, name: str) -> Any:
    """A log record's field ``name`` (a semconv.LOG_* name): under that name, as Loki's OTLP
    ingestion stores it (``training_run_id``), or under its name before 0.2.0."""
    for key in (name, name.replace(".", "_"), sc.LOG_LEGACY_NAMES.get(name)):
        if key is not None and attrs.get(key) is not None:
            return attrs[key]
    return None


@dataclass
class RunEvidence:
    run_dir: Path
    metrics: MetricsDigest
    traces: TraceEvidence
    logs: LogEvidence
    has_logs: bool
    live_exemplars: frozenset[tuple[str, str]] = frozenset()
    #: the lines of every signal's files that could not be read whole
    damage: Damage = field(default_factory=Damage)
    #: rank files that should be there and are not (:func:`missing_rank_files`)
    missing: list[Path] = field(default_factory=list)

    def file_causes(self, signals: Iterable[str]) -> list[str]:
        """The files of ``signals`` that could not be read whole, each with what is wrong in
        a few words: what an item read from them names as the likely cause of its failure
        (``telemetry_complete`` says it at length)."""
        wanted = set(signals)
        causes = [f"{path} ({_in_short(found)})" for path, found in self.damage.files.items()
                  if signal_of(path) in wanted]
        return causes + [f"{path} (missing)" for path in self.missing
                         if signal_of(path) in wanted]


def signal_of(path: Path) -> str | None:
    """The signal whose telemetry a file holds, by its name (``traces.rank-0.jsonl``)."""
    return next((signal for signal in SIGNALS if path.name.startswith(signal)), None)


def _in_short(found: FileDamage) -> str:
    torn = found.lines - (found.truncated_at is not None)
    parts = [f"{torn} damaged line{'s' if torn > 1 else ''}"] if torn else []
    if found.truncated_at is not None:
        parts.append(f"truncated in line {found.truncated_at}")
    return ", ".join(parts)


def missing_rank_files(run_dir: Path, world_size: int) -> list[Path]:
    """The rank files (``traces.rank-<N>.jsonl``...) of ranks below ``world_size`` that are
    not there, of each signal some rank wrote a file of: the embedded exporter makes each
    rank's file as it starts, so a missing one is a rank that never started instrumented, or
    a copy of the run that left it out. A signal with no rank file at all is not missing: its
    exporter was off, or a collector wrote the files (named otherwise)."""
    present: dict[str, set[int]] = defaultdict(set)
    for path in Path(run_dir).glob("*.rank-*.jsonl"):
        match = RANK_FILE.fullmatch(path.name)
        if match:
            present[match[1]].add(int(match[2]))
    return [Path(run_dir) / f"{signal}.rank-{rank}.jsonl" for signal in SIGNALS
            if present[signal] for rank in range(world_size) if rank not in present[signal]]


def declared_world_size(run_dir: Path, run_id: str | None = None) -> int:
    """The world size rank 0 wrote to run.json (0 where there is none, or it is of another
    run): it counts the ranks whose files are all missing, which the spans cannot."""
    try:
        info = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
        if run_id and info.get("run_id") != run_id:
            return 0
        return max(0, int(info.get("world_size") or 0))
    except (OSError, ValueError, TypeError, AttributeError):  # none, or damaged: no claim
        return 0


def gather(run_dir: Path, run_id: str | None = None,
           live_exemplars: frozenset[tuple[str, str]] = frozenset(),
           workers: int | None = None) -> RunEvidence:
    """``live_exemplars``: (trace id, span id) of exemplars a live Prometheus holds for this
    run, resolved against the files' spans in the same pass; ``workers`` processes read the
    traces files (None: one per CPU when the files are large; the evidence is the same
    whatever the number)."""
    with paused_gc():
        return _gather(run_dir, run_id, live_exemplars, workers)


def _gather(run_dir: Path, run_id: str | None, live_exemplars: frozenset[tuple[str, str]],
            workers: int | None) -> RunEvidence:
    damage = Damage()
    metrics = read_metrics(run_dir, run_id, damage)
    targets = {(e.trace_id, e.span_id) for e in metrics.exemplars} | live_exemplars
    target_traces = {t for t, _ in targets}
    reading = start_chunks(read_trace_files, signal_files(run_dir, sc.TRACES_GLOB),
                           run_id, targets, target_traces, workers=workers)
    logs, log_damage = LogEvidence(), Damage()
    log_files = signal_files(run_dir, sc.LOGS_GLOB)
    try:  # the logs read while the workers read the traces
        for record in iter_log_records(log_files, run_id, log_damage):
            logs.add(record.trace_id, record.span_id, record.attributes, record.body)
    finally:
        traces, *rest = reading()  # never leaves the workers behind
    for part in rest:
        traces.merge(part)
    damage.merge(traces.damage)
    damage.merge(log_damage)  # named after the traces', as when the logs were read last
    world = max(traces.world_size, max(traces.ranks, default=-1) + 1,
                declared_world_size(run_dir, run_id))
    return RunEvidence(run_dir, metrics, traces, logs, bool(log_files), live_exemplars,
                       damage, missing_rank_files(run_dir, world))
