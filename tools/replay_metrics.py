"""Replay a finished run's exported metrics into Prometheus, through the collector.

otel-train's file export (and a collector's file output) holds every metric export as one
OTLP JSON request per line. This posts them, oldest first, to a collector running
``collector/configs/replay.yaml`` (OTLP/HTTP in, Prometheus remote write out, the gateway's
name translation), so Prometheus ends up with the series it would have scraped live. Then
the repository's rules and dashboards can be evaluated on the run after the fact.

Prometheus evaluates recording rules and alerts only at the present, so ``--shift-to-now``
moves every timestamp by one offset so that the run ends now; the run's shape (intervals,
order, values) is untouched, and the rules see it within their 5-minute windows.

Usage::

    otelcol-train --config collector/configs/replay.yaml &     # PROMETHEUS_REMOTE_WRITE_ENDPOINT
    python tools/replay_metrics.py RUN_DIR --otlp-endpoint http://127.0.0.1:4318 --shift-to-now
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from otel_train import semconv  # noqa: E402
from otel_train.analysis import otlp  # noqa: E402

TIME_KEYS = ("timeUnixNano", "startTimeUnixNano")


def metric_files(run_dir: Path) -> list[Path]:
    files = otlp.signal_files(run_dir, semconv.METRICS_GLOB)
    if not files:
        raise SystemExit(f"replay_metrics: no {semconv.METRICS_GLOB} in {run_dir}")
    return files


def requests(files: list[Path], run_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """Every export request of the files (otel-train's reader: torn lines are salvaged) as
    (its newest point's time, request), oldest first; with ``run_id``, only that run's
    resources."""
    out = []
    for request in otlp.iter_requests(files):
        if run_id is not None:
            request["resourceMetrics"] = [
                entry for entry in request.get("resourceMetrics", ())
                if str(otlp.decode_attributes(entry.get("resource", {}).get("attributes")).get(
                    semconv.RES_RUN_ID)) == run_id]
        times = [int(p.get("timeUnixNano", 0)) for p in _points(request)]
        if times:
            out.append((max(times), request))
    out.sort(key=lambda pair: pair[0])
    return out


def _points(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rm in request.get("resourceMetrics", ()):
        for sm in rm.get("scopeMetrics", ()):
            for metric in sm.get("metrics", ()):
                for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    yield from metric.get(kind, {}).get("dataPoints", ())


def shift(request: dict[str, Any], offset_ns: int) -> None:
    for point in _points(request):
        for key in TIME_KEYS:
            if int(point.get(key, 0)):
                point[key] = str(int(point[key]) + offset_ns)
        for exemplar in point.get("exemplars", ()):
            if int(exemplar.get("timeUnixNano", 0)):
                exemplar["timeUnixNano"] = str(int(exemplar["timeUnixNano"]) + offset_ns)


def post(endpoint: str, request: dict[str, Any], timeout: float = 30.0) -> None:
    body = json.dumps(request).encode()
    req = urllib.request.Request(endpoint.rstrip("/") + "/v1/metrics", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:500]
        raise SystemExit(f"replay_metrics: the collector refused a request: {err.code} "
                         f"{detail}") from None
    except urllib.error.URLError as err:
        raise SystemExit(f"replay_metrics: no collector at {endpoint}: {err.reason}") from None


def replay(run_dir: Path, endpoint: str, shift_to_now: bool = False, run_id: str | None = None,
           progress: bool = True) -> dict[str, Any]:
    """Post the run's metric exports; returns what was sent (requests, points, offset)."""
    batch = requests(metric_files(run_dir), run_id)
    if not batch:
        raise SystemExit(f"replay_metrics: no metric points in {run_dir}"
                         + (f" for run {run_id}" if run_id else ""))
    offset = time.time_ns() - batch[-1][0] - 1_000_000_000 if shift_to_now else 0
    points = 0
    for number, (_, request) in enumerate(batch, 1):
        if offset:
            shift(request, offset)
        points += sum(1 for _ in _points(request))
        post(endpoint, request)
        if progress and (number % 50 == 0 or number == len(batch)):
            print(f"replay_metrics: {number}/{len(batch)} requests, {points} points",
                  file=sys.stderr)
    return {"requests": len(batch), "points": points, "offset_ns": offset,
            "first_ns": batch[0][0] + offset, "last_ns": batch[-1][0] + offset}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (metrics*.jsonl inside)")
    parser.add_argument("--otlp-endpoint", default="http://127.0.0.1:4318",
                        help="the replay collector's OTLP/HTTP base URL")
    parser.add_argument("--shift-to-now", action="store_true",
                        help="move all timestamps so that the run ends now")
    parser.add_argument("--run-id", help="only this run's resources (a collector's output)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        parser.error(f"{args.run_dir} is not a directory")
    print(json.dumps(replay(args.run_dir, args.otlp_endpoint, args.shift_to_now, args.run_id)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
