"""The NCCL proof that needs no 8 GPUs: N NCCL ranks sharing one GPU (each its own
``NCCL_HOSTID``, the socket transport), a user's DDP script with one fault at a time
(tests/gpu/nccl_faults_train.py), and what otel-train makes of it, with a verdict.

    python bench/multigpu/nccl_faults.py --ranks 8 --out DIR [--faults hang,cpu,gpu,gpu_between,region,data]
                                         [--cost-ranks 2,4,8] [--md bench/results/....md]

Per fault, from the run directory and ``otel-train report --json``:
- every sampled step is one trace holding a ``training.rank_step`` of each of the N ranks;
- the fault is named: its step, its rank, its cause (``hang`` and ``cpu``: the untimed stretch
  between forward and backward with the script's line; ``gpu``: the forward's GPU time;
  ``gpu_between``: GPU work queued between forward and backward; ``region``: the region
  ``metrics``; ``data``: the data wait), and where a waiting rank's host blocked, the collective its GPU
  waited in and the rank it waited for;
- ``hang``: the waiting ranks log ``training.collective.stalled`` for the hung collective
  before the process group's timeout (``OTEL_TRAIN_STALL_TIMEOUT_S=2`` here, the sleep 6 s);
- the arrivals: collectives matched across ranks, the latest arrival;
- the share of a step left "not explained", per rank, under 10%.
``--cost-ranks``: the fault-free script at each world size, otel-train's threads' CPU per
rank per step and per second of training (docs/scaling.md).
Writes ``DIR/nccl-faults.json`` and a Markdown table (``--md``); exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SCRIPT = REPO / "tests" / "gpu" / "nccl_faults_train.py"

from otel_train import semconv as sc  # noqa: E402
from otel_train.analysis.otlp import iter_log_records, iter_spans, signal_files  # noqa: E402
from otel_train.cli import main as cli  # noqa: E402

FAULTS = {  # fault: (steps, extra environment)
    "hang": ("6", {"HANG_S": "6", "OTEL_TRAIN_STALL_TIMEOUT_S": "2"}),
    "cpu": ("5,8,11", {}),
    "gpu": ("5,8,11", {}),
    "gpu_between": ("5,8,11", {}),
    "region": ("5,8,11", {}),
    "data": ("8", {}),
}
MAX_NOT_EXPLAINED = 0.10
PG_TIMEOUT_S = 600.0  # torch's default NCCL process-group timeout


def script_line(marker: str) -> int:
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith(marker))


def launch(ranks: int, out: Path, fault: str, steps: str, extra: dict[str, str]) -> Path:
    from otel_train import nccl

    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               NCCL_PROFILER_PLUGIN=str(nccl.plugin_path()), OTEL_TRAIN_OUTPUT_DIR=str(out),
               OTEL_TRAIN_LOG_LEVEL="warning", FAULT=fault, FAULT_RANK=str(ranks - 1),
               FAULT_STEPS=steps, PYTHONPATH=os.pathsep.join([str(REPO),
                                                              os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(ranks),
                           str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    (out / "torchrun.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{fault}: torchrun exited {done.returncode}: {done.stderr[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def report_of(run_dir: Path) -> dict:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        if cli(["report", str(run_dir), "--json", "--top", "5"]) != 0:
            raise RuntimeError(f"report failed on {run_dir}")
    return json.loads(buffer.getvalue())


def traces_hold_every_rank(run_dir: Path, ranks: int) -> tuple[int, int]:
    """(sampled steps, of them one trace holding every rank's training.rank_step)."""
    by_trace: dict[str, set[int]] = {}
    steps_of: dict[str, set[int]] = {}
    for span in iter_spans(signal_files(run_dir, sc.TRACES_GLOB),
                           names=frozenset({sc.SPAN_RANK_STEP})):
        by_trace.setdefault(span.trace_id, set()).add(int(span.attributes[sc.ATTR_RANK]))
        steps_of.setdefault(span.trace_id, set()).add(int(span.attributes[sc.ATTR_STEP]))
    whole = sum(1 for t, r in by_trace.items() if r == set(range(ranks))
                and len(steps_of[t]) == 1)
    return len(by_trace), whole


def stall_logs(run_dir: Path) -> list[dict]:
    out = []
    for record in iter_log_records(signal_files(run_dir, sc.LOGS_GLOB)):
        if record.body == sc.LOG_COLLECTIVE_STALLED or record.attributes.get(
                "event") == sc.LOG_COLLECTIVE_STALLED:
            out.append({"rank": record.resource.get(sc.RES_RANK), **{
                k: v for k, v in record.attributes.items() if isinstance(v, (int, float, str))}})
    return out


def expected(fault: str, ranks: int, slow: list[dict]) -> tuple[bool, str]:
    """Is the fault named right (step, rank, cause, line)? And the cause line said."""
    late = ranks - 1
    steps = [int(s) for s in FAULTS[fault][0].split(",")]
    found = {s["step"]: s for s in slow}
    misses = []
    for step in steps:
        got = found.get(step)
        if got is None:
            misses.append(f"step {step} not among the slowest")
            continue
        if got["rank"] != late:
            misses.append(f"step {step}: rank {got['rank']}, not {late}")
        if fault == "hang" and got["location"] != (
                f"main() at {SCRIPT.name}:{script_line('# FAULT: hang')}"):
            misses.append(f"step {step}: location {got['location']}")
        if fault == "cpu" and not (got["location"] or "").startswith("heavy() at "):
            misses.append(f"step {step}: location {got['location']}")
        if fault == "gpu" and (got["phase"], got["on_gpu"]) != ("forward", True):
            misses.append(f"step {step}: {got['phase']} on_gpu={got['on_gpu']}")
        if fault == "region" and (got["phase"], got["segment"]) != ("regions", "metrics"):
            misses.append(f"step {step}: {got['phase']} segment={got['segment']}")
        if fault == "gpu_between" and (got["phase"], got["on_gpu"], got["segment"]) != (
                "gpu_outside_phases", True, "between forward and backward"):
            misses.append(f"step {step}: {got['phase']} on_gpu={got['on_gpu']} "
                          f"segment={got['segment']}")
        if fault == "data" and got["phase"] != "data_wait":
            misses.append(f"step {step}: {got['phase']}")
        if fault in ("hang", "cpu") and got["segment"] != "between forward and backward":
            misses.append(f"step {step}: segment {got['segment']}")
    causes = "; ".join(found[s]["cause"] for s in steps if s in found)
    return not misses, causes + ("" if not misses else " | MISSED: " + "; ".join(misses))


def not_explained_shares(report: dict) -> dict[int, float]:
    return {row["rank"]: row["untimed_split_s"]["not_explained"]
            / sum(row["phase_mean_s"].values()) for row in report["rank_rows"]}


def run_fault(ranks: int, out: Path, fault: str, name: str | None = None) -> dict:
    steps, extra = FAULTS[fault]
    where = out / (name or fault)
    run_dir = launch(ranks, where, fault, steps, extra)
    report = report_of(run_dir)
    (where / "report.json").write_text(json.dumps(report, default=str))
    sampled, whole = traces_hold_every_rank(run_dir, ranks)
    named, causes = expected(fault, ranks, report["slow_steps"])
    shares = not_explained_shares(report)
    arrivals = report["arrivals"]
    result = {
        "fault": fault, "ranks": ranks, "sampled_steps": sampled, "traces_with_every_rank": whole,
        "named": named, "causes": causes, "straggler": report["straggler"],
        "straggler_signal": report["straggler_signal"],
        "not_explained_max": max(shares.values()),
        "arrivals_matched": arrivals["matched"], "worst_arrival": arrivals["worst"],
        "split_mean_s": {row["rank"]: row["untimed_split_s"] for row in report["rank_rows"]},
    }
    ok = named and whole == sampled > 0 and result["not_explained_max"] < MAX_NOT_EXPLAINED
    if fault == "hang":
        stalls = stall_logs(run_dir)
        result["stall_logs"] = len(stalls)
        result["stall_example"] = stalls[0] if stalls else None
        ok = ok and len(stalls) >= ranks - 1  # every waiting rank said so
    result["ok"] = ok
    return result


def cost(ranks: int, out: Path) -> dict:
    cost_dir = out / f"cost-{ranks}"
    launch(ranks, cost_dir / "runs", "none", "", {"STEPS": "60", "COST_OUT": str(cost_dir)})
    rows = [json.loads(p.read_text()) for p in sorted(cost_dir.glob("rank-*.json"))]
    per_step = [r["otel_threads_cpu_s"] / r["steps"] * 1e3 for r in rows]
    per_second = [r["otel_threads_cpu_s"] / r["wall_s"] * 1e3 for r in rows]
    step_ms = [r["wall_s"] / r["steps"] * 1e3 for r in rows]
    return {"ranks": ranks, "step_ms": statistics.median(step_ms),
            "threads_ms_per_step": statistics.median(per_step),
            "threads_ms_per_step_range": [min(per_step), max(per_step)],
            "threads_ms_per_s": statistics.median(per_second),
            "threads_ms_per_s_range": [min(per_second), max(per_second)]}


def markdown(results: list[dict], costs: list[dict], env: dict) -> str:
    lines = [f"# NCCL faults on {env['ranks']} ranks sharing one GPU",
             "", f"{env['date']}, {env['gpu']}, torch {env['torch']}, NCCL {env['nccl']}, "
             f"Python {env['python']}, commit {env['commit']}. Made by "
             "`bench/multigpu/nccl_faults.py`; the script is `tests/gpu/nccl_faults_train.py`.",
             "", "| fault | ok | traces with all ranks / sampled steps | not explained (max "
             "rank) | straggler | arrivals matched | what the report says |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['fault']} | {'yes' if r['ok'] else 'NO'} | "
                     f"{r['traces_with_every_rank']} / {r['sampled_steps']} | "
                     f"{r['not_explained_max']:.1%} | {r['straggler']} "
                     f"({r['straggler_signal']}) | {r['arrivals_matched']} | {r['causes']} |")
    hang = next((r for r in results if r["fault"] == "hang"), None)
    if hang is not None:
        lines += ["", f"Hang: {hang['stall_logs']} `training.collective.stalled` log records "
                  f"(stall timeout 2 s, the rank slept 6 s, the process group's timeout "
                  f"{PG_TIMEOUT_S:.0f} s); first: `{hang['stall_example']}`.",
                  f"Worst arrival: `{hang['worst_arrival']}`."]
    if costs:
        lines += ["", "otel-train's threads (emitter, gap sampler) per rank, fault-free script, "
                  "steps 2-59 (median over ranks, [min, max]):", "",
                  "| ranks | step ms | threads CPU ms / step | threads CPU ms / s |",
                  "| --- | --- | --- | --- |"]
        for c in costs:
            lo, hi = c["threads_ms_per_step_range"]
            slo, shi = c["threads_ms_per_s_range"]
            lines.append(f"| {c['ranks']} | {c['step_ms']:.1f} | {c['threads_ms_per_step']:.3f} "
                         f"[{lo:.3f}, {hi:.3f}] | {c['threads_ms_per_s']:.2f} "
                         f"[{slo:.2f}, {shi:.2f}] |")
    return "\n".join(lines) + "\n"


def environment(ranks: int) -> dict:
    import torch

    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h"], capture_output=True,
        text=True).stdout.strip()
    return {"ranks": ranks, "date": datetime.date.today().isoformat(),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "python": platform.python_version(), "commit": commit or "?"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--cost-ranks", default="")
    parser.add_argument("--md", type=Path)
    parser.add_argument("--fault-steps", action="append", default=[], metavar="FAULT=STEPS",
                        help="the steps a fault is injected in (cpu=10,11,12: three in a "
                             "row); a fault named more than once in --faults runs again")
    args = parser.parse_args(argv)
    for given in args.fault_steps:
        fault, _, steps = given.partition("=")
        FAULTS[fault] = (steps, FAULTS[fault][1])
    results, costs = [], []
    seen: dict[str, int] = {}
    for fault in [f for f in args.faults.split(",") if f]:
        seen[fault] = seen.get(fault, 0) + 1
        name = fault if seen[fault] == 1 else f"{fault}-{seen[fault]}"
        print(f"[nccl-faults] {name} on {args.ranks} ranks", flush=True)
        try:
            results.append(run_fault(args.ranks, args.out, fault, name))
        except Exception as err:  # one fault's failure is a miss, not the end of the proof
            results.append({"fault": fault, "ranks": args.ranks, "ok": False,
                            "error": repr(err)[-2000:], "sampled_steps": 0,
                            "traces_with_every_rank": 0, "not_explained_max": 1.0,
                            "straggler": None, "straggler_signal": None,
                            "arrivals_matched": 0, "causes": repr(err)[-300:]})
        print(json.dumps(results[-1], default=str)[:1500], flush=True)
    for ranks in [int(r) for r in args.cost_ranks.split(",") if r]:
        print(f"[nccl-faults] cost on {ranks} ranks", flush=True)
        costs.append(cost(ranks, args.out))
        print(json.dumps(costs[-1]), flush=True)
    env = environment(args.ranks)
    (args.out / "nccl-faults.json").write_text(json.dumps(
        {"env": env, "results": results, "costs": costs}, indent=1, default=str))
    text = markdown(results, costs, env)
    if args.md:
        args.md.write_text(text, encoding="utf-8")
    print(text)
    ok = all(r["ok"] for r in results)
    print(f"verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
