"""Reading OTLP JSON-lines files back in tests: spans, metric points and log records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _value(v: dict[str, Any]) -> Any:
    if not v:
        return None
    kind, raw = next(iter(v.items()))
    if kind == "intValue":
        return int(raw)
    return raw


def attrs(obj: dict[str, Any]) -> dict[str, Any]:
    return {kv["key"]: _value(kv.get("value", {})) for kv in obj.get("attributes", [])}


def _lines(run_dir: Path, pattern: str) -> Iterator[dict[str, Any]]:
    for path in sorted(Path(run_dir).glob(pattern)):
        with path.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def spans(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for doc in _lines(run_dir, "traces*.jsonl"):
        for rs in doc.get("resourceSpans", []):
            resource = attrs(rs.get("resource", {}))
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    span = dict(span)
                    span["attrs"] = attrs(span)
                    span["resource"] = resource
                    out.append(span)
    return out


def metric_points(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """Every data point of metric ``name`` in every export (cumulative: the last one wins)."""
    out = []
    for doc in _lines(run_dir, "metrics*.jsonl"):
        for rm in doc.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric["name"] != name:
                        continue
                    body = next(v for k, v in metric.items() if isinstance(v, dict)
                                and "dataPoints" in v)
                    for point in body["dataPoints"]:
                        point = dict(point)
                        point["attrs"] = attrs(point)
                        out.append(point)
    return out


def logs(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for doc in _lines(run_dir, "logs*.jsonl"):
        for rl in doc.get("resourceLogs", []):
            for sl in rl.get("scopeLogs", []):
                for record in sl.get("logRecords", []):
                    record = dict(record)
                    record["attrs"] = attrs(record)
                    out.append(record)
    return out


def only_run_dir(root: Path) -> Path:
    dirs = [p for p in Path(root).iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one run directory under {root}, found {dirs}"
    return dirs[0]
