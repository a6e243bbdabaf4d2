"""Step-paired overhead: instrumented and bare steps alternating inside one instrumented run.

Why: the block benchmarks (bench_gpu.py, multigpu/run.py's ``overhead`` mode) pair whole
blocks of bare and instrumented steps, and the bare blocks alone vary by 6-11% (CV) on the
H200 hosts, so a 95% CI of +-0.5% would need thousands of rounds. Adjacent steps share the
drift (clocks, neighbours, the allocator's state) that blocks do not; pairing them is what
resolves half a percent.

How: one ``otel_train.instrument()`` around the whole run, at default settings. Between
steps the benchmark switches otel-train's training-thread part off and on: off, the step
hooks are removed and the tracker stopped, so a bare step runs none of otel-train's code on
the training thread (no hook, no record, no CUDA event, no allocator read); on, they are put
back and the step is tracked as any other (its step record put inside its timed region).
Each pair is one bare and one instrumented step in a random order (seeded); each step is
timed between two ``torch.cuda.synchronize()`` calls (none on the CPU), its training
thread's CPU clock beside the wall clock.

What pairs cannot see: otel-train's background threads (the emitter, the gap sampler, the
NCCL plugin's poller) and its exporter process run through both steps of a pair. On a host
whose training thread is CPU-bound, a background thread costs the step at most its CPU time
under the interpreter lock; that CPU is measured exactly (per-thread on-CPU clocks over the
paired run) and added to the pair ratio as an upper bound, charged to the instrumented steps
alone although part of it (the emitter's and sampler's wake-ups) runs for bare steps too:

    bound = median pair ratio + background CPU per instrumented step / median bare step

The exporter process has cores of its own on GPU hosts and is reported beside, not added.

The emitter's passes hold the interpreter lock for their Python (~280 us a step's worth on
the GPU hosts); a step that needs the lock meanwhile waits. The run times every pass and
reports how many bare and instrumented steps had one inside them, and the pair ratio of the
pairs with none in either step: a pair ratio that falls there would put the difference in
those waits, one that does not puts it in the training thread's own work.

Targets (issue 15, ``--device cuda``): the bound <= 1.005 and the pair ratio's 95% CI
half-width <= 0.005. On the CPU (``--device cpu``, a tiny MLP whose steps are ~0.4 ms, so
the hooks' microseconds are percents) no target applies: the run checks the method, and
``tests/sdk/test_bench_overhead.py`` runs it quickly in CI.

``--parts ROUNDS`` measures the training thread's cost by part instead: rounds of paired runs
(``--pairs`` each) of several instrumented variants interleaved in one process (the machine's
drift between processes is larger than the parts), each against its own bare steps:

- ``default``: every source, as users run it;
- ``python_tracker``: the same with the step tracker's hot path in Python
  (``OTEL_TRAIN_FASTPATH=0``) instead of C (``otel_train/_fastpath.c``);
- ``cgroup_every_step``: the cgroup's ``cpu.stat`` read at every step's end (the interval
  of ``sources/cgroup.py`` set to 0, as it was before 2026-12-01);
- ``no_cgroup``, ``no_cuda_timing``, ``no_memory``: every source but that one;
- ``no_sources``: the step hooks and tracker alone (no source at all).

The CPU run compares ``default``, ``python_tracker``, ``no_cgroup`` and ``no_sources`` by
default, the CUDA run ``default``, ``python_tracker``, ``no_cuda_timing`` and ``no_sources``
(``--arms`` picks others).

``--block N``: each arm of a pair is N steps in a row (figures per step), so the hooks are
switched once in N steps: the cold-cache price of putting them back after a bare step, which
an always-instrumented run never pays, then falls on one step in N.

Usage: ``python bench/bench_step_pairs.py [--device cpu|cuda] [--pairs 1000] [--out FILE.md]``
(``--json FILE`` for the raw per-step figures; ``--parts 6 --pairs 500`` for the parts).
Recorded in ``bench/results/step-pairs-cpu.md`` (this VM) and ``step-pairs-h200-1gpu.md`` (one H200).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_stats as stats  # noqa: E402

import otel_train  # noqa: E402
from otel_train.sources import cgroup  # noqa: E402
from otel_train.tracker import set_alarm  # noqa: E402

TARGETS = [stats.Target("bound", "<=", 1.005, "step-time ratio with background CPU (bound)"),
           stats.Target("half_width", "<=", 0.005, "95% CI half-width of the pair ratio")]
#: otel-train's threads in the training process: Python's by name, C ones by the kernel's
#: (the NCCL plugin's poller, ``otel-nccl-poll``), and the OpenTelemetry SDK's own
#: (``OtelBatchSpanRecordProcessor``...) where it exports in process
THREAD_PREFIXES = ("otel-train", "otel-nccl", "otel_train", "Otel")
#: where the overrun alarm waits while the training-thread part is off (Switch.off)
_ALARM_PARKED_NS = 3600 * 10**9


def _schedstat_s(path: Path) -> float | None:
    """On-CPU seconds of one task (``/proc/.../schedstat``, ns exact); None where absent."""
    try:
        return int(path.read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def background_cpu_s(exporter_pid: int | None) -> dict[str, float]:
    """On-CPU seconds so far of otel-train's threads here, by name, and of its exporter
    process (``exporter``)."""
    names = {t.native_id: t.name for t in threading.enumerate()
             if not isinstance(t, threading._DummyThread)}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = names.get(int(task.name)) or (task / "comm").read_text().strip()
        except OSError:
            continue
        seconds = _schedstat_s(task / "schedstat")
        if seconds is not None and name.startswith(THREAD_PREFIXES):
            out[name] = out.get(name, 0.0) + seconds
    if exporter_pid is not None:
        seconds = _schedstat_s(Path(f"/proc/{exporter_pid}/schedstat"))
        if seconds is not None:
            out["exporter"] = seconds
    return out


class Switch:
    """otel-train's training-thread part off and on between steps, inside one run."""

    def __init__(self, inst: Any) -> None:
        self.inst = inst
        self.tracker = inst.tracker

    def off(self) -> None:
        self.inst._hooks.remove()
        self.tracker.enabled = False
        # The tracker moves the gap sampler's overrun alarm at each step's start (one
        # timerfd_settime a step, part of what is switched off). Left where the last
        # instrumented step put it, it would ring inside the bare step that follows, a step
        # past its typical length only because the bench stopped moving it: a wake-up a
        # pair that a run whose every step is recorded never has. It waits here instead,
        # and the next instrumented step's end sets it again.
        fd = getattr(self.tracker, "_alarm_fd", -1)
        if fd >= 0:
            try:
                set_alarm(fd, time.perf_counter_ns() + _ALARM_PARKED_NS)
            except OSError:
                pass

    def on(self) -> None:
        self.inst._install_hooks()
        self.tracker.step_start_ns = None  # the step starts at its first phase
        self.tracker.enabled = True

    def end_step(self) -> None:
        """The step record, put where the next step's first phase would have put it."""
        self.tracker.mark_step()


