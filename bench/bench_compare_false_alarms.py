"""False alarms of ``otel-train compare``: pairs of same-configuration demo runs on this
machine, compared as a CI job would compare a change against its baseline.

Why: the intervals are computed from each run's steps (a block bootstrap, docs/compare.md);
they do not see what differs between two launches of the same job (the machine's load, the
placement of its processes). What counts is how often two runs of the same configuration
are called different: a row that says "worse" here is a false alarm, and a gate that fails
is a CI job failed for nothing.

How: ``--pairs`` pairs of ``otel-train demo`` runs (2 ranks, gloo, eager, ``--steps``),
the two runs of a pair launched one after the other; each pair compared with the defaults
(``compare()``, 2000 replicates). Counted per pair:

Which launch of a pair is the baseline is drawn (seeded), so that an effect of the order
counts as it would in CI.

- the gate: failed at the default thresholds (step time +5%, samples/s -5%, and both
  intervals excluding zero);
- each ranked row (every row but the straggler's rank): flagged when it fails at its default
  threshold (``compare.DEFAULT_THRESHOLDS``: 5% for the rates and step times, 5% of the
  baseline's step for a part of the step, the tolerance of a row without an interval) with
  an interval that excludes zero: what ``--gate KEY=...`` at that threshold fails; also,
  apart, any "worse" verdict whatever its size.

The rates are given with 95% Wilson intervals. The rows of one pair share their runs, so
they are not independent trials: the pooled row rate's interval is optimistic, the per-pair
gate rate's is not.

Target (issue 52): no row flagged in ``--pairs`` (20) pairs. Exit status 1 where a row was
flagged, or fewer than 20 pairs ran.

Usage: ``python bench/bench_compare_false_alarms.py [--pairs 5] [--steps 20]
[--out bench/results/compare-false-alarms.md]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from otel_train.analysis.compare import (
    BETTER,
    DEFAULT_GATES,
    DEFAULT_THRESHOLDS,
    WORSE,
    compare,
)
from otel_train.analysis.compare_runs import load_run
from otel_train.analysis.compare_stats import wilson_interval

#: the pairs the target asks for
PAIRS = 20


def demo(root: Path, run_id: str, steps: int, seq_len: int) -> Path:
    command = [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", "2", "--steps",
               str(steps), "--no-compile", "--seq-len", str(seq_len), "--output-dir",
               str(root), "--run-id", run_id]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.exit(f"demo failed:\n{done.stderr[-2000:]}")
    return root / run_id


def one_pair(root: Path, index: int, steps: int, seq_len: int, rng: random.Random) -> dict:
    first = demo(root, f"pair{index}-first", steps, seq_len)
    second = demo(root, f"pair{index}-second", steps, seq_len)
    # which launch is the baseline is drawn: an effect of the order (the second launch
    # finding warm caches, a load that rises or falls) then counts, half the time, as the
    # change being worse, as it would in CI
    baseline_first = rng.random() < 0.5
    runs = [first, second] if baseline_first else [second, first]
    loaded = [load_run(runs[0], "baseline"), load_run(runs[1], "change")]
    result = compare(loaded)  # the default gates
    # every ranked row at its default threshold: what --gate KEY=... with the defaults fails
    flagged_keys = {f.key for f in compare(loaded, gates=DEFAULT_THRESHOLDS).failures}
    rows = {}
    for row in result.rows:
        if row.figure.key not in DEFAULT_THRESHOLDS:
            continue
        cell = row.cells[0]
        rows[row.figure.key] = {
            "worse": cell.verdict == WORSE,
            "different": cell.verdict in (WORSE, BETTER),
            "flagged": row.figure.key in flagged_keys,
            "change": cell.change}
    step = next(r for r in result.rows if r.figure.key == "step_time").cells[0]
    return {"gate_failed": bool(result.failures), "rows": rows,
            "baseline": "first" if baseline_first else "second",
            "step_change": step.change, "step_interval": step.change_interval}


def verdict(hits: int, n: int, pairs: int) -> tuple[str, float, float]:
    low, high = wilson_interval(hits, n)
    if hits:
        return "missed", low, high
    if pairs < PAIRS:
        return "not enough pairs", low, high
    return "met", low, high


def report(pairs: list[dict], args: argparse.Namespace, started: str, load: str) -> str:
    n = len(pairs)
    keys = list(pairs[0]["rows"]) if pairs else []
    flagged = sum(p["rows"][k]["flagged"] for p in pairs for k in keys)
    worse = sum(p["rows"][k]["worse"] for p in pairs for k in keys)
    different = sum(p["rows"][k]["different"] for p in pairs for k in keys)
    trials = n * len(keys)
    diff_low, diff_high = wilson_interval(different, trials)
    gate = sum(p["gate_failed"] for p in pairs)
    state, low, high = verdict(flagged, trials, n)
    gate_low, gate_high = wilson_interval(gate, n)
    worse_low, worse_high = wilson_interval(worse, trials)
    lines = [
        "# compare: false alarms on same-configuration runs",
        "",
        f"- date: {started} UTC",
        f"- machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"{platform.platform()}; load average before: {load} (a shared development machine)",
        f"- Python {platform.python_version()}; otel-train @ {_commit()}",
        f"- pairs: {n} of `otel-train demo --ranks 2 --no-compile --steps {args.steps} "
        f"--seq-len {args.seq_len}`, the two runs of a pair one after the other; each pair "
        "compared with the defaults (2000 replicates, 95% intervals)",
        f"- ranked rows: {len(keys)} ({', '.join(keys)})",
        "",
        "| what | alarms | of | rate | 95% Wilson interval |",
        "| --- | --- | --- | --- | --- |",
        f"| default gate failed (step time +5%, samples/s -5%) | {gate} | {n} pairs | "
        f"{_pct(gate, n)} | {gate_low:.1%} – {gate_high:.1%} |",
        f"| row worse beyond its default threshold | {flagged} | {trials} rows | "
        f"{_pct(flagged, trials)} | {low:.1%} – {high:.1%} |",
        f"| row \"worse\", any size | {worse} | {trials} rows | {_pct(worse, trials)} | "
        f"{worse_low:.1%} – {worse_high:.1%} |",
        f"| row \"worse\" or \"better\" (interval excluding zero) | {different} | {trials} "
        f"rows | {_pct(different, trials)} | {diff_low:.1%} – {diff_high:.1%} |",
        "",
        "Per pair: step-time change [95% interval], rows flagged",
        "",
    ]
    for i, pair in enumerate(pairs):
        interval = pair["step_interval"]
        shown = ("" if interval is None else
                 f" [{interval[0] * 100:+.1f}, {interval[1] * 100:+.1f}]")
        flagged_keys = [k for k in keys if pair["rows"][k]["flagged"]] or ["none"]
        change = pair["step_change"]
        lines.append(f"- pair {i} (baseline: the {pair['baseline']} launch): step "
                     f"{change * 100:+.1f}%{shown}; flagged: "
                     f"{', '.join(flagged_keys)}" if change is not None else f"- pair {i}: -")
    lines += ["", f"target: no row flagged in {PAIRS} pairs; verdict: {state}"]
    return "\n".join(lines) + "\n"


def _pct(hits: int, n: int) -> str:
    return f"{hits / n:.1%}" if n else "-"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() + " (+ working tree)"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="draws which launch of a pair "
                        "is the baseline")
    parser.add_argument("--out", type=Path, help="also write the result here (markdown)")
    args = parser.parse_args()
    assert set(DEFAULT_GATES) == {"step_time", "samples_per_s"}
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    pairs = []
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="compare-false-alarms-") as tmp:
        for index in range(args.pairs):
            pairs.append(one_pair(Path(tmp), index, args.steps, args.seq_len, rng))
            print(f"pair {index}: step {pairs[-1]['step_change']:+.3%}, gate "
                  f"{'failed' if pairs[-1]['gate_failed'] else 'passed'}", file=sys.stderr)
    text = report(pairs, args, started, load)
    text += f"- load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0 if verdict(*_flagged(pairs), len(pairs))[0] == "met" else 1


def _flagged(pairs: list[dict]) -> tuple[int, int]:
    keys = list(pairs[0]["rows"]) if pairs else []
    return (sum(p["rows"][k]["flagged"] for p in pairs for k in keys), len(pairs) * len(keys))


if __name__ == "__main__":
    sys.exit(main())
