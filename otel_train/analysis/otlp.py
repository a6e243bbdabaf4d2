"""Streaming reader of OTLP JSON lines: the embedded exporter's run directory and the
collector file exporter's output read the same.

Every line of a ``traces*.jsonl``, ``metrics*.jsonl`` or ``logs*.jsonl`` file is one OTLP
export request. The readers here yield one flat record at a time and never hold more than
one line, so memory stays bounded however long the run was.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.analysis.parallel import start_chunks


def decode_value(value: dict[str, Any]) -> Any:
    """The Python value of one OTLP ``AnyValue`` (ints arrive as strings in OTLP JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [decode_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return decode_attributes(value["kvlistValue"].get("values", []))
    return None


def decode_attributes(attributes: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: decode_value(a.get("value", {})) for a in attributes or ()}


RawAttributes = dict[str, dict[str, Any]]


def raw_attributes(attributes: Iterable[dict[str, Any]] | None) -> RawAttributes:
    """Key -> undecoded ``AnyValue``: the passes over every span decode only the values
    they read (:func:`attribute`), not every value of every span."""
    return {a["key"]: a.get("value", {}) for a in attributes or ()}


def pick_attributes(attributes: Iterable[dict[str, Any]] | None,
                    keys: frozenset[str]) -> RawAttributes:
    """:func:`raw_attributes` of only ``keys``: cheaper than the whole map where a pass
    reads a few of many attributes of every span."""
    picked = {}
    for a in attributes or ():
        key = a["key"]
        if key in keys:
            picked[key] = a.get("value", {})
    return picked


def attribute(attributes: RawAttributes, key: str, default: Any = None) -> Any:
    """``decode_attributes(...).get(key, default)`` of :func:`raw_attributes`' mapping."""
    value = attributes.get(key)
    return default if value is None else decode_value(value)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while streaming.

    Decoded export requests are acyclic, so reference counting frees them; but allocating
    millions of them triggers full collections, each of which walks every object alive in the
    process (torch alone holds millions), which made the reading four times slower.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def signal_files(run_dir: Path, pattern: str) -> list[Path]:
    """The files of one signal (``semconv.TRACES_GLOB`` ...), rank files in rank order."""
    return sorted(Path(run_dir).glob(pattern))


def iter_requests(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """One decoded export request per line. A writer killed mid-line leaves a torn line, and
    a restarted collector (appending) may go on writing on it: what parses whole is kept."""
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield from _decode_line(line)


def _decode_line(line: str) -> Iterator[dict[str, Any]]:
    try:
        yield json.loads(line)
        return
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    for match in _REQUEST_START.finditer(line):
        try:
            request, end = decoder.raw_decode(line, match.start())
        except json.JSONDecodeError:
            continue
        if not line[end:].strip() or _REQUEST_START.match(line, end):
            yield request


_REQUEST_START = re.compile(r'\{"resource(?:Spans|Metrics|Logs)"')


def _resources(request: dict[str, Any], key: str, run_id: str | None
               ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(decoded resource attributes, raw entry) of one request, only run ``run_id``'s."""
    for entry in request.get(key, ()):
        resource = decode_attributes(entry.get("resource", {}).get("attributes"))
        if run_id is None or str(resource.get(semconv.RES_RUN_ID, run_id)) == run_id:
            yield resource, entry


@dataclass(slots=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


#: where a trace's spans are: trace id -> [(file index, byte offset of the line)]
LineIndex = dict[str, list[tuple[int, int]]]


def iter_spans(paths: Iterable[Path], names: frozenset[str] | None = None,
               line_filter: tuple[str, ...] | None = None,
               run_id: str | None = None) -> Iterator[Span]:
    """Spans of the given files; ``names`` keeps only those names (attributes of the others
    are never decoded); ``line_filter`` skips lines that contain none of those strings;
    ``run_id`` keeps only that run's resources (a collector's files hold every run)."""
    for request in _filtered_requests(paths, line_filter):
        for raw, resource in _raw_spans(request, run_id):
            if names is None or raw.get("name") in names:
                yield _span(raw, resource)


def iter_span_batches(path: Path, run_id: str | None = None
                      ) -> Iterator[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
    """(byte offset of its line, decoded resource attributes, raw spans as in the file) of
    every scope's spans in one file, run ``run_id``'s: for the passes over every span,
    which build no :class:`Span` and decode only what they read (a loop over a batch costs
    far less per span than a generator yielding each); the offsets let a later pass read a
    trace's lines only (:func:`spans_at`)."""
    offset = 0
    with open(path, "rb") as lines:
        for line in lines:
            at, offset = offset, offset + len(line)
            if not line.strip():
                continue
            for request in _decode_line(line.decode("utf-8", errors="replace")):
                for resource, resource_spans in _resources(request, "resourceSpans", run_id):
                    for scope_spans in resource_spans.get("scopeSpans", ()):
                        yield at, resource, scope_spans.get("spans", ())


def _raw_spans(request: dict[str, Any], run_id: str | None
               ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(raw span, decoded resource attributes) of one export request, run ``run_id``'s."""
    for resource, resource_spans in _resources(request, "resourceSpans", run_id):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for raw in scope_spans.get("spans", ()):
                yield raw, resource


def spans_at(paths: list[Path], index: LineIndex, trace_ids: set[str],
             run_id: str | None = None, workers: int | None = None) -> list[Span]:
    """The spans of ``trace_ids``, reading only the lines ``index`` (file index in
    ``paths``, offset from :func:`iter_span_batches`) says hold them, in file and line
    order; the files split over ``workers`` processes as in pass one."""
    return start_spans_at(paths, index, trace_ids, run_id, workers)()


def start_spans_at(paths: list[Path], index: LineIndex, trace_ids: set[str],
                   run_id: str | None = None,
                   workers: int | None = None) -> Callable[[], list[Span]]:
    """:func:`spans_at` started in the workers; the function returned waits for it."""
    offsets: dict[int, list[int]] = {}
    for i, offset in sorted({loc for t in trace_ids for loc in index.get(t, ())}):
        offsets.setdefault(i, []).append(offset)
    files = [paths[i] for i in offsets]
    results = start_chunks(spans_in_lines, files, list(offsets.values()), trace_ids, run_id,
                           workers=workers)
    return lambda: [span for part in results() for span in part]


def spans_in_lines(files: list[tuple[int, Path]], offsets: list[list[int]],
                   trace_ids: set[str], run_id: str | None) -> list[Span]:
    """The spans of ``trace_ids`` on the lines at ``offsets[k]`` of each (k, path)."""
    spans = []
    for k, path in files:
        with open(path, "rb") as handle:
            for offset in offsets[k]:
                handle.seek(offset)
                line = handle.readline().decode("utf-8", errors="replace")
                for request in _decode_line(line):
                    for raw, resource in _raw_spans(request, run_id):
                        if raw.get("traceId", "") in trace_ids:
                            spans.append(_span(raw, resource))
    return spans


def _filtered_requests(paths: Iterable[Path],
                       needles: tuple[str, ...] | None) -> Iterator[dict[str, Any]]:
    if needles is None:
        yield from iter_requests(paths)
        return
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if any(needle in line for needle in needles):
                    yield from _decode_line(line)


def _span(raw: dict[str, Any], resource: dict[str, Any]) -> Span:
    return Span(
        name=raw.get("name", ""),
        trace_id=raw.get("traceId", ""),
        span_id=raw.get("spanId", ""),
        parent_id=raw.get("parentSpanId", "") or "",
        start_ns=int(raw.get("startTimeUnixNano", 0)),
        end_ns=int(raw.get("endTimeUnixNano", 0)),
        attributes=decode_attributes(raw.get("attributes")),
        resource=resource,
        links=links_of(raw),
    )


def links_of(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(trace id, span id) of each link of a raw span."""
    return [(lk.get("traceId", ""), lk.get("spanId", "")) for lk in raw.get("links", ())]


@dataclass(slots=True)
class MetricPoint:
    """One data point of one metric in one export; ``kind`` is histogram, sum or gauge."""

    name: str
    kind: str
    unit: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    time_ns: int
    start_ns: int
    value: float = 0.0
    count: int = 0
    bucket_counts: list[int] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)
    exemplars: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rank(self) -> int | None:
        rank = self.attributes.get(semconv.ATTR_RANK, self.resource.get(semconv.RES_RANK))
        return None if rank is None else int(rank)


def iter_metric_points(paths: Iterable[Path], run_id: str | None = None
                       ) -> Iterator[MetricPoint]:
    for request in iter_requests(paths):
        for resource, resource_metrics in _resources(request, "resourceMetrics", run_id):
            for scope_metrics in resource_metrics.get("scopeMetrics", ()):
                for metric in scope_metrics.get("metrics", ()):
                    yield from _points(metric, resource)


def _points(metric: dict[str, Any], resource: dict[str, Any]) -> Iterator[MetricPoint]:
    for kind in ("histogram", "sum", "gauge", "exponentialHistogram"):
        if kind in metric:
            break
    else:
        return  # summaries are not part of the contract
    for raw in metric[kind].get("dataPoints", ()):
        point = MetricPoint(
            name=metric.get("name", ""), kind=kind, unit=metric.get("unit", ""),
            attributes=decode_attributes(raw.get("attributes")), resource=resource,
            time_ns=int(raw.get("timeUnixNano", 0)), start_ns=int(raw.get("startTimeUnixNano", 0)),
            exemplars=raw.get("exemplars", []),
        )
        if kind == "histogram":
            point.value = float(raw.get("sum", 0.0))
            point.count = int(raw.get("count", 0))
            point.bucket_counts = [int(c) for c in raw.get("bucketCounts", ())]
            point.bounds = [float(b) for b in raw.get("explicitBounds", ())]
        elif kind == "exponentialHistogram":
            # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=
            # base2_exponential_bucket_histogram: the same histogram, its buckets as bounds
            point.kind = "histogram"
            point.value = float(raw.get("sum", 0.0))
            point.count = int(raw.get("count", 0))
            point.bounds, point.bucket_counts = _exponential_buckets(raw)
        else:
            point.value = float(raw["asDouble"] if "asDouble" in raw else raw.get("asInt", 0))
        yield point


def _exponential_buckets(raw: dict[str, Any]) -> tuple[list[float], list[int]]:
    """An exponential histogram point's buckets as explicit ones: bounds and counts (one
    more count than bounds, the last above every bound). Positive bucket ``i`` holds values
    in (base**i, base**(i + 1)], base = 2**(2**-scale); zero and negative values go in the
    first bucket, at or below the first positive bucket's lower bound. Durations and sizes
    are never negative."""
    base = 2.0 ** (2.0 ** -int(raw.get("scale", 0)))
    positive = raw.get("positive") or {}
    offset = int(positive.get("offset", 0))
    counts = [int(c) for c in positive.get("bucketCounts", ())]
    negative = sum(int(c) for c in (raw.get("negative") or {}).get("bucketCounts", ()))
    low = int(raw.get("zeroCount", 0)) + negative
    bounds = [base ** offset] + [base ** (offset + k + 1) for k in range(len(counts))]
    return bounds, [low, *counts, 0]


@dataclass(slots=True)
class LogRecord:
    time_ns: int
    severity: str
    body: Any
    trace_id: str
    span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


def iter_log_records(paths: Iterable[Path], run_id: str | None = None
                     ) -> Iterator[LogRecord]:
    for request in iter_requests(paths):
        for resource, resource_logs in _resources(request, "resourceLogs", run_id):
            for scope_logs in resource_logs.get("scopeLogs", ()):
                for raw in scope_logs.get("logRecords", ()):
                    yield LogRecord(
                        time_ns=int(raw.get("timeUnixNano", 0) or raw.get("observedTimeUnixNano", 0)),
                        severity=raw.get("severityText", ""),
                        body=decode_value(raw.get("body", {})),
                        trace_id=raw.get("traceId", "") or "",
                        span_id=raw.get("spanId", "") or "",
                        attributes=decode_attributes(raw.get("attributes")),
                        resource=resource,
                    )


def resolve_run_dir(path: Path, run_id: str | None = None) -> Path:
    """``path`` itself when it holds telemetry, else its run ``run_id`` or newest run."""
    path = Path(path)
    if run_id and signal_files(path / run_id, semconv.TRACES_GLOB):
        return path / run_id
    if signal_files(path, semconv.TRACES_GLOB) or signal_files(path, semconv.METRICS_GLOB):
        return path
    runs = [d for d in path.iterdir() if d.is_dir() and signal_files(d, semconv.TRACES_GLOB)] \
        if path.is_dir() else []
    if not runs:
        raise FileNotFoundError(f"no {semconv.TRACES_GLOB} or {semconv.METRICS_GLOB} in {path}")
    return max(runs, key=lambda d: d.stat().st_mtime)
