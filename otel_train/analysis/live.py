"""A run read live, as a run directory: Jaeger's traces of one run id written out as OTLP
JSON lines (``traces.rank-N.jsonl``), one file per rank, and (``compare --prometheus``) the
run's totals from Prometheus (memory, overlap, compile, goodput, MFU: each series' last
value) as one metrics file, so that the same readers (``report``'s passes, ``compare``'s
steps) read them as they read a run's own files. What the stores do not keep is not there:
span events (the untimed stretches' lines), logs, and without ``--prometheus`` the metrics
(``not recorded`` in ``compare``).
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
    start_ns: int | None = None
    for span in spans:
        if start_ns is None or span.start_ns < start_ns:
            start_ns = span.start_ns
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
    (run_dir / "run.json").write_text(json.dumps(
        {"run_id": run_id, "source": source, "start_ns": start_ns}, indent=2) + "\n")
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


# --- Prometheus: the run totals -------------------------------------------------------------

#: the metrics ``report`` and ``compare`` read as run totals (memory, overlap, compile,
#: goodput, throttling, MFU): what a run directory's metrics files give them, read here from
#: Prometheus. The per-step figures come from the traces (``--jaeger``), never from here
PROMETHEUS_METRICS = (
    sc.METRIC_MEMORY_ALLOCATED_PEAK, sc.METRIC_MEMORY_RESERVED, sc.METRIC_COMM_OVERLAP,
    sc.METRIC_CPU_THROTTLED_TIME, sc.METRIC_COMPILE_DURATION, sc.METRIC_COMPILE_RECOMPILES,
    sc.METRIC_COMPILE_GRAPH_BREAKS, sc.METRIC_GOODPUT_TIME, sc.METRIC_MFU,
)
#: how far back Prometheus is asked when the run's start is not known (its traces' first span)
DEFAULT_LOOKBACK_S = 6 * 3600
#: the metrics file written beside the traces
PROMETHEUS_FILE = "metrics.prometheus.jsonl"


def _attribute_names() -> dict[str, str]:
    """Prometheus label -> the contract's attribute (every ``ATTR_``/``RES_`` name of
    semconv): the labels that are not one (job, instance, scope) are left out."""
    names = {}
    for key, value in vars(sc).items():
        if key.startswith(("ATTR_", "RES_")) and isinstance(value, str) and "." in value:
            names[sc.prometheus_label(value)] = value
    return names


def _prometheus_points(api: Any, metric: sc.Metric, run_id: str, lookback_s: int,
                       labels: dict[str, str]) -> dict[tuple[tuple[str, str], ...], dict]:
    """Each series' last value in the window, by its attribute set: ``{"value": v}`` (a
    histogram's ``{"sum": s, "count": n}``). The same series scraped twice (a rank's own
    endpoint and the collector's) counts once: the largest value."""
    selector = f'{sc.PROM_RUN_LABEL}="{_promql_string(run_id)}"'
    window = f"[{lookback_s}s]"
    queries: list[tuple[str, str]] = []
    name = metric.prometheus
    if metric.kind == sc.HISTOGRAM:
        queries += [("sum", f'last_over_time({{__name__="{name}_sum",{selector}}}{window})'),
                    ("count", f'last_over_time({{__name__="{name}_count",{selector}}}{window})'),
                    ("sum", f'histogram_sum(last_over_time({{__name__="{name}",{selector}}}'
                            f'{window}))'),
                    ("count", f'histogram_count(last_over_time({{__name__="{name}",'
                              f'{selector}}}{window}))')]
    else:
        queries.append(("value", f'last_over_time({{__name__="{name}",{selector}}}{window})'))
    out: dict[tuple[tuple[str, str], ...], dict] = {}
    for field_name, promql in queries:
        for series in api.query(promql):
            attrs = tuple(sorted((labels[k], v) for k, v in series.get("metric", {}).items()
                                 if k in labels))
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            point = out.setdefault(attrs, {})
            point[field_name] = max(point.get(field_name, value), value)
    return out


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _otlp_metric(metric: sc.Metric, points: dict[tuple[tuple[str, str], ...], dict],
                 time_ns: int) -> dict[str, Any]:
    rows = []
    for attrs, values in points.items():
        row: dict[str, Any] = {"attributes": _attributes(_typed(dict(attrs))),
                               "timeUnixNano": str(time_ns)}
        if metric.kind == sc.HISTOGRAM:
            row["sum"] = values.get("sum", 0.0)
            row["count"] = str(int(values.get("count", 0)))
        else:
            row["asDouble"] = values.get("value", 0.0)
        rows.append(row)
    body: dict[str, Any] = {"dataPoints": rows}
    kind = {sc.HISTOGRAM: "histogram", sc.COUNTER: "sum", sc.GAUGE: "gauge"}[metric.kind]
    if kind != "gauge":
        body["aggregationTemporality"] = 2  # cumulative, as the SDK exports them
    if kind == "sum":
        body["isMonotonic"] = True
    return {"name": metric.name, "unit": metric.unit, kind: body}


def _typed(attrs: dict[str, str]) -> dict[str, Any]:
    """Label values back to the types the contract gives them: ranks are integers."""
    out: dict[str, Any] = dict(attrs)
    for key in (sc.ATTR_RANK, sc.RES_RANK, sc.ATTR_WORLD_SIZE):
        if key in out:
            try:
                out[key] = int(out[key])
            except ValueError:
                pass
    return out


def add_prometheus(base_url: str, run_id: str, run_dir: Path,
                   start_ns: int | None = None) -> int:
    """Run ``run_id``'s totals that the Prometheus at ``base_url`` holds (each series' last
    value since ``start_ns``, the run's start, or :data:`DEFAULT_LOOKBACK_S`), written into
    ``run_dir`` as an OTLP JSON-lines metrics file the run's readers read as its own. Returns
    the series written; OSError where Prometheus cannot be read."""
    import time

    from otel_train import __version__
    from otel_train.check.prometheus import PrometheusAPI

    api = PrometheusAPI(base_url)
    now_ns = time.time_ns()
    lookback = DEFAULT_LOOKBACK_S if start_ns is None else \
        max(int((now_ns - start_ns) / 1e9) + 60, 60)
    labels = _attribute_names()
    metrics = []
    series = 0
    for name in PROMETHEUS_METRICS:
        metric = sc.METRICS[name]
        points = _prometheus_points(api, metric, run_id, lookback, labels)
        if points:
            metrics.append(_otlp_metric(metric, points, now_ns))
            series += len(points)
    line = {"resourceMetrics": [{
        "resource": {"attributes": _attributes({sc.RES_RUN_ID: run_id})},
        "scopeMetrics": [{"scope": {"name": sc.SCOPE_NAME, "version": __version__},
                          "metrics": metrics}]}]}
    with open(run_dir / PROMETHEUS_FILE, "w", encoding="utf-8") as out:
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return series


def first_start_ns(run_dir: Path) -> int | None:
    """The run's start as its written traces say (the earliest span start), for the window
    Prometheus is asked about."""
    meta = run_dir / "run.json"
    try:
        value = json.loads(meta.read_text(encoding="utf-8")).get("start_ns")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) else None
