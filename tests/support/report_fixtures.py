"""A realistic run directory, written in exactly the embedded exporter's OTLP JSON lines.

``write_run`` simulates synchronous data-parallel training (N ranks x M steps, one straggler
rank with data-wait spikes, a first compile and one recompile, all-reduces whose waiting is the
exposed communication) and writes what otel-train exports for it. The report and check tests
use it, and so does ``bench/bench_report.py`` for the 8 ranks x 10,000 steps benchmark.

The ``break_*`` helpers damage one property of any run directory, this one's or a real one's,
so a test can assert that the matching check fails.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_train import semconv as sc
from otel_train.analysis.otlp import decode_attributes

T0_NS = 1_760_000_000_000_000_000
SPANS_PER_LINE = 512  # the BatchSpanProcessor's default export batch


@dataclass
class RunSpec:
    ranks: int = 4
    steps: int = 200
    run_id: str = "fixture-run"
    straggler_rank: int = 2
    #: steps on which the straggler waits ``spike_s`` for data
    spike_steps: tuple[int, ...] = (37, 120, 151)
    spike_s: float = 1.9
    micro_batches: int = 1
    sample_ratio: float = 1.0
    recompile_step: int = 60
    metrics_every: int = 50
    traceparent: tuple[str, str] | None = None  # (trace id, span id) of a launcher span
    seed: int = 7
    buckets: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    extra: dict[str, Any] = field(default_factory=dict)
    #: the rank steps carry their samples and tokens (``training.samples``/``tokens``)
    step_samples: bool = True
    #: the MFU of a 1 s step: each rank step says ``training.mfu`` = this / its seconds
    #: (a fixed model's FLOPs over its time); None: no MFU, as where the peak is unknown
    mfu_at_1s: float | None = None
    #: the ranks count ``training.goodput.time`` by bucket (runs before it did not)
    goodput: bool = True
    samples_per_step: int = 32
    tokens_per_sample: int = 2048


def _hex(n_bytes: int, *parts: object) -> str:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).digest()
    return digest[:n_bytes].hex()


def step_trace_id(run_id: str, step: int) -> str:
    return _hex(16, run_id, "step", step)


def rank_step_span_id(run_id: str, step: int, rank: int) -> str:
    return _hex(8, run_id, "step", step, "rank", rank)


def is_sampled(spec: RunSpec, step: int) -> bool:
    return int(step_trace_id(spec.run_id, step)[-14:], 16) / 16**14 < spec.sample_ratio


def _attrs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            encoded: dict[str, Any] = {"boolValue": value}
        elif isinstance(value, int):
            encoded = {"intValue": str(value)}
        elif isinstance(value, float):
            encoded = {"doubleValue": value}
        else:
            encoded = {"stringValue": str(value)}
        out.append({"key": key, "value": encoded})
    return out


def _resource(spec: RunSpec, rank: int) -> dict[str, Any]:
    return {"attributes": _attrs({
        "service.name": sc.SERVICE_NAME_DEFAULT, sc.RES_RUN_ID: spec.run_id, sc.RES_RANK: rank,
        sc.RES_LOCAL_RANK: rank % 8, sc.RES_WORLD_SIZE: spec.ranks,
        "host.name": f"node-{rank // 8}", "process.pid": 1000 + rank,
    })}


def _span(name: str, trace_id: str, span_id: str, parent: str, start: int, end: int,
          attrs: dict[str, Any], links: list[dict[str, str]] | None = None) -> dict[str, Any]:
    span = {"traceId": trace_id, "spanId": span_id, "parentSpanId": parent, "flags": 257,
            "name": name, "kind": 1, "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end), "attributes": _attrs(attrs), "status": {}}
    if links:
        span["links"] = links
    return span


# --- the simulated training ----------------------------------------------------------------


@dataclass
class RankStep:
    rank: int
    phases: dict[str, float]  # seconds per phase, the rank_step's phase totals
    start_ns: int
    end_ns: int
    compile_reason: str | None = None


def simulate_step(spec: RunSpec, rng: random.Random, step: int, start_ns: int) -> list[RankStep]:
    """One synchronous step: every rank waits in the all-reduce for the slowest one."""
    compute = []
    for rank in range(spec.ranks):
        slow = 1.15 if rank == spec.straggler_rank else 1.0
        phases = {
            sc.PHASE_DATA_WAIT: rng.uniform(0.004, 0.012) * slow,
            sc.PHASE_FORWARD: rng.uniform(0.045, 0.055),
            sc.PHASE_BACKWARD: rng.uniform(0.09, 0.11),
            sc.PHASE_OPTIMIZER: rng.uniform(0.018, 0.022),
            sc.PHASE_COMPILE: 0.0,
        }
        if rank == spec.straggler_rank and step in spec.spike_steps:
            phases[sc.PHASE_DATA_WAIT] += spec.spike_s
        reason = None
        if step == 0 or step == spec.recompile_step:
            reason = "first compile" if step == 0 else "guard failure: tensor 'x' size mismatch"
            phases[sc.PHASE_COMPILE] = (3.0 if step == 0 else 0.8) * rng.uniform(0.95, 1.05)
        compute.append((phases, reason))
    done = [sum(p.values()) - p[sc.PHASE_OPTIMIZER] for p, _ in compute]
    barrier = max(done) + 0.004
    out = []
    for rank, (phases, reason) in enumerate(compute):
        phases[sc.PHASE_EXPOSED_COMM] = barrier - done[rank]
        end = start_ns + int((barrier + phases[sc.PHASE_OPTIMIZER]) * 1e9)
        out.append(RankStep(rank, phases, start_ns, end, reason))
    return out


def _rank_step_spans(spec: RunSpec, step: int, rs: RankStep) -> list[dict[str, Any]]:
    tid, run = step_trace_id(spec.run_id, step), spec.run_id
    sid = rank_step_span_id(run, step, rs.rank)
    common = {sc.ATTR_RUN_ID: run, sc.ATTR_STEP: step, sc.ATTR_RANK: rs.rank}
    attrs = {**common, sc.ATTR_WORLD_SIZE: spec.ranks, sc.ATTR_MICRO_BATCHES: spec.micro_batches,
             sc.ATTR_STEP_DURATION: (rs.end_ns - rs.start_ns) / 1e9}
    attrs.update({sc.ATTR_PHASE_TOTAL_PREFIX + k: v for k, v in rs.phases.items()})
    if spec.step_samples:
        attrs[sc.ATTR_SAMPLES] = spec.samples_per_step
        attrs[sc.ATTR_TOKENS] = spec.samples_per_step * spec.tokens_per_sample
    if spec.mfu_at_1s is not None:
        attrs[sc.ATTR_MFU] = spec.mfu_at_1s / ((rs.end_ns - rs.start_ns) / 1e9)
    # the step's partition, as the SDK records it: here the phases are disjoint already
    duration = (rs.end_ns - rs.start_ns) / 1e9
    parts = {part: rs.phases.get(part, 0.0) for part in sc.PARTS}
    parts[sc.PART_NOT_EXPLAINED] = max(duration - sum(parts.values()), 0.0)
    attrs.update({sc.ATTR_RANK_STEP_PART_PREFIX + k: v for k, v in parts.items()})
    spans = [_span(sc.SPAN_RANK_STEP, tid, sid, _hex(8, run, "step", step, "root"),
                   rs.start_ns, rs.end_ns, attrs)]
    t = rs.start_ns
    if rs.compile_reason:
        end = t + int(rs.phases[sc.PHASE_COMPILE] * 1e9)
        spans.append(_span(sc.SPAN_COMPILE, tid, _hex(8, sid, "compile"), sid, t, end, {
            **common, sc.ATTR_COMPILE_REASON: rs.compile_reason,
            sc.ATTR_COMPILE_GRAPH_BREAKS: 1 if step == 0 else 0}))
        t = end
    mb_n = spec.micro_batches
    for mb in range(mb_n):
        for phase in (sc.PHASE_DATA_WAIT, sc.PHASE_FORWARD, sc.PHASE_BACKWARD):
            end = t + int(rs.phases[phase] / mb_n * 1e9)
            psid = _hex(8, sid, phase, mb)
            spans.append(_span(sc.PHASE_SPAN[phase], tid, psid, sid, t, end,
                               {**common, sc.ATTR_MICRO_BATCH: mb}))
            if phase == sc.PHASE_BACKWARD and mb == mb_n - 1:
                spans += _collectives(spec, step, rs, tid, psid, end)
            t = end
    t = rs.end_ns - int(rs.phases[sc.PHASE_OPTIMIZER] * 1e9)
    spans.append(_span(sc.SPAN_OPTIMIZER, tid, _hex(8, sid, "opt"), sid, t, rs.end_ns,
                       {**common, sc.ATTR_MICRO_BATCH: mb_n - 1}))
    return spans


def _collectives(spec: RunSpec, step: int, rs: RankStep, tid: str, parent: str,
                 backward_end: int) -> list[dict[str, Any]]:
    """Two gradient all-reduce buckets: the first overlaps backward, the last is exposed."""
    exposed = int(rs.phases[sc.PHASE_EXPOSED_COMM] * 1e9)
    spans = []
    for seq, (start, end) in enumerate([(backward_end - 30_000_000, backward_end - 12_000_000),
                                        (backward_end, backward_end + exposed)]):
        size = 50_000_000 if seq == 0 else 25_000_000
        busy_s = max((end - start) / 1e9, 1e-6) if seq == 0 else 0.004
        spans.append(_span(sc.SPAN_COLLECTIVE, tid, _hex(8, tid, rs.rank, "coll", seq), parent,
                           start, end, {
                               sc.ATTR_RUN_ID: spec.run_id, sc.ATTR_STEP: step,
                               sc.ATTR_RANK: rs.rank, sc.ATTR_COLLECTIVE_OP: "all_reduce",
                               sc.ATTR_COLLECTIVE_BACKEND: "nccl", sc.ATTR_COLLECTIVE_BYTES: size,
                               sc.ATTR_COLLECTIVE_GROUP_SIZE: spec.ranks,
                               sc.ATTR_COLLECTIVE_SEQ: step * 2 + seq,
                               sc.ATTR_COLLECTIVE_DTYPE: "bfloat16",
                               sc.ATTR_COLLECTIVE_BUS_BW: round(
                                   size * 2 * (spec.ranks - 1) / spec.ranks / busy_s / 1e9, 3),
                           }))
    return spans


# --- metrics: cumulative, exported every ``metrics_every`` steps ---------------------------


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts = bounds, [0] * (len(bounds) + 1)
        self.sum, self.count, self.exemplar = 0.0, 0, None

    def record(self, value: float, exemplar: tuple[str, str] | None = None,
               time_ns: int = 0) -> None:
        index = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[index] += 1
        self.sum += value
        self.count += 1
        if exemplar:
            self.exemplar = {"timeUnixNano": str(time_ns), "traceId": exemplar[0],
                             "spanId": exemplar[1], "asDouble": value}

    def point(self, attrs: dict[str, Any], start: int, now: int) -> dict[str, Any]:
        point = {"attributes": _attrs(attrs), "startTimeUnixNano": str(start),
                 "timeUnixNano": str(now), "count": str(self.count), "sum": self.sum,
                 "bucketCounts": [str(c) for c in self.counts],
                 "explicitBounds": list(self.bounds)}
        if self.exemplar:
            point["exemplars"] = [self.exemplar]
            self.exemplar = None  # exemplars are reset every collection
        return point


class RankMetrics:
    """One rank's meter: what the SDK's MeterProvider would export for it."""

    def __init__(self, spec: RunSpec, rank: int) -> None:
        self.spec, self.rank, self.start = spec, rank, T0_NS
        self.hists: dict[tuple[str, tuple], Histogram] = {}
        self.sums: dict[tuple[str, tuple], float] = {}
        self.gauges: dict[tuple[str, tuple], float] = {}
        self.last_end: int | None = None  # the rank's previous step's end

    def hist(self, name: str, **attrs: Any) -> Histogram:
        key = (name, tuple(sorted(attrs.items())))
        return self.hists.setdefault(key, Histogram(self.spec.buckets))

    def add(self, name: str, value: float, **attrs: Any) -> None:
        key = (name, tuple(sorted(attrs.items())))
        self.sums[key] = self.sums.get(key, 0.0) + value

    def record_step(self, step: int, rs: RankStep, sampled: bool) -> None:
        ex = (step_trace_id(self.spec.run_id, step),
              rank_step_span_id(self.spec.run_id, step, self.rank)) if sampled else None
        self.hist(sc.METRIC_STEP_DURATION).record((rs.end_ns - rs.start_ns) / 1e9, ex, rs.end_ns)
        for phase, seconds in rs.phases.items():
            if seconds > 0:
                self.hist(sc.METRIC_PHASE_DURATION, **{sc.ATTR_PHASE: phase}).record(
                    seconds, ex, rs.end_ns)
        op = {sc.ATTR_COLLECTIVE_OP: "all_reduce", sc.ATTR_COLLECTIVE_BACKEND: "nccl"}
        self.hist(sc.METRIC_COLLECTIVE_DURATION, **op).record(
            rs.phases[sc.PHASE_EXPOSED_COMM], ex, rs.end_ns)
        self.add(sc.METRIC_COLLECTIVE_SIZE, 75_000_000, **{sc.ATTR_COLLECTIVE_OP: "all_reduce"})
        self.add(sc.METRIC_SAMPLES, self.spec.samples_per_step)
        self.add(sc.METRIC_TOKENS, self.spec.samples_per_step * self.spec.tokens_per_sample)
        duration = (rs.end_ns - rs.start_ns) / 1e9
        parts = {part: rs.phases.get(part, 0.0) for part in sc.PARTS}
        parts[sc.PART_NOT_EXPLAINED] = max(duration - sum(parts.values()), 0.0)
        for part, seconds in parts.items():
            self.add(sc.METRIC_STEP_TIME, seconds, **{sc.ATTR_PART: part})
        if self.spec.goodput:
            self.record_goodput(step, rs)
        self.add(sc.METRIC_CPU_THROTTLED_TIME, 0.002 if self.rank == self.spec.straggler_rank else 0)
        if rs.compile_reason:
            self.hist(sc.METRIC_COMPILE_DURATION).record(rs.phases[sc.PHASE_COMPILE])
            reason = "first_compile" if step == 0 else "guard_failure"
            self.add(sc.METRIC_COMPILE_RECOMPILES, 0 if step == 0 else 1,
                     **{sc.ATTR_COMPILE_REASON: reason})
            self.add(sc.METRIC_COMPILE_GRAPH_BREAKS, 1 if step == 0 else 0,
                     **{sc.ATTR_COMPILE_REASON: reason})
        self.gauges[(sc.METRIC_COMM_OVERLAP, ())] = 0.6 if self.rank != self.spec.straggler_rank \
            else 0.8
        peak = 20e9 + self.rank * 1e8 + (step % 7) * 1e7
        self.gauges[(sc.METRIC_MEMORY_ALLOCATED_PEAK, ())] = max(
            peak, self.gauges.get((sc.METRIC_MEMORY_ALLOCATED_PEAK, ()), 0))
        self.gauges[(sc.METRIC_MEMORY_RESERVED, ())] = 24e9 + self.rank * 1e8

    def record_goodput(self, step: int, rs: RankStep) -> None:
        """The rank's run time by goodput bucket, as the SDK counts it: its start to its
        first step, between its steps, and each step's parts (a warm-up step: the run's
        first, or one with compile time, all but compile)."""
        def bucket(name: str, seconds: float) -> None:
            self.add(sc.METRIC_GOODPUT_TIME, seconds, **{sc.ATTR_GOODPUT_BUCKET: name})

        start = self.start if self.last_end is None else self.last_end
        bucket(sc.GOODPUT_STARTUP if self.last_end is None else sc.GOODPUT_BETWEEN_STEPS,
               (rs.start_ns - start) / 1e9)
        self.last_end = rs.end_ns
        duration, p = (rs.end_ns - rs.start_ns) / 1e9, rs.phases
        bucket(sc.GOODPUT_COMPILE, p[sc.PHASE_COMPILE])
        if step == 0 or rs.compile_reason:
            bucket(sc.GOODPUT_WARMUP, duration - p[sc.PHASE_COMPILE])
            return
        compute = p[sc.PHASE_FORWARD] + p[sc.PHASE_BACKWARD] + p[sc.PHASE_OPTIMIZER]
        bucket(sc.GOODPUT_PRODUCTIVE, compute)
        bucket(sc.GOODPUT_DATA_WAIT, p[sc.PHASE_DATA_WAIT])
        bucket(sc.GOODPUT_EXPOSED_COMM, p[sc.PHASE_EXPOSED_COMM])
        bucket(sc.GOODPUT_DEVICE_WAIT, 0.0)
        bucket(sc.GOODPUT_OUTSIDE_PHASES, max(duration - sum(p.values()), 0.0))

    def export(self, now: int) -> dict[str, Any]:
        base = {sc.ATTR_RANK: self.rank, sc.ATTR_RUN_ID: self.spec.run_id}
        metrics: dict[str, dict[str, Any]] = {}

        def metric(name: str, kind: str, extra: dict[str, Any]) -> list[dict[str, Any]]:
            entry = metrics.setdefault(name, {"name": name, kind: {"dataPoints": [], **extra}})
            return entry[kind]["dataPoints"]

        for (name, attrs), hist in self.hists.items():
            metric(name, "histogram", {"aggregationTemporality": 2}).append(
                hist.point({**base, **dict(attrs)}, self.start, now))
        for (name, attrs), value in self.sums.items():
            doubles = (sc.METRIC_TELEMETRY_DROPPED, sc.METRIC_CPU_THROTTLED_TIME,
                       sc.METRIC_GOODPUT_TIME, sc.METRIC_STEP_TIME)
            number = {"asInt": str(int(value))} if name not in doubles else {"asDouble": value}
            metric(name, "sum", {"aggregationTemporality": 2, "isMonotonic": True}).append(
                {"attributes": _attrs({**base, **dict(attrs)}), "startTimeUnixNano":
                 str(self.start), "timeUnixNano": str(now), **number})
        for (name, attrs), value in self.gauges.items():
            metric(name, "gauge", {}).append({"attributes": _attrs({**base, **dict(attrs)}),
                                              "timeUnixNano": str(now), "asDouble": value})
        return {"resourceMetrics": [{"resource": _resource(self.spec, self.rank), "scopeMetrics":
                                     [{"scope": {"name": sc.SCOPE_NAME},
                                       "metrics": list(metrics.values())}]}]}


# --- logs ----------------------------------------------------------------------------------


def _log(spec: RunSpec, rank: int, step: int, time_ns: int, body: str,
         extra: dict[str, Any]) -> dict[str, Any]:
    return {"timeUnixNano": str(time_ns), "observedTimeUnixNano": str(time_ns),
            "severityNumber": 9, "severityText": "INFO", "body": {"stringValue": body},
            "traceId": step_trace_id(spec.run_id, step),
            "spanId": rank_step_span_id(spec.run_id, step, rank),
            "attributes": _attrs({sc.LOG_RUN_ID: spec.run_id, sc.LOG_RANK: rank,
                                  sc.LOG_STEP: step, **extra})}


def step_logs(spec: RunSpec, step: int, rs: RankStep) -> list[dict[str, Any]]:
    logs = []
    wait = rs.phases[sc.PHASE_DATA_WAIT]
    if wait > 0.5 or step % 100 == 0:
        logs.append(_log(spec, rs.rank, step, rs.start_ns, "data_wait", {
            sc.LOG_PHASE: sc.PHASE_DATA_WAIT, sc.LOG_DURATION: round(wait, 6)}))
    if rs.compile_reason:
        logs.append(_log(spec, rs.rank, step, rs.start_ns, "compiled", {
            sc.LOG_PHASE: sc.PHASE_COMPILE,
            sc.LOG_DURATION: round(rs.phases[sc.PHASE_COMPILE], 6),
            sc.ATTR_COMPILE_REASON: rs.compile_reason}))
    return logs


# --- writing the run directory -------------------------------------------------------------


class _SignalFile:
    """One rank's ``<signal>.rank-<r>.jsonl``: items batched into export requests."""

    def __init__(self, path: Path, wrap: Callable[[list[dict[str, Any]]], dict[str, Any]]):
        self.file, self.wrap, self.items = open(path, "w", encoding="utf-8"), wrap, []

    def add(self, items: list[dict[str, Any]]) -> None:
        self.items += items
        if len(self.items) >= SPANS_PER_LINE:
            self.flush()

    def flush(self) -> None:
        if self.items:
            self.file.write(json.dumps(self.wrap(self.items), separators=(",", ":")) + "\n")
            self.items = []

    def close(self) -> None:
        self.flush()
        self.file.close()


