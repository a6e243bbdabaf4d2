"""training.collective.duration aggregated by otel-train (exporter/collective_histogram.py):
the points are the SDK's own explicit-bucket histogram's, exemplars included, and a pipeline
exports them once, beside the SDK's metrics."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train import config, semconv
from otel_train.exporter.collective_histogram import CollectiveDurations
from otel_train.exporter.providers import Pipeline
from otel_train.identity import Identity
from otel_train.wire import collectives as collective_rows

BOUNDS = semconv.METRICS[semconv.METRIC_COLLECTIVE_DURATION].buckets
# values on bucket boundaries (upper bounds are inclusive), between them, under and above
VALUES = [0.0, 1e-6, BOUNDS[0], BOUNDS[0] * 1.01, BOUNDS[3], 0.3, BOUNDS[-1], 1e3, 0.3]
ATTRS = [{"training.rank": 0, "training.collective.op": "all_gather", "training.collective.backend": "nccl"},
         {"training.rank": 0, "training.collective.op": "reduce_scatter", "training.collective.backend": "nccl"}]


def _ctx(trace_id: int, span_id: int, sampled: bool = True):
    return trace.set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id, span_id, False, TraceFlags(1 if sampled else 0))))


def _sdk_points(values_by_attrs):
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    hist = semconv.create(meter, semconv.METRIC_COLLECTIVE_DURATION)
    for attrs, values in values_by_attrs:
        for v in values:
            hist.record(v, attrs)
    (metric,) = [m for rm in reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics]
    return metric


def _key(point):
    return (tuple(sorted(point.attributes.items())), point.count, point.sum,
            tuple(point.bucket_counts), tuple(point.explicit_bounds), point.min, point.max)


def test_the_points_are_the_sdk_histograms_own():
    ours = CollectiveDurations()
    data = [(ATTRS[0], VALUES), (ATTRS[1], VALUES[::-1][:4])]
    for attrs, values in data:
        for v in values:
            ours.record(v, attrs)
    # a new dict with the same content is the same series
    ours.record(0.3, dict(ATTRS[0]))
    data[0] = (ATTRS[0], [*VALUES, 0.3])
    theirs = _sdk_points(data)
    mine = ours.metric()
    assert (mine.name, mine.unit, mine.description) == (theirs.name, theirs.unit,
                                                        theirs.description)
    assert mine.data.aggregation_temporality == theirs.data.aggregation_temporality
    assert sorted(map(_key, mine.data.data_points)) == sorted(map(_key, theirs.data.data_points))


def test_exemplars_the_latest_sampled_one_per_bucket_until_collected():
    ours = CollectiveDurations()
    ours.record(0.3, ATTRS[0], context=_ctx(1, 1))
    ours.record(0.31, ATTRS[0], context=_ctx(2, 2))  # same bucket: replaces
    ours.record(0.001, ATTRS[0], context=_ctx(3, 3, sampled=False))  # unsampled: none
    ours.record(0.002, ATTRS[0])
    (point,) = ours.metric().data.data_points
    assert [(e.trace_id, e.span_id, e.value) for e in point.exemplars] == [(2, 2, 0.31)]
    (point,) = ours.metric().data.data_points  # collected: exemplars start again
    assert point.exemplars == [] and point.count == 4  # cumulative: the counts stay


def test_delta_points_hold_what_came_since_the_last_collection():
    ours = CollectiveDurations(delta=True)
    assert ours.metric() is None
    ours.record(0.3, ATTRS[0])
    first = ours.metric().data.data_points[0]
    assert ours.metric() is None  # nothing new
    ours.record(0.1, ATTRS[0])
    ours.record(0.2, ATTRS[0])
    second = ours.metric().data.data_points[0]
    assert (first.count, second.count, second.sum) == (1, 2, 0.1 + 0.2)
    assert second.start_time_unix_nano >= first.time_unix_nano


def _exported_durations(run_dir: Path) -> list[dict]:
    out = []
    for path in run_dir.glob(semconv.METRICS_GLOB):
        for line in path.read_text().splitlines():
            for rm in json.loads(line)["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    assert sm["scope"]["name"] == semconv.SCOPE_NAME
                    out += [m for m in sm["metrics"]
                            if m["name"] == semconv.METRIC_COLLECTIVE_DURATION]
    return out


def test_a_pipeline_exports_every_collective_once_beside_the_sdks_metrics(tmp_path):
    cfg = config.load(output_dir=tmp_path, exporter="file")
    pipeline = Pipeline(cfg, Identity("h", 0, 0, 1, platform.node(), 1), tmp_path / "run")
    spec = collective_rows.Spec(3, True, False, (7, 8, 1, False), [], {"training.rank": 0})
    rows = [("all_reduce", "all_reduce", "gloo", "0", 2, 64, "float32", None, False, 0,
             1_000 * (i + 1), True, i, "python", v, None, None, 0)
            for i, v in enumerate(VALUES)]
    pipeline.collectives(spec, rows)
    assert pipeline.shutdown(30)
    (metric,) = _exported_durations(tmp_path / "run")  # one collection, one metric
    (point,) = metric["histogram"]["dataPoints"]
    assert int(point["count"]) == len(VALUES) and point["sum"] == sum(VALUES)
    assert [int(c) for c in point["bucketCounts"]] == [
        sum(1 for v in VALUES if (i == 0 or v > BOUNDS[i - 1])
            and (i == len(BOUNDS) or v <= BOUNDS[i])) for i in range(len(BOUNDS) + 1)]
    # the slowest collective carries the sampled step's exemplar: the rank-step span
    assert [(e["traceId"][-2:], e["spanId"][-2:], e["asDouble"])
            for e in point["exemplars"]] == [("07", "08", max(VALUES))]
    assert metric["histogram"]["aggregationTemporality"] == 2  # cumulative


def test_a_pipeline_without_collectives_exports_no_duration(tmp_path):
    cfg = config.load(output_dir=tmp_path, exporter="file")
    pipeline = Pipeline(cfg, Identity("h", 0, 0, 1, platform.node(), 1), tmp_path / "run")
    pipeline.measure_of(semconv.METRIC_STEP_DURATION)(0.5, {"a": 1})
    assert pipeline.shutdown(30)
    assert _exported_durations(tmp_path / "run") == []


def test_an_exporter_preferring_other_buckets_keeps_the_sdks_aggregation(tmp_path, monkeypatch):
    """Exponential histograms asked of the exporter (OTLP's setting, honoured by the file
    exporter too): the collective durations are the SDK's, exponential like the rest."""
    ident = Identity("h", 0, 0, 1, platform.node(), 1)
    default = Pipeline(config.load(output_dir=tmp_path, exporter="file"), ident, tmp_path / "a")
    # shut down: a pipeline left running would leave its SDK threads to later tests' forks
    assert default.shutdown(30) and default.collective_durations is not None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                       "base2_exponential_bucket_histogram")
    pipeline = Pipeline(config.load(output_dir=tmp_path, exporter="file"), ident, tmp_path / "b")
    assert pipeline.collective_durations is None
    spec = collective_rows.Spec(0, False, False, (7, 8, 1, False), [], {"training.rank": 0})
    row = ("all_reduce", "all_reduce", "gloo", "0", 2, 64, "float32", None, False, 0, 1_000,
           True, 0, "python", 0.25, None, None, 0)
    pipeline.collectives(spec, [row])
    assert pipeline.shutdown(30)
    (metric,) = _exported_durations(tmp_path / "b")
    assert int(metric["exponentialHistogram"]["dataPoints"][0]["count"]) == 1
