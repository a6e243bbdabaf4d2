"""Benchmark: ``otel-train report`` and ``otel-train check`` on runs of many ranks (issue 52,
item 6: a 16,384-rank run read in under 60 s and 2 GB).

The runs are replicas of one real run directory (a demo's), made by
``tests/support/replicate.py``: rank ``r`` is a copy of the real rank ``r % world``, with its
own rank, run id and span ids (written once under ``--data``, reused when there). Each
command runs as a user runs it, in a fresh process (``python -m otel_train.cli CMD RUN
--json``, stdout discarded): its wall time and CPU time, and its peak memory: the RSS and
the PSS of the command's process and its worker processes together, sampled from /proc (RSS
every 50 ms, PSS every second), beside getrusage's peak of its largest process. Writes a
Markdown record (and its numbers as JSON) and exits 1 when a target is missed at the
largest run.

    .venv/bin/python bench/bench_report_scale.py --real RUN_DIR --ranks 1024 4096 --repeat 1 \\
        --code OLD_CHECKOUT --out /tmp/before.md     # the numbers before a change
    .venv/bin/python bench/bench_report_scale.py --real RUN_DIR --ranks 1024 4096 16384 \\
        --before /tmp/before.json --out bench/results/report-16384-ranks.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_report import machine, mean_ci95, versions  # noqa: E402
from support.replicate import replicate  # noqa: E402

from otel_train import semconv  # noqa: E402
from otel_train.analysis import typed  # noqa: E402
from otel_train.analysis.otlp import signal_files  # noqa: E402
from otel_train.analysis.parallel import worker_count  # noqa: E402

TARGET_S, TARGET_MB = 60.0, 2048.0

def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    found, todo = [], [pid]
    while todo:
        at = todo.pop()
        found.append(at)
        try:
            for task in os.listdir(f"/proc/{at}/task"):
                with open(f"/proc/{at}/task/{task}/children") as children:
                    todo += [int(c) for c in children.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _sum_kb(pids: list[int], file: str, key: str) -> float:
    """The sum of ``key``'s kB in /proc/PID/``file`` over ``pids``, MB (0 for those gone)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/{file}") as lines:
                for text in lines:
                    if text.startswith(key):
                        total += int(text.split()[1]) / 1024
                        break
        except (OSError, ValueError):
            continue
    return total


def run_once(command: str, run_dir: Path, code: Path = REPO) -> dict[str, Any]:
    """One fresh ``otel-train COMMAND RUN --json`` of ``code``'s otel_train: wall s, peak
    MB of its process tree."""
    argv = [sys.executable, "-m", "otel_train.cli", command, str(run_dir), "--json"]
    t0 = time.perf_counter()
    err_file = tempfile.TemporaryFile()  # a pipe unread while it runs could fill and stall it
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file, cwd=code)
    peak = peak_pss = 0.0
    tick = 0
    while True:  # wait4: the child's rusage (ru_maxrss: its largest process's peak)
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        pids = _tree(child.pid)
        # RSS (/proc/PID/status: cheap) every 50 ms; PSS every second: smaps_rollup walks
        # the page tables, which for GBs took the measured command a fifth of a core
        peak = max(peak, _sum_kb(pids, "status", "VmRSS:"))
        if tick % 20 == 0:
            peak_pss = max(peak_pss, _sum_kb(pids, "smaps_rollup", "Pss:"))
        tick += 1
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    err_file.seek(0)
    err = err_file.read().decode(errors="replace")
    err_file.close()
    return {"s": wall, "rc": os.waitstatus_to_exitcode(status), "tree_mb": peak,
            "tree_pss_mb": peak_pss, "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_child_mb": usage.ru_maxrss / 1024, "err": err[-1000:]}


def ensure_run(real: Path, root: Path, ranks: int) -> tuple[Path, float]:
    run_dir = root / f"replica-{ranks}"
    if (run_dir / "run.json").exists():
        return run_dir, 0.0
    t0 = time.perf_counter()
    replicate(real, root, ranks, run_dir.name)
    return run_dir, time.perf_counter() - t0


def size_mb(run_dir: Path, glob: str = "*.jsonl") -> float:
    return sum(p.stat().st_size for p in run_dir.glob(glob)) / 1e6


