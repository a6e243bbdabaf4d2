"""End to end: a 2-rank gloo training run -> the real collector -> a real Prometheus.

The collector is the one built from collector/ running collector/configs/local.yaml; the
Prometheus is Debian's (exemplar storage on) running prometheus/prometheus.yml and rules.yml
with this test's ports. Nothing is mocked: ``otel-train demo`` trains for real, exports OTLP
over HTTP, and every assertion reads what the programs wrote or serve.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support import REPO_ROOT, otlp_files
from support.pipeline_fixtures import (
    CONFIGS_DIR,
    Collector,
    Prometheus,
    adjacent_free_ports,
    collector_binary,
    json_lines,
    prometheus_binary,
    read_logs,
    read_spans,
    wait_for,
)

from otel_train import semconv

pytestmark = pytest.mark.slow

RANKS = 2
PHASE_SPANS = {semconv.SPAN_DATA_WAIT, semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD,
               semconv.SPAN_OPTIMIZER}
CONTRACT_SERIES = {
    f"{semconv.PROM_STEP_DURATION}_count": (),
    f"{semconv.PROM_STEP_DURATION}_bucket": (),
    f"{semconv.PROM_PHASE_DURATION}_count": (semconv.PROM_PHASE_LABEL,),
    semconv.PROM_SAMPLES: (),
    semconv.PROM_TOKENS: (),
    semconv.PROM_TELEMETRY_DROPPED: (semconv.PROM_SIGNAL_LABEL,),
}


# --- a demo run in the background ----------------------------------------------------------




@dataclass
class DemoRun:
    """``otel-train demo`` exporting OTLP to a collector; its output read as it comes."""

    collector: Collector
    workdir: Path
    steps: int
    extra_args: list[str] = field(default_factory=list)
    sampler_ratio: float = 1.0
    prometheus_port: int | None = None
    run_id: str = field(default_factory=lambda: f"e2e-{uuid.uuid4().hex[:12]}")
    proc: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in list(env):
            if name.startswith(("OTEL_", "OTEL_TRAIN_")):
                del env[name]
        env.update({
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.collector.otlp_http,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            # The demo's 100 steps last a few seconds: drained at the default 2 s, a rank's
            # step count can reach Prometheus first at its final value, and a rate over the
            # run is then 0/0. Drained every 0.5 s, each scrape sees the counts move.
            "OTEL_TRAIN_EMIT_INTERVAL_MS": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BLRP_SCHEDULE_DELAY": "200",
            "OTEL_TRAIN_OUTPUT_DIR": str(self.workdir / "runs"),
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(self.sampler_ratio),
            "PYTHONUNBUFFERED": "1",
        })
        if self.prometheus_port is not None:
            env["OTEL_TRAIN_PROMETHEUS_PORT"] = str(self.prometheus_port)
        return env

    def start(self) -> DemoRun:
        argv = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", str(RANKS),
                "--steps", str(self.steps), "--no-compile", "--ddp", "--workers", "0",
                "--run-id", self.run_id, "--output-dir", str(self.workdir / "runs"),
                *self.extra_args]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=self.env(), cwd=REPO_ROOT, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def text(self) -> str:
        return "".join(self.output)

    def latest_step(self) -> int:
        """The highest step number the ranks' console logs have reached so far."""
        steps = [int(s) for s in re.findall(r'"step": (\d+)', self.text())]
        return max(steps, default=-1)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            self.kill()
            raise AssertionError(
                f"demo did not finish in {timeout}s:\n{self.text()[-4000:]}") from err
        self.finished = time.monotonic()
        deadline = time.monotonic() + 10
        while not self.text().rstrip().endswith("}") and time.monotonic() < deadline:
            time.sleep(0.05)  # the reader thread drains the pipe's last lines
        return rc

    def result(self) -> dict[str, Any]:
        """The JSON line the demo prints at the end: run id, run dir, dropped telemetry."""
        for line in reversed(self.text().splitlines()):
            if line.startswith("{") and '"dropped"' in line:
                return json.loads(line)
        raise AssertionError("no result line in demo output:\n" + self.text()[-4000:])

    def console_events(self, event: str) -> list[dict[str, Any]]:
        found = []
        for match in re.finditer(r"\{[^{}]*\}", self.text()):
            try:
                doc = json.loads(match.group(0))
            except ValueError:
                continue
            if doc.get("event") == event:
                found.append(doc)
        return found

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def run_spans(collector: Collector, run_id: str) -> list[dict[str, Any]]:
    return [s for s in read_spans(collector.output_dir / "traces.jsonl")
            if s["attrs"].get(semconv.ATTR_RUN_ID) == run_id
            or s["resource"].get(semconv.RES_RUN_ID) == run_id]


