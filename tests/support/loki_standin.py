"""A stand-in for Loki's HTTP API, for testing ``otel-train check --loki`` (an HTTP client).

This is NOT Loki and shares no code with it. It is a stand-in because no real Loki may run in
this project's tests: Loki is under the AGPL-3.0, which this project keeps out of its code and
its tests, and the package registries available here mark Loki's Go module as not to be used.

What it implements is the subset of Loki's documented API that ``otel_train/check/loki.py``
uses, written from Loki's documentation (HTTP API: ``GET /loki/api/v1/query_range``; OTLP
ingestion: ``POST /otlp/v1/logs``), so the client is tested against the documented contract:

- ``POST /otlp/v1/logs`` takes OTLP/HTTP JSON (an ExportLogsServiceRequest) and stores it the
  way Loki's OTLP ingestion does: the body is the log line; a fixed list of resource
  attributes (``service.name`` first, ``unknown_service`` when it is missing, and the
  ``k8s.*``, ``deployment.environment`` ... ones) become index labels; every other resource
  attribute, the scope's name and version, each record's attributes, ``trace_id``, ``span_id``,
  ``severity_text`` and ``severity_number`` become structured metadata; attribute names are
  normalised to label names (``.`` and other non-word characters become ``_``). The timestamp
  is the record's, else its observed time.
- ``GET /loki/api/v1/query_range`` with ``query``, ``start``/``end`` (Unix ns; start inclusive,
  end exclusive), ``limit`` (default 100) and ``direction`` (``backward`` default, or
  ``forward``): at most ``limit`` entries in that direction's order. Without Loki's
  ``categorize-labels`` encoding flag, Loki returns structured metadata merged into each
  entry's labels, so entries are grouped into streams by their full label set; so does this.
  The LogQL subset: a stream selector of matchers (``=``, ``!=``, ``=~``, ``!~``, regexes fully
  anchored as in Loki) followed by label filter stages ``| name <op> "value"`` with the same
  operators. Anything else is answered 400 with a parse error, as Loki answers a query it
  cannot parse, so a test cannot pass on LogQL the stand-in silently misreads.
- ``GET /ready`` answers ``ready``.

It holds everything in memory and is started on a free loopback port by the tests.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from otel_train.analysis.otlp import decode_value

#: resource attributes Loki's OTLP ingestion indexes as stream labels by default
INDEX_LABELS = (
    "service.name", "service.namespace", "service.instance.id", "deployment.environment",
    "deployment.environment.name", "cloud.region", "cloud.availability_zone",
    "k8s.cluster.name", "k8s.namespace.name", "k8s.pod.name", "k8s.container.name",
    "container.name", "k8s.replicaset.name", "k8s.deployment.name", "k8s.statefulset.name",
    "k8s.daemonset.name", "k8s.cronjob.name", "k8s.job.name",
)
DEFAULT_LIMIT = 100

_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*')
_FILTER = re.compile(r'\s*\|\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*')


class LogQLError(ValueError):
    """A query outside the implemented subset (Loki: 400, parse error)."""


def label_name(attribute: str) -> str:
    return re.sub(r"\W", "_", attribute)


def _value(v: dict[str, Any]) -> str:
    """An OTLP value as Loki's label or metadata string: arrays and maps as JSON."""
    value = decode_value(v)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _attributes(obj: dict[str, Any]) -> dict[str, str]:
    return {kv["key"]: _value(kv.get("value", {})) for kv in obj.get("attributes", [])}


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def __call__(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.name, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None
        return hit if self.op == "=~" else not hit


def parse_query(query: str) -> list[Matcher]:
    """The stream selector's matchers, then the label filters (all must hold)."""
    m = re.fullmatch(r"\s*\{(.*?)\}(.*)", query, flags=re.S)
    if not m:
        raise LogQLError(f"parse error: {query!r} does not start with a stream selector")
    matchers = []
    selector = m.group(1)
    for part in filter(str.strip, selector.split(",")):
        one = _MATCHER.fullmatch(part)
        if not one:
            raise LogQLError(f"parse error: unsupported matcher {part!r}")
        matchers.append(Matcher(one.group(1), one.group(2), json.loads(one.group(3))))
    if not matchers:
        raise LogQLError("parse error: queries require at least one matcher")
    rest = m.group(2)
    while rest.strip():
        one = _FILTER.match(rest)
        if not one:
            raise LogQLError(f"parse error: unsupported pipeline stage {rest.strip()!r}")
        matchers.append(Matcher(one.group(1), one.group(2), json.loads(one.group(3))))
        rest = rest[one.end():]
    return matchers


@dataclass
class LokiStandin:
    """The stored entries: (timestamp ns, line, labels: index labels + structured metadata)."""

    entries: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def push_otlp(self, request: dict[str, Any]) -> int:
        """Store an OTLP JSON ExportLogsServiceRequest as Loki's OTLP ingestion would."""
        added = []
        for rl in request.get("resourceLogs", []):
            resource = _attributes(rl.get("resource", {}))
            index = {label_name(k): v for k, v in resource.items() if k in INDEX_LABELS}
            index.setdefault("service_name", "unknown_service")
            resource_meta = {label_name(k): v for k, v in resource.items()
                             if k not in INDEX_LABELS}
            for sl in rl.get("scopeLogs", []):
                scope = sl.get("scope", {})
                scope_meta = {k: v for k, v in (("scope_name", scope.get("name", "")),
                                                ("scope_version", scope.get("version", "")))
                              if v}
                for record in sl.get("logRecords", []):
                    meta = {label_name(k): v for k, v in _attributes(record).items()}
                    for key, name in (("traceId", "trace_id"), ("spanId", "span_id"),
                                      ("severityText", "severity_text")):
                        if record.get(key):
                            meta[name] = record[key]
                    if record.get("severityNumber"):
                        meta["severity_number"] = str(record["severityNumber"])
                    ts = int(record.get("timeUnixNano") or record.get("observedTimeUnixNano")
                             or 0)
                    line = _value(record.get("body", {}))
                    added.append((ts, line, {**resource_meta, **scope_meta, **meta, **index}))
        with self.lock:
            self.entries += added
        return len(added)

    def query_range(self, query: str, start_ns: int, end_ns: int, limit: int = DEFAULT_LIMIT,
                    direction: str = "backward") -> dict[str, Any]:
        """The ``data`` of Loki's query_range answer for a log query."""
        if direction not in ("forward", "backward"):
            raise LogQLError(f"invalid direction {direction!r}")
        matchers = parse_query(query)
        with self.lock:
            hits = [e for e in self.entries
                    if start_ns <= e[0] < end_ns and all(m(e[2]) for m in matchers)]
        hits.sort(key=lambda e: e[0], reverse=direction == "backward")
        streams: dict[str, dict[str, Any]] = {}
        for ts, line, labels in hits[:limit]:
            key = json.dumps(labels, sort_keys=True)
            streams.setdefault(key, {"stream": labels, "values": []})["values"].append(
                [str(ts), line])
        return {"resultType": "streams", "result": list(streams.values()), "stats": {}}


def _handler(store: LokiStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet test output
            pass

        def _send(self, status: int, body: Any, content_type: str = "application/json"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlparse(self.path)
            if url.path == "/ready":
                return self._send(200, "ready\n", "text/plain")
            if url.path != "/loki/api/v1/query_range":
                return self._send(404, "404 page not found\n", "text/plain")
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                data = store.query_range(
                    params["query"], int(params["start"]), int(params["end"]),
                    int(params.get("limit", DEFAULT_LIMIT)),
                    params.get("direction", "backward"))
            except (KeyError, ValueError) as exc:  # LogQLError is a ValueError
                return self._send(400, f"{exc}\n", "text/plain")
            self._send(200, {"status": "success", "data": data})

        def do_POST(self) -> None:  # noqa: N802
            if urlparse(self.path).path != "/otlp/v1/logs":
                return self._send(404, "404 page not found\n", "text/plain")
            if not self.headers.get("Content-Type", "").startswith("application/json"):
                # Loki also takes protobuf; the tests send JSON only
                return self._send(415, "only OTLP/HTTP JSON here\n", "text/plain")
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            store.push_otlp(json.loads(body))
            self._send(200, {})

    return Handler


@dataclass
class RunningStandin:
    store: LokiStandin
    url: str

    @property
    def otlp_logs(self) -> str:
        return f"{self.url}/otlp/v1/logs"


@contextmanager
def running_loki_standin() -> Iterator[RunningStandin]:
    """The stand-in serving on a free 127.0.0.1 port until the block ends."""
    store = LokiStandin()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    thread = threading.Thread(target=server.serve_forever, name="loki-standin", daemon=True)
    thread.start()
    try:
        yield RunningStandin(store, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
