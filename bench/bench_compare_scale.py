"""Benchmark: ``otel-train compare`` on two synthetic runs of many ranks, one with a planted
slowdown (issue 52: two 1,024-rank runs under 60 s and 2 GB, the slowdown found and
attributed to backward on its rank).

The runs are written by ``tests/support/report_fixtures.py`` with one seed, so that every
rank's steps are the same in both but for the plant: rank ``--slow-rank``'s backward is 10%
longer in every step of the second run, and the others wait for it in the all-reduce, as in
synchronous training (tests/report/test_compare.py's ``slowed_backward``). Each comparison
runs in a fresh process (``python -m otel_train.cli compare BASE SLOW --json``): its wall
time, and its peak RSS with that of its largest worker process. Writes a Markdown record and
exits 1 when a target is missed or the slowdown is not attributed to its rank.

    .venv/bin/python bench/bench_compare_scale.py --ranks 1024 --out bench/results/compare-1024-ranks.md
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import pytest  # noqa: E402  (MonkeyPatch, as the test uses it)
from bench_report import machine, mean_ci95  # noqa: E402
from support import report_fixtures as rf  # noqa: E402

import otel_train  # noqa: E402

TARGET_S, TARGET_MB = 60.0, 2048.0

CHILD = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
out = subprocess.run([sys.executable, "-m", "otel_train.cli", "compare", *sys.argv[1:3], "--json"],
                     capture_output=True, text=True)
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"s": wall, "rc": out.returncode, "rss_mb": usage,
                  "doc": json.loads(out.stdout) if out.stdout.strip() else None,
                  "err": out.stderr[-2000:]}))
"""


def write_runs(root: Path, ranks: int, steps: int, slow_rank: int
               ) -> tuple[Path, Path, float | None]:
    sys.path.insert(0, str(REPO / "tests" / "report"))
    from test_compare import slowed_backward  # the test's plant, not a copy of it

    spec = {"ranks": ranks, "steps": steps, "spike_steps": (), "metrics_every": 30, "seed": 1}
    base, slow = root / f"base-{ranks}", root / f"slow-{ranks}"
    if (base / "run.json").exists() and (slow / "run.json").exists():
        return base, slow, None  # written by an earlier run of the benchmark
    t0 = time.perf_counter()
    rf.write_run(rf.RunSpec(run_id=base.name, **spec), root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", slowed_backward(slow_rank, 1.10))
        rf.write_run(rf.RunSpec(run_id=slow.name, **spec), root)
    return base, slow, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--slow-rank", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("/tmp/otel-train-bench-compare"))
    parser.add_argument("--out", type=Path, help="Markdown file to write")
    args = parser.parse_args()
    if not 0 <= args.slow_rank < args.ranks:
        parser.error(f"--slow-rank {args.slow_rank} is not a rank of {args.ranks}")
    args.data.mkdir(parents=True, exist_ok=True)
    base, slow, gen_s = write_runs(args.data, args.ranks, args.steps, args.slow_rank)
    size = sum(p.stat().st_size for d in (base, slow) for p in d.iterdir())
    load_before = os.getloadavg()[0]
    runs = []
    for i in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, str(base), str(slow)], check=True,
                             capture_output=True, text=True, cwd=REPO)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1}/{args.repeat}: {runs[-1]['s']:.1f} s, "
              f"{runs[-1]['rss_mb']:.0f} MB, exit {runs[-1]['rc']}", file=sys.stderr)
    secs = sorted(r["s"] for r in runs)
    rss = max(r["rss_mb"] for r in runs)
    doc = runs[-1]["doc"] or {}
    where = (doc.get("where") or [{}])[0]
    sentence = where.get("sentence", runs[-1]["err"])
    parts = where.get("parts") or [{}]
    found = (parts[0].get("part") == "backward" and parts[0].get("ranks") == [args.slow_rank])
    low, high = mean_ci95(secs)
    median = statistics.median(secs)
    missed = [f"median {median:.1f} s > {TARGET_S:g} s"] if median > TARGET_S else []
    missed += [f"peak RSS {rss:.0f} MB > {TARGET_MB:g} MB"] if rss > TARGET_MB else []
    missed += [] if found else ["the slowdown not attributed to backward on its rank"]
    verdict = ("met" if not missed else "missed: " + "; ".join(missed)) + (
        f": median {median:.1f} s, peak {rss:.0f} MB; backward on rank {args.slow_rank} named"
        if found else "")
    now = datetime.datetime.now(datetime.timezone.utc)
    header = {
        "what": f"otel-train compare on two synthetic {args.ranks:,}-rank runs x {args.steps} "
                f"steps, rank {args.slow_rank}'s backward 10% longer in the second",
        "machine": machine(),
        "versions": f"Python {platform.python_version()}, otel-train {otel_train.__version__}",
        "date": f"{now:%Y-%m-%d %H:%M} UTC",
        "verdict": verdict,
        "made by": f"python bench/bench_compare_scale.py --ranks {args.ranks} --steps "
                   f"{args.steps} --repeat {args.repeat} --out {args.out or '-'}",
    }
    # each value a JSON string: YAML reads it as the same string, colons and all
    lines = ["---", *(f"{key}: {json.dumps(value)}" for key, value in header.items()),
        "---", "",
        f"# `otel-train compare` on {args.ranks:,} ranks", "",
        f"- data: two runs, {size / 1e6:.0f} MB of OTLP JSON lines "
        f"(tests/support/report_fixtures.py, one seed{'' if gen_s is None else f', written in {gen_s:.0f} s'})",
        f"- load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}",
        "- each comparison a fresh `python -m otel_train.cli compare BASE SLOW --json`: wall time "
        "from the shell, imports included; peak RSS the largest of the command's process and "
        "its workers", "",
        "| runs | median s | min – max s | 95% CI of the mean s | peak RSS MB |",
        "| --- | --- | --- | --- | --- |",
        f"| {len(secs)} | {median:.1f} | {secs[0]:.1f} – {secs[-1]:.1f} | {low:.1f} – {high:.1f} "
        f"| {rss:.0f} |", "",
        f"Where the time moved, as compare says it: {sentence}", "",
        f"Targets: median <= {TARGET_S:g} s, peak RSS <= {TARGET_MB:g} MB, backward on rank "
        f"{args.slow_rank} named first. Verdict: {verdict}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
