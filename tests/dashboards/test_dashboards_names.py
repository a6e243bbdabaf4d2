"""The metric names the dashboards query are the names the real collector writes.

The contract's instruments, recorded with the OpenTelemetry SDK and sent over OTLP to the
collector built from collector/ (configs/local.yaml, Prometheus exporter with
UnderscoreEscapingWithSuffixes): its /metrics must show exactly the Prometheus names in
dashboards/otel_dashboards/names.py, including ``_ratio`` for gauges of unit "1"
(prometheus/otlptranslator ``normalizeName``, collector-contrib v0.161.0).
"""

from __future__ import annotations

import sys

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from support import REPO_ROOT
from support.pipeline_fixtures import (
    CONFIGS_DIR,
    OPENMETRICS,
    http_get,
    running_collector,
    wait_for,
)

sys.path.insert(0, str(REPO_ROOT / "dashboards"))
from otel_dashboards import names  # noqa: E402

ATTRS = {"training.run.id": "names-test", "training.rank": 0}


def record_contract_metrics(endpoint: str) -> None:
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"))
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("otel_train")
    meter.create_gauge("training.comm.overlap", unit="1").set(0.8, ATTRS)
    meter.create_gauge("training.mfu", unit="1").set(0.4, ATTRS)
    meter.create_gauge("training.memory.peak.allocated", unit="By").set(2**30, ATTRS)
    meter.create_gauge("training.memory.reserved", unit="By").set(2**31, ATTRS)
    meter.create_counter("training.collective.size", unit="By").add(
        2**20, {**ATTRS, "training.collective.op": "all_reduce"}
    )
    meter.create_counter("training.cpu.throttled.time", unit="s").add(0.5, ATTRS)
    meter.create_counter("training.compile.recompiles").add(
        1, {**ATTRS, "training.compile.reason": "guard_failed_shape"}
    )
    meter.create_histogram("training.collective.duration", unit="s").record(
        0.01, {**ATTRS, "training.collective.op": "all_reduce", "training.collective.backend": "gloo"}
    )
    provider.force_flush()
    provider.shutdown()


def test_collector_writes_the_names_the_dashboards_query(tmp_path):
    expected = {
        names.COMM_OVERLAP,
        names.MFU,
        names.MEMORY_PEAK,
        names.MEMORY_RESERVED,
        names.COLLECTIVE_BYTES,
        names.CPU_THROTTLED,
        names.RECOMPILES,
        names.COLLECTIVE + "_bucket",
    }
    with running_collector(CONFIGS_DIR / "local.yaml", tmp_path) as collector:
        record_contract_metrics(collector.otlp_http)

        def exposed() -> set[str] | None:
            _, body = http_get(collector.metrics_url, accept=OPENMETRICS)
            found = {
                line.split("{")[0].split(" ")[0]
                for line in body.splitlines()
                if line.startswith("training_")
            }
            return found if expected <= found else None

        found = wait_for("the contract's metrics on the collector's /metrics", exposed, timeout=30)
        _, body = http_get(collector.metrics_url)
    assert expected <= found
    overlap = next(line for line in body.splitlines() if line.startswith(names.COMM_OVERLAP + "{"))
    assert 'training_rank="0"' in overlap and "training_collective_op" not in overlap
