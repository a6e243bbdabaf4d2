"""Benchmark: do two launches of the demo's training differ in speed because of otel-train, or
without it too? (issue 52: ``compare``'s false alarms on same-configuration demo runs)

``bench_compare_false_alarms.py`` found two launches of the same demo differing by -19% to
+46% in mean step time, and ``bench_launch_drift.py`` a one-thread matrix loop differing by
up to 18% between launches. This runs the demo's own training (its model, data, loader
workers and loop: 2 ranks, gloo, FSDP2, eager) in fresh launches, alternately with
otel-train instrumenting it (``otel_train.instrument``, the demo's defaults) and without, and
times every step on rank 0 with ``time.perf_counter`` in the loop itself (not from the
telemetry): the same clock for both. Steps ``--skip`` and on are the steady ones.

Per launch: the median steady step. Per mode: the spread of the launches' medians (slowest
over fastest, minus 1) and their mean with a 95% interval. The launches alternate, so a
drift of the machine reaches both modes alike.

Two verdicts, and exit 1 where either misses:

- the machine: the uninstrumented launches' spread at most ``--threshold`` (5%, compare's
  default step-time gate). Where it is more, two launches of the same training differ by more
  than the gate without otel-train in them, and the false-alarm target of
  ``bench_compare_false_alarms.py`` cannot be met by any interval computed from one launch a
  side (as ``bench_launch_drift.py`` asks of a matrix loop);
- otel-train: it adds no launch-to-launch variation of its own: the 95% bootstrap interval
  of the ratio of the launches' standard deviations (with over without; launches resampled
  within each mode, 2000 replicates) reaches down to 1 or below.

    .venv/bin/python bench/bench_launch_drift_demo.py --launches 10 \\
        --out bench/results/launch-drift-demo.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_launch_drift import versions  # noqa: E402
from bench_report import machine, mean_ci95, write_record  # noqa: E402

MODES = ("off", "on")


def _child_rank(rank: int, mode: str, steps: int, port: int, out: str, output_dir: str) -> None:
    """One rank of one launch: the demo's ``_rank_main`` and ``_train``, timed."""
    import argparse as _argparse

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader

    from otel_train import demo

    args = _argparse.Namespace(parallel="fsdp2", compile=False, backend="inductor",
                               seq_len=32, batch_size=8, workers=2, ranks=2, steps=steps)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model, opt = demo._build(args)
        data = demo.CopyTask(steps * args.batch_size * 2, args.seq_len)
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                            num_workers=args.workers, persistent_workers=True)
        inst = None
        if mode == "on":
            import otel_train

            inst = otel_train.instrument(model, optimizer=opt, run_id=f"drift-{port}",
                                         output_dir=output_dir)
            inst.start()
        times = []
        last = time.perf_counter()
        for step, batch in enumerate(loader):
            if step >= steps:
                break
            inputs, targets = batch[:, :-1], batch[:, 1:]
            logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.reshape(-1, demo.VOCAB),
                                               targets.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        if inst is not None:
            inst.stop(None)
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()


def _child(mode: str, steps: int, out: str) -> None:
    import torch.multiprocessing as mp

    from otel_train.demo import _free_port

    with tempfile.TemporaryDirectory() as output_dir:
        mp.spawn(_child_rank, args=(mode, steps, _free_port(), out, output_dir), nprocs=2)


def launch(mode: str, steps: int, skip: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(steps),
                        "--child-out", str(out)], check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
        times = json.loads(out.read_text())[skip:]
    return {"mode": mode, "median_ms": statistics.median(times) * 1e3,
            "mean_ms": statistics.fmean(times) * 1e3, "steps": len(times)}