def run_logs(collector: Collector, run_id: str) -> list[dict[str, Any]]:
    return [r for r in read_logs(collector.output_dir / "logs.jsonl")
            if r["resource"].get(semconv.RES_RUN_ID) == run_id]


def metric_points(collector: Collector, name: str, run_id: str) -> list[dict[str, Any]]:
    """Every exported point of metric ``name`` of the run, in file order."""
    points = []
    for doc in json_lines(collector.output_dir / "metrics.jsonl"):
        for rm in doc.get("resourceMetrics", []):
            resource = otlp_files.attrs(rm.get("resource", {}))
            if resource.get(semconv.RES_RUN_ID) != run_id:
                continue
            rank = int(resource[semconv.RES_RANK])
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric["name"] != name:
                        continue
                    body = next(v for v in metric.values() if isinstance(v, dict)
                                and "dataPoints" in v)
                    for point in body["dataPoints"]:
                        points.append({**point, "rank": rank, "attrs": otlp_files.attrs(point)})
    return points


# --- one run through collector and Prometheus, shared by the checks below -------------------


@dataclass
class Pipeline:
    collector: Collector
    prometheus: Prometheus
    demo: DemoRun
    spans: list[dict[str, Any]]
    logs: list[dict[str, Any]]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Pipeline:
    collector_binary()
    prometheus_binary()
    workdir = tmp_path_factory.mktemp("e2e")
    collector = Collector(CONFIGS_DIR / "local.yaml", workdir)
    rank_port = adjacent_free_ports()
    prometheus = Prometheus(workdir, targets={
        "otel-train-collector": [f"127.0.0.1:{collector.ports['prometheus']}"],
        "otelcol": [f"127.0.0.1:{collector.ports['telemetry']}"],
        "otel-train-ranks": [f"127.0.0.1:{rank_port + r}" for r in range(RANKS)],
    })
    demo = DemoRun(collector, workdir, steps=100, extra_args=["--slow-rank", "1"],
                   sampler_ratio=0.5, prometheus_port=rank_port)
    try:
        collector.start()
        prometheus.start()
        demo.start()
        rc = demo.wait(timeout=300)
        assert rc == 0, demo.text()[-4000:]
        # The run flushed on exit; wait until the collector has written all it accepted.
        wait_for("the collector to write everything it received", collector.drained, 60,
                 on_timeout=collector.log_tail)
        spans = run_spans(collector, demo.run_id)
        logs = wait_for("the run's logs in the collector's logs",
                        lambda: run_logs(collector, demo.run_id), 30)
        yield Pipeline(collector, prometheus, demo, spans, logs)
    finally:
        demo.kill()
        prometheus.kill()
        collector.kill()


