"""The verdict of a multi-GPU overhead run against issue 15's targets; exits 1 on a miss.

Reads ``DIR/result-rank*.json`` of ``bench/multigpu/run.py --modes cost,overhead`` and
prints, per rank:

- the paired step-time ratio of each overhead arm with its 95% bootstrap CI
  (``bench/overhead_stats.py``), the bare arm's noise, and the rounds a +-0.5% CI would need;
- the exact figure: CPU of otel-train's own threads in the training process (the emitter)
  per step and per NCCL collective, from the cost mode's per-thread CPU (a lower bound of the
  training process's cost: the capture on the training threads is not separable there), and
  the exporter process's CPU per step;
- the whole-process CPU difference per step (noisy: the training threads spin on the GPU);
- with otel-train's NCCL plugin (``DIR/plugin-cost.json`` from bench/nccl/plugin_cost.c):
  the plugin's own C work per collective on NCCL's threads is added to the exact figure, and
  with ``--baseline DIR0`` (the cost mode without the plugin) so is the growth of the CPU of
  NCCL's and torch's own threads in bare blocks (the proxy thread polls for kernel stamps).

Targets: ratio median <= 1.005; otel-train CPU in the training process <= 5 us per collective
and <= 0.3% of the step.

    python bench/multigpu/verdict.py DIR [--arm default] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import overhead_stats as stats  # noqa: E402

OUR_THREADS = ("otel-train-emitter", "OtelBatchSpanRecordProcessor",
               "OtelBatchLogRecordProcessor", "OtelPeriodicExportingMetricReader",
               "otel-nccl-poll",  # the NCCL plugin's CUDA-event poller (C)
               "otel-nccl-enqueue")  # its callbacks on NCCL's enqueuing threads, in situ
#: with OTEL_TRAIN_NCCL_SELF_TIME=1 the plugin's callbacks are timed where they run (run.py
#: counts them as this pseudo-thread, out of MainThread's and autograd's CPU)
IN_SITU = "otel-nccl-enqueue"
TRAINING_THREADS = ("MainThread",)  # and pt_autograd_*: the training's own work
TARGETS = [stats.Target("ratio", "<=", 1.005, "step-time ratio (median of rounds)"),
           stats.Target("us_per_collective", "<=", 5.0, "otel-train CPU per collective", "us"),
           stats.Target("share_of_step", "<=", 0.003, "otel-train CPU share of a step")]


def _native_threads_s(doc: dict[str, Any]) -> float | None:
    """CPU per step of the bare arm's threads that are neither training threads nor ours
    (NCCL's proxy, torch's watchdog, CUDA's event handler)."""
    per = doc["modes"].get("cost", {}).get("per_step", {})
    if "bare" not in per:
        return None
    return sum(v for k, v in per["bare"]["threads_s"].items()
               if k not in TRAINING_THREADS and not k.startswith("pt_autograd")
               and k not in OUR_THREADS)


def rank_figures(doc: dict[str, Any], arm: str, plugin: dict[str, Any] | None = None,
                 baseline: dict[str, Any] | None = None
                 ) -> tuple[dict[str, float | None], list[str]]:
    lines: list[str] = []
    figures: dict[str, float | None] = {}
    over = doc["modes"].get("overhead", {})
    arms = over.get("arms", {})
    if arm in arms and "bare" in arms:
        ratio = stats.paired_ratio(arms["bare"], arms[arm])
        figures["ratio"] = ratio.median_ratio
        need = stats.rounds_for_half_width(ratio)
        lines.append(f"ratio {arm}/bare {ratio.median_ratio:.4f} (95% CI {ratio.ci_low:.4f}-"
                     f"{ratio.ci_high:.4f}, +-{100 * ratio.half_width:.2f}%, {ratio.rounds} "
                     f"rounds; +-0.5% would need ~{need}); bare per step median "
                     f"{1e3 * ratio.bare.median:.1f} ms, p99 {1e3 * ratio.bare.p99:.1f}, max "
                     f"{1e3 * ratio.bare.max:.1f}, CV {100 * ratio.bare.cv:.1f}%")
    cost = doc["modes"].get("cost", {})
    per = cost.get("per_step", {})
    if arm in per and "bare" in per:
        ours = sum(v for k, v in per[arm]["threads_s"].items() if k in OUR_THREADS)
        step_s = statistics.median(per["bare"]["wall_s"])
        colls = cost.get("nccl_collectives_per_step")
        in_situ = per[arm]["threads_s"].get(IN_SITU)
        if in_situ and colls:
            lines.append(f"NCCL plugin's callbacks on the enqueuing threads, timed in situ "
                         f"(OTEL_TRAIN_NCCL_SELF_TIME=1): {1e3 * in_situ:.3f} ms per step, "
                         f"{1e9 * in_situ / colls:.0f} ns per collective (counted in the "
                         f"exact figure; bench/nccl/plugin_cost.c, not added: "
                         f"{json.dumps(plugin)})")
        elif plugin is not None and colls:
            # the plugin's C work on the enqueuing thread (and NCCL's proxy thread with
            # kernel timing); its poller thread is counted above, by thread
            per_ns = (plugin["enqueue_thread_ns"] + plugin.get("read_ns", 0.0)
                      + plugin.get("proxy_thread_ns", 0.0))
            c_s = per_ns * 1e-9 * colls
            lines.append(f"NCCL plugin's C work ({plugin.get('timing', 'kernel')} timing) "
                         f"{per_ns:.0f} ns per collective on NCCL's threads "
                         f"(bench/nccl/plugin_cost.c: {json.dumps(plugin)}): "
                         f"{1e3 * c_s:.3f} ms per step, added to the exact figure")
            ours += c_s
        if baseline is not None:
            with_plugin, without = _native_threads_s(doc), _native_threads_s(baseline)
            if with_plugin is not None and without is not None:
                grown = max(0.0, with_plugin - without)
                lines.append(f"NCCL/torch native threads in bare blocks: {1e3 * with_plugin:.2f} "
                             f"ms per step with the plugin, {1e3 * without:.2f} without: "
                             f"{1e3 * grown:.2f} ms added to the exact figure")
                ours += grown
        gc_arm, gc_bare = per[arm].get("gc_collections"), per["bare"].get("gc_collections")
        if gc_arm is not None and gc_bare is not None:
            in_ours = sum(v for k, v in per[arm].get("gc_s", {}).items() if k in OUR_THREADS)
            lines.append(
                f"garbage collections per step (gen 0/1/2): {[round(g, 2) for g in gc_bare]} "
                f"bare, {[round(g, 2) for g in gc_arm]} instrumented; of otel-train's thread "
                f"CPU, {1e3 * in_ours:.3f} ms per step was collections its allocations "
                "triggered (over every thread's objects; counted in the figure below)")
        figures["share_of_step"] = ours / step_s if step_s else None
        figures["us_per_collective"] = 1e6 * ours / colls if colls else None
        added = [1e3 * (a - b) for a, b in zip(per[arm]["cpu_s"], per["bare"]["cpu_s"])]
        lines.append(
            f"otel-train threads {1e3 * ours:.2f} ms CPU per step ({100 * ours / step_s:.2f}% of "
            f"{1e3 * step_s:.1f} ms; {colls or float('nan'):.1f} NCCL collectives per step: "
            f"{figures['us_per_collective'] or float('nan'):.1f} us each); exporter process "
            f"{1e3 * statistics.median(per[arm]['children_cpu_s']):.1f} ms per step; whole "
            f"process CPU added per step (noisy) {[round(a, 1) for a in added]} ms")
    return figures, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--arm", default="default")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path, help="the same cost run without the plugin")
    args = parser.parse_args()
    plugin_file = args.dir / "plugin-cost.json"
    plugin = json.loads(plugin_file.read_text()) if plugin_file.exists() else None
    files = sorted(args.dir.glob("result-rank*.json"))
    if not files:
        parser.error(f"no result-rank*.json in {args.dir}")
    missed_all: list[str] = []
    report = [f"# Overhead verdict: {args.dir.name}, arm {args.arm}", ""]
    for path in files:
        doc = json.loads(path.read_text())
        base_file = args.baseline / path.name if args.baseline else None
        baseline = (json.loads(base_file.read_text())
                    if base_file is not None and base_file.exists() else None)
        figures, lines = rank_figures(doc, args.arm, plugin, baseline)
        missed = stats.verdict(figures, TARGETS)
        missed_all += [f"rank {doc['rank']}: {m}" for m in missed]
        report += [f"## rank {doc['rank']}", "", *[f"- {line}" for line in lines],
                   f"- missed: {'; '.join(missed) or 'none'}", ""]
    report.append(f"verdict: {'; '.join(missed_all) or 'all targets met'}")
    text = "\n".join(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if missed_all else 0


if __name__ == "__main__":
    sys.exit(main())
