"""Step pairs of several launches of the same product code, pooled: one bound from them all.

Why: ``bench/bench_step_pairs.py``'s figure moves between launches by more than one run's
confidence interval (on the H100 host: pair ratios 1.0042, 1.0029 and 1.0009 from three
launches of one product code), so one launch's verdict says as much about the launch as about
otel-train. Pooling the pairs of every launch gives the estimate over launches, with each
launch's own figures beside it.

How: each ``--json`` is a ``bench_step_pairs.py --json`` file (its raw pairs). Pooling is
refused unless every file names a commit and ``git diff`` finds no change to ``otel_train/``
between them (``--allow-product-change`` overrides, and the report says so). The pooled pairs
go through the benchmark's own ``summarise`` (the bound: pooled median pair ratio plus every
launch's background CPU over every pair, over the pooled median bare step) and its verdict.
The interval resamples pairs, not launches: with three launches the spread between them is
reported as the range of their own bounds, not folded into the interval.

    python bench/pool_step_pairs.py --json a.json b.json c.json --out pooled.md --json-out p.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import bench_step_pairs as pairs  # noqa: E402
import overhead_stats as stats  # noqa: E402

#: the raw lists a pooled run concatenates (the drains' where each file has them)
LISTS = ("bare_wall_ns", "inst_wall_ns", "bare_cpu_ns", "inst_cpu_ns", "first")
DRAINS = ("bare_drain_ns", "inst_drain_ns")


def product_changes(commits: list[str], repo: Path) -> list[str]:
    """``a..b`` for each pair of consecutive commits whose ``otel_train/`` differs (or that
    git cannot compare)."""
    changed = []
    for a, b in zip(commits, commits[1:], strict=False):
        done = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", a, b, "--",
                               "otel_train"], capture_output=True)
        if done.returncode != 0:
            changed.append(f"{a}..{b}")
    return changed


def pool(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """One raw record from several launches' (each pair kept whole)."""
    blocks = {r.get("block", 1) for r in raws}
    if len(blocks) != 1:
        raise ValueError(f"launches with different --block: {sorted(blocks)}")
    out: dict[str, Any] = {k: [v for r in raws for v in r[k]] for k in LISTS}
    if all(r.get(k) for r in raws for k in DRAINS):
        out.update({k: [v for r in raws for v in r[k]] for k in DRAINS})
    background: dict[str, float] = {}
    for r in raws:
        for name, seconds in r["background_s"].items():
            background[name] = background.get(name, 0.0) + seconds
    out.update(background_s=background, block=blocks.pop(),
               elapsed_s=sum(r["elapsed_s"] for r in raws),
               steps_recorded=sum(r["steps_recorded"] for r in raws))
    return out


def markdown(files: list[Path], runs: list[dict[str, Any]], pooled: dict[str, Any],
             changes: list[str], missed: list[str]) -> str:
    lines = ["# Step pairs pooled over launches", "",
             "`python bench/pool_step_pairs.py --json " + " ".join(f.name for f in files)
             + "`: each launch's pairs as `bench/bench_step_pairs.py` recorded them, pooled "
             "(pairs resampled, launches not: their spread is the range of their own bounds).",
             "", "| launch | commit | date | pairs | pair ratio [95% CI] | threads, us / step "
             "| bare step, ms | bound [95% CI] |", "| --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]
    for f, run in zip(files, runs, strict=True):
        s, env = run["summary"], run["environment"]
        lines.append(f"| {f.name} | {env.get('commit', '?')} | {env.get('date', '?')[:16]} | "
                     f"{s['pairs']} | {s['ratio']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]"
                     f" | {s['background_us_per_step']:.1f} | {s['bare_step_ms']:.2f} | "
                     f"{s['bound']:.4f} [{s['bound_ci'][0]:.4f}, {s['bound_ci'][1]:.4f}] |")
    p = pooled
    lines.append(f"| **pooled** | | | {p['pairs']} | **{p['ratio']:.4f}** [{p['ci_low']:.4f}, "
                 f"{p['ci_high']:.4f}] (half-width {p['half_width'] * 100:.2f}%) | "
                 f"{p['background_us_per_step']:.1f} | {p['bare_step_ms']:.2f} | "
                 f"**{p['bound']:.4f}** [{p['bound_ci'][0]:.4f}, {p['bound_ci'][1]:.4f}] |")
    bounds = [r["summary"]["bound"] for r in runs]
    limit = next(t.limit for t in pairs.TARGETS if t.key == "bound")  # the benchmark's own
    lines += ["", f"Launches' own bounds: {min(bounds):.4f} to {max(bounds):.4f}; "
              f"{sum(b <= limit for b in bounds)} of {len(bounds)} at or under {limit} alone.",
              ""]
    drains = p.get("drains") or {}
    if drains.get("clear_ratio"):
        low, high = drains["clear_ratio"][1], drains["clear_ratio"][2]
        lines += [f"Pairs with no emitter pass in either step: {drains['clear_pairs']}, pair "
                  f"ratio {drains['clear_ratio'][0]:.4f} [{low:.4f}, {high:.4f}].", ""]
    lines.append("Product code (`otel_train/`): " + (
        "the same in every launch (git diff)." if not changes else
        "**differs** between " + ", ".join(changes) + " (pooled with --allow-product-change)."))
    lines += ["", "Targets (issue 15, on CUDA): " + "; ".join(
        t.describe() for t in pairs.TARGETS) + ".", "",
        "verdict: " + ("all targets met" if not missed else "missed: " + "; ".join(missed))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, nargs="+", required=True,
                        help="bench_step_pairs.py --json files, each one launch")
    parser.add_argument("--out", type=Path, help="the report (markdown)")
    parser.add_argument("--json-out", type=Path, help="the pooled summary")
    parser.add_argument("--allow-product-change", action="store_true")
    parser.add_argument("--repo", type=Path, default=BENCH.parent)
    args = parser.parse_args(argv)
    if len(args.json) < 2:
        parser.error("--json: two launches or more")
    runs = []
    for path in args.json:
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
            run["raw"]["bare_wall_ns"]  # noqa: B018 (a bench_step_pairs record)
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"{path}: not a bench_step_pairs.py --json record ({err})")
        runs.append(run)
    commits = [r["environment"].get("commit") for r in runs]
    if any(c in (None, "", "?", "unknown") for c in commits):
        parser.error("every launch must name its commit (BENCH_COMMIT on the device)")
    changes = product_changes(commits, args.repo)
    if changes and not args.allow_product_change:
        parser.error("otel_train/ differs between " + ", ".join(changes)
                     + ": not one product's launches (--allow-product-change to pool anyway)")
    pooled = pairs.summarise(pool([r["raw"] for r in runs]))
    missed = stats.verdict(pooled, pairs.TARGETS)
    text = markdown(args.json, runs, pooled, changes, missed)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "launches": [{"file": p.name, "commit": c, "summary": r["summary"]}
                         for p, c, r in zip(args.json, commits, runs, strict=True)],
            "pooled": pooled, "product_changes": changes, "missed": missed}, indent=1),
            encoding="utf-8")
    print(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