def _wrapper(spec: RunSpec, rank: int, kind: str) -> Callable[[list], dict[str, Any]]:
    res, scope = _resource(spec, rank), {"name": sc.SCOPE_NAME}
    if kind == "traces":
        return lambda items: {"resourceSpans": [{"resource": res, "scopeSpans": [
            {"scope": scope, "spans": items}]}]}
    return lambda items: {"resourceLogs": [{"resource": res, "scopeLogs": [
        {"scope": scope, "logRecords": items}]}]}


def write_run(spec: RunSpec, root: Path) -> Path:
    """Write the run directory ``root/<run id>`` and return it."""
    run_dir = Path(root) / spec.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    traces = [_SignalFile(run_dir / f"traces.rank-{r}.jsonl", _wrapper(spec, r, "traces"))
              for r in range(spec.ranks)]
    logs = [_SignalFile(run_dir / f"logs.rank-{r}.jsonl", _wrapper(spec, r, "logs"))
            for r in range(spec.ranks)]
    metrics_files = [open(run_dir / f"metrics.rank-{r}.jsonl", "w", encoding="utf-8")
                     for r in range(spec.ranks)]
    meters = [RankMetrics(spec, r) for r in range(spec.ranks)]
    for meter in meters:
        for signal in (sc.SIGNAL_SPANS, sc.SIGNAL_METRICS, sc.SIGNAL_LOGS):
            meter.add(sc.METRIC_TELEMETRY_DROPPED, 0, **{sc.ATTR_SIGNAL: signal})
    t = T0_NS + 2_000_000_000
    for step in range(spec.steps):
        rank_steps = simulate_step(spec, rng, step, t)
        end = max(rs.end_ns for rs in rank_steps)
        sampled = is_sampled(spec, step)
        if sampled:
            traces[0].add([_span(sc.SPAN_STEP, step_trace_id(spec.run_id, step),
                                 _hex(8, spec.run_id, "step", step, "root"), "", t, end,
                                 {sc.ATTR_RUN_ID: spec.run_id, sc.ATTR_STEP: step,
                                  sc.ATTR_WORLD_SIZE: spec.ranks})])
        for rs in rank_steps:
            if sampled:
                traces[rs.rank].add(_rank_step_spans(spec, step, rs))
            logs[rs.rank].add(step_logs(spec, step, rs))
            meters[rs.rank].record_step(step, rs, sampled)
        if (step + 1) % spec.metrics_every == 0 or step == spec.steps - 1:
            for meter, out in zip(meters, metrics_files, strict=True):
                out.write(json.dumps(meter.export(end), separators=(",", ":")) + "\n")
        t = end + 1_000_000
    for rank in range(spec.ranks):
        traces[rank].add(_run_spans(spec, rank, t))
        for signal in (traces[rank], logs[rank]):
            signal.close()
        metrics_files[rank].close()
    (run_dir / "run.json").write_text(json.dumps(
        {"run_id": spec.run_id, "world_size": spec.ranks, "started": T0_NS / 1e9}))
    return run_dir


