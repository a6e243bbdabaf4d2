"""Read a multi-GPU run directory back (``bench/multigpu/run.py --out DIR``) and check it:
one trace per sampled step holding every rank's spans, NCCL all-gather/reduce-scatter spans
with GPU durations and bus bandwidth, the straggler by rank-step busy time and raw step time,
and the hung rank's stall report against the process group's timeout. Prints JSON.

Usage: ``python bench/multigpu/check.py DIR``
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from otel_train import semconv as sc  # noqa: E402
from otel_train.analysis import otlp  # noqa: E402


def run_dir(root: Path, mode: str) -> Path:
    return sorted(p for p in (root / mode).iterdir() if p.is_dir())[-1]


def spans(d: Path) -> list[otlp.Span]:
    return list(otlp.iter_spans(sorted(d.glob(sc.TRACES_GLOB))))


def traces(d: Path, world: int) -> dict[str, Any]:
    sp = spans(d)
    by_trace: dict[str, set[int]] = defaultdict(set)
    steps_of: dict[str, int] = {}
    for s in sp:
        if s.name == sc.SPAN_RANK_STEP:
            by_trace[s.trace_id].add(int(s.attributes[sc.ATTR_RANK]))
            steps_of[s.trace_id] = int(s.attributes[sc.ATTR_STEP])
    roots = {s.trace_id for s in sp if s.name == sc.SPAN_STEP}
    complete = [t for t, r in by_trace.items() if len(r) == world and t in roots]
    colls = [s for s in sp if s.name == sc.SPAN_COLLECTIVE]
    per_op: dict[str, dict[str, Any]] = {}
    for op in sorted({s.attributes.get(sc.ATTR_COLLECTIVE_OP) for s in colls}):
        mine = [s for s in colls if s.attributes.get(sc.ATTR_COLLECTIVE_OP) == op]
        single = [s for s in mine if int(s.attributes.get(sc.ATTR_COLLECTIVE_COUNT, 1)) == 1]
        gpu = [s.attributes[sc.ATTR_COLLECTIVE_GPU_DURATION] for s in single
               if sc.ATTR_COLLECTIVE_GPU_DURATION in s.attributes]
        bus = [s.attributes[sc.ATTR_COLLECTIVE_BUS_BW] for s in single
               if sc.ATTR_COLLECTIVE_BUS_BW in s.attributes]
        per_op[str(op)] = {
            "spans": len(mine), "summary_spans": len(mine) - len(single),
            "collectives": sum(int(s.attributes.get(sc.ATTR_COLLECTIVE_COUNT, 1)) for s in mine),
            "with_gpu_duration": len(gpu), "with_bus_bw": len(bus),
            "sources": sorted({str(s.attributes.get(sc.ATTR_COLLECTIVE_SOURCE)) for s in mine}),
            "bytes_median": statistics.median(s.attributes.get(sc.ATTR_COLLECTIVE_BYTES, 0)
                                              for s in mine),
            "gpu_ms_median": 1e3 * statistics.median(gpu) if gpu else None,
            "bus_gbps_median": statistics.median(bus) if bus else None,
            "bus_gbps_p90": (sorted(bus)[int(0.9 * (len(bus) - 1))] if bus else None),
            "ranks": sorted({int(s.attributes.get(sc.ATTR_RANK, -1)) for s in mine})}
    in_step_traces = sum(1 for s in colls if s.trace_id in by_trace)
    return {"sampled_step_traces": len(by_trace), "with_every_rank_and_root": len(complete),
            "steps": sorted(steps_of.values())[:3] + ["..."], "collective_spans": len(colls),
            "collective_spans_in_step_traces": in_step_traces, "per_op": per_op}


def straggler(d: Path, slow_rank: int) -> dict[str, Any]:
    sp = [s for s in spans(d) if s.name == sc.SPAN_RANK_STEP]
    dur: dict[int, list[float]] = defaultdict(list)
    busy: dict[int, list[float]] = defaultdict(list)
    exposed_key = sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_EXPOSED_COMM
    for s in sp:
        r = int(s.attributes[sc.ATTR_RANK])
        dur[r].append(s.duration_s)
        busy[r].append(s.duration_s - float(s.attributes.get(exposed_key, 0.0)))
    mean = {r: statistics.mean(v) for r, v in dur.items()}
    mean_busy = {r: statistics.mean(v) for r, v in busy.items()}
    med = statistics.median(mean.values())
    med_busy = statistics.median(mean_busy.values())
    return {"slow_rank": slow_rank, "mean_step_s": mean, "mean_busy_s": mean_busy,
            "step_over_median": {r: m / med for r, m in mean.items()},
            "busy_over_median": {r: m / med_busy for r, m in mean_busy.items()},
            "named_by_busy": max(mean_busy, key=mean_busy.get),
            "named_by_step": max(mean, key=mean.get)}


def report_straggler(d: Path) -> dict[str, Any]:
    """What ``otel-train report`` says, and the per-rank collective seconds per step it used."""
    from otel_train.analysis.build import build_report
    from otel_train.analysis.metrics import read_metrics

    rep = build_report(d)
    metrics = read_metrics(d)
    steps: dict[int, int] = defaultdict(int)
    for point in metrics.series(sc.METRIC_STEP_DURATION):
        steps[int(point.rank or 0)] += point.count
    coll = metrics.per_rank_total(sc.METRIC_COLLECTIVE_DURATION)
    return {"straggler": rep.straggler, "signal": rep.straggler_signal,
            "wait_share": rep.straggler_wait_share, "wait_rank": rep.straggler_wait_rank,
            "busy_ratio": rep.straggler_busy_ratio, "slowest_share": rep.straggler_slowest_share,
            "trained_steps": dict(steps),
            "collective_s_per_step": {r: coll[r] / steps[r] for r in coll if steps.get(r)},
            "slow_steps": [s.cause for s in rep.slow_steps[:5]]}


def hang(d: Path, res: dict[str, Any]) -> dict[str, Any]:
    logs = [r for r in otlp.iter_log_records(sorted(d.glob(sc.LOGS_GLOB)))
            if sc.LOG_COLLECTIVE_STALLED in str(r.body) or
            r.attributes.get("event") == sc.LOG_COLLECTIVE_STALLED]
    start = res.get("hang_start_ns")
    by_rank: dict[int, list[int]] = defaultdict(list)
    for r in logs:
        by_rank[int(r.resource.get(sc.RES_RANK, r.attributes.get("rank", -1)))].append(r.time_ns)
    first = {r: min(t) for r, t in by_rank.items()}
    events = [s for s in spans(d) if s.name == sc.SPAN_COLLECTIVE
              and s.attributes.get(sc.ATTR_COLLECTIVE_STALLED)]
    return {"stall_logs_by_rank": {r: len(t) for r, t in by_rank.items()},
            "first_report_after_hang_start_s": ({r: (t - start) / 1e9 for r, t in first.items()}
                                                if start else None),
            "stalled_spans_by_rank": {r: sum(1 for s in events
                                             if int(s.attributes[sc.ATTR_RANK]) == r)
                                      for r in (0, 1)},
            "pg_timeout_s": res.get("pg_timeout_s"), "hang_s": res.get("hang_s")}


def main() -> None:
    root = Path(sys.argv[1])
    results = [json.loads(p.read_text()) for p in sorted(root.glob("result-rank*.json"))]
    world = results[0]["world_size"]
    out: dict[str, Any] = {"versions": results[0].get("versions")}
    modes = results[0]["modes"]
    for mode in ("normal", "straggler", "straggler_gpu", "profile", "hang"):
        if mode in modes and (root / mode).is_dir():
            out[f"{mode}_traces"] = traces(run_dir(root, mode), world)
    if "straggler" in modes:
        out["straggler"] = straggler(run_dir(root, "straggler"),
                                     modes["straggler"].get("slow_rank", 1))
        out["straggler_report"] = report_straggler(run_dir(root, "straggler"))
    if "straggler_gpu" in modes and (root / "straggler_gpu").is_dir():
        out["straggler_gpu"] = straggler(run_dir(root, "straggler_gpu"),
                                         modes["straggler_gpu"].get("slow_rank", 1))
        out["straggler_gpu_report"] = report_straggler(run_dir(root, "straggler_gpu"))
    if "hang" in modes:
        slow = results[modes["hang"].get("slow_rank", 1)]["modes"]["hang"]
        out["hang"] = hang(run_dir(root, "hang"), slow)
    out["overhead"] = {r["rank"]: {k: r["modes"].get("overhead", {}).get(k) for k in
                                   ("ratio_median", "ratio_min", "ratio_max", "median_step_s",
                                    "dynamo_delta", "default", "sampled10", "summary")}
                       for r in results}
    out["profile"] = {r["rank"]: {k: r["modes"].get("profile", {}).get(k) for k in
                                  ("otel_overlap", "otel_overlap_unrounded", "hta_overlap_pct",
                                   "comm_kernels", "exposed_comm_s_per_step")} for r in results}
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
