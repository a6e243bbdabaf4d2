"""The collector distribution built from collector/ and the three pipelines it runs.

The binary comes from ``collector/build.sh`` (OTEL_TRAIN_COLLECTOR_BIN overrides it); tests
skip without it locally and fail without it in CI (OTEL_TRAIN_REQUIRE_BINARIES=1).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.pipeline_fixtures import (
    COLLECTOR_DIR,
    CONFIGS_DIR,
    DEFAULT_COLLECTOR,
    OPENMETRICS,
    Collector,
    Prometheus,
    collector_binary,
    free_port,
    http_get,
    http_post_json,
    prometheus_binary,
    read_logs,
    read_spans,
    running_collector,
    wait_for,
)

CONFIGS = ("local", "agent", "gateway", "replay")
RELEASE = "v0.161.0"
# k8sattributesprocessor went stable in that release: its tag there is v1.0.0
STABLE_IN_RELEASE = {
    "github.com/open-telemetry/opentelemetry-collector-contrib/processor/k8sattributesprocessor":
        "v1.0.0",
}

# --- the manifest and the build ------------------------------------------------------------


def manifest_modules() -> list[tuple[str, str]]:
    text = (COLLECTOR_DIR / "manifest.yaml").read_text()
    return re.findall(r"^\s*- gomod: (\S+) (v\S+)\s*$", text, flags=re.M)


def test_manifest_pins_every_module_to_one_collector_release():
    modules = manifest_modules()
    assert len(modules) >= 10
    for module, version in modules:
        assert version == STABLE_IN_RELEASE.get(module, RELEASE), module
    build_script = (COLLECTOR_DIR / "build.sh").read_text()
    assert f'BUILDER_VERSION="{RELEASE}"' in build_script


def test_binary_is_built_from_the_manifest():
    out = subprocess.run([collector_binary(), "components"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for module, version in manifest_modules():
        assert f"module: {module} {version}" in out, f"{module} {version} missing from binary"


def test_second_build_is_a_cache_hit():
    chosen = os.environ.get("OTEL_TRAIN_COLLECTOR_BIN")
    if chosen and Path(chosen).resolve() != DEFAULT_COLLECTOR.resolve():
        pytest.skip("a collector binary from elsewhere is in use")
    collector_binary()  # skip (or fail in CI) when it was never built
    proc = subprocess.Popen(["bash", str(COLLECTOR_DIR / "build.sh")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("build.sh rebuilt instead of hitting its cache: the binary is stale "
                    "(manifest changed since the last build?)")
    assert proc.returncode == 0, err
    assert "up to date" in err
    assert out.strip().splitlines()[-1] == str(DEFAULT_COLLECTOR)


# --- validation ----------------------------------------------------------------------------


def validate(config: Path, env: dict[str, str] | None = None,
             unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "K8S_NODE_NAME": "node-a", **(env or {})}
    for name in unset:
        full_env.pop(name, None)
    return subprocess.run([collector_binary(), "validate", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=full_env)


def test_every_shipped_config_is_checked():
    assert sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")) == sorted(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid(name):
    result = validate(CONFIGS_DIR / f"{name}.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid_with_every_variable_set(name, tmp_path):
    # Every ${env:NAME:-default} set to its own default: the overrides are wired, not only
    # the defaults (a variable inside a number or a list would break here first).
    text = (CONFIGS_DIR / f"{name}.yaml").read_text()
    env = dict(re.findall(r"\$\{env:(\w+):-([^}]*)\}", text))
    env["OTELCOL_QUEUE_DIR"] = str(tmp_path / "queue")
    result = validate(CONFIGS_DIR / f"{name}.yaml", env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_validate_rejects_an_unknown_setting(tmp_path):
    # validate must really check the components' settings, or the tests above prove nothing.
    # (Not every component rejects unknown keys: the prometheus exporter of v0.161.0 silently
    # ignores them, so a misspelt enable_open_metrics is caught by the exemplar test below.)
    broken = tmp_path / "local.yaml"
    text = (CONFIGS_DIR / "local.yaml").read_text()
    broken.write_text(text.replace("check_interval: 1s", "check_intervall: 1s"))
    result = validate(broken)
    assert result.returncode != 0
    assert "check_intervall" in result.stdout + result.stderr


def test_validate_checks_the_sending_queue_batch_settings(tmp_path):
    broken = tmp_path / "gateway.yaml"
    text = (CONFIGS_DIR / "gateway.yaml").read_text()
    broken.write_text(text.replace("flush_timeout: 2s", "flush_timeout: 0s", 1))
    result = validate(broken)
    assert result.returncode != 0
    assert "flush_timeout" in result.stdout + result.stderr


def test_agent_refuses_to_run_without_its_node_name():
    result = validate(CONFIGS_DIR / "agent.yaml", unset=("K8S_NODE_NAME",))
    assert result.returncode != 0
    assert "K8S_NODE_NAME" in result.stdout + result.stderr


@pytest.mark.parametrize("name", CONFIGS)
def test_every_address_and_path_comes_from_the_environment(name):
    text = (CONFIGS_DIR / f"{name}.yaml").read_text()
    keys = r"(endpoint|path|hostname|port|host|directory)"
    settings = re.findall(rf"^\s*{keys}:\s*(\S.*)$", text, flags=re.M)
    assert settings
    for key, value in settings:
        assert "${env:" in value, f"{name}.yaml: {key}: {value} is not configurable"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_pipeline_keeps_health_check(name):
    text = (CONFIGS_DIR / f"{name}.yaml").read_text()
    assert re.search(r"^\s*extensions: \[health_check[,\]]", text, flags=re.M)


# --- batching and queues (v0.161.0 exporterhelper; docs/pipeline.md#batching) -----------------


def config(name: str) -> dict:
    return yaml.safe_load((CONFIGS_DIR / f"{name}.yaml").read_text())


def queues(exporter: dict) -> list[dict]:
    """The exporter's sending queues: its own and, for load_balancing, its OTLP template's."""
    found = [exporter["sending_queue"]] if "sending_queue" in exporter else []
    template = exporter.get("protocol", {}).get("otlp", {})
    return found + ([template["sending_queue"]] if "sending_queue" in template else [])


@pytest.mark.parametrize("name", ["agent", "gateway"])
def test_agent_and_gateway_batch_in_the_exporters_queues_not_in_a_processor(name):
    cfg = config(name)
    assert "batch" not in cfg["processors"]
    for pipeline, spec in cfg["service"]["pipelines"].items():
        assert spec["processors"][0] == "memory_limiter", pipeline
        for exporter in spec["exporters"]:
            if exporter == "prometheus_remote_write":
                continue  # no sending_queue in v0.161.0, and must not reorder samples
            batches = [q["batch"] for q in queues(cfg["exporters"][exporter]) if "batch" in q]
            assert len(batches) == 1, f"{pipeline}: {exporter} batches {len(batches)} times"
            assert batches[0]["sizer"] == "items"
            assert 0 < batches[0]["min_size"] <= batches[0]["max_size"]


def test_gateway_keeps_tail_sampling_on_traces():
    assert config("gateway")["service"]["pipelines"]["traces"]["processors"] == [
        "memory_limiter", "tail_sampling"]


def test_gateway_queues_every_queueing_exporter_on_disk():
    cfg = config("gateway")
    storages = set()
    for name, exporter in cfg["exporters"].items():
        if name == "prometheus_remote_write":
            assert "sending_queue" not in exporter  # it has none to persist
            continue
        storages.add(exporter["sending_queue"]["storage"])
    (storage,) = storages
    assert storage.startswith("file_storage/")
    assert storage in cfg["service"]["extensions"]
    assert cfg["extensions"][storage]["directory"] == "${env:OTELCOL_QUEUE_DIR:-/var/lib/otelcol/queue}"
    assert cfg["extensions"][storage]["create_directory"] is True


def test_local_and_replay_keep_their_processors():
    # local.yaml's file and prometheus exporters have no sending_queue in v0.161.0, so the
    # batch processor stays; replay.yaml neither batches nor queues, by design.
    assert config("local")["service"]["pipelines"]["traces"]["processors"] == [
        "memory_limiter", "resource", "batch"]
    replay = config("replay")
    assert "processors" not in replay or "batch" not in replay["processors"]
    assert "sending_queue" not in replay["exporters"]["prometheus_remote_write"]


# --- the local pipeline, live --------------------------------------------------------------

TRACE_ID = "5b8efff798038103d269b633813fc60c"


def _kv(key: str, value: object) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _resource(rank: int) -> dict:
    return {"attributes": [_kv("service.name", "otel-train"),
                           _kv("service.instance.id", f"run-x-rank-{rank}"),
                           _kv("training.run.id", "run-x"), _kv("training.rank", rank)]}


def otlp_spans(trace_id: str, spans: list[dict], rank: int = 0) -> dict:
    return {"resourceSpans": [{"resource": _resource(rank),
                               "scopeSpans": [{"scope": {"name": "otel_train"}, "spans": spans}]}]}


def span(name: str, trace_id: str, span_id: str, start_ns: int, duration_ms: float,
         parent: str = "", attrs: dict | None = None, events: list[dict] | None = None,
         error: bool = False) -> dict:
    out = {
        "traceId": trace_id, "spanId": span_id, "parentSpanId": parent, "name": name,
        "kind": 1, "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(start_ns + int(duration_ms * 1e6)),
        "attributes": [_kv(k, v) for k, v in (attrs or {}).items()],
        "events": events or [],
    }
    if error:
        out["status"] = {"code": 2, "message": "boom"}
    return out


def step_histogram(now: int) -> dict:
    """One training.step.duration histogram point of rank 1, with an exemplar."""
    return {"resourceMetrics": [{"resource": _resource(1), "scopeMetrics": [{
        "scope": {"name": "otel_train"}, "metrics": [{
            "name": "training.step.duration", "unit": "s", "histogram": {
                "aggregationTemporality": 2, "dataPoints": [{
                    "attributes": [_kv("training.rank", 1), _kv("training.run.id", "run-x")],
                    "startTimeUnixNano": str(now - 10**9), "timeUnixNano": str(now),
                    "count": "1", "sum": 0.05, "bucketCounts": ["0", "1", "0"],
                    "explicitBounds": [0.01, 0.1],
                    "exemplars": [{"timeUnixNano": str(now), "asDouble": 0.05,
                                   "traceId": TRACE_ID, "spanId": "00f067aa0ba902b7"}],
                }]}}]}]}]}


def test_local_pipeline_writes_traces_and_logs_and_serves_exemplars(tmp_path):
    now = time.time_ns()
    with running_collector(CONFIGS_DIR / "local.yaml", tmp_path,
                           extra_env={"DEPLOYMENT_ENVIRONMENT": "ci"}) as col:
        body = otlp_spans(TRACE_ID, [span("training.step", TRACE_ID, "00f067aa0ba902b7", now, 50,
                                          attrs={"training.step": 3})])
        assert http_post_json(f"{col.otlp_http}/v1/traces", body) == 200
        logs = {"resourceLogs": [{"resource": _resource(0), "scopeLogs": [{"logRecords": [{
            "timeUnixNano": str(now), "severityNumber": 9, "body": {"stringValue": "step done"},
            "traceId": TRACE_ID, "spanId": "00f067aa0ba902b7"}]}]}]}
        assert http_post_json(f"{col.otlp_http}/v1/logs", logs) == 200
        metrics = step_histogram(now)
        assert http_post_json(f"{col.otlp_http}/v1/metrics", metrics) == 200

        spans = wait_for("the span in the file exporter's traces.jsonl",
                         lambda: read_spans(col.output_dir / "traces.jsonl"), 20)
        assert spans[0]["traceId"] == TRACE_ID
        assert spans[0]["resource"]["deployment.environment.name"] == "ci"
        assert spans[0]["resource"]["service.environment"] == "ci"
        records = wait_for("the log record in logs.jsonl",
                           lambda: read_logs(col.output_dir / "logs.jsonl"), 20)
        assert records[0]["traceId"] == TRACE_ID and records[0]["spanId"] == "00f067aa0ba902b7"

        def exposition() -> str | None:
            status, text = http_get(col.metrics_url, accept=OPENMETRICS)
            return text if status == 200 and "training_step_duration_seconds_bucket" in text \
                else None

        text = wait_for("the histogram on the Prometheus exporter", exposition, 20)
        bucket = next(line for line in text.splitlines()
                      if line.startswith("training_step_duration_seconds_bucket")
                      and 'le="0.1"' in line)
        assert 'training_rank="1"' in bucket and 'training_run_id="run-x"' in bucket
        assert f'trace_id="{TRACE_ID}"' in bucket, "exemplar lost: " + bucket


def test_local_collector_survives_a_kill_and_restart_on_the_same_ports(tmp_path):
    col = Collector(CONFIGS_DIR / "local.yaml", tmp_path)
    try:
        col.start()
        col.kill()
        assert not col.process.alive()
        col.restart()
        body = otlp_spans(TRACE_ID, [span("training.step", TRACE_ID, "00f067aa0ba902b8",
                                          time.time_ns(), 10)])
        assert http_post_json(f"{col.otlp_http}/v1/traces", body) == 200
        wait_for("the span after the restart",
                 lambda: read_spans(col.output_dir / "traces.jsonl"), 20)
    finally:
        col.kill()


# --- the gateway's tail sampling, live ------------------------------------------------------


def test_gateway_keeps_slow_failed_and_stalled_steps_and_drops_the_rest(tmp_path):
    # The gateway's Tempo exporter points at a local collector, whose file exporter is the
    # "trace backend"; Loki and remote write point at closed ports (unused here).
    with running_collector(CONFIGS_DIR / "local.yaml", tmp_path / "backend") as backend:
        closed = free_port()
        env = {
            "TEMPO_OTLP_ENDPOINT": backend.otlp_grpc,
            "LOKI_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}/otlp",
            "PROMETHEUS_REMOTE_WRITE_ENDPOINT": f"http://127.0.0.1:{closed}/api/v1/write",
            "OTELCOL_SLOW_STEP_THRESHOLD_MS": "1000",
            "OTELCOL_SAMPLING_PERCENTAGE": "0",
            "OTELCOL_TAIL_DECISION_WAIT": "2s",
            "OTELCOL_MEMORY_LIMIT_MIB": "256",
            "OTELCOL_MEMORY_SPIKE_LIMIT_MIB": "64",
        }
        with running_collector(CONFIGS_DIR / "gateway.yaml", tmp_path / "gateway",
                               extra_env=env) as gateway:
            now = time.time_ns()
            ids = {k: f"{i + 1:032x}" for i, k in
                   enumerate(("fast", "slow", "error", "stalled_event", "stalled_attr"))}

            def step(kind: str, duration_ms: float, **kw: object) -> list[dict]:
                tid = ids[kind]
                root = span("training.step", tid, "a" * 16, now, duration_ms)
                child = span("training.collective", tid, "b" * 16, now, min(duration_ms, 5),
                             parent="a" * 16, **kw)
                return [root, child]

            # "fast" goes first: its decision is due no later than the others', so once the
            # kept traces have arrived, a wrongly kept "fast" would have arrived too.
            batches = [
                step("fast", 20),
                step("slow", 1500),
                step("error", 20, error=True),
                step("stalled_event", 20, events=[{"name": "training.collective.stalled",
                                                   "timeUnixNano": str(now)}]),
                step("stalled_attr", 20, attrs={"training.collective.stalled": True}),
            ]
            for spans in batches:
                assert http_post_json(f"{gateway.otlp_http}/v1/traces",
                                      otlp_spans(spans[0]["traceId"], spans)) == 200

            kept_kinds = {"slow", "error", "stalled_event", "stalled_attr"}

            def kept() -> set[str] | None:
                seen = {s["traceId"] for s in read_spans(backend.output_dir / "traces.jsonl")}
                kinds = {k for k, tid in ids.items() if tid in seen}
                return kinds if kinds >= kept_kinds else None

            got = wait_for("the tail-sampled traces at the backend", kept, 40,
                           on_timeout=gateway.log_tail)
            assert got == kept_kinds, f"kept {got}"
            # both spans of each kept trace arrive together
            spans = read_spans(backend.output_dir / "traces.jsonl")
            for kind in kept_kinds:
                assert len([s for s in spans if s["traceId"] == ids[kind]]) == 2


def test_gateway_delivers_logs_over_otlp_http_and_metrics_by_remote_write(tmp_path):
    # Loki's stand-in is a local collector (OTLP/HTTP in, logs.jsonl out); the metrics go to
    # a real Prometheus with its remote-write receiver and exemplar storage on.
    prometheus_binary()
    prom = Prometheus(tmp_path / "prom", targets={}, extra_args=[
        "--web.enable-remote-write-receiver"])
    try:
        prom.start()
        with running_collector(CONFIGS_DIR / "local.yaml", tmp_path / "loki") as loki:
            env = {
                "TEMPO_OTLP_ENDPOINT": f"127.0.0.1:{free_port()}",
                "LOKI_OTLP_ENDPOINT": loki.otlp_http,
                "PROMETHEUS_REMOTE_WRITE_ENDPOINT": f"{prom.url}/api/v1/write",
            }
            with running_collector(CONFIGS_DIR / "gateway.yaml", tmp_path / "gateway",
                                   extra_env=env) as gateway:
                now = time.time_ns()
                logs = {"resourceLogs": [{"resource": _resource(1), "scopeLogs": [{
                    "logRecords": [{"timeUnixNano": str(now), "severityNumber": 9,
                                    "body": {"stringValue": "step done"},
                                    "traceId": TRACE_ID, "spanId": "00f067aa0ba902b7"}]}]}]}
                assert http_post_json(f"{gateway.otlp_http}/v1/logs", logs) == 200
                assert http_post_json(f"{gateway.otlp_http}/v1/metrics",
                                      step_histogram(now)) == 200

                records = wait_for("the log at the OTLP/HTTP backend",
                                   lambda: read_logs(loki.output_dir / "logs.jsonl"), 30,
                                   on_timeout=gateway.log_tail)
                assert records[0]["traceId"] == TRACE_ID

                query = 'training_step_duration_seconds_count{training_run_id="run-x"}'
                result = wait_for("the remote-written histogram in Prometheus",
                                  lambda: prom.query(query), 30, on_timeout=gateway.log_tail)
                assert result[0]["metric"]["training_rank"] == "1"
                assert float(result[0]["value"][1]) == 1
                exemplars = wait_for(
                    "the remote-written exemplar",
                    lambda: prom.api("query_exemplars",
                                     query='training_step_duration_seconds_bucket'
                                           '{training_run_id="run-x"}',
                                     start=str(now / 1e9 - 600), end=str(now / 1e9 + 600)), 30)
                trace_ids = {e["labels"].get("trace_id") for s in exemplars
                             for e in s["exemplars"]}
                assert trace_ids == {TRACE_ID}
    finally:
        prom.kill()


# --- the gateway's persistent queue, across a restart -----------------------------------------


def send_steps_with_the_sdk(otlp_http: str, steps: int) -> set[tuple[str, str]]:
    """`steps` traces (a training.step with two children) through the SDK's OTLP/HTTP exporter.

    Returns every span as (trace id, span id), hex as in OTLP JSON."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "otel-train",
                                                        "training.run.id": "run-q"}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=5)))
    tracer = provider.get_tracer("otel_train")
    sent = set()
    for step in range(steps):
        with tracer.start_as_current_span("training.step", attributes={"training.step": step}) as root:
            spans = [root]
            for phase in ("training.forward", "training.backward"):
                with tracer.start_as_current_span(phase) as child:
                    spans.append(child)
        sent |= {(f"{s.get_span_context().trace_id:032x}", f"{s.get_span_context().span_id:016x}")
                 for s in spans}
    provider.shutdown()
    return sent