def _sd_ratio(on: list[float], off: list[float], resamples: int = 2000
              ) -> tuple[float, tuple[float, float]]:
    """The ratio of the two modes' standard deviations over launches, and its 95% percentile
    bootstrap interval (each mode's launches resampled with replacement, seeded)."""
    rng = random.Random(0)
    ratios = []
    for _ in range(resamples):
        a = statistics.pstdev(rng.choices(on, k=len(on)))
        b = statistics.pstdev(rng.choices(off, k=len(off)))
        if b > 0:
            ratios.append(a / b)
    ratios.sort()
    return (statistics.stdev(on) / statistics.stdev(off),
            (ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=10, help="per mode")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--skip", type=int, default=20, help="warm-up steps left out")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="the largest spread between launches compare's gate tolerates")
    parser.add_argument("--out", type=Path, help="Markdown file to write (and .json beside)")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.steps, args.child_out)
        return 0
    if args.launches < 2 or args.steps <= args.skip + 5:
        parser.error("--launches must be 2 or more and --steps more than --skip + 5")
    load_before = os.getloadavg()[0]
    runs: list[dict[str, float]] = []
    for k in range(args.launches):
        for mode in (MODES if k % 2 == 0 else MODES[::-1]):  # alternate which goes first
            runs.append(launch(mode, args.steps, args.skip))
            print(f"launch {k + 1}/{args.launches} {mode}: median step "
                  f"{runs[-1]['median_ms']:.2f} ms", file=sys.stderr)
    summary = {}
    for mode in MODES:
        medians = [r["median_ms"] for r in runs if r["mode"] == mode]
        low, high = mean_ci95(medians)
        summary[mode] = {"spread": max(medians) / min(medians) - 1,
                         "mean_ms": statistics.fmean(medians), "low_ms": low, "high_ms": high,
                         "min_ms": min(medians), "max_ms": max(medians),
                         "stdev_pct": statistics.stdev(medians) / statistics.fmean(medians)}
    on, off = summary["on"], summary["off"]
    ratio, (ratio_low, ratio_high) = _sd_ratio(
        [r["median_ms"] for r in runs if r["mode"] == "on"],
        [r["median_ms"] for r in runs if r["mode"] == "off"])
    machine_met = off["spread"] <= args.threshold
    own_met = ratio_low <= 1.0
    met = machine_met and own_met
    verdict = (f"{'met' if met else 'missed'}: without otel-train the launches' median steps "
               f"spread {off['spread']:.1%} (target: at most {args.threshold:.0%}, "
               f"{'met' if machine_met else 'missed'}); with it {on['spread']:.1%}, their "
               f"standard deviation {ratio:.2f} times that without [95% interval "
               f"{ratio_low:.2f}, {ratio_high:.2f}] (target: otel-train adds no detectable "
               f"launch-to-launch variation, {'met' if own_met else 'missed'})")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_json = args.out.with_suffix(".json").name if args.out else "-"
    lines = [
        "---",
        'what: "launch-to-launch speed of the demo\'s training (2 ranks, gloo, FSDP2, eager), '
        'with and without otel-train, alternate launches (issue 52: compare\'s false alarms)"',
        f'machine: "{machine()}"',
        f'versions: "{versions()}"',
        f'date: "{date}"',
        f'verdict: "{verdict}"',
        f'made by: "python bench/bench_launch_drift_demo.py --launches {args.launches} '
        f'--steps {args.steps} --skip {args.skip}"',
        f'data: "{out_json}"',
        "---",
        "",
        "# Launch-to-launch speed of the demo, with and without otel-train",
        "",
        f"- load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}",
        f"- {args.launches} launches a mode, alternating; each a fresh process spawning 2 "
        f"ranks that run the demo's training for {args.steps} steps; rank 0's steps "
        f"{args.skip} and on timed with `time.perf_counter` in the loop",
        "",
        "| launch | otel-train | median step ms | mean step ms | steps |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {k // 2 + 1} | {r['mode']} | {r['median_ms']:.2f} | {r['mean_ms']:.2f} | "
          f"{r['steps']} |" for k, r in enumerate(runs)),
        "",
        "| otel-train | launches' medians: mean ms (95% CI) | fastest | slowest | spread | "
        "stdev, % of the mean |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {mode} | {s['mean_ms']:.2f} ({s['low_ms']:.2f} – {s['high_ms']:.2f}) | "
          f"{s['min_ms']:.2f} | {s['max_ms']:.2f} | {s['spread']:.1%} | {s['stdev_pct']:.1%} |"
          for mode, s in summary.items()),
        "",
        f"- the standard deviation of the launches' medians with otel-train over that without: "
        f"{ratio:.2f} [95% bootstrap interval {ratio_low:.2f}, {ratio_high:.2f}]",
        f"- the mean of the launches' medians with otel-train over that without: "
        f"{on['mean_ms'] / off['mean_ms']:.3f} (a rough overhead figure: the launches' drift "
        "is in it; bench_overhead_cpu.py measures the overhead side by side)",
        "",
        f"Verdict: {verdict}.",
        "",
    ]
    write_record(args.out, "\n".join(lines),
                 {"date": date, "machine": machine(), "versions": versions(),
                  "verdict": verdict, "steps": args.steps, "skip": args.skip,
                  "launches": runs, "summary": summary,
                  "sd_ratio": {"ratio": ratio, "low": ratio_low, "high": ratio_high}})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
