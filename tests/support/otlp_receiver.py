"""An OTLP receiver in the test process, over gRPC and HTTP/protobuf, for tests of how the
exporters are configured (protocol, timeout, compression), where the collector built from
``collector/`` is not needed: what it does with the data is not under test.

This is NOT the collector. It serves the three export services as opentelemetry-proto
defines them (gRPC ``TraceService``/``MetricsService``/``LogsService``, and ``POST
/v1/{traces,metrics,logs}`` with a protobuf body, gzip or deflate encoded or not), answers
every request with success and keeps the decoded requests. Both listen on free loopback
ports; ``running_receiver`` stops them when the test ends.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import zlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

#: by signal: (request type, response type)
_MESSAGES = {
    "traces": (trace_service_pb2.ExportTraceServiceRequest,
               trace_service_pb2.ExportTraceServiceResponse),
    "metrics": (metrics_service_pb2.ExportMetricsServiceRequest,
                metrics_service_pb2.ExportMetricsServiceResponse),
    "logs": (logs_service_pb2.ExportLogsServiceRequest,
             logs_service_pb2.ExportLogsServiceResponse),
}
_DECODE = {"": lambda b: b, "identity": lambda b: b, "gzip": gzip.decompress,
           "deflate": zlib.decompress}


@dataclass
class Receiver:
    grpc_port: int = 0
    http_port: int = 0
    #: by signal: every request received, decoded, with (protocol, content encoding)
    received: dict[str, list[tuple[str, str, Any]]] = field(
        default_factory=lambda: {signal: [] for signal in _MESSAGES})
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def keep(self, signal: str, protocol: str, encoding: str, request: Any) -> None:
        with self._lock:
            self.received[signal].append((protocol, encoding, request))

    def span_names(self) -> list[str]:
        return [span.name for _, _, request in self.received["traces"]
                for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]

    def metric_names(self) -> set[str]:
        return {metric.name for _, _, request in self.received["metrics"]
                for rm in request.resource_metrics for sm in rm.scope_metrics
                for metric in sm.metrics}

    def log_bodies(self) -> list[str]:
        return [record.body.string_value for _, _, request in self.received["logs"]
                for rl in request.resource_logs for sl in rl.scope_logs
                for record in sl.log_records]

    def protocols(self) -> set[tuple[str, str, str]]:
        """(signal, protocol, content encoding) of every request received."""
        return {(signal, protocol, encoding) for signal, requests in self.received.items()
                for protocol, encoding, _ in requests}


def _grpc_servicers(receiver: Receiver) -> list[tuple[Any, Any]]:
    def export(signal: str) -> Any:
        response = _MESSAGES[signal][1]

        def handle(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            metadata = dict(context.invocation_metadata())
            receiver.keep(signal, "grpc", metadata.get("grpc-encoding", ""), request)
            return response()

        return handle

    traces = type("Traces", (trace_service_pb2_grpc.TraceServiceServicer,),
                  {"Export": export("traces")})
    metrics = type("Metrics", (metrics_service_pb2_grpc.MetricsServiceServicer,),
                   {"Export": export("metrics")})
    logs = type("Logs", (logs_service_pb2_grpc.LogsServiceServicer,), {"Export": export("logs")})
    return [(trace_service_pb2_grpc.add_TraceServiceServicer_to_server, traces()),
            (metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server, metrics()),
            (logs_service_pb2_grpc.add_LogsServiceServicer_to_server, logs())]


def _http_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
            signal = self.path.removeprefix("/v1/")
            if signal not in _MESSAGES:
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            encoding = self.headers.get("Content-Encoding", "")
            request_type, response_type = _MESSAGES[signal]
            receiver.keep(signal, "http/protobuf", encoding,
                          request_type.FromString(_DECODE[encoding](body)))
            payload = response_type().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    for add, servicer in _grpc_servicers(receiver):
        add(servicer, server)
    receiver.grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(receiver))
    receiver.http_port = http.server_address[1]
    thread = threading.Thread(target=http.serve_forever, name="otlp-receiver-http",
                              daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        http.shutdown()
        http.server_close()
        server.stop(grace=None)
