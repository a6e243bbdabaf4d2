"""What each NCCL timing route costs the training process, per collective and per second, on
N NCCL ranks sharing one GPU (each its own ``NCCL_HOSTID``: NCCL's network transport, as
between nodes), with a verdict against issue 33's targets.

    python bench/multigpu/route_cost.py --ranks 2,4 --out DIR [--extra 200] [--md FILE]

Arms, each a torchrun launch of the user's DDP script (tests/gpu/nccl_faults_train.py,
fault-free, ``STEPS`` steps, steps 2 to the last measured): ``bare`` (no otel-train, no
plugin), ``events`` (``OTEL_TRAIN_NCCL_TIMING=events``: CUDA events and the poller thread) and
``auto`` (the default: kernel-channel timing here, every communicator spanning "nodes").
Each arm runs twice, with 0 and with ``--extra`` small all-reduces more per step:
- per collective (marginal): the training process's CPU per extra collective, minus the same
  figure of ``bare`` (what NCCL and torch spend on a collective anyway), of every thread but
  NCCL's own (``NCCL_SET_THREAD_NAME=1``: its proxy threads spin for the network transport
  as long as a collective lasts, the same with and without otel-train, and that spin, a
  collective's wall time, would bury a microsecond under the run-to-run spread of its
  milliseconds); target <= 5 us; the figure with NCCL's threads is recorded beside it;
- per second of training: otel-train's own threads' CPU (emitter, gap sampler) over the
  wall time, without extra collectives; target <= 1 ms/s.
Exits 1 when ``auto`` misses a target.
"""

from __future__ import annotations

import argparse
import datetime
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
ARMS = ("bare", "events", "auto")
US_PER_COLLECTIVE, MS_PER_S = 5.0, 1.0


def launch(ranks: int, arm: str, extra: int, steps: int, out: Path) -> list[dict]:
    from otel_train import nccl

    cost_dir = out / f"{ranks}-{arm}-{extra}"
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OTEL_TRAIN_OUTPUT_DIR=str(cost_dir / "runs"), OTEL_TRAIN_CONSOLE_LOG_LEVEL="warning",
               FAULT="none", STEPS=str(steps), COST_OUT=str(cost_dir),
               EXTRA_COLLECTIVES=str(extra), NCCL_SET_THREAD_NAME="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("OTEL_TRAIN_NCCL_TIMING", None)
    if arm == "bare":
        env.pop("NCCL_PROFILER_PLUGIN", None)
        env.update(BARE="1", OTEL_TRAIN_NCCL_PLUGIN="false")
    else:
        env["NCCL_PROFILER_PLUGIN"] = str(nccl.plugin_path())
        if arm == "events":
            env["OTEL_TRAIN_NCCL_TIMING"] = "events"
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(ranks),
                           str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    cost_dir.mkdir(parents=True, exist_ok=True)
    (cost_dir / "torchrun.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{ranks} {arm} {extra}: torchrun {done.returncode}: "
                           f"{done.stderr[-1500:]}")
    return [json.loads(p.read_text()) for p in sorted(cost_dir.glob("rank-*.json"))]


def own(row: dict) -> float:
    """CPU seconds of the training process's threads but NCCL's."""
    return sum(v for k, v in row["threads_cpu_s"].items() if not k.startswith("NCCL"))


def figures(ranks: int, extra: int, steps: int, out: Path) -> dict:
    per: dict[str, dict] = {}
    for arm in ARMS:
        base, more = launch(ranks, arm, 0, steps, out), launch(ranks, arm, extra, steps, out)
        # per rank: CPU per extra collective, microseconds
        marginal = [1e6 * (own(m) / m["steps"] - own(b) / b["steps"]) / extra
                    for b, m in zip(base, more, strict=True)]
        with_nccl = [1e6 * (m["process_cpu_s"] / m["steps"] - b["process_cpu_s"] / b["steps"])
                     / extra for b, m in zip(base, more, strict=True)]
        nccl_threads = {name for b in base + more for name in b["threads_cpu_s"]
                        if name.startswith("NCCL")}
        per[arm] = {"us_per_collective": marginal, "us_per_collective_with_nccl": with_nccl,
                    "nccl_threads": sorted(nccl_threads),
                    "process_cpu_ms_per_step": [1e3 * b["process_cpu_s"] / b["steps"]
                                                for b in base],
                    "otel_threads_ms_per_s": [1e3 * b["otel_threads_cpu_s"] / b["wall_s"]
                                              for b in base],
                    "step_ms": statistics.median(1e3 * b["wall_s"] / b["steps"] for b in base)}
    for key in ("us_per_collective", "us_per_collective_with_nccl"):
        bare = per["bare"][key]
        for arm in ARMS[1:]:
            per[arm]["added_" + key] = [a - b for a, b in zip(per[arm][key], bare, strict=True)]
    return {"ranks": ranks, "extra": extra, "arms": per}


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def markdown(results: list[dict], env: dict) -> str:
    lines = ["# NCCL timing routes: cost on ranks sharing one GPU", "",
             f"{env['date']}, {env['gpu']}, torch {env['torch']}, NCCL {env['nccl']}, Python "
             f"{env['python']}, commit {env['commit']}. Made by `bench/multigpu/route_cost.py`"
             " (median over ranks [min, max]; one launch per arm and collective count).", "",
             "| ranks | arm | step ms | process CPU ms / step | added CPU us / collective "
             "(marginal, NCCL's threads out) | the same, NCCL's threads in | otel-train threads "
             "ms / s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for arm in ARMS:
            a = r["arms"][arm]
            added = med(a["added_us_per_collective"]) if arm != "bare" else (
                f"(itself {med(a['us_per_collective'])})")
            added_nccl = med(a["added_us_per_collective_with_nccl"]) if arm != "bare" else (
                f"(itself {med(a['us_per_collective_with_nccl'])})")
            lines.append(f"| {r['ranks']} | {arm} | {a['step_ms']:.1f} | "
                         f"{med(a['process_cpu_ms_per_step'])} | {added} | {added_nccl} | "
                         f"{med(a['otel_threads_ms_per_s']) if arm != 'bare' else '-'} |")
    return "\n".join(lines) + "\n"


def verdicts(results: list[dict]) -> list[str]:
    misses = []
    for r in results:
        auto = r["arms"]["auto"]
        us = statistics.median(auto["added_us_per_collective"])
        ms = statistics.median(auto["otel_threads_ms_per_s"])
        if us > US_PER_COLLECTIVE:
            misses.append(f"{r['ranks']} ranks: {us:.2f} us a collective > {US_PER_COLLECTIVE}")
        if ms > MS_PER_S:
            misses.append(f"{r['ranks']} ranks: threads {ms:.2f} ms/s > {MS_PER_S}")
    return misses


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--extra", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    results = []
    for ranks in [int(r) for r in args.ranks.split(",") if r]:
        print(f"[route-cost] {ranks} ranks", flush=True)
        results.append(figures(ranks, args.extra, args.steps, args.out))
        print(json.dumps(results[-1]), flush=True)
    env = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "python": platform.python_version(),
           "commit": os.environ.get("BENCH_COMMIT", "?")}
    misses = verdicts(results)
    text = markdown(results, env) + "\nverdict: " + (
        "PASS" if not misses else "FAIL: " + "; ".join(misses)) + "\n"
    (args.out / "route-cost.json").write_text(json.dumps({"env": env, "results": results},
                                                         indent=1))
    if args.md:
        args.md.write_text(text, encoding="utf-8")
    print(text)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
