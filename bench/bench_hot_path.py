"""Training-thread cost of instrumentation, instrumented against bare, in one process.

Two measurements:

1. per record: the hot-path primitives alone (a phase begin/end pair appending one record),
   timed with ``timeit`` over many repetitions;
2. per step: a real (tiny, so that overhead is visible) training step: DataLoader fetch,
   forward, backward, optimizer step. Blocks of bare steps and instrumented steps are
   interleaved (A/B/A/B...) so drift hits both alike. For each block we record the median
   wall time per step and the training thread's CPU time per step (``thread_time_ns``,
   which leaves out the emitter thread's work and time spent waiting for the GIL).

Targets (issue 15): training-thread time <= 20 us a step (the median of the blocks' paired
differences, with its 95% bootstrap CI) and <= 1 us a record. Exits non-zero when one is
missed (``--no-verdict`` to only report).

``--parts`` adds two arms to every round, by part: the four hooks alone (data wait, forward,
backward, optimizer) driving a :class:`StepTracker` whose records go nowhere, with no
pipeline, sources, emitter or exporter; and their wrappers alone (the tracker's ``begin``
declining at once). Instrumented less hooks-only is what the running pipeline (its sources'
hooks on the training thread, its threads and the exporter process beside it) adds; hooks
less wrappers is the tracker's own work.

Usage: ``python bench/bench_hot_path.py [--blocks 10] [--steps 200] [--parts] [--out FILE.md]``
(recorded: ``bench/results/hot-path-parts-cpu.md``, ``--parts``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import timeit
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train
from otel_train import semconv
from otel_train.recorder import Recorder
from otel_train.tracker import StepHooks, StepTracker, tracker_class

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_stats as stats  # noqa: E402

TARGETS = [stats.Target("step_cpu_us", "<=", 20.0, "added training-thread CPU a step", "us"),
           stats.Target("record_ns", "<=", 1000.0, "one record (phase begin+end)", "ns")]


def per_record_ns(repeat: int = 7, number: int = 200_000, fastpath: bool = True
                  ) -> list[float]:
    tracker = tracker_class(fastpath)(Recorder(1 << 30), "bench", 0)

    def pair() -> None:
        tracker.begin(semconv.PHASE_FORWARD)
        tracker.end(semconv.PHASE_FORWARD)

    times = timeit.repeat(pair, repeat=repeat, number=number)
    return [t / number * 1e9 for t in times]


def _setup() -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    return model, opt, DataLoader(data, batch_size=16, shuffle=False)


def _steps(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader, n: int
           ) -> tuple[list[int], list[int]]:
    wall, cpu = [], []
    it = iter(loader)
    for _ in range(n):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        wall.append(time.perf_counter_ns() - w0)
        cpu.append(time.thread_time_ns() - c0)
    return wall, cpu


class _HooksOnly:
    """The four step hooks on a tracker whose records go nowhere: no pipeline at all."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.recorder = Recorder(1 << 30)
        self.hooks = StepHooks(self.tracker())
        self.hooks.hook_dataloader()
        self.hooks.hook_model(self.model)
        self.hooks.hook_backward()
        self.hooks.hook_optimizer()

    def __exit__(self, *exc: object) -> None:
        self.hooks.remove()

    def tracker(self) -> StepTracker:
        return tracker_class()(self.recorder, "bench", 0)


class _WrappersOnly(_HooksOnly):
    """The four hooks' wrappers alone: each calls ``begin``, which declines at once (the
    tracker is disabled, as a forked worker's is)."""

    def tracker(self) -> StepTracker:
        tracker = super().tracker()
        tracker.enabled = False
        return tracker


def per_step(blocks: int, steps: int, out_dir: Path, parts: bool = False, warmup: int = 50
             ) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    model, opt, loader = _setup()
    _steps(model, opt, loader, steps)  # warm-up
    arms = ["bare", "inst", *(["hooks", "wrappers"] if parts else [])]
    res: dict[str, list[float]] = {f"{a}_{k}": [] for a in arms for k in ("wall", "cpu")}
    for r in range(blocks):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # rotate the order
            ctx: Any = contextlib.nullcontext()
            if arm == "inst":
                ctx = otel_train.instrument(model, output_dir=out_dir,
                                            console_log_level="warning")
            elif arm == "hooks":
                ctx = _HooksOnly(model)
            elif arm == "wrappers":
                ctx = _WrappersOnly(model)
            with ctx:
                # untimed first, in every arm alike: a run's first steps pay its start (the
                # threads' first wake-ups, cold caches), which is not the hot path
                _steps(model, opt, loader, warmup)
                wall, cpu = _steps(model, opt, loader, steps)
            res[f"{arm}_wall"].append(statistics.median(wall) / 1e3)
            res[f"{arm}_cpu"].append(statistics.median(cpu) / 1e3)
    return res


