"""Faults put between training and the collector: a link that never answers, a collector
that refuses everything, and one that answers every request 503
(tests/pipeline/test_reliability_collector.py, tests/pipeline/test_accounts_under_faults.py,
bench/bench_faults.py).
"""

from __future__ import annotations

import http.server
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


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.answered += 1  # type: ignore[attr-defined]
        self.send_response(503)  # OTLP/HTTP: retryable, so the exporter retries to its timeout
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line a request on stderr otherwise


class Answering503:
    """An HTTP server answering every OTLP request 503 Service Unavailable: a collector
    behind a load balancer with no healthy backend."""

    def __init__(self) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
        self.server.daemon_threads = True
        self.server.answered = 0  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def answered(self) -> int:
        return self.server.answered  # type: ignore[attr-defined]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