def telemetry_total(col: Collector, metric: str, **labels: str) -> float:
    return sum(value for name, got, value in col.telemetry()
               if name.startswith(metric) and all(got.get(k) == v for k, v in labels.items()))


def test_gateway_queue_survives_a_restart(tmp_path):
    """Spans the gateway accepted while Tempo was down reach Tempo after a gateway restart.

    The shipped gateway.yaml, unchanged: its Tempo exporter points at a port where nothing
    listens, so the sampled traces wait in the persistent sending queue (file_storage, in the
    collector's OTELCOL_QUEUE_DIR). The gateway is stopped with SIGTERM, the "Tempo" (a local
    collector, whose file exporter records what it receives) starts on that port, and the same
    gateway starts again on the same queue directory. Nothing is sent after the restart.
    """
    tempo = Collector(CONFIGS_DIR / "local.yaml", tmp_path / "tempo")  # its ports, not started
    closed = free_port()
    env = {
        "TEMPO_OTLP_ENDPOINT": tempo.otlp_grpc,
        "LOKI_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}/otlp",
        "PROMETHEUS_REMOTE_WRITE_ENDPOINT": f"http://127.0.0.1:{closed}/api/v1/write",
        "OTELCOL_SAMPLING_PERCENTAGE": "100",
        "OTELCOL_TAIL_DECISION_WAIT": "1s",
        "OTELCOL_MEMORY_LIMIT_MIB": "256",
        "OTELCOL_MEMORY_SPIKE_LIMIT_MIB": "64",
    }
    gateway = Collector(CONFIGS_DIR / "gateway.yaml", tmp_path / "gateway", extra_env=env)
    steps = 5
    try:
        gateway.start()
        sent = send_steps_with_the_sdk(gateway.otlp_http, steps)
        assert len(sent) == 3 * steps
        # Tail sampling releases each trace as one request into the Tempo exporter's queue.
        wait_for("every sampled trace in the Tempo exporter's queue",
                 lambda: telemetry_total(gateway, "otelcol_exporter_queue_size",
                                         exporter="otlp_grpc/tempo") >= steps,
                 30, on_timeout=gateway.log_tail)
        gateway.stop()
        assert gateway.process.proc.returncode == 0, "not a graceful stop" + gateway.log_tail()
        assert list(gateway.queue_dir.iterdir()), "nothing on disk"

        tempo.start()
        gateway.restart()

        def delivered() -> set[tuple[str, str]] | None:
            got = {(s["traceId"], s["spanId"])
                   for s in read_spans(tempo.output_dir / "traces.jsonl")}
            return got if got >= sent else None

        got = wait_for("the spans queued before the restart, at Tempo", delivered, 60,
                       on_timeout=gateway.log_tail)
        assert got == sent
    finally:
        gateway.kill()
        tempo.kill()
