"""Reading OTLP JSON-lines files back in tests: spans, metric points and log records.

The package's own reader (``otel_train.analysis.otlp``) reads the lines and decodes the
values, so the tests and ``otel-train report`` read files the same way: torn lines salvaged,
``intValue`` strings as ints, arrays as lists, kvlists as dicts. What tests get is each item
as the export request holds it (``traceId``, ``body``, ``exemplars``... untouched, so a test
can assert on any field) plus ``attrs``, its decoded attributes, and, for spans and log
records, ``resource``, the decoded resource attributes.

A run directory's files are written by the SDK's exporter, a whole request per line: the
readers of a run directory (``requests``, ``spans``, ``logs``, ``metric_points``) fail on a
line that is not one whole request, where the package's reader would salvage it. The
collector's files (``file_*``) are read as the package reads them, torn lines salvaged (a
collector killed mid-write leaves one).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.analysis import otlp


def attrs(obj: dict[str, Any]) -> dict[str, Any]:
    return otlp.decode_attributes(obj.get("attributes"))


def file_requests(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """The export requests of ``paths``, one per line; files not written yet hold none. The
    tests poll these files while the collector writes them, so a torn last line is expected:
    its damage is not warned of."""
    return otlp.iter_requests((path for path in map(Path, paths) if path.exists()),
                              otlp.Damage())


def requests(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    """The export requests of a run directory's files matching ``pattern``, each file's lines
    every one a whole request."""
    out = []
    for path in otlp.signal_files(run_dir, pattern):
        with path.open(encoding="utf-8") as f:
            lines = sum(1 for line in f if line.strip())
        found = list(otlp.iter_requests([path]))
        assert len(found) == lines, f"{path}: {lines} lines, {len(found)} whole requests"
        out.extend(found)
    return out


def file_spans(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return _spans(file_requests(paths))


def file_logs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return _logs(file_requests(paths))


def _spans(requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for request in requests:
        for rs in request.get("resourceSpans", []):
            resource = attrs(rs.get("resource", {}))
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    out.append({**span, "attrs": attrs(span), "resource": resource})
    return out


def _logs(requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for request in requests:
        for rl in request.get("resourceLogs", []):
            resource = attrs(rl.get("resource", {}))
            for sl in rl.get("scopeLogs", []):
                scope = sl.get("scope", {})
                for record in sl.get("logRecords", []):
                    out.append({**record, "attrs": attrs(record), "resource": resource,
                                "scope": scope})
    return out


def spans(run_dir: Path) -> list[dict[str, Any]]:
    return _spans(requests(run_dir, semconv.TRACES_GLOB))


def logs(run_dir: Path) -> list[dict[str, Any]]:
    return _logs(requests(run_dir, semconv.LOGS_GLOB))


def metric_points(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """Every data point of metric ``name`` in every export (cumulative: the last one wins)."""
    out = []
    for request in requests(run_dir, semconv.METRICS_GLOB):
        for rm in request.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric["name"] != name:
                        continue
                    body = next(v for v in metric.values()
                                if isinstance(v, dict) and "dataPoints" in v)
                    out.extend({**point, "attrs": attrs(point)} for point in body["dataPoints"])
    return out


def data_points(run_dir: Path) -> int:
    """How many metric data points the run directory's files hold, of every metric and every
    export: the unit the metric signal is counted in (exported, dropped)."""
    return sum(len(body["dataPoints"])
               for request in requests(run_dir, semconv.METRICS_GLOB)
               for rm in request.get("resourceMetrics", [])
               for sm in rm.get("scopeMetrics", [])
               for metric in sm.get("metrics", [])
               for body in metric.values() if isinstance(body, dict) and "dataPoints" in body)


def only_run_dir(root: Path) -> Path:
    dirs = [p for p in Path(root).iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one run directory under {root}, found {dirs}"
    return dirs[0]
