"""``semconv.METRICS`` is the one definition of every metric otel-train creates.

Every metric a run exports is in the table, with the table's kind, unit and description,
whichever process builds it; every instrument is made from the table; and each entry's
derived Prometheus name is what the collector's Prometheus exporter (the real one built
from collector/) and the per-rank prometheus-client endpoint serve.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from support import REPO_ROOT, otlp_files, training
from support.pipeline_fixtures import CONFIGS_DIR, free_port, http_get, running_collector, wait_for

import otel_train
from otel_train import semconv
from otel_train.config import ConfigWarning
from otel_train.export.prometheus import PrometheusEndpoint

_OTLP_KIND = {"histogram": semconv.HISTOGRAM, "sum": semconv.COUNTER,
              "gauge": semconv.GAUGE}
_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)


def exported_metrics(run_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    """(name, kind, unit, description) of each metric in a run directory's files."""
    for request in otlp_files.requests(run_dir, semconv.METRICS_GLOB):
        for rm in request.get("resourceMetrics", ()):
            for sm in rm.get("scopeMetrics", ()):
                for m in sm.get("metrics", ()):
                    kind = next(_OTLP_KIND[k] for k in m if k in _OTLP_KIND)
                    yield m["name"], kind, m.get("unit", ""), m.get("description", "")


def test_every_metric_name_constant_has_one_definition():
    constants = {v for k, v in vars(semconv).items() if k.startswith("METRIC_")}
    assert constants == set(semconv.METRICS)


def test_instruments_are_made_only_from_the_table():
    # semconv.create is the one caller of a meter's create_* (the exporter's proxy meter
    # defines them; defining is not calling)
    calls = [f"{path.relative_to(REPO_ROOT)}:{n}"
             for path in sorted((REPO_ROOT / "otel_train").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\.create_(histogram|counter|gauge|up_down_counter|observable_\w+)\(",
                          line)]
    assert calls == []


@pytest.mark.parametrize("export_process", [True, False])
def test_every_metric_a_run_exports_is_the_tables(tmp_path, monkeypatch, export_process):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    model, opt, loader = training.setup(batches=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        with otel_train.instrument(model, output_dir=tmp_path, export_process=export_process):
            training.train(model, opt, loader)
    # a source whose metric is missing from the table cannot make it, so it does not start
    assert [str(w.message) for w in caught if "could not start" in str(w.message)] == []
    exported = set(exported_metrics(otlp_files.only_run_dir(tmp_path)))
    assert {name for name, *_ in exported} >= {semconv.METRIC_STEP_DURATION,
                                               semconv.METRIC_TELEMETRY_DROPPED}
    for name, kind, unit, description in exported:
        assert name in semconv.METRICS, f"{name} is not in semconv.METRICS"
        metric = semconv.METRICS[name]
        assert (kind, unit, description) == (metric.kind, metric.unit, metric.description)


def test_comm_overlap_is_one_instrument_for_both_of_its_sources(caplog):
    # sources/collectives/__init__.py and sources/gpu/profiler.py both set training.comm.overlap
    meter = MeterProvider().get_meter(semconv.SCOPE_NAME)
    with caplog.at_level(logging.WARNING):
        first = semconv.create(meter, semconv.METRIC_COMM_OVERLAP)
        second = semconv.create(meter, semconv.METRIC_COMM_OVERLAP)
    assert first is second
    assert not caplog.records


def record_every_metric(endpoint: str) -> None:
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"))
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter(semconv.SCOPE_NAME)
    attrs = {semconv.ATTR_RUN_ID: "semconv-test", semconv.ATTR_RANK: 0}
    for metric in semconv.METRICS.values():
        instrument = semconv.create(meter, metric.name)
        measure = {semconv.HISTOGRAM: "record", semconv.COUNTER: "add",
                   semconv.GAUGE: "set"}[metric.kind]
        getattr(instrument, measure)(1, attrs)
    provider.force_flush()
    provider.shutdown()


def families(body: str) -> dict[str, str]:
    """{metric family: type} of a Prometheus exposition."""
    return dict(_TYPE_LINE.findall(body))


def test_the_collector_serves_every_metric_under_its_derived_name(tmp_path):
    expected = {m.prometheus: m.kind for m in semconv.METRICS.values()}
    with running_collector(CONFIGS_DIR / "local.yaml", tmp_path) as collector:
        record_every_metric(collector.otlp_http)

        def served() -> dict[str, str] | None:
            # classic text exposition: family names carry _total, as stored in Prometheus
            found = families(http_get(collector.metrics_url)[1])
            return found if set(expected) <= set(found) else None

        found = wait_for("every table metric on the collector's /metrics", served, timeout=30)
    ours = {name: kind for name, kind in found.items()
            if name.startswith(("training_", "otel_train_"))}
    assert set(ours) == set(expected)


def test_the_per_rank_endpoint_serves_the_derived_names():
    endpoint = PrometheusEndpoint("127.0.0.1", free_port(), 0, "semconv-test")
    try:
        endpoint.observe_step(0.1, {semconv.PHASE_FORWARD: 0.05}, 8, 512, None)
        endpoint.add_step_time({semconv.PART_FORWARD: 0.05, semconv.PART_NOT_EXPLAINED: 0.05},
                               {semconv.GOODPUT_PRODUCTIVE: 0.05})
        endpoint.add_cpu_throttled(0.5)
        body = http_get(f"http://127.0.0.1:{endpoint.port}/metrics")[1]
    finally:
        endpoint.close()
    # prometheus-client adds a _created gauge beside each counter and histogram
    served: dict[str, Any] = {name: kind for name, kind in families(body).items()
                              if not name.endswith("_created")}
    assert served == {
        semconv.PROM_STEP_DURATION: "histogram",
        semconv.PROM_PHASE_DURATION: "histogram",
        semconv.PROM_SAMPLES: "counter",
        semconv.PROM_TOKENS: "counter",
        semconv.PROM_TELEMETRY_DROPPED: "counter",
        semconv.PROM_CPU_THROTTLED: "counter",
        semconv.PROM_STEP_TIME: "counter",
        semconv.PROM_GOODPUT_TIME: "counter",
    }