def _row(n: int, run_dir: Path, workers: int, command: str, runs: list[dict[str, Any]]
         ) -> tuple[str, dict[str, Any]]:
    secs = sorted(r["s"] for r in runs)
    peak = max(r["tree_mb"] for r in runs)
    peak_pss = max(r["tree_pss_mb"] for r in runs)
    largest = max(r["max_child_mb"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    low, high = mean_ci95(secs)
    traces_mb, files_mb = size_mb(run_dir, "traces*.jsonl"), size_mb(run_dir)
    row = (f"| {n:,} | {traces_mb:,.0f} | {files_mb:,.0f} | {workers} | `{command}` | "
           f"{len(runs)} | {statistics.median(secs):.1f} | {secs[0]:.1f} – {secs[-1]:.1f} | "
           f"{low:.1f} – {high:.1f} | {cpu:.1f} | {peak:,.0f} | {peak_pss:,.0f} | {largest:,.0f} |")
    return row, {"ranks": n, "command": command, "seconds": secs, "peak_rss_mb": peak,
                 "peak_pss_mb": peak_pss, "largest_process_mb": largest, "workers": workers,
                 "cpu_s": [r["cpu_s"] for r in runs],
                 "traces_mb": traces_mb, "files_mb": files_mb}


HEAD = ("| ranks | traces MB | all files MB | workers | command | runs | median s | "
        "min – max s | 95% CI of the mean s | CPU s (median) | peak RSS MB (all processes) | "
        "peak PSS MB (all processes) | largest process MB |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", type=Path, required=True, help="the run directory copied")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each command at the largest size (1 at the others)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/otel-train-bench-scale"))
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the checkout whose otel_train the commands run (an earlier "
                             "commit's, for the numbers before a change)")
    parser.add_argument("--before", type=Path,
                        help="the JSON of an earlier run (--code), tabled beside")
    parser.add_argument("--out", type=Path, help="Markdown file to write (and .json beside)")
    args = parser.parse_args()
    ranks = sorted(args.ranks)
    date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"
    load_before = os.getloadavg()[0]
    msgspec_version = __import__("msgspec").__version__ if typed.enabled() else "not used"
    rows, record = [], []
    missed = []
    for n in ranks:
        run_dir, _ = ensure_run(args.real, args.data, n)
        repeat = args.repeat if n == ranks[-1] else 1
        workers = worker_count(signal_files(run_dir, semconv.TRACES_GLOB))
        for command in ("report", "check"):
            runs = [run_once(command, run_dir, args.code) for _ in range(repeat)]
            bad = [r for r in runs if r["rc"] not in (0, 1)]  # check's 1: items failed
            if bad:
                print(bad[0]["err"], file=sys.stderr)
                return 2
            row, numbers = _row(n, run_dir, workers, command, runs)
            rows.append(row)
            record.append(numbers)
            print(row, flush=True)
            if n == ranks[-1]:
                median = statistics.median(numbers["seconds"])
                if median > TARGET_S:
                    missed.append(f"{command} {median:.1f} s")
                if numbers["peak_rss_mb"] > TARGET_MB:
                    missed.append(f"{command} {numbers['peak_rss_mb']:,.0f} MB RSS "
                                  f"({numbers['peak_pss_mb']:,.0f} MB PSS)")
    largest = [r for r in record if r["ranks"] == ranks[-1]]
    verdict = (("missed: " + "; ".join(missed)) if missed else "met") + " (" + ", ".join(
        f"{r['command']} {statistics.median(r['seconds']):.1f} s, "
        f"{r['peak_rss_mb']:,.0f} MB RSS / {r['peak_pss_mb']:,.0f} MB PSS" for r in largest) + \
        f"; target {TARGET_S:g} s and {TARGET_MB:g} MB at {ranks[-1]:,} ranks)"
    versions_line = f"{versions().split(' @ ')[0]}, msgspec {msgspec_version}"
    what = (f"otel-train report and check on replicas of a 2-rank demo run at "
            f"{', '.join(f'{n:,}' for n in ranks)} ranks (issue 52, item 6)")
    lines = [
        "---", f'what: "{what}"', f'machine: "{machine()}"', f'versions: "{versions_line}"',
        f'date: "{date}"', f'verdict: "{verdict}"',
        'made by: "python bench/bench_report_scale.py --real RUN_DIR --ranks '
        f'{" ".join(map(str, ranks))} --repeat {args.repeat}"',
        f'data: "{args.out.with_suffix(".json").name if args.out else ""}"', "---", "",
        f"# report/check at scale: {', '.join(f'{n:,}' for n in ranks)} ranks", "",
        f"- load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f} (a shared "
        "development machine: another engineer's work ran beside it)",
        f"- runs: replicas of a real demo run (`{args.real.name}`, "
        f"{len(signal_files(args.real, semconv.TRACES_GLOB))} ranks, 20 steps) made by "
        "tests/support/replicate.py",
        "- each command in a fresh process as a user runs it (`python -m otel_train.cli CMD RUN "
        "--json`, stdout discarded, imports included); peak RSS and PSS are of the command's "
        "process and its worker processes together, sampled from /proc (RSS every 50 ms, PSS "
        "every second: reading it costs more) (the "
        "workers are forked: RSS counts the pages they share with the parent in each, PSS "
        "once); largest process MB is getrusage's peak of the largest single process; CPU s "
        "is the user and system time of the command and its workers (less moved by the "
        "other work on the machine than the wall time)", "",
        HEAD, *rows]
    if args.before:
        before = json.loads(args.before.read_text())
        lines += ["", f"Before this change (the readers of `{before['code']}`, the same runs, "
                  f"{before['date']}):", "", HEAD]
        lines += [f"| {r['ranks']:,} | {r['traces_mb']:,.0f} | {r['files_mb']:,.0f} | "
                  f"{r['workers']} | `{r['command']}` | {len(r['seconds'])} | "
                  f"{statistics.median(r['seconds']):.1f} | {min(r['seconds']):.1f} – "
                  f"{max(r['seconds']):.1f} | – | {statistics.median(r['cpu_s']):.1f} | "
                  f"{r['peak_rss_mb']:,.0f} | "
                  f"{r['peak_pss_mb']:,.0f} | {r['largest_process_mb']:,.0f} |"
                  for r in before["sizes"]]
    lines += ["", f"Targets at {ranks[-1]:,} ranks: each command's median <= {TARGET_S:g} s "
              f"and peak RSS of all its processes <= {TARGET_MB:g} MB. Verdict: {verdict}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(
            {"date": date, "machine": machine(), "versions": versions_line,
             "code": str(args.code), "verdict": verdict, "sizes": record}, indent=2) + "\n",
            encoding="utf-8")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