def _fmt(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.2f} (IQR {q[0]:.2f}–{q[2]:.2f})"


def _parts_lines(steps: dict[str, list[float]]) -> list[str]:
    hooks = stats.paired_difference(steps["bare_cpu"], steps["hooks_cpu"])
    wrappers = stats.paired_difference(steps["bare_cpu"], steps["wrappers_cpu"])
    tracking = stats.paired_difference(steps["wrappers_cpu"], steps["hooks_cpu"])
    rest = stats.paired_difference(steps["hooks_cpu"], steps["inst_cpu"])
    return [
        "By part (`--parts`, the same rounds, the arms' order rotated each round):",
        "",
        "| part | added training-thread CPU a step, µs: median [95% CI] |",
        "| --- | --- |",
        f"| the four hooks alone (no pipeline), against bare | {hooks.median:.2f} "
        f"[{hooks.ci_low:.2f}, {hooks.ci_high:.2f}] |",
        f"| of which the wrappers alone (``begin`` declining at once), against bare | "
        f"{wrappers.median:.2f} [{wrappers.ci_low:.2f}, {wrappers.ci_high:.2f}] |",
        f"| of which the tracker's work (hooks alone against wrappers alone) | "
        f"{tracking.median:.2f} [{tracking.ci_low:.2f}, {tracking.ci_high:.2f}] |",
        f"| the running pipeline (instrumented against hooks alone) | {rest.median:.2f} "
        f"[{rest.ci_low:.2f}, {rest.ci_high:.2f}] |",
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--parts", action="store_true",
                        help="a third arm: the four hooks alone, without the pipeline")
    parser.add_argument("--warmup-steps", type=int, default=50,
                        help="untimed steps at the start of every block, every arm alike")
    parser.add_argument("--no-verdict", action="store_true")
    args = parser.parse_args()
    if args.blocks < 2 or args.steps < 1:
        parser.error("--blocks must be at least 2 and --steps positive")
    record = per_record_ns()
    record_python = per_record_ns(fastpath=False)
    with tempfile.TemporaryDirectory() as tmp:
        steps = per_step(args.blocks, args.steps, Path(tmp), args.parts, args.warmup_steps)
    over_wall = [i - b for i, b in zip(steps["inst_wall"], steps["bare_wall"])]
    over_cpu = [i - b for i, b in zip(steps["inst_cpu"], steps["bare_cpu"])]
    ratio = [i / b for i, b in zip(steps["inst_wall"], steps["bare_wall"])]
    cpu = stats.paired_difference(steps["bare_cpu"], steps["inst_cpu"])
    wall = stats.paired_ratio(steps["bare_wall"], steps["inst_wall"])
    missed = stats.verdict({"step_cpu_us": cpu.median, "record_ns": statistics.median(record)},
                           TARGETS)
    lines = [
        "# Hot-path benchmark: training-thread cost of instrumentation",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores; Python {platform.python_version()}",
        f"- torch {torch.__version__}, opentelemetry-sdk {metadata.version('opentelemetry-sdk')}, "
        f"otel-train {otel_train.__version__}",
        f"- default settings (every step sampled, file exporter); {args.blocks} interleaved "
        f"blocks of {args.steps} steps each, bare and instrumented, each after "
        f"{args.warmup_steps} untimed steps in its arm",
        "",
        "| measure | median (IQR over blocks) |",
        "| --- | --- |",
        f"| one phase begin+end (one record), ns ({tracker_class().__name__}) | "
        f"{_fmt(record)} |",
        f"| the same with the Python tracker (OTEL_TRAIN_FASTPATH=0), ns | "
        f"{_fmt(record_python)} |",
        f"| bare step, wall µs | {_fmt(steps['bare_wall'])} |",
        f"| instrumented step, wall µs | {_fmt(steps['inst_wall'])} |",
        f"| added wall time per step, µs | {_fmt(over_wall)} |",
        f"| added training-thread CPU time per step, µs | {_fmt(over_cpu)} |",
        f"| step-time ratio instrumented/bare | {_fmt(ratio)} |",
        "",
        f"Added training-thread CPU a step: median {cpu.median:.2f} µs, 95% CI "
        f"[{cpu.ci_low:.2f}, {cpu.ci_high:.2f}] (bootstrap over {cpu.rounds} paired blocks); "
        f"step-time ratio {wall.median_ratio:.3f} [{wall.ci_low:.3f}, {wall.ci_high:.3f}].",
        "",
        *(_parts_lines(steps) if args.parts else []),
        "Targets (issue 15): " + "; ".join(t.describe() for t in TARGETS) + ".",
        "",
        "verdict: " + ("; ".join(missed) if missed else "all targets met"),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 1 if missed and not args.no_verdict else 0


if __name__ == "__main__":
    sys.exit(main())
