"""The trace items of the checklist, from a live Jaeger through its HTTP query API (urllib only).

A run's traces are found by a search on ``training.run.id`` in every service Jaeger knows;
exemplars that Prometheus holds are looked up by trace id. Jaeger's JSON is turned into the
reader's :class:`~otel_train.analysis.otlp.Span` and fed to the same evidence and the same
checks as a run directory's files, so the verdicts mean the same whatever the source.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.metrics import MetricsDigest
from otel_train.analysis.otlp import Span
from otel_train.check import signal_checks, trace_checks
from otel_train.check.evidence import LogEvidence, RunEvidence, TraceEvidence
from otel_train.check.http import get_json
from otel_train.check.verdicts import FAIL, CheckResult

SOURCE = "jaeger"
#: the checklist items Jaeger's traces answer (exemplars too, with Prometheus's exemplars)
ITEMS = ("trace_coverage", "same_trace_across_ranks", "sampling_consistency", "ranks_finished",
         "launcher_context")
#: traces one search may return; a Jaeger whose storage caps search depth lower answers 400
SEARCH_LIMIT = 10_000
#: trace ids per by-id request (each is one ``traceID=`` query parameter)
IDS_PER_REQUEST = 50
#: the query API's own default lookback for searches: runs older than this are not found
LOOKBACK = "2 days"
FIX_NOTHING_FOUND = ("check the run id, that the ranks export OTLP traces to this Jaeger (or "
                     "to a collector that forwards to it) and that its retention covers the run")


class JaegerAPI:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base, self.timeout_s = base_url.rstrip("/"), timeout_s

    def get(self, path: str, params: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
        body = get_json(self.base, path, urllib.parse.urlencode(list(params)), self.timeout_s,
                        "Jaeger")
        if not isinstance(body, dict):
            raise OSError(f"Jaeger at {self.base} answered {path} with no JSON object")
        return body

    def services(self) -> list[str]:
        return sorted(self.get("/api/services").get("data") or ())

    def find_traces(self, service: str, tags: dict[str, str]) -> list[dict[str, Any]]:
        body = self.get("/api/traces", [("service", service), ("tags", json.dumps(tags)),
                                        ("limit", str(SEARCH_LIMIT))])
        if body.get("errors") and not body.get("data"):
            raise OSError(f"Jaeger search in {service!r}: {body['errors']}")
        return body.get("data") or []

    def traces_by_id(self, trace_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The traces of those ids that Jaeger has; unknown ids are left out."""
        ids = sorted(trace_ids)
        found: list[dict[str, Any]] = []
        for i in range(0, len(ids), IDS_PER_REQUEST):
            chunk = ids[i:i + IDS_PER_REQUEST]
            found += self.get("/api/traces", [("traceID", t) for t in chunk]).get("data") or []
        return found


# --- Jaeger JSON -> the reader's spans ------------------------------------------------------


def _hex_id(value: str, width: int) -> str:
    """Jaeger prints ids without leading zeros where the high half is zero; OTLP pads them."""
    return value.lower().rjust(width, "0")


def _tag_value(tag: dict[str, Any]) -> Any:
    value, kind = tag.get("value"), tag.get("type", "string")
    if kind == "int64":
        return int(value)
    if kind == "float64":
        return float(value)
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    return value


