"""What each NCCL timing route costs the training process, per collective and per second, on
N NCCL ranks sharing one GPU (each its own ``NCCL_HOSTID``: NCCL's network transport, as
between nodes), with a verdict against issue 33's targets.

    python bench/multigpu/route_cost.py --ranks 2,4 --out DIR [--extra 50] [--duration 30]

Arms, each one torchrun launch of the user's DDP script (tests/gpu/nccl_faults_train.py,
fault-free): ``bare`` (no otel-train, no plugin), ``events`` (``OTEL_TRAIN_NCCL_TIMING=events``:
CUDA events and the poller thread) and ``auto`` (the default: kernel-channel timing here,
every communicator spanning "nodes"). Within each launch, blocks of ``--block`` steps
alternate between no extra all-reduce and ``--extra`` small all-reduces a step, for at least
``--duration`` seconds: each pair of neighbouring blocks differs only in collectives, so
drift cancels. Every rank sleeps in synchronisations instead of spinning
(``COST_BLOCKING_SYNC=1``, in every arm): a spinning host would count each socket
collective's milliseconds of wall time as CPU.
- per collective (marginal): per pair of blocks, the CPU of every thread of the training
  process but NCCL's own (``NCCL_SET_THREAD_NAME=1``: its proxy thread polls the network
  transport at 100% the whole run, with and without otel-train, so what the plugin adds
  there costs no CPU) per extra collective, minus the same figure of ``bare``; target
  <= 5 us. The figure with NCCL's threads is recorded beside it;
- per second of training: otel-train's own threads' CPU (emitter, gap sampler) over the
  wall time of the blocks without extra collectives; target <= 1 ms/s.
Each figure: median over (rank, pair) with a 95% confidence interval (bootstrap over the
pairs; for "added", the instrumented arm's minus bare's, resampled independently). Exits 1
when ``auto`` misses a target.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SCRIPT = REPO / "tests" / "gpu" / "nccl_faults_train.py"
ARMS = ("bare", "events", "auto")
#: more arms for ``--arms``: the plugin loaded (auto timing) in a loop without otel-train,
#: which drains nothing: NCCL's and the plugin's callbacks' share of the cost
EXTRA_ARMS = ("plugin_only",)
US_PER_COLLECTIVE, MS_PER_S = 5.0, 1.0


def launch(ranks: int, arm: str, args: argparse.Namespace, out: Path) -> list[dict]:
    from otel_train import nccl

    cost_dir = out / f"{ranks}-{arm}"
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OTEL_TRAIN_OUTPUT_DIR=str(cost_dir / "runs"), OTEL_TRAIN_LOG_LEVEL="warning",
               FAULT="none", COST_OUT=str(cost_dir), COST_BLOCK=str(args.block),
               COST_DURATION_S=str(args.duration), COST_BLOCKING_SYNC="1",
               EXTRA_COLLECTIVES=str(args.extra), NCCL_SET_THREAD_NAME="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("OTEL_TRAIN_NCCL_TIMING", None)
    if arm == "bare":
        env.pop("NCCL_PROFILER_PLUGIN", None)
        env.update(BARE="1", OTEL_TRAIN_NCCL_PLUGIN="false")
    elif arm == "plugin_only":
        env.update(BARE="1", NCCL_PROFILER_PLUGIN=str(nccl.plugin_path()))
    else:
        env["NCCL_PROFILER_PLUGIN"] = str(nccl.plugin_path())
        if arm == "events":
            env["OTEL_TRAIN_NCCL_TIMING"] = "events"
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(ranks),
                           str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=args.duration * 4 + 180)
    cost_dir.mkdir(parents=True, exist_ok=True)
    (cost_dir / "torchrun.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{ranks} {arm}: torchrun {done.returncode}: {done.stderr[-1500:]}")
    return [json.loads(p.read_text()) for p in sorted(cost_dir.glob("rank-*.json"))]


def own(block: dict) -> float:
    """CPU seconds of the training process's threads but NCCL's."""
    return sum(v for k, v in block["threads_cpu_s"].items() if not k.startswith("NCCL"))


def pairs(rows: list[dict], cpu: Callable[[dict], float]) -> list[float]:
    """Per (rank, pair of neighbouring blocks): CPU us per extra collective."""
    out = []
    for row in rows:
        blocks = row["blocks"]
        for a, b in zip(blocks[0::2], blocks[1::2], strict=False):
            more, base = (a, b) if a["extra"] else (b, a)
            if more["extra"] and not base["extra"]:
                out.append(1e6 * (cpu(more) / more["steps"] - cpu(base) / base["steps"])
                           / more["extra"])
    return out


def ci(values: list[float], minus: list[float] | None = None, n: int = 2000
       ) -> tuple[float, float, float]:
    """Median (of ``values`` less the median of ``minus``) and a 95% bootstrap interval."""
    rng = random.Random(0)

    def stat(v: list[float], m: list[float] | None) -> float:
        return statistics.median(v) - (statistics.median(m) if m else 0.0)

    draws = sorted(stat(rng.choices(values, k=len(values)),
                        rng.choices(minus, k=len(minus)) if minus else None) for _ in range(n))
    return stat(values, minus), draws[int(0.025 * n)], draws[int(0.975 * n) - 1]


def figures(ranks: int, args: argparse.Namespace, out: Path) -> dict:
    per: dict[str, dict] = {}
    for arm in args.arms:
        rows = launch(ranks, arm, args, out)
        base_blocks = [b for r in rows for b in r["blocks"] if not b["extra"]]
        per[arm] = {
            "pairs_us": pairs(rows, own),
            "pairs_us_with_nccl": pairs(rows, lambda b: b["process_cpu_s"]),
            "otel_threads_pairs_us": pairs(rows, lambda b: b["otel_threads_cpu_s"]),
            "nccl_threads": sorted({k for r in rows for b in r["blocks"]
                                    for k in b["threads_cpu_s"] if k.startswith("NCCL")}),
            # where it goes: each thread name's marginal CPU us per collective (median)
            "by_thread_us": {name: statistics.median(pairs(
                rows, lambda b, name=name: b["threads_cpu_s"].get(name, 0.0)))
                for name in sorted({k for r in rows for b in r["blocks"]
                                    for k in b["threads_cpu_s"]})},
            "otel_threads_ms_per_s": [1e3 * sum(b["otel_threads_cpu_s"] for b in r["blocks"]
                                                if not b["extra"])
                                      / sum(b["wall_s"] for b in r["blocks"] if not b["extra"])
                                      for r in rows],
            "otel_threads_ms_per_step": [1e3 * sum(b["otel_threads_cpu_s"] for b in r["blocks"]
                                                   if not b["extra"])
                                         / sum(b["steps"] for b in r["blocks"] if not b["extra"])
                                         for r in rows],
            "step_ms": statistics.median(1e3 * b["wall_s"] / b["steps"] for b in base_blocks),
            "measured_s": statistics.median(sum(b["wall_s"] for b in r["blocks"]) for r in rows),
            "blocks": statistics.median(len(r["blocks"]) for r in rows),
        }
    for arm in args.arms[1:]:
        for key in ("pairs_us", "pairs_us_with_nccl"):
            per[arm]["added_" + key] = ci(per[arm][key], per["bare"][key])
    for arm in args.arms:
        per[arm]["itself_us"] = ci(per[arm]["pairs_us"])
        per[arm]["otel_threads_us"] = ci(per[arm]["otel_threads_pairs_us"])
    return {"ranks": ranks, "extra": args.extra, "block": args.block, "arms": per}


def fmt(est: tuple[float, float, float]) -> str:
    return f"{est[0]:.2f} [{est[1]:.2f}, {est[2]:.2f}]"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def markdown(results: list[dict], env: dict) -> str:
    lines = ["# NCCL timing routes: cost on ranks sharing one GPU", "",
             f"{env['date']}, {env['gpu']}, torch {env['torch']}, NCCL {env['nccl']}, Python "
             f"{env['python']}, commit {env['commit']}. Made by `bench/multigpu/route_cost.py`"
             ": per collective, median over (rank, pair of blocks) [95% bootstrap CI]; per "
             "step and per second, median over ranks [min, max].", "",
             "| ranks | arm | step ms | measured s (blocks) | added CPU us / collective "
             "(NCCL's threads out) | the same, NCCL's threads in | of it otel-train's threads, us "
             "/ collective | otel-train threads ms / step | otel-train threads ms / s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for arm in r["arms"]:
            a = r["arms"][arm]
            added = fmt(a["added_pairs_us"]) if arm != "bare" else (
                f"(itself {fmt(a['itself_us'])})")
            added_nccl = fmt(a["added_pairs_us_with_nccl"]) if arm != "bare" else "-"
            threads = arm not in ("bare", "plugin_only")
            lines.append(
                f"| {r['ranks']} | {arm} | {a['step_ms']:.1f} | {a['measured_s']:.0f} "
                f"({a['blocks']:.0f}) | {added} | {added_nccl} | "
                f"{fmt(a['otel_threads_us']) if threads else '-'} | "
                f"{spread(a['otel_threads_ms_per_step']) if threads else '-'} | "
                f"{spread(a['otel_threads_ms_per_s']) if threads else '-'} |")
    lines += ["", "Where the marginal CPU per collective goes, by thread name (us, median "
              "over (rank, pair); NCCL's threads named by NCCL_SET_THREAD_NAME=1):", ""]
    for r in results:
        names = sorted({n for a in r["arms"].values() for n in a["by_thread_us"]})
        arms = list(r["arms"])
        lines += [f"| {r['ranks']} ranks: thread | " + " | ".join(arms) + " |",
                  "| --- |" + " --- |" * len(arms)]
        for name in names:
            values = [r["arms"][arm]["by_thread_us"].get(name) for arm in arms]
            if all(v is None or abs(v) < 0.5 for v in values):
                continue
            lines.append(f"| {name} | " + " | ".join(
                "-" if v is None else f"{v:.1f}" for v in values) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def verdicts(results: list[dict]) -> list[str]:
    misses = []
    for r in results:
        auto = r["arms"]["auto"]
        us = auto["added_pairs_us"][0]
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
    parser.add_argument("--extra", type=int, default=50)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"bare first, then of {', '.join(ARMS[1:] + EXTRA_ARMS)}")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    args.arms = [a for a in args.arms.split(",") if a]
    if args.arms[:1] != ["bare"] or "auto" not in args.arms or not set(args.arms) <= set(
            ARMS + EXTRA_ARMS):
        parser.error(f"--arms: bare first, auto among them, of {', '.join(ARMS + EXTRA_ARMS)}")
    results = []
    for ranks in [int(r) for r in args.ranks.split(",") if r]:
        print(f"[route-cost] {ranks} ranks", flush=True)
        results.append(figures(ranks, args, args.out))
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
