"""A run read live from a trace store, as a run directory: Jaeger's traces of one run id
written out as OTLP JSON lines (``traces.rank-N.jsonl``), one file per rank, so that the
same readers (``report``'s passes, ``compare``'s steps) read them as they read a run's own
files. What Jaeger does not keep is not there: span events (the untimed stretches' lines),
metrics (memory, compile time, goodput: ``not recorded`` in ``compare``), logs.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.otlp import Span

#: Jaeger's own tags on a span (its translation of OTLP fields), not attributes
_JAEGER_TAGS = frozenset({"otel.scope.name", "otel.scope.version", "span.kind",
                          "otel.status_code", "otel.status_description", "error",
                          "internal.span.format", "w3c.tracestate"})
#: spans a line of the written files holds (pass two seeks to lines: keep them short)
SPANS_A_LINE = 256


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in values.items()
            if k not in _JAEGER_TAGS]


def _otlp_span(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": span.trace_id, "spanId": span.span_id, "name": span.name,
        "startTimeUnixNano": str(span.start_ns), "endTimeUnixNano": str(span.end_ns),
        "attributes": _attributes(span.attributes),
    }
    if span.parent_id:
        out["parentSpanId"] = span.parent_id
    if span.links:
        out["links"] = [{"traceId": t, "spanId": s} for t, s in span.links]
    return out


def _rank(span: Span) -> int:
    rank = span.attributes.get(sc.ATTR_RANK, span.resource.get(sc.RES_RANK))
    try:
        return int(rank)
    except (TypeError, ValueError):
        return -1  # a launcher's span: no rank


def write_run(spans: Iterable[Span], run_id: str, into: Path, source: str) -> Path:
    """``spans`` (of run ``run_id``) as the run directory ``into/run_id``: one traces file a
    rank (spans without a rank, a launcher's, with rank 0's), and a ``run.json`` naming
    where they came from. Returns the directory."""
    by_rank: dict[int, dict[str, list[Span]]] = {}
    resources: dict[str, dict[str, Any]] = {}
    for span in spans:
        resource = json.dumps(span.resource, sort_keys=True, default=str)
        resources.setdefault(resource, span.resource)
        scope = str(span.attributes.get("otel.scope.version", ""))
        key = f"{resource}\x1f{span.attributes.get('otel.scope.name', '')}\x1f{scope}"
        by_rank.setdefault(max(_rank(span), 0), {}).setdefault(key, []).append(span)
    run_dir = into / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    for rank, groups in sorted(by_rank.items()):
        with open(run_dir / f"traces.rank-{rank}.jsonl", "w", encoding="utf-8") as out:
            for key, group in groups.items():
                resource_key, scope_name, scope_version = key.split("\x1f")
                group.sort(key=lambda s: s.start_ns)
                for at in range(0, len(group), SPANS_A_LINE):
                    scope: dict[str, Any] = {"name": scope_name}
                    if scope_version:
                        scope["version"] = scope_version
                    line = {"resourceSpans": [{
                        "resource": {"attributes": _attributes(resources[resource_key])},
                        "scopeSpans": [{"scope": scope, "spans": [
                            _otlp_span(s) for s in group[at:at + SPANS_A_LINE]]}]}]}
                    out.write(json.dumps(line, separators=(",", ":")) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "source": source},
                                                 indent=2) + "\n")
    return run_dir


def from_jaeger(base_url: str, run_id: str, into: Path | None = None) -> Path:
    """Run ``run_id``'s traces that the Jaeger at ``base_url`` holds, as a run directory
    under ``into`` (a new temporary directory by default). OSError when Jaeger cannot be
    read or holds no span of the run."""
    from otel_train.check.jaeger import FIX_NOTHING_FOUND, JaegerAPI, fetch_run, spans_of

    fetched = fetch_run(JaegerAPI(base_url), run_id)
    spans = [span for trace in fetched.traces.values() for span in spans_of(trace)
             if str(span.resource.get(sc.RES_RUN_ID, run_id)) == run_id]
    if not any(_rank(span) >= 0 for span in spans):
        raise FileNotFoundError(f"Jaeger at {base_url} holds no span of run {run_id!r}: "
                                f"{FIX_NOTHING_FOUND}")
    if fetched.truncated:
        import warnings

        warnings.warn(f"otel-train: Jaeger at {base_url} returned its search limit of traces "
                      f"for {', '.join(fetched.truncated)}: run {run_id!r} may be read in "
                      "part", stacklevel=2)
    root = into or Path(tempfile.mkdtemp(prefix="otel-train-live-"))
    return write_run(spans, run_id, root, f"jaeger {base_url}")
