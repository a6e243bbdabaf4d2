"""The emitter thread's CPU a step and per NCCL plugin record, on a machine without a GPU.

Why: on ranks sharing one H200 the emitter thread is most of what otel-train's threads cost
(bench/results/nccl-timing-routes-shared-h200.md), and a device lease is short. Here the same
emitter runs, at default settings, under a CPU training loop with one gloo rank, while the
records NCCL would give otel-train's profiler plugin are made by calling the plugin the way
NCCL 2.28 does (the stand-in of tests/collectives/test_nccl_plugin.py: a communicator
spanning two "nodes", so kernel-channel timing, as on ranks sharing one GPU over sockets).
The plugin, its ring, the reader and everything after it are the real ones; only NCCL is
stood in for (the kernel stamps are made up: the emitter's CPU does not depend on them).

How: blocks of ``--block`` steps alternate between ``--extra`` plugin operations a step and
none; each step waits ``--step-ms`` (a host waiting on its device). The emitter's thread CPU
(``/proc/self/task/<tid>/schedstat``) per block gives, per pair of neighbouring blocks, the
CPU per extra operation (marginal) and, from the blocks without, per step and per second.
``--profile FILE``: a cProfile of the emitter thread over the run instead (pstats text).

    python bench/emitter_cpu.py [--extra 40] [--step-ms 12] [--duration 20] [--out FILE]

Reported, not judged: the targets are the GPU benchmarks' (bench/multigpu/route_cost.py).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests" / "collectives")]
import overhead_stats as stats  # noqa: E402


def _cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", type=int, default=40, help="plugin operations a step, every other block")
    ap.add_argument("--base", type=int, default=2, help="plugin operations every step")
    ap.add_argument("--step-ms", type=float, default=12.0)
    ap.add_argument("--block", type=int, default=20, help="steps a block")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--profile", type=Path, help="write a cProfile of the emitter thread here")
    ap.add_argument("--parts", action="store_true",
                    help="also the emitter's CPU by part (bench/emitter_parts.py)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.extra < 1 or args.block < 1 or args.step_ms <= 0:
        ap.error("--extra and --block need at least 1, --step-ms more than 0")

    tmp = tempfile.mkdtemp(prefix="otel-train-emitter-cpu-")
    os.environ["OTEL_TRAIN_CACHE_DIR"] = os.path.join(tmp, "cache")
    os.environ["OTEL_TRAIN_NCCL_TIMING"] = "kernel"
    os.environ.setdefault("OTEL_TRAIN_LOG_LEVEL", "warning")
    from otel_train import nccl

    path = str(nccl.plugin_path())
    os.environ[nccl.ENV_NCCL] = path
    import torch
    import torch.distributed as dist
    from test_nccl_plugin import FakeNccl  # NCCL's calls into the plugin
    from torch import nn

    import otel_train
    from otel_train.sources.collectives import flight_recorder

    # NCCL's process group stood in for too: the collectives source reads NCCL (and so the
    # plugin) only where torch's NCCL flight recorder has a group to read
    flight_recorder.FlightRecorder.available = lambda self: True
    flight_recorder.FlightRecorder.poll = lambda self: []
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    fake = FakeNccl(path, comm=0xC0FFEE, nranks=2, nnodes=2)  # NCCL's communicator, as at init
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    seq = [0]
    wait_s = args.step_ms / 1e3

    def operations(n: int) -> None:
        for _ in range(n):
            seq[0] += 1
            h = fake.start_coll(b"AllReduce", seq=seq[0], count=1024, channels=1)
            fake.channel(h, 0, 1_000, 2_000)
            fake.stop(h)
        fake.keep.clear()

    def step(extra: int) -> None:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        operations(args.base + extra)
        time.sleep(wait_s)
        opt.step()
        opt.zero_grad()
        steps_run[0] += 1

    blocks: list[dict[str, Any]] = []
    # CPU time of the emitter's thread, not wall time (a pass blocks in sends and reads)
    prof = cProfile.Profile(time.thread_time) if args.profile else None
    import contextlib

    import emitter_parts

    steps_run = [0]
    parts_cm = emitter_parts.timing_parts() if args.parts else contextlib.nullcontext({})
    with parts_cm as parts, otel_train.instrument(
            model, optimizer=opt, output_dir=os.path.join(tmp, "run")) as inst:
        emitter = inst.emitter
        if prof is not None:  # the emitter thread's passes, profiled on that thread
            pump = emitter.pump

            def profiled(final: bool = False) -> int:
                prof.enable()
                try:
                    return pump(final)
                finally:
                    prof.disable()
            emitter.pump = profiled
        tid = emitter._thread.native_id
        mechanisms = [m for src in inst._sources for m in getattr(src, "mechanisms", ())]
        assert "nccl_profiler_plugin" in mechanisms, mechanisms
        for _ in range(2 * args.block):  # warm-up: first steps, first drains
            step(args.extra)
        t_end = time.monotonic() + args.duration
        i = 0
        while time.monotonic() < t_end or i % 2:
            extra = args.extra if i % 2 else 0
            w0, c0 = time.monotonic(), _cpu_ns(tid)
            for _ in range(args.block):
                step(extra)
            blocks.append({"extra": extra, "steps": args.block, "wall_s": time.monotonic() - w0,
                           "emitter_ns": _cpu_ns(tid) - c0})
            i += 1
        inst_totals = nccl.Plugin(path).totals()
    dist.destroy_process_group()

    marginal = []
    for a, b in zip(blocks[0::2], blocks[1::2], strict=False):
        marginal.append((b["emitter_ns"] / b["steps"] - a["emitter_ns"] / a["steps"])
                        / args.extra / 1e3)
    base = [b for b in blocks if not b["extra"]]
    per_step = [b["emitter_ns"] / b["steps"] / 1e3 for b in base]
    per_s = [b["emitter_ns"] / b["wall_s"] / 1e6 for b in base]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "machine": f"{platform.node()} {os.cpu_count()} CPUs", "python": platform.python_version(),
        "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
        "plugin": inst_totals, "blocks": blocks,
        "us_per_operation": _summary(marginal), "us_per_step": _summary(per_step),
        "ms_per_s": _summary(per_s),
    }
    lines = [
        "# The emitter's CPU on this machine, NCCL's plugin calls made by a stand-in", "",
        f"{result['date']}, {result['machine']}, Python {result['python']}, torch "
        f"{result['torch']}. `{' '.join(sys.argv[1:])}`", "",
        f"- per plugin operation (marginal, {len(marginal)} pairs of blocks): "
        f"{_fmt(result['us_per_operation'])} us",
        f"- per step, {args.base} operations a step: {_fmt(result['us_per_step'])} us",
        f"- per second of training ({1e3 / args.step_ms:.0f} steps a second at most): "
        f"{_fmt(result['ms_per_s'])} ms",
        f"- the plugin's totals: {inst_totals}",
    ]
    if parts:
        lines += ["", "The emitter by part (thread CPU, every step of the run):", "", "```",
                  *emitter_parts.lines(emitter_parts.table(parts, steps_run[0])), "```"]
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(45)
        s2 = io.StringIO()
        pstats.Stats(prof, stream=s2).sort_stats("cumulative").print_stats(45)
        args.profile.write_text(s.getvalue() + "\n\n" + s2.getvalue(), encoding="utf-8")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def _summary(values: list[float]) -> dict[str, float]:
    """Median, its 95% bootstrap interval, min and max."""
    lo, hi = stats.bootstrap_median_ci(values) if len(values) > 1 else (values[0], values[0])
    return {"median": statistics.median(values), "ci_low": lo, "ci_high": hi,
            "min": min(values), "max": max(values), "n": len(values)}


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} [95% CI {s['ci_low']:.2f}, {s['ci_high']:.2f}]"


if __name__ == "__main__":
    raise SystemExit(main())
