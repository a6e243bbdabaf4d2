"""``training.collective.duration``, aggregated here and handed to the SDK's exporters whole.

Every collective is measured (summaries and sampling reduce spans, never what is measured),
and at tens of thousands of collectives a second a rank the OpenTelemetry SDK's
per-measurement path would be the exporter's largest cost (docs/overhead.md), most of it
cleaning and hashing the attribute set again on every call
(``Measurement.__post_init__``, ``_hash_attributes``). The Python SDK has no interface to
record many values of one attribute set at once, so this histogram aggregates them itself:
the series is found once per attribute set (the caller passes the same dict for a step's
collectives of one op), each value is one ``bisect`` and a few additions, and at each
collection :meth:`metric` returns the SDK's own ``Metric`` of ``HistogramDataPoint``s, which
:class:`~otel_train.exporter.providers.Pipeline` adds to what its metric reader collected
before the exporter sees it. The points are what the SDK's explicit-bucket aggregation
would make: its buckets (``(lower, upper]``, from semconv's bucket advice), count, sum, min
and max, cumulative from the first measurement (or delta, if the exporter prefers it), and
one exemplar per bucket, the latest offered since the last collection, from the step span
of the measurement's context.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import AggregationTemporality as Temporality
from opentelemetry.sdk.metrics.export import Histogram, HistogramDataPoint, Metric

from otel_train import semconv


class _Series:
    __slots__ = ("attributes", "counts", "count", "sum", "min", "max", "exemplars", "start")

    def __init__(self, attributes: dict[str, Any], buckets: int, start: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.count = 0
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        #: bucket -> (value, time ns, trace id, span id): the latest offered since collection
        self.exemplars: dict[int, tuple[float, int, int, int]] = {}
        self.start = start


class CollectiveDurations:
    """The collective duration histogram of one pipeline; thread-safe (recorded on the
    exporter's main thread, collected on the metric reader's)."""

    def __init__(self, delta: bool = False) -> None:
        spec = semconv.METRICS[semconv.METRIC_COLLECTIVE_DURATION]
        assert spec.kind == semconv.HISTOGRAM and spec.buckets is not None
        self.name, self.unit, self.description = spec.name, spec.unit, spec.description
        self.bounds = list(spec.buckets)
        self.delta = delta
        self._series: dict[tuple[tuple[str, Any], ...], _Series] = {}
        self._lock = threading.Lock()
        self._last_attributes: dict[str, Any] | None = None
        self._last: _Series | None = None
        self._start = time.time_ns()
        #: changes whenever the series do (providers.PendingPoints reports them on change)
        self.version = 0

    def record(self, value: float, attributes: dict[str, Any], context: Any = None) -> None:
        """One measurement, as the SDK histogram's ``record``. A caller passing the same
        ``attributes`` dict again (unchanged) skips the look-up of its series."""
        with self._lock:
            series = self._last
            if attributes is not self._last_attributes or series is None:
                key = tuple(sorted(attributes.items()))
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = _Series(dict(attributes),
                                                         len(self.bounds) + 1, self._start)
                    self.version += 1
                self._last_attributes, self._last = attributes, series
            i = bisect.bisect_left(self.bounds, value)
            series.counts[i] += 1
            series.count += 1
            series.sum += value
            if value < series.min:
                series.min = value
            if value > series.max:
                series.max = value
            if context is not None:
                span = trace.get_current_span(context).get_span_context()
                if span.is_valid and span.trace_flags.sampled:
                    series.exemplars[i] = (value, time.time_ns(), span.trace_id,
                                           span.span_id)

    def series_keys(self) -> frozenset[tuple[str, frozenset[Any]]]:
        """The series the next collection will carry, as providers.series_key names them."""
        with self._lock:
            return frozenset((self.name, frozenset(key)) for key in self._series)

    def metric(self) -> Metric | None:
        """The histogram's points now, as the SDK's reader would collect them; None before
        the first measurement. Delta: the series start again after each collection."""
        now = time.time_ns()
        with self._lock:
            points = []
            for series in self._series.values():
                points.append(HistogramDataPoint(
                    attributes=dict(series.attributes), start_time_unix_nano=series.start,
                    time_unix_nano=now, count=series.count, sum=series.sum,
                    bucket_counts=list(series.counts), explicit_bounds=list(self.bounds),
                    min=series.min, max=series.max,
                    exemplars=[Exemplar({}, v, t, s, tr)
                               for _, (v, t, tr, s) in sorted(series.exemplars.items())]))
                series.exemplars = {}
            if self.delta:
                self.version += bool(self._series)
                self._series.clear()
                self._last_attributes = self._last = None
                self._start = now
        if not points:
            return None
        temporality = Temporality.DELTA if self.delta else Temporality.CUMULATIVE
        return Metric(name=self.name, description=self.description, unit=self.unit,
                      data=Histogram(data_points=points, aggregation_temporality=temporality))
