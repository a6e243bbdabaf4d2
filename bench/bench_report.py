"""Benchmark: ``otel-train report`` and ``otel-train check`` on 8 ranks x 10,000 steps.

Writes the run with ``tests/support/report_fixtures.py`` (once; reused when already there), then runs
each command ``--repeat`` times, each in a fresh process so peak RSS is its own, and writes a
markdown table with the machine, versions, date, load, median, spread and the 95% confidence
interval of the mean; exits 1 when a median misses ``TARGET_S``.

    .venv/bin/python bench/bench_report.py --out bench/results/report.md
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
#: issue 17, item 4: report and check each within this on 8 ranks x 10,000 steps
TARGET_S = 5.0
sys.path.insert(0, str(REPO / "tests"))

from support.report_fixtures import RunSpec, write_run  # noqa: E402

from otel_train import semconv  # noqa: E402
from otel_train.analysis.otlp import signal_files  # noqa: E402
from otel_train.analysis.parallel import worker_count as workers_for  # noqa: E402


def worker_count(run_dir: Path) -> int:
    return workers_for(signal_files(run_dir, semconv.TRACES_GLOB))

# One measured command: wall time of the work and the process's peak RSS, as JSON.
CHILD = """
import json, os, resource, sys, time
from pathlib import Path
import otel_train.analysis.build, otel_train.analysis.html, otel_train.check.rundir
base_mb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
t0 = time.perf_counter()
if sys.argv[1] == "report":
    from otel_train.analysis.build import build_report
    from otel_train.analysis.html import render_html
    report = build_report(Path(sys.argv[2]))
    render_html(report)
else:
    from otel_train.check.rundir import check_run_dir
    check_run_dir(Path(sys.argv[2]))
print(json.dumps({"s": time.perf_counter() - t0, "base_mb": base_mb,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

#: two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the normal's)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def ensure_run(root: Path, ranks: int, steps: int) -> tuple[Path, float]:
    spec = RunSpec(ranks=ranks, steps=steps, run_id=f"bench-{ranks}x{steps}",
                   straggler_rank=3, spike_steps=(812, 4000, 9001), recompile_step=5000,
                   metrics_every=500)
    run_dir = root / spec.run_id
    if (run_dir / "run.json").exists():
        return run_dir, 0.0
    t0 = time.perf_counter()
    write_run(spec, root)
    return run_dir, time.perf_counter() - t0


def measure(command: str, run_dir: Path, repeat: int) -> list[dict[str, float]]:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, command, str(run_dir)], check=True,
                             capture_output=True, text=True, cwd=REPO)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def measure_cli(command: str, run_dir: Path, repeat: int) -> list[float]:
    """Wall time of the whole command as a user runs it: interpreter, imports, rendering."""
    argv = [sys.executable, "-m", "otel_train.cli", command, str(run_dir), "--json"]
    if command == "report":
        argv += ["--html", "/tmp/otel-train-bench-report.html"]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=command == "report")
        times.append(time.perf_counter() - t0)
    return times


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    return f"{os.cpu_count()} cores ({cpu}), {mem_kb / 2**20:.0f} GiB RAM, {platform.platform()}"


def versions() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    from importlib.metadata import version

    return (f"Python {platform.python_version()}, rich {version('rich')}, "
            f"otel-train {version('otel-train') if _installed() else 'src'} @ {commit}")


def _installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("otel-train")
        return True
    except PackageNotFoundError:
        return False


def write_record(out: Path | None, text: str, data: dict) -> None:
    """Print a benchmark's Markdown record; with ``out``, write it there and ``data`` as JSON
    beside it (the name its front matter's ``data:`` gives)."""
    print(text)
    if out:
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """The 95% confidence interval of the mean (Student's t; the runs as a sample)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    df = len(values) - 1
    t = T_975[max(k for k in T_975 if k <= df)] if df <= 30 else 1.960
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean - half, mean + half


def summary(name: str, runs: list[dict[str, float]]) -> str:
    secs = sorted(r["s"] for r in runs)
    rss = max(r["rss_mb"] for r in runs)
    growth = max(r["rss_mb"] - r["base_mb"] for r in runs)
    worker = max(r.get("worker_rss_mb", 0.0) for r in runs)
    low, high = mean_ci95(secs)
    return (f"| {name} | {len(runs)} | {statistics.median(secs):.2f} | {secs[0]:.2f} – "
            f"{secs[-1]:.2f} | {statistics.pstdev(secs):.2f} | {low:.2f} – {high:.2f} | "
            f"{rss:.0f} | {growth:.0f} | {worker:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path("/tmp/otel-train-bench"))
    parser.add_argument("--out", type=Path, help="markdown file to write")
    args = parser.parse_args()
    run_dir, gen_s = ensure_run(args.data, args.ranks, args.steps)
    size = sum(p.stat().st_size for p in run_dir.iterdir())
    spans = sum(1 for p in run_dir.glob("traces*.jsonl") for line in open(p)
                for _ in range(line.count('"spanId"')))
    lines = [
        f"# report/check benchmark: {args.ranks} ranks x {args.steps:,} steps",
        "", f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- machine: {machine()}; load average before: {os.getloadavg()[0]:.2f} "
        "(a shared development machine)", f"- versions: {versions()}",
        f"- data: {size / 1e6:.0f} MB of OTLP JSON lines, {spans:,} spans "
        f"(tests/support/report_fixtures.py{f', written in {gen_s:.0f} s' if gen_s else ''})",
        "- each run in a fresh process; time is the command's work (report: both trace passes, "
        "metrics pass, HTML rendering; check: every span, metric point and log record)", "",
        f"- the traces files are read by {worker_count(run_dir)} worker processes "
        "(otel_train/analysis/parallel.py: one per usable CPU, the files split into runs of "
        "consecutive files, the results merged in file order)",
        "- peak RSS includes the imports (report and check import no torch since the lazy "
        "package import); growth is the peak over the RSS after the imports, i.e. what "
        "reading the run costs in the command's own process; worker MB is the largest peak "
        "RSS of a worker process", "",
        "| command | runs | median s | min – max s | stdev s | 95% CI of the mean s | "
        "peak RSS MB | growth MB | worker MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    runs = {cmd: measure(cmd, run_dir, args.repeat) for cmd in ("report", "check")}
    lines += [summary(f"`otel-train {cmd}`", runs[cmd]) for cmd in runs]
    lines += ["", "The same, end to end from the shell (`python -m otel_train.cli CMD RUN --json`, "
              "report also `--html`), imports included:", "",
              "| command | runs | median s | min – max s | 95% CI of the mean s |",
              "| --- | --- | --- | --- | --- |"]
    for cmd in ("report", "check"):
        walls = sorted(measure_cli(cmd, run_dir, args.repeat))
        low, high = mean_ci95(walls)
        lines.append(f"| `otel-train {cmd}` | {len(walls)} | {statistics.median(walls):.2f} | "
                     f"{walls[0]:.2f} – {walls[-1]:.2f} | {low:.2f} – {high:.2f} |")
    lines += ["", f"- load average after: {os.getloadavg()[0]:.2f}"]
    missed = []
    for cmd, measured in runs.items():
        median = statistics.median(r["s"] for r in measured)
        if median > TARGET_S:
            missed.append(f"{cmd} {median:.2f} s")
    lines += ["", f"target: each command's work <= {TARGET_S:g} s (median); verdict: "
              f"{'missed: ' + '; '.join(missed) if missed else 'met'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
