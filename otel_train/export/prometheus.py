"""Optional per-rank Prometheus endpoint through prometheus-client.

The OpenTelemetry Python Prometheus exporter drops exemplars; prometheus-client keeps them
in OpenMetrics exposition (served when the scraper asks for it, as Prometheus does with
exemplar storage on). So the emitter feeds these instruments itself, beside the OTel ones.
Rank r serves on ``port + local_rank``, bound to loopback unless configured otherwise.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from otel_train import semconv

_LABELS = (semconv.PROM_RANK_LABEL, semconv.PROM_RUN_LABEL)
_SIGNAL_LABEL = semconv.PROM_SIGNAL_LABEL


def _histogram(name: str, labels: tuple[str, ...], registry: CollectorRegistry) -> Histogram:
    metric = semconv.METRICS[name]
    return Histogram(metric.prometheus, metric.description, labels, registry=registry,
                     buckets=metric.buckets)


def _counter(name: str, labels: tuple[str, ...], registry: CollectorRegistry) -> Counter:
    # prometheus-client takes the _total off a counter's name and serves it on the samples
    metric = semconv.METRICS[name]
    return Counter(metric.prometheus, metric.description, labels, registry=registry)


class PrometheusEndpoint:
    def __init__(self, addr: str, port: int, rank: int, run_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.port = port
        self._labels = {semconv.PROM_RANK_LABEL: str(rank), semconv.PROM_RUN_LABEL: run_id}
        reg = self.registry
        self.step = _histogram(semconv.METRIC_STEP_DURATION, _LABELS, reg)
        self.phase = _histogram(semconv.METRIC_PHASE_DURATION,
                                (*_LABELS, semconv.PROM_PHASE_LABEL), reg)
        self.samples = _counter(semconv.METRIC_SAMPLES, _LABELS, reg)
        self.tokens = _counter(semconv.METRIC_TOKENS, _LABELS, reg)
        self.dropped = _counter(semconv.METRIC_TELEMETRY_DROPPED,
                                (*_LABELS, _SIGNAL_LABEL), reg)
        self.cpu_throttled = _counter(semconv.METRIC_CPU_THROTTLED_TIME, _LABELS, reg)
        self.parts = _counter(semconv.METRIC_STEP_TIME, (*_LABELS, semconv.PROM_PART_LABEL), reg)
        self.goodput = _counter(semconv.METRIC_GOODPUT_TIME,
                                (*_LABELS, semconv.PROM_GOODPUT_BUCKET_LABEL), reg)
        for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
            # a zero from the start, so increase() sees the first drop
            self.dropped.labels(**self._labels, **{_SIGNAL_LABEL: signal})
        self._server, self._thread = start_http_server(port, addr=addr, registry=reg)

    def observe_step(self, duration_s: float, phases: dict[str, float], samples: int,
                     tokens: int, exemplar: dict[str, str] | None) -> None:
        self.step.labels(**self._labels).observe(duration_s, exemplar)
        for phase, seconds in phases.items():
            self.phase.labels(**self._labels, training_phase=phase).observe(seconds, exemplar)
        if samples:
            self.samples.labels(**self._labels).inc(samples)
        if tokens:
            self.tokens.labels(**self._labels).inc(tokens)

    def add_step_time(self, parts: dict[str, float], goodput: dict[str, float]) -> None:
        """The steps' seconds by part and by goodput bucket since the last call (the
        emitter's tick), as the OTLP counters get them."""
        for part, seconds in parts.items():
            self.parts.labels(**self._labels, training_part=part).inc(seconds)
        for bucket, seconds in goodput.items():
            self.goodput.labels(**self._labels, training_goodput_bucket=bucket).inc(seconds)

    def add_dropped(self, signal: str, count: int) -> None:
        self.dropped.labels(**self._labels, **{_SIGNAL_LABEL: signal}).inc(count)

    def add_cpu_throttled(self, seconds: float) -> None:
        self.cpu_throttled.labels(**self._labels).inc(seconds)

    def close(self) -> None:
        server: Any = self._server
        server.shutdown()
        server.server_close()
