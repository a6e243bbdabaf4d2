"""Load the real collector with many ranks' OTLP trace traffic; measure its CPU and memory.

Emulates N ranks of a training job exporting their step traces to a collector, the way the SDK
does it: per rank and per step one `training.rank_step` with `training.data_wait`, `training.forward`,
`training.backward`, `training.optimizer` and one `training.collective` child (6 spans; rank 0 adds the
`training.step` root), every rank of a step in the same trace (trace id shared across ranks), sent
as OTLP/HTTP protobuf batches of several steps per request, like the SDK's batch span processor.
The bodies are encoded once by the OpenTelemetry SDK's own OTLP encoder from SDK spans with
otel-train's names and attributes; per request only the trace ids are swapped in.

The collector is collector/_build/otelcol-train, on 127.0.0.1 free ports, with one of two
pipelines that end in the `debug` exporter at basic verbosity (a sink: one log line per batch):
  agent:   memory_limiter, resource                         (collector/configs/agent.yaml's work
           without k8s_attributes, which needs an API server)
  gateway: memory_limiter, tail_sampling (the gateway's four policies)
both batching in the debug exporter's sending queue (1 s, 1024-4096 spans), as the shipped
configs batch in their exporters' queues (no batch processor since v0.161.0's guidance).
Each load level runs for a fixed time at a paced rate; sent and accepted spans are both divided
by the same sending window (the actual one, which a sender that falls behind stretches), and
their ratio (delivered) must be at least 0.99 at every level (exit 1 otherwise). CPU comes from /proc/<pid>/stat
(utime+stime), memory from /proc/<pid>/status (VmRSS, VmHWM); the accepted count from the
collector's own otelcol_receiver_accepted_spans metric. Bounded: every level stops after
--seconds, the whole run after the levels given.

Series per rank: counted from the metrics file of a real `otel-train demo` run (--series-run),
as Prometheus holds them after translation: one series per counter/gauge point's attribute set,
and buckets + 2 (sum, count) per histogram point's attribute set.

    python bench/bench_collector_load.py --levels 2000,5000,10000,20000 --seconds 20 \
        --out bench/results/collector-load.md [--series-run DIR]
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otel_train import semconv

REPO = Path(__file__).resolve().parent.parent
COLLECTOR = Path(os.environ.get("OTEL_TRAIN_COLLECTOR_BIN",
                                REPO / "collector" / "_build" / "otelcol-train"))
STEPS_PER_REQUEST = 16      # the SDK's batch processor sends many steps' spans per export
PAGE = os.sysconf("SC_CLK_TCK")

CONFIG = """
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{http_port}
processors:
  memory_limiter:
    check_interval: 1s
    limit_mib: 1500
    spike_limit_mib: 300
  resource:
    attributes:
      - key: deployment.environment.name
        value: bench
        action: insert
  tail_sampling:
    decision_wait: 10s
    num_traces: 200000
    expected_new_traces_per_sec: 1000
    policies:
      - name: slow-steps
        type: latency
        latency: {{threshold_ms: 5000}}
      - name: errors
        type: status_code
        status_code: {{status_codes: [ERROR]}}
      - name: stalled-collectives
        type: ottl_condition
        ottl_condition:
          error_mode: ignore
          span:
            - span.name == "training.collective" and span.attributes["training.collective.stalled"] == true
      - name: baseline-share
        type: probabilistic
        probabilistic: {{sampling_percentage: 10}}
exporters:
  debug:
    verbosity: basic
    # batching in the exporter's sending queue, as collector/configs/agent.yaml and
    # gateway.yaml do since they dropped the batch processor (docs/pipeline.md)
    sending_queue:
      enabled: true
      sizer: requests
      queue_size: 5000
      batch:
        flush_timeout: 1s
        sizer: items
        min_size: 1024
        max_size: 4096
service:
  telemetry:
    logs: {{level: warn}}
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus: {{host: 127.0.0.1, port: {metrics_port}}}
  pipelines:
    traces:
      receivers: [otlp]
      processors: {processors}
      exporters: [debug]
