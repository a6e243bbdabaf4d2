"""Real collector and Prometheus processes for the pipeline tests, and readers for their output.

Every server binds 127.0.0.1 on a free port; every process is started in its own process
group and killed (group and all) when its test ends; waits poll with a deadline, never sleep
blindly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import REPO_ROOT, otlp_files
from support.binaries import require_binary
from support.waits import wait_for

COLLECTOR_DIR = REPO_ROOT / "collector"
CONFIGS_DIR = COLLECTOR_DIR / "configs"
PROMETHEUS_DIR = REPO_ROOT / "prometheus"
DEFAULT_COLLECTOR = COLLECTOR_DIR / "_build" / "otelcol-train"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def collector_binary() -> str:
    return require_binary("otelcol-train", "OTEL_TRAIN_COLLECTOR_BIN", DEFAULT_COLLECTOR)


def prometheus_binary() -> str:
    return require_binary("prometheus", "OTEL_TRAIN_PROMETHEUS_BIN")


def promtool_binary() -> str:
    return require_binary("promtool", "OTEL_TRAIN_PROMTOOL_BIN")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different free ports. Picked one at a time, a port freed by the previous pick
    can come back (it did: Jaeger's OTLP and query ports once collided); here every socket
    stays bound until all are picked."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def adjacent_free_ports() -> int:
    """A port p with p + 1 free too: rank r serves its Prometheus endpoint on p + r."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def http_get(url: str, accept: str | None = None, timeout: float = 5.0) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def http_post_json(url: str, body: dict[str, Any], timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


# --- processes -----------------------------------------------------------------------------


@dataclass
class Process:
    """A started server: its command, log file, and a kill that takes its whole group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return f"\n--- {self.name} log ({self.log_path}) ---\n" + \
                self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Graceful (SIGTERM, so exporters flush), then SIGKILL if it lingers."""
        self.kill(signal.SIGTERM)


