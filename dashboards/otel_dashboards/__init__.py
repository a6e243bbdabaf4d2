"""otel-train's Grafana dashboards, written with grafana-foundation-sdk (Grafana 11.6 schema).

Each module builds one dashboard; ``DASHBOARDS`` maps the committed JSON file name to the
function that builds it. ``dashboards/build.py`` writes them; tests compare.
"""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders.dashboard import Dashboard

from . import attribution, checklist, collectives, compare, compile_health, ranks

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "training-attribution.json": attribution.build,
    "ranks-and-stragglers.json": ranks.build,
    "collectives.json": collectives.build,
    "compile-health.json": compile_health.build,
    "production-readiness.json": checklist.build,
    "compare-runs.json": compare.build,
}