def _run_spans(spec: RunSpec, rank: int, end_ns: int) -> list[dict[str, Any]]:
    trace_id, parent = _hex(16, spec.run_id, "run"), ""
    if spec.traceparent:
        trace_id, parent = spec.traceparent
    run_span = _hex(8, spec.run_id, "run", rank)
    attrs = {sc.ATTR_RUN_ID: spec.run_id, sc.ATTR_RANK: rank, sc.ATTR_WORLD_SIZE: spec.ranks}
    return [_span(sc.SPAN_RUN, trace_id, run_span, parent, T0_NS, end_ns, attrs),
            _span(sc.SPAN_SETUP, trace_id, _hex(8, run_span, "setup"), run_span, T0_NS,
                  T0_NS + 1_500_000_000, attrs)]


# --- breaking one property of a run directory ----------------------------------------------


def rewrite_lines(run_dir: Path, pattern: str,
                  edit: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Apply ``edit`` to every export request of the files matching ``pattern``."""
    for path in sorted(Path(run_dir).glob(pattern)):
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                edited = edit(json.loads(line))
                if edited is not None:
                    out.append(json.dumps(edited, separators=(",", ":")))
        path.write_text("".join(item + "\n" for item in out), encoding="utf-8")


def each_span(request: dict[str, Any]) -> Iterator[tuple[list, dict[str, Any]]]:
    for rs in request.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in list(ss.get("spans", ())):
                yield ss["spans"], span


def attr(item: dict[str, Any], key: str) -> Any:
    """The decoded value of attribute ``key`` of a raw span or record, None without it."""
    return decode_attributes(item.get("attributes")).get(key)


def break_log_ids(run_dir: Path) -> None:
    """Logs without trace and span ids, as plain logging outside the bridge writes them."""
    def edit(request: dict[str, Any]) -> dict[str, Any]:
        for rl in request.get("resourceLogs", ()):
            for sl in rl.get("scopeLogs", ()):
                for record in sl.get("logRecords", ()):
                    record.pop("traceId", None)
                    record.pop("spanId", None)
        return request
    rewrite_lines(run_dir, sc.LOGS_GLOB, edit)


def break_rank_sampling(run_dir: Path, rank: int) -> None:
    """``rank`` drops every other sampled step, as a per-rank random sampler would."""
    def edit(request: dict[str, Any]) -> dict[str, Any]:
        for spans, span in each_span(request):
            step = attr(span, sc.ATTR_STEP)
            if attr(span, sc.ATTR_RANK) == rank and step is not None and step % 2 == 1 \
                    and span["name"] not in (sc.SPAN_RUN, sc.SPAN_SETUP):
                spans.remove(span)
        return request
    rewrite_lines(run_dir, sc.TRACES_GLOB, edit)


def break_exemplars(run_dir: Path) -> None:
    def edit(request: dict[str, Any]) -> dict[str, Any]:
        for rm in request.get("resourceMetrics", ()):
            for sm in rm.get("scopeMetrics", ()):
                for metric in sm.get("metrics", ()):
                    for point in metric.get("histogram", {}).get("dataPoints", ()):
                        point.pop("exemplars", None)
        return request
    rewrite_lines(run_dir, sc.METRICS_GLOB, edit)


def drop_metric(run_dir: Path, name: str) -> None:
    def edit(request: dict[str, Any]) -> dict[str, Any]:
        for rm in request.get("resourceMetrics", ()):
            for sm in rm.get("scopeMetrics", ()):
                sm["metrics"] = [m for m in sm.get("metrics", ()) if m.get("name") != name]
        return request
    rewrite_lines(run_dir, sc.METRICS_GLOB, edit)


def break_step_trace_ids(run_dir: Path, rank: int) -> None:
    """``rank`` puts its step spans into traces of its own, as a per-rank random id would."""
    def edit(request: dict[str, Any]) -> dict[str, Any]:
        for _, span in each_span(request):
            if attr(span, sc.ATTR_RANK) == rank and attr(span, sc.ATTR_STEP) is not None:
                span["traceId"] = _hex(16, "rank-own", span["traceId"])
        return request
    rewrite_lines(run_dir, sc.TRACES_GLOB, edit)


# --- a real run ----------------------------------------------------------------------------


def run_demo(root: Path, run_id: str, steps: int = 12, extra_args: tuple[str, ...] = (),
             env: dict[str, str] | None = None) -> Path:
    """Run ``otel-train demo`` (2 ranks, gloo, eager) into ``root`` and return its run dir."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", "2", "--steps",
               str(steps), "--no-compile", "--output-dir", str(root), "--run-id", run_id,
               *extra_args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return Path(root) / run_id
