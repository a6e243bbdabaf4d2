"""The log item of the checklist, from a live Loki through its HTTP query API (urllib only).

A run's log lines are read with ``/loki/api/v1/query_range`` and a LogQL selector on the run
id, in pages; each line's labels (stream labels and the structured metadata Loki merges into
them: where OTLP logs keep ``trace_id``, ``span_id`` and the record's attributes) are fed to
the same evidence and the same check as a run directory's log records.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.metrics import MetricsDigest
from otel_train.check import signal_checks
from otel_train.check.evidence import LogEvidence, RunEvidence, TraceEvidence
from otel_train.check.http import api_data
from otel_train.check.verdicts import FAIL, CheckResult

SOURCE = "loki"
ITEMS = ("log_fields",)
#: lines per query_range request (Loki's default max_entries_limit_per_query is 5000)
PAGE = 5000
#: how far back the run's lines are looked for
LOOKBACK_S = 2 * 24 * 3600
#: OTLP resource attribute training.run.id as Loki stores it (dots become underscores),
#: whether an index label or structured metadata: a label filter matches either
RUN_LABEL = sc.RES_RUN_ID.replace(".", "_")


def run_query(run_id: str) -> str:
    return f'{{service_name=~".+"}} | {RUN_LABEL}={json.dumps(run_id)}'


class LokiAPI:
    def __init__(self, base_url: str, timeout_s: float = 30.0, page: int = PAGE) -> None:
        self.base, self.timeout_s, self.page = base_url.rstrip("/"), timeout_s, page

    def get(self, path: str, **params: str) -> Any:
        return api_data(self.base, path, params, self.timeout_s, "Loki")

    def lines(self, query: str, start_ns: int, end_ns: int
              ) -> Iterator[tuple[int, str, dict[str, str]]]:
        """(timestamp ns, line, labels) of every line ``query`` matches, oldest first."""
        seen: set[tuple[int, str, str]] = set()
        while True:
            data = self.get("/loki/api/v1/query_range", query=query, start=str(start_ns),
                            end=str(end_ns), limit=str(self.page), direction="forward")
            page = [(int(ts), line, stream.get("stream", {}))
                    for stream in data.get("result", ()) for ts, line, *_ in stream["values"]]
            page.sort(key=lambda entry: entry[0])
            fresh = 0
            for ts, line, labels in page:
                key = (ts, line, json.dumps(labels, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    fresh += 1
                    yield ts, line, labels
            if len(page) < self.page or not fresh:
                return
            # the next page starts at the last timestamp (inclusive): lines sharing it are
            # read again and skipped as seen
            start_ns = page[-1][0]


def check_loki(base_url: str, run_id: str) -> list[CheckResult]:
    api = LokiAPI(base_url)
    end_ns = time.time_ns()
    logs = LogEvidence()
    for _, line, labels in api.lines(run_query(run_id), end_ns - LOOKBACK_S * 10**9, end_ns):
        logs.add(labels.get(sc.LOG_TRACE_ID, ""), labels.get(sc.LOG_SPAN_ID, ""), labels, line)
    if not logs.records:
        return [CheckResult("log_fields", FAIL, f"Loki at {api.base} holds no line of run "
                            f"{run_id!r} ({run_query(run_id)}, last 2 days)",
                            "check the run id, and that the ranks export OTLP logs to this "
                            "Loki (its /otlp endpoint, or a collector that forwards to it)",
                            SOURCE)]
    evidence = RunEvidence(Path(base_url), MetricsDigest(), TraceEvidence(), logs, True)
    return [dataclasses.replace(signal_checks.log_fields(evidence), source=SOURCE)]