# --- workloads -------------------------------------------------------------------------------

Workload = tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[], None], Callable[[], None]]


def cpu_workload() -> Workload:
    """bench_hot_path.py's tiny MLP and loader (the hot-path benchmark's step, paired)."""
    from bench_hot_path import _setup
    from torch import nn

    torch.set_num_threads(1)
    model, opt, loader = _setup()
    batches = _forever(loader)

    def step() -> None:
        x, y = next(batches)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return model, opt, step, lambda: None


def cuda_workload(quick: bool) -> Workload:
    """bench_gpu.py's compiled FSDP2 GPT on one GPU (world-size-1 NCCL group), batches
    picked through a DataLoader of indices so that the data wait is hooked as users have it."""
    import torch.distributed as dist
    from bench_gpu import GPTConfig, batches, build
    from torch.utils.data import DataLoader

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    torch.cuda.set_device(0)
    cfg = GPTConfig(layers=4, batch=2) if quick else GPTConfig()
    model, opt = build(cfg, "default")
    data = batches(cfg)
    indices = _forever(DataLoader(range(len(data)), batch_size=None))

    def step() -> None:
        tokens, targets = data[next(indices)]
        model(tokens, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step, torch.cuda.synchronize


def _forever(loader: Any) -> Any:
    while True:
        yield from loader


# --- the paired run --------------------------------------------------------------------------

def timed_step(step: Callable[[], None], sync: Callable[[], None],
               after: Callable[[], None] | None = None,
               windows: list[tuple[int, int]] | None = None) -> tuple[int, int]:
    """(wall ns, training-thread CPU ns) of one step between two synchronisations;
    ``windows`` gets its (start, end) on the perf counter."""
    sync()
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    step()
    if after is not None:
        after()
    sync()
    w1 = time.perf_counter_ns()
    if windows is not None:
        windows.append((w0, w1))
    return w1 - w0, time.thread_time_ns() - c0


def watch_drains(emitter: Any) -> list[tuple[int, int]]:
    """Every emitter pass's (start, end) on the perf counter from now on (the instance's
    ``pump`` shadowed; the list is appended on the emitter thread)."""
    drains: list[tuple[int, int]] = []
    pump = emitter.pump

    def timed_pump(final: bool = False) -> int:
        t0 = time.perf_counter_ns()
        try:
            return pump(final)
        finally:
            drains.append((t0, time.perf_counter_ns()))

    emitter.pump = timed_pump
    return drains


def overlap_ns(window: tuple[int, int], drains: list[tuple[int, int]]) -> int:
    """How much of ``window`` the emitter's passes took up (``drains`` sorted by start)."""
    lo, hi = window
    total = 0
    for start, end in drains:
        if start >= hi:
            break
        total += max(0, min(end, hi) - max(start, lo))
    return total


def settle(inst: Any) -> None:
    """Let the deferred work of the paired steps happen before its CPU is read: the
    emitter drains what they recorded (at its own interval) and the exporter exports it.
    The wait's own wake-ups are charged to the steps too (a bound, not an estimate)."""
    interval = inst.config.emit_interval_s
    deadline = time.monotonic() + 3 * interval + 5
    while len(inst.recorder) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(interval + 0.2)  # the drain that took the last records, and their export


def paired_run(workload: Workload, pairs: int, warmup: int, out_dir: Path, seed: int,
               instrument: Callable[[], Any] | None = None, block: int = 1,
               emitter_parts: bool = False) -> dict[str, Any]:
    """Pairs of steps in one instrumented run (``instrument()`` makes its context manager;
    default settings by default). Ranks that call this with one seed switch the same steps.
    ``block`` > 1: each arm of a pair is that many steps in a row (their mean per step), so
    the hooks are switched once a block and the cold-cache price of switching them back on
    falls on one step in ``block`` (as in a run where they are never off).
    ``emitter_parts``: the emitter's thread CPU by part as well (``bench/emitter_parts.py``,
    its timers opened before ``instrument()``), per recorded step; its clock reads are in the
    threads' figure and so in the bound."""
    model, opt, step, sync = workload
    if instrument is None:
        def instrument() -> Any:
            return otel_train.instrument(model, optimizer=opt, output_dir=out_dir,
                                         console_log_level="warning")
    for _ in range(warmup):  # compile, allocator and caches settle, bare
        step()
    sync()
    rng = random.Random(seed)
    bare_wall: list[int] = []
    inst_wall: list[int] = []
    bare_cpu: list[int] = []
    inst_cpu: list[int] = []
    first: list[str] = []
    bare_windows: list[tuple[int, int]] = []
    inst_windows: list[tuple[int, int]] = []
    parts_cm: Any = contextlib.nullcontext({})
    if emitter_parts:
        import emitter_parts as parts_mod

        parts_cm = parts_mod.timing_parts()
    with parts_cm as parts, instrument() as inst:
        switch = Switch(inst)
        drains = watch_drains(inst.emitter)
        for _ in range(warmup):  # the run's start-up (exporter, sources) settles, instrumented
            step()
        switch.end_step()
        sync()
        exporter_pid = getattr(inst._pipeline, "pid", None)
        before, started = background_cpu_s(exporter_pid), time.perf_counter()
        for _ in range(pairs):
            order = ("bare", "inst") if rng.random() < 0.5 else ("inst", "bare")
            first.append(order[0])
            for arm in order:
                wall = cpu = 0
                if arm == "bare":
                    switch.off()
                    for _ in range(block):
                        w, c = timed_step(step, sync, windows=bare_windows)
                        wall, cpu = wall + w, cpu + c
                    bare_wall.append(wall // block)
                    bare_cpu.append(cpu // block)
                    switch.on()
                else:
                    for _ in range(block):
                        w, c = timed_step(step, sync, switch.end_step, inst_windows)
                        wall, cpu = wall + w, cpu + c
                    inst_wall.append(wall // block)
                    inst_cpu.append(cpu // block)
        elapsed = time.perf_counter() - started
        settle(inst)
        after = background_cpu_s(exporter_pid)
    background = {k: after[k] - before.get(k, 0.0) for k in after}
    passes = sorted(drains)

    def per_arm(windows: list[tuple[int, int]]) -> list[int]:
        # each arm's emitter-pass time inside its steps (a block's steps summed)
        spans = [overlap_ns(w, passes) for w in windows]
        return [sum(spans[i:i + block]) for i in range(0, len(spans), block)]

    out = {"bare_wall_ns": bare_wall, "inst_wall_ns": inst_wall, "bare_cpu_ns": bare_cpu,
           "inst_cpu_ns": inst_cpu, "first": first, "elapsed_s": elapsed,
           "background_s": background, "steps_recorded": inst.tracker.step, "block": block,
           "bare_drain_ns": per_arm(bare_windows), "inst_drain_ns": per_arm(inst_windows)}
    if emitter_parts:
        out["emitter_parts"] = parts_mod.table(parts, max(inst.tracker.step, 1))
    return out


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    pairs = len(raw["bare_wall_ns"])
    ratio = stats.paired_ratio(raw["bare_wall_ns"], raw["inst_wall_ns"])
    cpu = stats.paired_difference(raw["bare_cpu_ns"], raw["inst_cpu_ns"])
    bare_step_s = ratio.bare.median / 1e9
    block = raw.get("block", 1)
    threads_s = sum(v for k, v in raw["background_s"].items() if k != "exporter")
    background_per_step_s = threads_s / (pairs * block)
    added = background_per_step_s / bare_step_s
    # the ratio when the bare step comes first and when it comes second: a difference
    # would mean a step's cost spills into the next one (the pairing then needs care)
    by_order = {}
    for which in ("bare", "inst"):
        idx = [i for i, f in enumerate(raw["first"]) if f == which]
        if len(idx) >= 2:
            by_order[which] = statistics.median(raw["inst_wall_ns"][i] / raw["bare_wall_ns"][i]
                                                for i in idx)
    # the emitter's passes inside the steps: how often, how long, and the pair ratio of
    # the pairs that had none in either step (a pass holds the interpreter lock for its
    # Python: a step that needs it meanwhile waits)
    drains: dict[str, Any] = {}
    if raw.get("bare_drain_ns") and len(raw["bare_drain_ns"]) == pairs:
        for arm in ("bare", "inst"):
            hit = [d for d in raw[f"{arm}_drain_ns"] if d > 0]
            drains[f"{arm}_share"] = len(hit) / pairs
            drains[f"{arm}_ms_per_step"] = sum(hit) / 1e6 / (pairs * block)
        clear = [i for i in range(pairs)
                 if raw["bare_drain_ns"][i] == 0 and raw["inst_drain_ns"][i] == 0]
        drains["clear_pairs"] = len(clear)
        if len(clear) >= 10:
            free = stats.paired_ratio([raw["bare_wall_ns"][i] for i in clear],
                                      [raw["inst_wall_ns"][i] for i in clear])
            drains["clear_ratio"] = (free.median_ratio, free.ci_low, free.ci_high)
    return {
        "drains": drains,
        "pairs": pairs, "ratio": ratio.median_ratio, "ci_low": ratio.ci_low,
        "ci_high": ratio.ci_high, "half_width": ratio.half_width,
        "bare_step_ms": bare_step_s * 1e3, "bare_cv": ratio.bare.cv,
        "inst_step_ms": ratio.instrumented.median / 1e6,
        "pairs_for_half_width_0.5pct": stats.rounds_for_half_width(ratio),
        "training_thread_cpu_us": cpu.median / 1e3, "training_thread_cpu_ci_us":
            (cpu.ci_low / 1e3, cpu.ci_high / 1e3),
        "background_us_per_step": background_per_step_s * 1e6,
        "background_by_thread_us_per_step": {k: v / (pairs * block) * 1e6
                                             for k, v in sorted(raw["background_s"].items())},
        "bound": ratio.median_ratio + added, "bound_ci": (ratio.ci_low + added,
                                                          ratio.ci_high + added),
        "ratio_by_first_arm": by_order, "elapsed_s": raw["elapsed_s"],
        "emitter_parts": raw.get("emitter_parts"),
        "steps_recorded": raw["steps_recorded"], "block": block,
    }


def markdown(res: dict[str, Any], env: dict[str, Any], args: argparse.Namespace,
             missed: list[str] | None) -> str:
    bt = res["background_by_thread_us_per_step"]
    rows = [
        ("pairs (bare + instrumented step, random order)" if res.get("block", 1) == 1 else
         f"pairs (a block of {res['block']} bare + one of {res['block']} instrumented steps, "
         "random order; figures per step)", res["pairs"]),
        ("bare step, median ms (CV over steps)", f"{res['bare_step_ms']:.3f} "
                                                 f"({res['bare_cv']:.1%})"),
        ("instrumented step, median ms", f"{res['inst_step_ms']:.3f}"),
        ("**pair ratio, median [95% CI]**", f"**{res['ratio']:.4f}** [{res['ci_low']:.4f}, "
                                            f"{res['ci_high']:.4f}] (half-width "
                                            f"{res['half_width']:.2%})"),
        ("pairs a +-0.5% CI would need at this noise", res["pairs_for_half_width_0.5pct"]),
        ("pair ratio with the bare step first / second",
         " / ".join(f"{res['ratio_by_first_arm'].get(k, float('nan')):.4f}"
                    for k in ("bare", "inst"))),
        ("training thread's CPU added a step, µs [95% CI]",
         f"{res['training_thread_cpu_us']:.1f} [{res['training_thread_cpu_ci_us'][0]:.1f}, "
         f"{res['training_thread_cpu_ci_us'][1]:.1f}]"),
        ("otel-train's threads here, µs of CPU a step (exact)",
         f"{res['background_us_per_step']:.1f} ("
         + ", ".join(f"{k} {v:.1f}" for k, v in bt.items() if k != "exporter") + ")"),
        ("exporter process, µs of CPU a step (own cores; not in the bound)",
         f"{bt.get('exporter', float('nan')):.1f}"),
        ("**bound: pair ratio + threads' CPU / bare step [95% CI]**",
         f"**{res['bound']:.4f}** [{res['bound_ci'][0]:.4f}, {res['bound_ci'][1]:.4f}]"),
    ]
    dr = res.get("drains") or {}
    if "bare_share" in dr:
        rows.append(("the emitter's passes inside the steps: share of bare / instrumented "
                     "steps with one, ms of pass a step",
                     f"{dr['bare_share']:.1%} / {dr['inst_share']:.1%}; "
                     f"{dr['bare_ms_per_step']:.3f} / {dr['inst_ms_per_step']:.3f}"))
        clear = dr.get("clear_ratio")
        rows.append(("pair ratio of the pairs with no pass in either step [95% CI] (pairs)",
                     (f"{clear[0]:.4f} [{clear[1]:.4f}, {clear[2]:.4f}]" if clear else "-")
                     + f" ({dr['clear_pairs']})"))
    lines = [
        "# Step-paired overhead: instrumented and bare steps alternating in one run", "",
        f"`python bench/bench_step_pairs.py --device {args.device} --pairs {args.pairs}"
        f"{f' --block {args.block}' if args.block > 1 else ''}"
        f"{' --quick' if args.quick else ''}"
        f"{' --emitter-parts' if getattr(args, 'emitter_parts', False) else ''}`; default "
        "settings (every step sampled, "
        "file exporter); each step timed between two synchronisations.", "",
        stats.environment_markdown(env), "",
        stats.markdown_table(["measure", "value"], rows), "",
        "Targets (issue 15, on CUDA): " + "; ".join(t.describe() for t in TARGETS) + ".", "",
    ]
    parts = res.get("emitter_parts")
    if parts:
        import emitter_parts as parts_mod

        lines += ["The emitter by part (`--emitter-parts`: thread CPU of each part a recorded "
                  "step, nested parts inside their callers; the parts' own clock reads are in "
                  "the threads' figure above, and so in the bound):", "", "```",
                  *parts_mod.lines(parts), "```", ""]
    if missed is None:
        lines.append("verdict: no target on the CPU (the run checks the method)")
    else:
        lines.append("verdict: " + ("; ".join(missed) if missed else "all targets met"))
    return "\n".join(lines) + "\n"


# --- by part -----------------------------------------------------------------------------------

PART_ARMS = ("default", "python_tracker", "no_cgroup", "no_sources")
CUDA_PART_ARMS = ("default", "python_tracker", "no_cuda_timing", "no_sources")
#: every variant --arms may name
ALL_ARMS = tuple(dict.fromkeys((*PART_ARMS, *CUDA_PART_ARMS, "cgroup_every_step",
                                "no_memory")))
#: which source each ``no_<name>`` variant leaves out
_LEFT_OUT = {"no_cgroup": "otel_train.sources.cgroup:",
             "no_cuda_timing": "otel_train.sources.gpu.cuda_timing:",
             "no_memory": "otel_train.sources.gpu.memory:"}


_INSTRUMENT = importlib.import_module("otel_train.instrument")
_ALL_SOURCES: tuple[str, ...] = _INSTRUMENT.SOURCES
_CGROUP_INTERVAL_NS = cgroup.MIN_READ_INTERVAL_NS


def _configure(arm: str) -> None:
    """The sources (and the cgroup's read interval) of one variant, for the next run."""
    if arm not in ALL_ARMS:
        raise ValueError(f"unknown variant {arm!r}")
    if arm == "python_tracker":
        os.environ["OTEL_TRAIN_FASTPATH"] = "0"
    else:
        os.environ.pop("OTEL_TRAIN_FASTPATH", None)
    cgroup.MIN_READ_INTERVAL_NS = 0 if arm == "cgroup_every_step" else _CGROUP_INTERVAL_NS
    if arm == "no_sources":
        _INSTRUMENT.SOURCES = ()
    elif arm in _LEFT_OUT:
        _INSTRUMENT.SOURCES = tuple(s for s in _ALL_SOURCES if not s.startswith(_LEFT_OUT[arm]))
    else:
        _INSTRUMENT.SOURCES = _ALL_SOURCES


def parts_run(workload: Workload, rounds: int, pairs: int, warmup: int, out_dir: Path,
              seed: int, arms: tuple[str, ...] = PART_ARMS) -> dict[str, Any]:
    """Pairs of every variant of ``arms``, rounds interleaved (order rotated)."""
    pooled: dict[str, dict[str, list[int]]] = {
        arm: {"bare_cpu_ns": [], "inst_cpu_ns": [], "bare_wall_ns": [], "inst_wall_ns": []}
        for arm in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            _configure(arm)
            raw = paired_run(workload, pairs, warmup, out_dir / f"{arm}-{r}", seed + r)
            for key, values in pooled[arm].items():
                values.extend(raw[key])
    _configure("default")
    out: dict[str, Any] = {}
    for arm, raw in pooled.items():
        cpu = stats.paired_difference(raw["bare_cpu_ns"], raw["inst_cpu_ns"])
        ratio = stats.paired_ratio(raw["bare_wall_ns"], raw["inst_wall_ns"])
        out[arm] = {"pairs": cpu.rounds, "cpu_us": cpu.median / 1e3,
                    "cpu_ci_us": (cpu.ci_low / 1e3, cpu.ci_high / 1e3),
                    "ratio": ratio.median_ratio, "ratio_ci": (ratio.ci_low, ratio.ci_high)}
    return out


def parts_markdown(parts: dict[str, Any], env: dict[str, Any], args: argparse.Namespace
                   ) -> str:
    rows = [(arm, v["pairs"], f"{v['cpu_us']:.1f} [{v['cpu_ci_us'][0]:.1f}, "
                               f"{v['cpu_ci_us'][1]:.1f}]",
             f"{v['ratio']:.4f} [{v['ratio_ci'][0]:.4f}, {v['ratio_ci'][1]:.4f}]")
            for arm, v in parts.items()]
    return "\n".join([
        "# Step-paired overhead by part: the training thread's cost of each variant", "",
        f"`python bench/bench_step_pairs.py --device {args.device} --parts {args.parts} "
        f"--pairs {args.pairs}`: rounds of paired runs of each variant, interleaved in one "
        "process (order rotated each round), each against its own bare steps.", "",
        stats.environment_markdown(env), "",
        stats.markdown_table(["variant", "pairs", "training thread's CPU added a step, µs "
                              "[95% CI]", "pair ratio [95% CI]"], rows), "",
        "No target applies to a part: the parts say where the training thread's time goes.",
        ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=None,
                        help="steps before timing, bare then instrumented (default: 20 on "
                             "CUDA, 200 on the CPU)")
    parser.add_argument("--quick", action="store_true", help="CUDA: a 4-layer model")
    parser.add_argument("--seed", type=int, default=stats.SEED)
    parser.add_argument("--out", type=Path, default=None, help="the markdown result")
    parser.add_argument("--json", type=Path, default=None, help="summary and raw steps")
    parser.add_argument("--no-verdict", action="store_true")
    parser.add_argument("--parts", type=int, default=0, metavar="ROUNDS",
                        help="the cost by part instead: ROUNDS rounds of every variant")
    parser.add_argument("--block", type=int, default=1,
                        help="steps in a row per arm of a pair (the hooks switched once a "
                             "block; default 1: every step)")
    parser.add_argument("--arms", default=None,
                        help="--parts: the variants, comma-separated (default by device)")
    parser.add_argument("--emitter-parts", action="store_true",
                        help="the paired run also times the emitter's thread CPU by part "
                             "(bench/emitter_parts.py; its clock reads count in the bound)")
    args = parser.parse_args()
    arms = tuple(a for a in (args.arms or "").split(",") if a) or (
        CUDA_PART_ARMS if args.device == "cuda" else PART_ARMS)
    unknown = [a for a in arms if a not in ALL_ARMS]
    if unknown:
        parser.error(f"--arms: unknown variant(s) {', '.join(unknown)}")
    if args.pairs < 10:
        parser.error("--pairs must be at least 10 (a CI needs pairs)")
    if args.block < 1 or (args.parts and args.block > 1):
        parser.error("--block must be at least 1, and is for the paired run (not --parts)")
    if args.parts and args.emitter_parts:
        parser.error("--emitter-parts is for the paired run (not --parts)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    warmup = args.warmup if args.warmup is not None else (20 if args.device == "cuda" else 200)
    env = stats.environment()
    workload = cuda_workload(args.quick) if args.device == "cuda" else cpu_workload()
    if args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            parts = parts_run(workload, args.parts, args.pairs, warmup, Path(tmp), args.seed,
                              arms)
        text = parts_markdown(parts, env, args)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        if args.json:
            args.json.write_text(json.dumps({"environment": env, "parts": parts}, indent=1))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        raw = paired_run(workload, args.pairs, warmup, Path(tmp), args.seed,
                         block=args.block, emitter_parts=args.emitter_parts)
    res = summarise(raw)
    missed = stats.verdict(res, TARGETS) if args.device == "cuda" else None
    text = markdown(res, env, args, missed)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"environment": env, "summary": res, "raw": raw},
                                        indent=1, default=str))
    if args.device == "cuda":
        import torch.distributed as dist

        dist.destroy_process_group()
    return 1 if missed and not args.no_verdict else 0


if __name__ == "__main__":
    sys.exit(main())
