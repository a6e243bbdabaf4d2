"""What each NCCL timing route costs the training process, per collective and per second, on
N NCCL ranks sharing one GPU (each its own ``NCCL_HOSTID``: NCCL's network transport, as
between nodes), with a verdict against issue 33's targets.

    python bench/multigpu/route_cost.py --ranks 2,4 --out DIR [--extra 50] [--duration 30]

Arms, each one torchrun launch of the user's DDP script (tests/gpu/nccl_faults_train.py,
fault-free): ``bare`` (no otel-train, no plugin), ``events`` (``OTEL_TRAIN_NCCL_TIMING=events``:
CUDA events and the poller thread) and ``auto`` (the default: kernel-channel timing here,
every communicator spanning "nodes"). Within each launch, blocks of ``--block`` steps cycle
through three kinds for at least ``--duration`` seconds: ``base`` (no extra all-reduce),
``coll`` (``--extra`` small all-reduces a step) and ``pad`` (none, but each step has the GPU
sleep what ``coll``'s collectives added to a step: the host then waits in the same place).
Each block runs ``--settle`` seconds (3 steps at least) before it is measured: a step length
ten times the last block's is an overrun to the gap sampler until its typical length follows,
a transient of the benchmark's making, not of training's. A block's measurement starts and
ends with the GPU synchronised and the emitter drained on the spot, so its CPU is the work of
its own steps. Every rank sleeps
in synchronisations instead of spinning (``COST_BLOCKING_SYNC=1``, in every arm): a spinning
host would count each socket collective's milliseconds of wall time as CPU.

Three figures, because otel-train's cost scales three ways (issue 33, docs/overhead.md):
- per collective (marginal): per (rank, triple), coll less pad (the same steps, the same
  length: only the collectives differ; what is left of their difference in length is charged
  at the per-second rate), for every thread of the training process but NCCL's own
  (``NCCL_SET_THREAD_NAME=1``: its proxy thread polls the network transport at 100% the whole
  run, with and without otel-train, so what the plugin adds there costs no CPU), per extra
  collective, minus the same figure of ``bare``; target <= 5 us. The figure with NCCL's
  threads is recorded beside it;
- per second of training: otel-train's own threads (emitter, gap sampler), pad less base
  (the same steps, longer) over the seconds pad adds: wake-ups and polling; target <= 1 ms/s;
- per step: otel-train's threads in the base blocks less their seconds at that rate and the
  edge's drains at a pass's fixed cost, per step (with the step's own DDP all-reduce);
  reported, and beside it the base blocks' whole share (ms/s at their step rate).
Each figure: median over (rank, triple) with a 95% confidence interval (bootstrap over the
triples; for "added", the instrumented arm's minus bare's, resampled independently). Exits 1
when ``auto`` misses a target. ``--parts``: the emitter's CPU by part as well.

The whole process's marginal moves by +-10-16 us between launches of arms that differ by
code that can only add CPU (bench/results/nccl-timing-route-wrappers-2-ranks-shared-h100.md:
``no_wrappers`` below ``bare``), more than the 5 us target. The parts that are measured
exactly are reported apart: otel-train's threads (their own CPU clocks), and with the
``auto_timed`` arm the plugin's callbacks where NCCL enqueues, timed in situ
(``OTEL_TRAIN_NCCL_SELF_TIME=1``); the ``torch.distributed`` wrapper's share is
``bench/bench_collective_wrapper.py --real --device cuda``'s.
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
#: which drains nothing: NCCL's and the plugin's callbacks' share of the cost; ``no_wrappers``:
#: ``auto`` without otel-train's ``torch.distributed`` wrappers (a measurement switch of the
#: script, COST_NO_WRAPPERS=1): the wrappers' share of the training thread's cost a collective
#: ``auto_timed``: ``auto`` with the plugin timing its own callbacks where NCCL enqueues
#: (OTEL_TRAIN_NCCL_SELF_TIME=1, two thread-CPU clock reads a callback more): the plugin's
#: share of the training thread a collective, exact where the whole process's is not
EXTRA_ARMS = ("plugin_only", "no_wrappers", "auto_timed")
US_PER_COLLECTIVE, MS_PER_S = 5.0, 1.0


def launch(ranks: int, arm: str, args: argparse.Namespace, out: Path) -> list[dict]:
    from otel_train import nccl

    cost_dir = out / f"{ranks}-{arm}"
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OTEL_TRAIN_OUTPUT_DIR=str(cost_dir / "runs"), OTEL_TRAIN_LOG_LEVEL="warning",
               FAULT="none", COST_OUT=str(cost_dir), COST_BLOCK=str(args.block),
               COST_DURATION_S=str(args.duration), COST_BLOCKING_SYNC="1",
               COST_SETTLE_S=str(args.settle),
               EXTRA_COLLECTIVES=str(args.extra), NCCL_SET_THREAD_NAME="1",
               COST_PARTS="1" if args.parts else "0",
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
        if arm == "no_wrappers":
            env["COST_NO_WRAPPERS"] = "1"
        if arm == "auto_timed":
            env["OTEL_TRAIN_NCCL_SELF_TIME"] = "1"
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node", str(ranks),
                           str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=args.duration * 4 + 180)
    cost_dir.mkdir(parents=True, exist_ok=True)
    (cost_dir / "torchrun.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise RuntimeError(f"{ranks} {arm}: torchrun {done.returncode}: {done.stderr[-1500:]}")
    return [json.loads(p.read_text()) for p in sorted(cost_dir.glob("rank-*.json"))]


EMITTER = "py:otel-train-emitter"


def edge_s(block: dict) -> float:
    """The emitter's CPU seconds in the drains the benchmark asks for at the block's end, at
    a pass's fixed cost (the work they find is the block's own: it stays counted)."""
    return block.get("passes", 0) * block.get("drain_ns", 0) / 1e9


def own(block: dict) -> float:
    """CPU seconds of the training process's threads but NCCL's (the edge's drains out)."""
    return sum(v for k, v in block["threads_cpu_s"].items()
               if not k.startswith("NCCL")) - edge_s(block)


def process(block: dict) -> float:
    return block["process_cpu_s"] - edge_s(block)


def otel(block: dict) -> float:
    return block["otel_threads_cpu_s"] - edge_s(block)


def plugin_callbacks_gross(block: dict) -> float:
    """CPU seconds of the plugin's callbacks where NCCL enqueues (OTEL_TRAIN_NCCL_SELF_TIME=1),
    as timed: with the timer's own part (a thread-CPU clock read a callback)."""
    return block["plugin_callbacks_s"]


def plugin_callbacks(block: dict) -> float:
    """The same, net of the timer's own part: each callback's figure holds one empty timed
    region (``plugin_timer_floor_ns``, measured in situ on the training thread), which the
    untimed plugin does not pay."""
    floor_ns = block.get("plugin_timer_floor_ns", 0.0)
    return plugin_callbacks_gross(block) - block["plugin_callbacks"] * floor_ns / 1e9


def thread(name: str) -> Callable[[dict], float]:
    def cpu(block: dict) -> float:
        value = block["threads_cpu_s"].get(name, 0.0)
        return value - edge_s(block) if name == EMITTER else value
    return cpu


KINDS = ("base", "coll", "pad")


def triples(rows: list[dict]) -> list[tuple[dict, dict, dict]]:
    """Each rank's blocks as (base, coll, pad) triples, in order."""
    out = []
    for row in rows:
        b = row["blocks"]
        for triple in zip(b[0::3], b[1::3], b[2::3], strict=False):
            if tuple(t.get("kind") for t in triple) == KINDS:
                out.append(triple)
    return out


def per_s(base: dict, pad: dict, cpu: Callable[[dict], float]) -> float:
    """CPU seconds a second of training: pad less base (the same steps, longer), over the
    wall time pad adds."""
    longer = pad["wall_s"] - base["wall_s"]
    return (cpu(pad) - cpu(base)) / longer if longer > 0 else 0.0


def marginal(rows: list[dict], cpu: Callable[[dict], float]) -> list[float]:
    """Per (rank, triple): CPU us per extra collective, coll less pad (the same steps and
    nearly the same length); what is left of their difference in length is charged at the
    per-second rate, so the figure is what scales with collectives alone."""
    out = []
    for base, coll, pad in triples(rows):
        rest = coll["wall_s"] - pad["wall_s"]
        added = cpu(coll) - cpu(pad) - per_s(base, pad, cpu) * rest
        out.append(1e6 * added / (coll["steps"] * coll["extra"]))
    return out


def per_step(rows: list[dict], cpu: Callable[[dict], float]) -> list[float]:
    """Per (rank, triple): CPU us a step (with its DDP all-reduce) of the base block, less
    its seconds at the per-second rate (the edge's drains are out already: :func:`edge_s`)."""
    return [1e6 * (cpu(base) - per_s(base, pad, cpu) * base["wall_s"]) / base["steps"]
            for base, _, pad in triples(rows)]


def ci(values: list[float], minus: list[float] | None = None, n: int = 2000
       ) -> tuple[float, float, float]:
    """Median (of ``values`` less the median of ``minus``) and a 95% bootstrap interval."""
    rng = random.Random(0)

    def stat(v: list[float], m: list[float] | None) -> float:
        return statistics.median(v) - (statistics.median(m) if m else 0.0)

    draws = sorted(stat(rng.choices(values, k=len(values)),
                        rng.choices(minus, k=len(minus)) if minus else None) for _ in range(n))
    return stat(values, minus), draws[int(0.025 * n)], draws[int(0.975 * n) - 1]


WAKERS = ("emitter", "gap_sampler", "gap_stretches", "gap_overruns")


def wakeups_per_s(rows: list[dict], k: int) -> dict[str, float]:
    """Median over (rank, triple) of the k-th block's wake-ups a second, by what woke (the
    emitter's less the edge's drain passes; the gap sampler's, and its looks that sampled a
    stretch or found an overrun)."""
    out = {}
    for name in WAKERS:
        values = [(t[k].get("wakeups", {}).get(name, 0)
                   - (t[k].get("passes", 0) if name == "emitter" else 0)) / t[k]["wall_s"]
                  for t in triples(rows) if name in t[k].get("wakeups", {})]
        if values:
            out[name] = statistics.median(values)
    return out


OTEL_THREADS = (EMITTER, "py:otel-train-gap-sampler")


def sampler_us_per_wakeup(rows: list[dict]) -> dict[str, float]:
    """By kind of block, median over (rank, triple): the gap sampler thread's CPU us over
    its wake-ups in the block (what a look costs, wake-up and work)."""
    out = {}
    for k, kind in enumerate(KINDS):
        values = [1e6 * t[k]["threads_cpu_s"].get(OTEL_THREADS[1], 0.0)
                  / t[k]["wakeups"]["gap_sampler"] for t in triples(rows)
                  if t[k].get("wakeups", {}).get("gap_sampler")]
        if values:
            out[kind] = statistics.median(values)
    return out


def figures(ranks: int, args: argparse.Namespace, out: Path) -> dict:
    rows_by_arm = {}
    for arm in args.arms:
        rows_by_arm[arm] = launch(ranks, arm, args, out)
        if not triples(rows_by_arm[arm]):
            raise RuntimeError(f"{ranks} {arm}: no complete (base, coll, pad) triple of blocks")
    return {"ranks": ranks, "extra": args.extra, "block": args.block,
            "arms": arm_figures(rows_by_arm)}


def arm_figures(rows_by_arm: dict[str, list[dict]]) -> dict[str, dict]:
    """Each arm's figures from its ranks' blocks (the first arm is bare: the others' "added"
    figures are theirs less its)."""
    per: dict[str, dict] = {}
    for arm, rows in rows_by_arm.items():
        base_blocks = [t[0] for t in triples(rows)]
        names = sorted({k for r in rows for b in r["blocks"] for k in b["threads_cpu_s"]})
        parts = sorted({k for r in rows for b in r["blocks"] for k in b.get("emitter_parts_ns", {})})
        per[arm] = {
            "pairs_us": marginal(rows, own),
            "pairs_us_with_nccl": marginal(rows, process),
            "otel_threads_pairs_us": marginal(rows, otel),
            "nccl_threads": [n for n in names if n.startswith("NCCL")],
            # where it goes: each thread name's marginal CPU us per collective (median)
            "by_thread_us": {name: statistics.median(marginal(rows, thread(name)))
                             for name in names},
            # the emitter by part (--parts): us per collective and per step
            "parts_us_per_collective": {part: statistics.median(marginal(
                rows, lambda b, part=part: b["emitter_parts_ns"].get(part, 0) / 1e9))
                for part in parts},
            # ... and per second of training (what the base and pad blocks' difference
            # in length adds: the part's share of "per second")
            "parts_ms_per_s": {part: statistics.median(1e3 * per_s(
                b, p, lambda blk, part=part: blk.get("emitter_parts_ns", {}).get(part, 0) / 1e9)
                for b, _, p in triples(rows)) for part in parts},
            "parts_us_per_step": {part: statistics.median(
                1e6 * t[0]["emitter_parts_ns"].get(part, 0) / 1e9 / t[0]["steps"]
                for t in triples(rows)) for part in parts},
            # the three ways otel-train's threads' CPU scales: per second of training, per
            # step, per collective (above); and all of it in the base blocks, as a user sees
            "otel_per_s_ms": [1e3 * per_s(b, p, otel) for b, _, p in triples(rows)],
            # ... of it each of otel-train's threads, and the gap sampler's CPU a wake-up by
            # kind of block (what one look costs: its wake-up and its work)
            "per_s_by_thread_ms": {name: statistics.median(
                1e3 * per_s(b, p, thread(name)) for b, _, p in triples(rows))
                for name in names if name in OTEL_THREADS},
            "sampler_us_per_wakeup": sampler_us_per_wakeup(rows),
            "otel_per_step_us": per_step(rows, otel),
            "otel_threads_ms_per_s": [1e3 * sum(otel(b) for b in r["blocks"]
                                                if b.get("kind") == "base")
                                      / sum(b["wall_s"] for b in r["blocks"]
                                            if b.get("kind") == "base") for r in rows],
            "otel_threads_ms_per_step": [1e3 * sum(otel(b) for b in r["blocks"]
                                                   if b.get("kind") == "base")
                                         / sum(b["steps"] for b in r["blocks"]
                                               if b.get("kind") == "base") for r in rows],
            # wake-ups a second of each kind of block (the emitter's less the edge's
            # passes), and what the gap sampler's looks found (stretches, overruns)
            "wakeups_per_s": {kind: wakeups_per_s(rows, k) for k, kind in enumerate(KINDS)},
            "step_ms": statistics.median(1e3 * b["wall_s"] / b["steps"] for b in base_blocks),
            "coll_step_ms": statistics.median(1e3 * t[1]["wall_s"] / t[1]["steps"]
                                              for t in triples(rows)),
            "pad_step_ms": statistics.median(1e3 * t[2]["wall_s"] / t[2]["steps"]
                                             for t in triples(rows)),
            "measured_s": statistics.median(sum(b["wall_s"] for b in r["blocks"]) for r in rows),
            "blocks": statistics.median(len(r["blocks"]) for r in rows),
        }
        if all("plugin_callbacks_s" in b for t in triples(rows) for b in t):
            # auto_timed: the plugin's callbacks where NCCL enqueues, timed in situ (inside
            # py:main's CPU above, not beside it), per extra collective; and how many
            per[arm]["plugin_callbacks_pairs_us"] = marginal(rows, plugin_callbacks)
            per[arm]["plugin_callbacks_gross_pairs_us"] = marginal(rows, plugin_callbacks_gross)
            per[arm]["plugin_timer_floor_ns"] = statistics.median(
                b.get("plugin_timer_floor_ns", 0.0) for t in triples(rows) for b in t)
            per[arm]["plugin_callbacks_per_collective"] = statistics.median(marginal(
                rows, lambda b: b["plugin_callbacks"] / 1e6))
    arms = list(rows_by_arm)
    for arm in arms[1:]:
        for key in ("pairs_us", "pairs_us_with_nccl"):
            per[arm]["added_" + key] = ci(per[arm][key], per["bare"][key])
    for arm in arms:
        per[arm]["itself_us"] = ci(per[arm]["pairs_us"])
        per[arm]["otel_threads_us"] = ci(per[arm]["otel_threads_pairs_us"])
        per[arm]["otel_per_s"] = ci(per[arm]["otel_per_s_ms"])
        per[arm]["otel_per_step"] = ci(per[arm]["otel_per_step_us"])
        if "plugin_callbacks_pairs_us" in per[arm]:
            per[arm]["plugin_callbacks_us"] = ci(per[arm]["plugin_callbacks_pairs_us"])
            per[arm]["plugin_callbacks_gross_us"] = ci(
                per[arm]["plugin_callbacks_gross_pairs_us"])
            # the parts measured exactly: otel-train's threads and the plugin's callbacks
            per[arm]["parts_pairs_us"] = [
                a + b for a, b in zip(per[arm]["otel_threads_pairs_us"],
                                      per[arm]["plugin_callbacks_pairs_us"], strict=True)]
            per[arm]["parts_us"] = ci(per[arm]["parts_pairs_us"])
    return per


def fmt(est: tuple[float, float, float]) -> str:
    return f"{est[0]:.2f} [{est[1]:.2f}, {est[2]:.2f}]"


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def markdown(results: list[dict], env: dict) -> str:
    lines = ["# NCCL timing routes: cost on ranks sharing one GPU", "",
             f"{env['date']}, {env['gpu']}, torch {env['torch']}, NCCL {env['nccl']}, Python "
             f"{env['python']}, commit {env['commit']}. Made by `bench/multigpu/route_cost.py`"
             ": median over (rank, triple of blocks) [95% bootstrap CI]; the base blocks' "
             "whole share, median over ranks [min, max].", "",
             "| ranks | arm | step ms base / coll / pad | measured s (blocks) | added CPU us / "
             "collective (NCCL's threads out) | the same, NCCL's threads in | of it otel-train's "
             "threads, us / collective | otel-train threads: us / step | ms / s of training "
             "(what scales with time) | all of it in the base blocks, ms / s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for arm in r["arms"]:
            a = r["arms"][arm]
            added = fmt(a["added_pairs_us"]) if arm != "bare" else (
                f"(itself {fmt(a['itself_us'])})")
            added_nccl = fmt(a["added_pairs_us_with_nccl"]) if arm != "bare" else "-"
            threads = arm not in ("bare", "plugin_only")
            lines.append(
                f"| {r['ranks']} | {arm} | {a['step_ms']:.1f} / {a['coll_step_ms']:.1f} / "
                f"{a['pad_step_ms']:.1f} | {a['measured_s']:.0f} ({a['blocks']:.0f}) | "
                f"{added} | {added_nccl} | "
                f"{fmt(a['otel_threads_us']) if threads else '-'} | "
                f"{fmt(a['otel_per_step']) if threads else '-'} | "
                f"{fmt(a['otel_per_s']) if threads else '-'} | "
                f"{spread(a['otel_threads_ms_per_s']) if threads else '-'} |")
    lines += ["", "Wake-ups a second by kind of block (median over (rank, triple); the "
              "emitter's without the edges' drains; of the gap sampler's looks, those that "
              "sampled a stretch and those that found a step past its typical length):", "",
              "| ranks | arm | block | " + " | ".join(WAKERS) + " |",
              "| --- | --- | --- |" + " --- |" * len(WAKERS)]
    for r in results:
        for arm, a in r["arms"].items():
            if arm in ("bare", "plugin_only"):
                continue
            for kind, w in a.get("wakeups_per_s", {}).items():
                if w:
                    lines.append(f"| {r['ranks']} | {arm} | {kind} | " + " | ".join(
                        f"{w[n]:.1f}" if n in w else "-" for n in WAKERS) + " |")
    lines += ["", "otel-train's threads per second of training (ms/s, median over (rank, "
              "triple)), and the gap sampler's CPU a wake-up by kind of block (us):", "",
              "| ranks | arm | emitter ms/s | gap sampler ms/s | sampler us / wake-up: "
              + " / ".join(KINDS) + " |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        for arm, a in r["arms"].items():
            if "per_s_by_thread_ms" not in a or arm in ("bare", "plugin_only"):
                continue
            by, wake = a["per_s_by_thread_ms"], a.get("sampler_us_per_wakeup", {})
            lines.append(f"| {r['ranks']} | {arm} | {by.get(OTEL_THREADS[0], 0.0):.3f} | "
                         f"{by.get(OTEL_THREADS[1], 0.0):.3f} | " + " / ".join(
                             f"{wake[k]:.0f}" if k in wake else "-" for k in KINDS) + " |")
    lines += ["", "Where the marginal CPU per collective goes, by thread name (us, median "
              "over (rank, triple); NCCL's threads named by NCCL_SET_THREAD_NAME=1):", ""]
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
    timed = [(r["ranks"], arm, a) for r in results for arm, a in r["arms"].items()
             if "plugin_callbacks_us" in a]
    if timed:
        lines += ["The plugin's callbacks where NCCL enqueues, timed in situ "
                  "(`OTEL_TRAIN_NCCL_SELF_TIME=1`: a part of the training thread's CPU, exact "
                  "where the whole process's marginal is not), per extra collective: as "
                  "timed, and net of the timer's own part (one empty timed region a callback, "
                  "measured on the training thread; 0 where the run predates it); with "
                  "otel-train's threads, the parts measured exactly (the `torch.distributed` "
                  "wrapper, ~1 us, is `bench/bench_collective_wrapper.py`'s):", "",
                  "| ranks | arm | callbacks a collective | timer, ns a callback "
                  "| plugin callbacks as timed, us / collective | net of the timer "
                  "| otel-train's threads, us / collective | net callbacks + threads |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for ranks, arm, a in timed:
            gross = a.get("plugin_callbacks_gross_us", a["plugin_callbacks_us"])
            lines.append(f"| {ranks} | {arm} | {a['plugin_callbacks_per_collective']:.2f} | "
                         f"{a.get('plugin_timer_floor_ns', 0.0):.0f} | {fmt(gross)} | "
                         f"{fmt(a['plugin_callbacks_us'])} | {fmt(a['otel_threads_us'])} | "
                         f"{fmt(a['parts_us'])} |")
        lines.append("")
    for r in results:
        for arm, a in r["arms"].items():
            if not a.get("parts_us_per_step"):
                continue
            lines += [f"The emitter by part, {r['ranks']} ranks, {arm} (`--parts`: thread CPU "
                      "of each part, nested parts inside their callers; the gap sampler's "
                      "parts are its own thread's; the base blocks' us a "
                      "step, whole; us per extra collective and ms per second as above):",
                      "", "| part | us / step (base) | us / collective | ms / s |",
                      "| --- | --- | --- | --- |"]
            for part, us in sorted(a["parts_us_per_step"].items(), key=lambda kv: -kv[1]):
                lines.append(f"| {part} | {us:.1f} | "
                             f"{a['parts_us_per_collective'].get(part, 0.0):.2f} | "
                             f"{a.get('parts_ms_per_s', {}).get(part, 0.0):.3f} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def verdicts(results: list[dict]) -> list[str]:
    """Issue 33's targets: the training process's CPU per collective (marginal) and otel-train's
    threads' CPU per second of training (what scales with time: wake-ups, polling). The
    per-step part and the base blocks' whole share are reported beside them."""
    misses = []
    for r in results:
        auto = r["arms"]["auto"]
        us = auto["added_pairs_us"][0]
        ms = auto["otel_per_s"][0]
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
    parser.add_argument("--settle", type=float, default=1.5,
                        help="seconds each block runs unmeasured first (at least 3 steps): "
                             "the gap sampler's typical step length follows the new steps'")
    parser.add_argument("--md", type=Path)
    parser.add_argument("--parts", action="store_true",
                        help="also the emitter's CPU by part (bench/emitter_parts.py)")
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