@dataclass
class Collector:
    """The collector built from collector/, running one of collector/configs/*.yaml."""

    config: Path
    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: Process | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        names = ("grpc", "http", "prometheus", "health", "telemetry")
        for name, port in zip(names, free_ports(len(names))):
            self.ports.setdefault(name, port)

    @property
    def output_dir(self) -> Path:
        return self.workdir / "collector-output"

    @property
    def queue_dir(self) -> Path:
        return self.workdir / "queue"

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def otlp_grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}/metrics"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "OTELCOL_OTLP_GRPC_ENDPOINT": self.otlp_grpc,
            "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.ports['http']}",
            "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{self.ports['prometheus']}",
            "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{self.ports['health']}",
            "OTELCOL_TELEMETRY_HOST": "127.0.0.1",
            "OTELCOL_TELEMETRY_PORT": str(self.ports["telemetry"]),
            "OTELCOL_OUTPUT_DIR": str(self.output_dir),
            # the gateway's persistent sending queues: kept across restart(), like the files
            "OTELCOL_QUEUE_DIR": str(self.queue_dir),
            # the gateway's listen address and ports (local.yaml takes whole endpoints)
            "OTELCOL_LISTEN_HOST": "127.0.0.1",
            "OTELCOL_OTLP_GRPC_PORT": str(self.ports["grpc"]),
            "OTELCOL_OTLP_HTTP_PORT": str(self.ports["http"]),
        })
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 60.0) -> Collector:
        name = f"collector-{self.config.stem}"
        self.process = Process(
            name, [collector_binary(), "--config", str(self.config)], self.env(),
            self.workdir / f"{name}.log",
        ).start()
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float) -> None:
        assert self.process is not None
        process = self.process

        def healthy() -> bool:
            if not process.alive():
                raise AssertionError(f"collector exited with {process.proc.returncode}"
                                     + process.log_tail())
            status, _ = http_get(f"http://127.0.0.1:{self.ports['health']}/", timeout=2)
            return status == 200

        wait_for("the collector's health_check to answer 200", healthy, timeout,
                 on_timeout=process.log_tail)

    def restart(self, timeout: float = 60.0) -> None:
        self.restarts += 1
        self.start(timeout)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else ""

    def telemetry(self) -> list[tuple[str, dict[str, str], float]]:
        """The collector's own metrics: (name, labels, value) of every sample."""
        status, text = http_get(f"http://127.0.0.1:{self.ports['telemetry']}/metrics")
        assert status == 200, text[:500]
        samples = []
        for match in re.finditer(r"^(\w+)(?:\{(.*)\})? (\S+)$", text, flags=re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
        return samples

    def drained(self) -> bool:
        """Everything the receiver accepted is written to the trace and log files.

        Compares the collector's own counters (received, sent by the file exporters) with
        the records in the files, so a test can read complete files without guessing a delay.
        Meant for a collector that has not been restarted (its counters start at zero).
        """
        samples = self.telemetry()

        def total(prefix: str, exporter: str | None = None) -> float:
            return sum(v for name, labels, v in samples if name.startswith(prefix)
                       and (exporter is None or labels.get("exporter") == exporter))

        accepted_spans = total("otelcol_receiver_accepted_spans")
        accepted_logs = total("otelcol_receiver_accepted_log_records")
        return (
            accepted_spans > 0
            and accepted_spans == total("otelcol_exporter_sent_spans", "file/traces")
            == len(read_spans(self.output_dir / "traces.jsonl"))
            and accepted_logs == total("otelcol_exporter_sent_log_records", "file/logs")
            == len(read_logs(self.output_dir / "logs.jsonl"))
        )


@contextlib.contextmanager
def running_collector(config: Path, workdir: Path, **kwargs: Any) -> Iterator[Collector]:
    collector = Collector(config, workdir, **kwargs)
    try:
        yield collector.start()
    finally:
        collector.kill()


@dataclass
class Prometheus:
    """A real Prometheus, on a free port, scraping with the repo's prometheus/ configuration."""

    workdir: Path
    targets: dict[str, list[str]]
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(self) -> Path:
        """prometheus/prometheus.yml, with this test's targets and intervals; rules beside it."""
        text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
        text = text.replace("scrape_interval: 15s", f"scrape_interval: {self.scrape_interval}")
        text = text.replace("scrape_timeout: 10s", f"scrape_timeout: {self.scrape_interval}")
        text = text.replace("evaluation_interval: 30s",
                            f"evaluation_interval: {self.evaluation_interval}")
        targets = {"prometheus": [f"127.0.0.1:{self.port}"], **self.targets}  # self-scrape
        for job, job_targets in targets.items():
            text = replace_job_targets(text, job, job_targets)
        conf_dir = self.workdir / "prometheus"
        conf_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROMETHEUS_DIR / "rules.yml", conf_dir / "rules.yml")
        path = conf_dir / "prometheus.yml"
        path.write_text(text)
        return path

    def start(self, timeout: float = 60.0) -> Prometheus:
        config = self.write_config()
        argv = [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'prometheus' / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--enable-feature=exemplar-storage",
            "--storage.tsdb.retention.time=1h",
            *self.extra_args,
        ]
        self.process = Process("prometheus", argv, dict(os.environ),
                               self.workdir / "prometheus.log").start()
        process = self.process

        def ready() -> bool:
            if not process.alive():
                raise AssertionError("prometheus exited" + process.log_tail())
            return http_get(f"{self.url}/-/ready", timeout=2)[0] == 200

        wait_for("prometheus to be ready", ready, timeout, on_timeout=process.log_tail)
        return self

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        status, body = http_get(url, timeout=10)
        doc = json.loads(body)
        assert status == 200 and doc.get("status") == "success", (url, status, body[:2000])
        return doc["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.api("query", query=promql)["result"]

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else ""


def replace_job_targets(config_text: str, job: str, targets: list[str]) -> str:
    """Replace the static targets of scrape job ``job`` in a prometheus.yml text."""
    lines = config_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- job_name: {job}")
    out = lines[:start + 1]
    i = start + 1
    while i < len(lines) and not lines[i].strip().startswith("- job_name:"):
        stripped = lines[i].strip()
        if stripped.startswith("- targets:"):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            out.append(f"{indent}- targets: {json.dumps(targets)}")
            i += 1
            # drop a block list of targets that follows
            while i < len(lines) and lines[i].strip().startswith("- ") and \
                    not lines[i].strip().startswith("- job_name:") and \
                    len(lines[i]) - len(lines[i].lstrip()) > len(indent):
                i += 1
            continue
        out.append(lines[i])
        i += 1
    out.extend(lines[i:])
    return "\n".join(out) + "\n"


# --- OTLP JSON lines (the collector's file exporter), read by the package's reader ---------


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The export requests of one JSON-lines file, none while it does not exist.

    A collector killed mid-write leaves a torn line, and the restarted one (appending)
    continues on it: of such a line, the requests that parse whole are kept and the torn
    fragment is skipped; so is a last line still being written.
    """
    return otlp_files.file_requests([path])


def read_spans(path: Path) -> list[dict[str, Any]]:
    return otlp_files.file_spans([path])


def read_logs(path: Path) -> list[dict[str, Any]]:
    return otlp_files.file_logs([path])


def read_metric_names(path: Path) -> set[str]:
    return {
        metric["name"]
        for doc in json_lines(path)
        for rm in doc.get("resourceMetrics", [])
        for sm in rm.get("scopeMetrics", [])
        for metric in sm.get("metrics", [])
    }