def sampled_steps(spans: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        step = span["attrs"].get(semconv.ATTR_STEP)
        if span["name"] != semconv.SPAN_RUN and span["name"] != semconv.SPAN_SETUP \
                and step is not None:
            by_step[int(step)].append(span)
    return by_step


def test_every_rank_s_spans_of_a_sampled_step_share_one_trace(pipeline):
    steps = sampled_steps(pipeline.spans)
    # a trace-id ratio of 0.5 over 100 steps: some sampled, some not, the same on every rank
    assert 10 <= len(steps) <= 90, f"{len(steps)} of 100 steps sampled"
    for step, spans in steps.items():
        trace_ids = {s["traceId"] for s in spans}
        assert len(trace_ids) == 1, f"step {step} spans {len(trace_ids)} traces"
        roots = [s for s in spans if s["name"] == semconv.SPAN_STEP]
        assert len(roots) == 1 and not roots[0].get("parentSpanId"), f"step {step} root"
        rank_steps = {int(s["attrs"][semconv.ATTR_RANK]): s for s in spans
                      if s["name"] == semconv.SPAN_RANK_STEP}
        assert set(rank_steps) == set(range(RANKS)), f"step {step}: ranks {set(rank_steps)}"
        for rank, rank_step in rank_steps.items():
            assert rank_step["parentSpanId"] == roots[0]["spanId"]
            phases = {s["name"] for s in spans if s.get("parentSpanId") == rank_step["spanId"]}
            assert phases >= PHASE_SPANS, f"step {step} rank {rank}: phases {phases}"


def test_logs_carry_the_ids_of_their_step_s_spans(pipeline):
    spans_by_id = {(s["traceId"], s["spanId"]): s for s in pipeline.spans}
    trace_of_step = {step: spans[0]["traceId"]
                     for step, spans in sampled_steps(pipeline.spans).items()}
    resolved = 0
    for record in pipeline.logs:
        attrs = record["attrs"]
        for name in (semconv.LOG_RUN_ID, semconv.LOG_RANK, semconv.LOG_STEP):
            assert name in attrs, f"log without {name}: {record}"
        assert re.fullmatch(r"[0-9a-f]{32}", record.get("traceId", "")), record
        assert re.fullmatch(r"[0-9a-f]{16}", record.get("spanId", "")), record
        step = int(attrs[semconv.LOG_STEP])
        if step in trace_of_step and record["traceId"] == trace_of_step[step]:
            span = spans_by_id.get((record["traceId"], record["spanId"]))
            assert span is not None, f"log's span {record['spanId']} is not in the trace"
            assert int(span["attrs"].get(semconv.ATTR_RANK, -1)) == int(attrs[semconv.LOG_RANK])
            resolved += 1
    assert resolved > 0, "no log line points into an exported step trace"
    # and the sampled steps' log lines all do
    for record in pipeline.logs:
        step = int(record["attrs"][semconv.LOG_STEP])
        if step in trace_of_step and record["body"].get("stringValue") == "demo.loss":
            assert record["traceId"] == trace_of_step[step], record


def test_prometheus_has_the_contract_metrics_for_every_rank(pipeline):
    prom, run_id = pipeline.prometheus, pipeline.demo.run_id
    for job in ("otel-train-collector", "otel-train-ranks"):
        for series, extra_labels in CONTRACT_SERIES.items():
            # prometheus-client shows a labelled counter only once it was incremented: a rank
            # endpoint of a run that dropped nothing has no dropped series
            if job == "otel-train-ranks" and series == semconv.PROM_TELEMETRY_DROPPED:
                continue
            query = f'max_over_time({series}{{training_run_id="{run_id}"}}[10m])'

            def ranks(q: str = query, extra: tuple[str, ...] = extra_labels, j: str = job):
                result = [r for r in prom.query(q) if r["metric"].get("job") == j
                          or (j == "otel-train-collector"
                              and r["metric"].get("job") == "otel-train")]
                for r in result:
                    for label in extra:
                        assert label in r["metric"], r
                return {r["metric"][semconv.PROM_RANK_LABEL] for r in result} == \
                    {str(r) for r in range(RANKS)}

            wait_for(f"{series} of both ranks from {job}", ranks, 30,
                     on_timeout=prom.log_tail)
    phases = {r["metric"][semconv.PROM_PHASE_LABEL] for r in prom.query(
        f'{semconv.PROM_PHASE_DURATION}_count{{training_run_id="{run_id}"}}')}
    assert phases >= set(semconv.TIMED_PHASES)
    # Every step reaches Prometheus. The collector's endpoint shows the run's final export
    # only from the scrape after it arrived, so poll until it does (a scrape a second); a
    # lost step keeps the count below 100 and fails at the deadline with the last counts.
    want = {str(r): 100.0 for r in range(RANKS)}

    def step_counts() -> dict[str, float]:
        steps = prom.query(f'max by (training_rank) ({semconv.PROM_STEP_DURATION}_count'
                           f'{{training_run_id="{run_id}",job="otel-train"}})')
        counts = {r["metric"]["training_rank"]: float(r["value"][1]) for r in steps}
        if counts != want:
            raise AssertionError(f"step counts {counts}, want {want}")
        return counts

    wait_for("every rank's 100 steps in Prometheus", step_counts, 30, on_timeout=prom.log_tail)


def test_exemplars_resolve_to_exported_traces(pipeline):
    prom, run_id = pipeline.prometheus, pipeline.demo.run_id
    exported = {(s["traceId"], s["spanId"]) for s in pipeline.spans}
    exported_traces = {t for t, _ in exported}
    now = time.time()

    def exemplars_from(job: str) -> list[dict[str, Any]]:
        data = prom.api("query_exemplars",
                        query=f'{semconv.PROM_STEP_DURATION}_bucket{{training_run_id="{run_id}"}}',
                        start=str(now - 600), end=str(time.time() + 60))
        return [e for series in data if series["seriesLabels"].get("job") in job.split("|")
                for e in series["exemplars"]]

    for job in ("otel-train", "otel-train-ranks"):
        exemplars = wait_for(f"exemplars scraped from {job}", lambda j=job: exemplars_from(j),
                             30, on_timeout=prom.log_tail)
        for exemplar in exemplars:
            labels = exemplar["labels"]
            assert labels["trace_id"] in exported_traces, f"{job}: unknown trace {labels}"
            assert (labels["trace_id"], labels["span_id"]) in exported, \
                f"{job}: exemplar span {labels} is not an exported span"


def test_rules_load_and_evaluate_on_the_run(pipeline):
    prom, run_id = pipeline.prometheus, pipeline.demo.run_id
    groups = prom.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    source = (REPO_ROOT / "prometheus" / "rules.yml").read_text()
    assert len(rules) == len(re.findall(r"^\s*- (alert|record): ", source, flags=re.M))
    for rule in rules:
        assert rule["health"] in ("ok", "unknown"), rule
        assert not rule.get("lastError"), rule

    def evaluated() -> bool:
        rules_now = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        return all(r["health"] == "ok" for r in rules_now)

    wait_for("every rule evaluated once", evaluated, 30, on_timeout=prom.log_tail)
    for record, expected in (
        ("training_run_rank:step_duration_seconds:mean5m", RANKS),
        ("training_run:step_duration_seconds:max_over_median5m", 1),
    ):
        query = f'{record}{{training_run_id="{run_id}"}}'
        def every_series(q: str = query, n: int = expected) -> list[dict[str, Any]] | None:
            # a rank's record appears once two of its scrapes differ: wait for all of them
            found = prom.query(q)
            return found if len(found) >= n else None

        result = wait_for(f"{record} of the run", every_series, 30)
        assert len(result) == expected, result
        assert all(float(r["value"][1]) > 0 for r in result), result
    # every rank's timed phases get a share of its step time, a fraction of it
    query = f'training_run_rank_phase:phase_duration_seconds:share5m{{training_run_id="{run_id}"}}'
    shares = wait_for("the phase shares of the run", lambda: prom.query(query), 30)
    seen = {(r["metric"]["training_rank"], r["metric"]["training_phase"]) for r in shares}
    assert seen >= {(str(rank), phase) for rank in range(RANKS)
                    for phase in semconv.TIMED_PHASES}, seen
    assert all(0 <= float(r["value"][1]) <= 1 for r in shares), shares


# --- the collector dies mid-run --------------------------------------------------------------


def _step_seconds(demo: DemoRun, first: int, last: int) -> float:
    """Seconds rank 0 took from step ``first`` to step ``last``, from its console logs. The
    demo logs its loss after the optimizer step of loop step s, which is counted in (and
    carries the ids of) step s + 1 (README, Usage): so the line of step s says s + 1."""
    stamps = {int(e["step"]) - 1: datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
              for e in demo.console_events("demo.loss") if int(e.get("rank", -1)) == 0}
    return (stamps[last] - stamps[first]).total_seconds()


def test_collector_outage_costs_telemetry_not_training(tmp_path):
    collector_binary()
    collector = Collector(CONFIGS_DIR / "local.yaml", tmp_path)
    demo = DemoRun(collector, tmp_path, steps=400, extra_args=["--slow-rank", "1"])
    try:
        collector.start()
        demo.start()
        wait_for("the run's first steps at the collector, and 60 steps done",
                 lambda: demo.latest_step() >= 60 and [
                     s for s in run_spans(collector, demo.run_id)
                     if s["name"] == semconv.SPAN_RANK_STEP], 120,
                 on_timeout=lambda: demo.text()[-3000:])
        collector.kill()
        killed_at_step = demo.latest_step()
        assert demo.proc.poll() is None, "the run ended before the outage began"
        # Keep the collector down while training goes on, longer than the exporters' timeout.
        outage_steps = 100
        wait_for("training to go on without the collector",
                 lambda: demo.latest_step() >= killed_at_step + outage_steps, 120,
                 on_timeout=lambda: demo.text()[-3000:])
        restarted_at_step = demo.latest_step()
        assert demo.proc.poll() is None, "the run ended during the outage; make it longer"
        collector.restart()

        assert demo.wait(timeout=300) == 0, demo.text()[-4000:]

        # on time: the steps during the outage were no slower than those before it
        last_before = 10 * (killed_at_step // 10)
        before = _step_seconds(demo, 20, last_before) / (last_before - 20)
        first = 10 * (killed_at_step // 10 + 1)
        last = 10 * (restarted_at_step // 10)
        during = _step_seconds(demo, first, last) / (last - first)
        assert during < 1.5 * before + 0.01, \
            f"{during * 1e3:.1f} ms a step during the outage, {before * 1e3:.1f} ms before"

        # telemetry resumes: both ranks' steps after the restart reach the collector
        def resumed() -> bool:
            late = {(int(s["attrs"][semconv.ATTR_RANK]), int(s["attrs"][semconv.ATTR_STEP]))
                    for s in run_spans(collector, demo.run_id)
                    if s["name"] == semconv.SPAN_RANK_STEP}
            return all(any(r == rank and step > restarted_at_step for r, step in late)
                       for rank in range(RANKS))

        wait_for("both ranks' steps after the restart", resumed, 60,
                 on_timeout=collector.log_tail)

        # what was lost is counted, by the SDK and in the metrics that reach the collector
        dropped = demo.result()["dropped"]
        assert sum(dropped.values()) > 0, f"rank 0 reports no drops: {dropped}"
        rank_steps = {int(s["attrs"][semconv.ATTR_STEP])
                      for s in run_spans(collector, demo.run_id)
                      if s["name"] == semconv.SPAN_RANK_STEP
                      and int(s["attrs"][semconv.ATTR_RANK]) == 0}
        missing = set(range(demo.steps)) - rank_steps
        assert missing, "no step was lost: the outage proved nothing"
        assert dropped.get(semconv.SIGNAL_SPANS, 0) > 0

        def counted_in_metrics() -> dict[tuple[int, str], float] | None:
            last: dict[tuple[int, str], float] = {}
            for p in metric_points(collector, semconv.METRIC_TELEMETRY_DROPPED, demo.run_id):
                value = p.get("asInt", p.get("asDouble", 0))
                last[(p["rank"], p["attrs"][semconv.ATTR_SIGNAL])] = float(value)
            rank0 = {sig: v for (rank, sig), v in last.items() if rank == 0}
            return last if rank0 and all(rank0.get(sig, 0) == n for sig, n in dropped.items()
                                         if n) else None

        counted = wait_for("the final dropped counts in the collector's metrics",
                           counted_in_metrics, 30)
        assert counted[(0, semconv.SIGNAL_SPANS)] > 0
        print(f"outage from step {killed_at_step} to {restarted_at_step}: "
              f"{before * 1e3:.1f} ms/step before, {during * 1e3:.1f} ms/step during; "
              f"rank 0 lost {len(missing)} of {demo.steps} steps' spans; dropped {counted}")
    finally:
        demo.kill()
        collector.kill()
