"""Benchmark: how much this machine's speed changes from one launch of a process to the next,
with no otel-train, no torch.distributed and no data loader in it (issue 52: why two
same-configuration demo runs are called different by ``compare``).

Each launch is a fresh Python process that times one fixed piece of work (20 products of two
256x256 float32 matrices on one thread) over and over for ``--seconds`` and prints the median.
Within a launch the median is known to a fraction of a percent; what this measures is how far
the launches' medians lie apart. ``compare``'s default gate calls a run worse when its step
time is 5% longer with an interval that excludes zero; the intervals come from the steps of
each run, so where launches of the same work differ by more than that, same-configuration
pairs are flagged however long the runs. Exits 1 when the launches' spread (slowest median
over fastest, minus 1) exceeds ``--threshold`` (5%): on such a machine the false-alarm
target of ``bench_compare_false_alarms.py`` cannot be met by any interval computed from one
launch a side.

    .venv/bin/python bench/bench_launch_drift.py --launches 12 --out bench/results/launch-drift.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_report import machine, mean_ci95, write_record  # noqa: E402

PROBE = """
import statistics, sys, time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
for _ in range(50):
    a @ a
times, end = [], time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    times.append(time.perf_counter() - t)
times.sort()
n = len(times)
# the median and a distribution-free 95% interval of it (order statistics)
half = 1.96 * n ** 0.5 / 2
print(statistics.median(times), times[max(0, int(n / 2 - half))],
      times[min(n - 1, int(n / 2 + half))], n)
"""


def versions() -> str:
    import platform

    import torch

    return f"Python {platform.python_version()}, torch {torch.__version__}"


def launch(seconds: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(seconds)], capture_output=True,
                         text=True, check=True, timeout=seconds + 120).stdout.split()
    median, low, high, n = (float(v) for v in out)
    return {"median_ms": median * 1e3, "low_ms": low * 1e3, "high_ms": high * 1e3,
            "samples": int(n)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=3.0, help="each launch's timing")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="the largest spread between launches compare's gate tolerates")
    parser.add_argument("--out", type=Path, help="Markdown file to write (and .json beside)")
    args = parser.parse_args()
    if args.launches < 2 or args.seconds <= 0:
        parser.error("--launches must be 2 or more and --seconds positive")
    load_before = os.getloadavg()[0]
    runs = []
    for k in range(args.launches):
        runs.append(launch(args.seconds))
        print(f"launch {k + 1}/{args.launches}: median {runs[-1]['median_ms']:.3f} ms",
              file=sys.stderr)
    medians = [r["median_ms"] for r in runs]
    spread = max(medians) / min(medians) - 1
    within = statistics.median((r["high_ms"] - r["low_ms"]) / r["median_ms"] for r in runs)
    low, high = mean_ci95(medians)
    met = spread <= args.threshold
    verdict = (f"{'met' if met else 'missed'}: launches' medians {min(medians):.3f} to "
               f"{max(medians):.3f} ms, a spread of {spread:.1%} (target: at most "
               f"{args.threshold:.0%}, compare's default step-time gate)")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "---",
        'what: "launch-to-launch speed of this machine: one fixed matrix-product loop, one '
        'thread, in fresh processes (issue 52: compare\'s false alarms)"',
        f'machine: "{machine()}"',
        f'versions: "{versions()}"',
        f'date: "{date}"',
        f'verdict: "{verdict}"',
        f'made by: "python bench/bench_launch_drift.py --launches {args.launches} '
        f'--seconds {args.seconds:g}"',
        f'data: "{args.out.with_suffix(".json").name if args.out else "-"}"',
        "---",
        "",
        "# Launch-to-launch speed drift",
        "",
        f"- load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}",
        f"- {args.launches} launches, each a fresh `python -c` process timing 20 products of "
        f"two 256x256 float32 matrices on one thread for {args.seconds:g} s (after a warm-up)",
        "",
        "| launch | median ms | 95% interval of the median ms | timings |",
        "| --- | --- | --- | --- |",
        *(f"| {k + 1} | {r['median_ms']:.3f} | {r['low_ms']:.3f} – {r['high_ms']:.3f} | "
          f"{r['samples']} |" for k, r in enumerate(runs)),
        "",
        f"- across launches: median {statistics.median(medians):.3f} ms, mean 95% CI "
        f"{low:.3f} – {high:.3f} ms, fastest {min(medians):.3f}, slowest {max(medians):.3f}: "
        f"a spread of {spread:.1%}",
        f"- within a launch, the median's 95% interval is {within:.2%} of it (median over "
        "launches): the launches differ by far more than each is uncertain",
        "",
        f"Verdict: {verdict}.",
        "",
    ]
    write_record(args.out, "\n".join(lines),
                 {"date": date, "machine": machine(), "versions": versions(),
                  "verdict": verdict, "seconds": args.seconds, "launches": runs,
                  "spread": spread})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
