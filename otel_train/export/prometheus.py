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
from otel_train.export.buckets import SECONDS_BUCKETS

_LABELS = (semconv.PROM_RANK_LABEL, semconv.PROM_RUN_LABEL)


class PrometheusEndpoint:
    def __init__(self, addr: str, port: int, rank: int, run_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.port = port
        self._labels = {semconv.PROM_RANK_LABEL: str(rank), semconv.PROM_RUN_LABEL: run_id}
        reg = self.registry
        self.step = Histogram("training_step_duration_seconds", "Step time per rank.",
                              _LABELS, registry=reg, buckets=SECONDS_BUCKETS)
        self.phase = Histogram("training_phase_duration_seconds",
                               "Time per phase of a step, per rank.",
                               (*_LABELS, semconv.PROM_PHASE_LABEL), registry=reg,
                               buckets=SECONDS_BUCKETS)
        self.samples = Counter("training_samples", "Samples trained.", _LABELS, registry=reg)
        self.tokens = Counter("training_tokens", "Tokens trained.", _LABELS, registry=reg)
        self.dropped = Counter("otel_train_telemetry_dropped",
                               "Telemetry otel-train had to drop, by signal.",
                               (*_LABELS, semconv.ATTR_SIGNAL), registry=reg)
        self.cpu_throttled = Counter("training_cpu_throttled_time_seconds",
                                     "Time this rank's cgroup was CPU-throttled.", _LABELS,
                                     registry=reg)
        for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
            # a zero from the start, so increase() sees the first drop
            self.dropped.labels(**self._labels, signal=signal)
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

    def add_dropped(self, signal: str, count: int) -> None:
        self.dropped.labels(**self._labels, signal=signal).inc(count)

    def add_cpu_throttled(self, seconds: float) -> None:
        self.cpu_throttled.labels(**self._labels).inc(seconds)

    def close(self) -> None:
        server: Any = self._server
        server.shutdown()
        server.server_close()