def _tags(tags: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    return {t["key"]: _tag_value(t) for t in tags or () if "key" in t}


def _resource(process: dict[str, Any] | None) -> dict[str, Any]:
    process = process or {}
    return {**_tags(process.get("tags")), "service.name": process.get("serviceName", "")}


def spans_of(trace: dict[str, Any]) -> Iterator[Span]:
    """The spans of one trace of the query API's JSON, as the OTLP reader yields them: the
    process's tags are the resource, the CHILD_OF reference is the parent, FOLLOWS_FROM
    references are the links."""
    processes = {pid: _resource(p) for pid, p in (trace.get("processes") or {}).items()}
    for raw in trace.get("spans") or ():
        refs = raw.get("references") or ()
        parent = next((r.get("spanID", "") for r in refs if r.get("refType") == "CHILD_OF"), "")
        start_ns = int(raw.get("startTime", 0)) * 1000
        yield Span(
            name=raw.get("operationName", ""),
            trace_id=_hex_id(raw.get("traceID", ""), 32),
            span_id=_hex_id(raw.get("spanID", ""), 16),
            parent_id=_hex_id(parent, 16) if parent else "",
            start_ns=start_ns,
            end_ns=start_ns + int(raw.get("duration", 0)) * 1000,
            attributes=_tags(raw.get("tags")),
            resource=processes.get(raw.get("processID", "")) or _resource(raw.get("process")),
            links=[(_hex_id(r.get("traceID", ""), 32), _hex_id(r.get("spanID", ""), 16))
                   for r in refs if r.get("refType") == "FOLLOWS_FROM"],
        )


def _of_run(span: Span, run_id: str) -> bool:
    """As the file reader: a resource without a run id (a launcher's) is kept."""
    return str(span.resource.get(sc.RES_RUN_ID, run_id)) == run_id


# --- the checks -----------------------------------------------------------------------------


@dataclasses.dataclass
class Fetched:
    traces: dict[str, dict[str, Any]]  # trace id: the query API's trace
    services: list[str]
    truncated: list[str]  # services whose search hit SEARCH_LIMIT


def fetch_run(api: JaegerAPI, run_id: str, extra_trace_ids: Iterable[str] = ()) -> Fetched:
    """Every trace Jaeger holds with a span of run ``run_id``, plus ``extra_trace_ids``."""
    services = api.services()
    traces: dict[str, dict[str, Any]] = {}
    truncated = []
    for service in services:
        found = api.find_traces(service, {sc.ATTR_RUN_ID: run_id})
        if len(found) >= SEARCH_LIMIT:
            truncated.append(service)
        for trace in found:
            traces.setdefault(_hex_id(trace.get("traceID", ""), 32), trace)
    missing = set(extra_trace_ids) - traces.keys()
    for trace in api.traces_by_id(missing):
        traces.setdefault(_hex_id(trace.get("traceID", ""), 32), trace)
    return Fetched(traces, services, truncated)


def jaeger_evidence(fetched: Fetched, run_id: str, base_url: str,
                    live_exemplars: frozenset[tuple[str, str]]) -> RunEvidence:
    targets = set(live_exemplars)
    target_traces = {t for t, _ in targets}
    traces = TraceEvidence()
    for trace in fetched.traces.values():
        for span in spans_of(trace):
            if _of_run(span, run_id):
                traces.add(span, targets, target_traces)
    # no run directory, no metrics, no logs: the checks fed this read only its traces
    return RunEvidence(Path(base_url), MetricsDigest(), traces, LogEvidence(), False,
                       live_exemplars)


def check_jaeger(base_url: str, run_id: str,
                 live_exemplars: frozenset[tuple[str, str]] | None = None) -> list[CheckResult]:
    """The trace items (coverage, one trace per step, sampling consistency, launcher context)
    from Jaeger's copy of run ``run_id``; with ``live_exemplars`` (from Prometheus) also
    whether each exemplar names a span Jaeger holds."""
    api = JaegerAPI(base_url)
    fetched = fetch_run(api, run_id, {t for t, _ in live_exemplars or ()})
    evidence = jaeger_evidence(fetched, run_id, base_url, live_exemplars or frozenset())
    items = [*trace_checks.CHECKS, signal_checks.launcher_context]
    if not evidence.traces.spans:
        nothing = (f"Jaeger at {api.base} holds no span of run {run_id!r} (searched "
                   f"{sc.ATTR_RUN_ID} in services {fetched.services or 'none'}, last "
                   f"{LOOKBACK})")
        ids = [*ITEMS, *(["exemplars"] if live_exemplars is not None else [])]
        return [CheckResult(i, FAIL, nothing, FIX_NOTHING_FOUND, SOURCE) for i in ids]
    results = [dataclasses.replace(check(evidence), source=SOURCE) for check in items]
    if fetched.truncated:
        results[0].evidence += (f" (searches in {fetched.truncated} hit the limit of "
                                f"{SEARCH_LIMIT} traces: only the newest were read)")
    if live_exemplars is not None:
        row = signal_checks.live_exemplars_resolve(evidence)
        # the same verdict as against a run directory's files, the spans being Jaeger's here
        results.append(dataclasses.replace(
            row, source=f"prometheus+{SOURCE}",
            evidence=row.evidence.replace("in the files", "held by Jaeger")))
    return results