"""
PIPELINES = {
    "agent": "[memory_limiter, resource]",
    "gateway": "[memory_limiter, tail_sampling]",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the traffic -----------------------------------------------------------------------------


def placeholder_ids(count: int) -> list[bytes]:
    rng = random.Random(7)
    return [rng.randbytes(16) for _ in range(count)]


def rank_body(rank: int, world: int, run_id: str, placeholders: list[bytes]) -> tuple[bytes, int]:
    """One rank's export of STEPS_PER_REQUEST steps, encoded by the SDK's OTLP encoder."""
    resource = Resource.create({
        "service.name": semconv.SERVICE_NAME_DEFAULT, "service.instance.id": f"{run_id}-{rank}",
        semconv.RES_RUN_ID: run_id, semconv.RES_RANK: rank, semconv.RES_LOCAL_RANK: rank % 8,
        semconv.RES_WORLD_SIZE: world, "host.name": f"node-{rank // 8}", "process.pid": 1000,
        "k8s.pod.name": f"job-worker-{rank // 8}", "k8s.namespace.name": "training",
        "k8s.node.name": f"gpu-node-{rank // 8}",
    })
    rng = random.Random(rank)
    spans = []
    t0 = time.time_ns()
    for i, trace_bytes in enumerate(placeholders):
        step = i
        trace_id = int.from_bytes(trace_bytes, "big")
        step_span_id = rng.getrandbits(64) | 1
        start = t0 + step * 1_000_000_000
        common = {semconv.ATTR_RUN_ID: run_id, semconv.ATTR_STEP: step, semconv.ATTR_RANK: rank}

        def make(name, span_id, parent, begin, end, attrs, trace_id=trace_id, common=common):
            return ReadableSpan(
                name=name,
                context=SpanContext(trace_id, span_id, False, TraceFlags(1)),
                parent=None if parent is None else SpanContext(trace_id, parent, False,
                                                               TraceFlags(1)),
                resource=resource, attributes={**common, **attrs}, kind=SpanKind.INTERNAL,
                start_time=begin, end_time=end)

        if rank == 0:
            spans.append(make(semconv.SPAN_STEP, step_span_id, None, start,
                              start + 950_000_000, {semconv.ATTR_WORLD_SIZE: world}))
        rank_step = rng.getrandbits(64) | 1
        phases = [("data_wait", 50), ("forward", 300), ("backward", 500), ("optimizer", 90)]
        spans.append(make(semconv.SPAN_RANK_STEP, rank_step, step_span_id, start,
                          start + 940_000_000, {
                              **{semconv.ATTR_PHASE_TOTAL_PREFIX + p: ms / 1000
                                 for p, ms in phases},
                              semconv.ATTR_MICRO_BATCHES: 1, semconv.ATTR_SAMPLES: 64,
                              semconv.ATTR_TOKENS: 131072}))
        cursor = start
        backward_id = None
        for phase, ms in phases:
            span_id = rng.getrandbits(64) | 1
            spans.append(make(semconv.PHASE_SPAN[phase], span_id, rank_step, cursor,
                              cursor + ms * 1_000_000,
                              {semconv.ATTR_PHASE: phase, semconv.ATTR_MICRO_BATCH: 0}))
            if phase == "backward":
                backward_id, backward_start = span_id, cursor
            cursor += ms * 1_000_000
        spans.append(make(semconv.SPAN_COLLECTIVE, rng.getrandbits(64) | 1, backward_id,
                          backward_start + 100_000_000, backward_start + 400_000_000, {
                              "training.collective.op": "reduce_scatter", "training.collective.backend": "nccl",
                              "training.collective.bytes": 268435456, "training.collective.group_size": world,
                              "training.collective.seq": step * 40, "training.collective.bus_bandwidth_gbps": 180.5,
                          }))
    return encode_spans(spans).SerializeToString(), len(spans)


class Load:
    """Paced senders: each request is one rank's batch of steps, trace ids swapped in."""

    def __init__(self, port: int, ranks: int, threads: int = 4):
        self.port, self.ranks, self.threads = port, ranks, threads
        self.placeholders = placeholder_ids(STEPS_PER_REQUEST)
        self.bodies = [rank_body(r, ranks, "bench-run", self.placeholders) for r in range(ranks)]
        self.sent_spans = 0
        self.errors = 0
        self._lock = threading.Lock()

    def run(self, spans_per_s: float, seconds: float, step_base: int) -> float:
        """Send for `seconds` at about spans_per_s; returns the rate actually sent."""
        avg = sum(n for _, n in self.bodies) / len(self.bodies)
        interval = self.threads * avg / spans_per_s
        stop_at = time.monotonic() + seconds
        sent = [0] * self.threads

        def sender(index: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            request = index
            next_at = time.monotonic()
            while time.monotonic() < stop_at:
                rank = request % self.ranks
                group = request // self.ranks  # ranks of one group of steps share trace ids
                body, count = self.bodies[rank]
                for i, placeholder in enumerate(self.placeholders):
                    step = step_base + group * STEPS_PER_REQUEST + i
                    body = body.replace(placeholder, step.to_bytes(8, "big") * 2)
                try:
                    conn.request("POST", "/v1/traces", body,
                                 {"Content-Type": "application/x-protobuf"})
                    response = conn.getresponse()
                    response.read()
                    if response.status == 200:
                        sent[index] += count
                    else:
                        with self._lock:
                            self.errors += 1
                except OSError:
                    with self._lock:
                        self.errors += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                request += self.threads
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            conn.close()

        workers = [threading.Thread(target=sender, args=(i,)) for i in range(self.threads)]
        begin = time.monotonic()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - begin
        self.sent_spans += sum(sent)
        self.last_elapsed = elapsed
        return sum(sent) / elapsed


# --- the collector ---------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / PAGE  # utime, stime


def proc_memory_mib(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {key: int(re.search(rf"^{key}:\s+(\d+) kB", status, re.M).group(1)) / 1024
            for key in ("VmRSS", "VmHWM")}


def accepted_spans(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("otelcol_receiver_accepted_spans"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_ready(metrics_port: int, deadline_s: float = 30) -> None:
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        try:
            accepted_spans(metrics_port)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("collector did not start")


def measure(pipeline: str, levels: list[int], seconds: float, ranks: int) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-collector-"))
    http_port, metrics_port = free_port(), free_port()
    config = workdir / "config.yaml"
    config.write_text(CONFIG.format(http_port=http_port, metrics_port=metrics_port,
                                    processors=PIPELINES[pipeline]))
    log = open(workdir / "collector.log", "w")
    proc = subprocess.Popen([str(COLLECTOR), f"--config={config}"], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "GOMAXPROCS": "2"})
    rows = []
    try:
        wait_ready(metrics_port)
        load = Load(http_port, ranks)
        load.run(levels[0] / 4, 3, step_base=10_000_000)  # warm up
        time.sleep(2)
        for n, level in enumerate(levels):
            cpu0, accepted0, t0 = proc_cpu_seconds(proc.pid), accepted_spans(metrics_port), \
                time.monotonic()
            rss_samples = []
            sampler_stop = threading.Event()

            def sample_rss(stop=sampler_stop, samples=rss_samples):
                while not stop.wait(0.5):
                    samples.append(proc_memory_mib(proc.pid)["VmRSS"])

            sampler = threading.Thread(target=sample_rss)
            sampler.start()
            errors0 = load.errors
            offered = load.run(level, seconds, step_base=(n + 1) * 100_000_000)
            sampler_stop.set()
            sampler.join()
            time.sleep(1.5)  # let the last batch drain before reading the counters
            wall = time.monotonic() - t0
            cpu = proc_cpu_seconds(proc.pid) - cpu0
            accepted = accepted_spans(metrics_port) - accepted0
            window = load.last_elapsed  # the sending window: both rates over the same time
            sent = offered * window
            rows.append({
                "pipeline": pipeline, "target_spans_per_s": level,
                "send_window_s": round(window, 2),
                "sent_spans": round(sent), "accepted_spans": accepted,
                "sent_spans_per_s": round(offered),
                "accepted_spans_per_s": round(accepted / window),
                "delivered": round(accepted / sent, 4) if sent else None,
                "request_errors": load.errors - errors0,
                "cpu_cores": round(cpu / wall, 3),
                "cpu_s_per_1k_spans": round(cpu / (accepted / 1000), 4) if accepted else None,
                "rss_mib_mean": round(sum(rss_samples) / max(len(rss_samples), 1), 1),
                "rss_mib_max": round(max(rss_samples, default=0), 1),
            })
            print(json.dumps(rows[-1]), flush=True)
        rows[-1]["vm_hwm_mib"] = round(proc_memory_mib(proc.pid)["VmHWM"], 1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


# --- series per rank -------------------------------------------------------------------------


def series_per_rank(run_dir: Path) -> dict:
    """Distinct Prometheus series per rank in a run's OTLP JSON metrics files (last export)."""
    series: dict[str, set] = {}
    for path in glob.glob(str(run_dir / "**" / "metrics*.jsonl"), recursive=True):
        for line in Path(path).read_text().splitlines():
            for rm in json.loads(line).get("resourceMetrics", []):
                res = {a["key"]: a["value"] for a in rm["resource"].get("attributes", [])}
                rank = str(next(iter(res.get(semconv.RES_RANK, {"": "?"}).values())))
                for sm in rm.get("scopeMetrics", []):
                    for metric in sm.get("metrics", []):
                        for kind in ("sum", "gauge", "histogram"):
                            if kind not in metric:
                                continue
                            for point in metric[kind].get("dataPoints", []):
                                attrs = tuple(sorted((a["key"], json.dumps(a["value"]))
                                                     for a in point.get("attributes", [])))
                                if kind == "histogram":
                                    for b in range(len(point.get("explicitBounds", [])) + 1):
                                        series.setdefault(rank, set()).add(
                                            (metric["name"], "bucket", b, attrs))
                                    for part in ("sum", "count"):
                                        series.setdefault(rank, set()).add(
                                            (metric["name"], part, attrs))
                                else:
                                    series.setdefault(rank, set()).add((metric["name"], attrs))
    per_rank = {rank: len(s) for rank, s in sorted(series.items())}
    by_metric: dict[str, int] = {}
    for key in series.get("0", set()):
        by_metric[key[0]] = by_metric.get(key[0], 0) + 1
    return {"per_rank": per_rank, "rank0_by_metric": dict(sorted(by_metric.items()))}


# --- main ------------------------------------------------------------------------------------

#: accepted / sent at every level (sent and accepted both counted over the sending window;
#: accepted read after a 1.5 s drain): below this the collector was dropping or refusing
MIN_DELIVERED = 0.99



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="2000,5000,10000,20000",
                        help="offered spans/s, comma separated")
    parser.add_argument("--seconds", type=float, default=20, help="duration of each level")
    parser.add_argument("--ranks", type=int, default=64, help="emulated ranks")
    parser.add_argument("--pipelines", default="agent,gateway")
    parser.add_argument("--series-run", type=Path, help="run directory of an otel-train demo")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    result = {"collector": str(COLLECTOR), "ranks": args.ranks, "seconds": args.seconds,
              "steps_per_request": STEPS_PER_REQUEST, "cpus": os.cpu_count(), "rows": []}
    for pipeline in args.pipelines.split(","):
        result["rows"] += measure(pipeline, levels, args.seconds, args.ranks)
    if args.series_run:
        result["series"] = series_per_rank(args.series_run)
        print(json.dumps(result["series"]))
    # verdict: the collector took (nearly) everything it was sent at every level
    missed = [f"{r['pipeline']} at {r['target_spans_per_s']} spans/s delivered "
              f"{r['delivered']}" for r in result["rows"]
              if r["delivered"] is None or r["delivered"] < MIN_DELIVERED]
    result["verdict"] = "; ".join(missed) or "all levels delivered"
    print(f"verdict: {result['verdict']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
