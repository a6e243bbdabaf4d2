"""Faults put between training and the collector: a link that never answers, and a collector
that refuses everything (tests/pipeline/test_reliability_collector.py, bench/bench_faults.py).
"""

from __future__ import annotations

import socket
import threading


class StallingProxy:
    """Accepts TCP connections and never answers: a collector stuck behind a dead link."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


#: a collector whose memory_limiter (1 MiB) refuses every request
REFUSING_CONFIG = """
receivers:
  otlp:
    protocols:
      http:
        endpoint: ${env:OTELCOL_OTLP_HTTP_ENDPOINT}
processors:
  memory_limiter:
    check_interval: 100ms
    limit_mib: 1
    spike_limit_mib: 0
exporters:
  debug:
    verbosity: basic
extensions:
  health_check:
    endpoint: ${env:OTELCOL_HEALTH_ENDPOINT}
service:
  extensions: [health_check]
  telemetry:
    metrics:
      readers:
        - pull:
            exporter:
              prometheus:
                host: ${env:OTELCOL_TELEMETRY_HOST}
                port: ${env:OTELCOL_TELEMETRY_PORT}
  pipelines:
    traces: {receivers: [otlp], processors: [memory_limiter], exporters: [debug]}
    metrics: {receivers: [otlp], processors: [memory_limiter], exporters: [debug]}
    logs: {receivers: [otlp], processors: [memory_limiter], exporters: [debug]}
"""
