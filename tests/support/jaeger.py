"""A real Jaeger v2 for tests (built by tools/jaeger/install.sh, in-memory storage, every
port a free one on 127.0.0.1), and runs sent to it over OTLP/HTTP."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from otel_train import semconv as sc
from support import REPO_ROOT
from support.binaries import require_binary
from support.pipeline_fixtures import (
    Process,
    free_ports,
    http_get,
    http_post_json,
    json_lines,
    wait_for,
)

DEFAULT_JAEGER = REPO_ROOT / "tools" / "jaeger" / "bin" / "jaeger"
JAEGER_CONFIG = REPO_ROOT / "tools" / "jaeger" / "config.yaml"


@dataclass
class Jaeger:
    process: Process
    query_port: int
    otlp_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"


@contextlib.contextmanager
def running_jaeger(workdir: Path) -> Iterator[Jaeger]:
    """tools/jaeger/config.yaml's Jaeger on free ports, killed on exit."""
    binary = require_binary("jaeger", "OTEL_TRAIN_JAEGER_BIN", DEFAULT_JAEGER)
    names = ("JAEGER_QUERY_PORT", "JAEGER_QUERY_GRPC_PORT", "JAEGER_OTLP_HTTP_PORT")
    ports = dict(zip(names, free_ports(len(names))))
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    process = Process("jaeger", [binary, "--config", str(JAEGER_CONFIG)], env,
                      workdir / "jaeger.log").start()
    server = Jaeger(process, ports["JAEGER_QUERY_PORT"], ports["JAEGER_OTLP_HTTP_PORT"])

    def ready() -> bool:
        if not process.alive():
            raise AssertionError("jaeger exited" + process.log_tail())
        return http_get(f"{server.url}/api/services", timeout=2)[0] == 200 and \
            http_get(f"{server.otlp_http}/", timeout=2)[0] > 0

    try:
        wait_for("jaeger's query API and OTLP receiver", ready, 60, on_timeout=process.log_tail)
        yield server
    finally:
        process.kill()


def send_run(jaeger: Jaeger, run_dir: Path) -> int:
    """Every export request of ``run_dir``'s traces files, posted to Jaeger's OTLP/HTTP
    receiver; the number of requests."""
    sent = 0
    for path in sorted(run_dir.glob(sc.TRACES_GLOB)):
        for request in json_lines(path):
            status = http_post_json(f"{jaeger.otlp_http}/v1/traces", request)
            assert status == 200, f"Jaeger answered {status} to a request of {path}"
            sent += 1
    return sent
