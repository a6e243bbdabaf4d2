"""Wake-ups and CPU a second of otel-train's own threads in the training process.

Why: every wake-up of a background thread costs kernel CPU (~56 us on the H200 host) and,
beside a training thread, the interpreter lock's hand-overs (bench/gil_wakeups.py). The
emitter drains only when records wait or a source's deadline comes, and the gap sampler
sleeps until a step could have run past its typical length (docs/overhead.md, "Wake-ups"):
this counts what that leaves.

How: each arm is an ``otel_train`` checkout (``--arm NAME:PATH``, imported through
PYTHONPATH; ``before`` is typically the commit before the change, unpacked with
``git archive``), run in a child process, rounds alternating between arms. A child runs a
CPU training loop under ``otel_train.instrument()`` at default settings (the exporter
process on), each step ~50 ms: a small MLP whose forward also waits 40 ms inside the phase,
the way a host waits on a device (so no step has an untimed stretch). After a warm-up it
reads, for every thread of its own process, ``voluntary_ctxt_switches`` +
``nonvoluntary_ctxt_switches`` of ``/proc/self/task/<tid>/status`` (each block of a thread
is one switch, and one wake-up after it; a thread that wakes into a held interpreter lock
blocks again, counted too) and the on-CPU ns of ``/proc/self/task/<tid>/schedstat``, over
``--steady-s`` of training and then over ``--idle-s`` of a pause (the training thread
asleep outside every phase, inside ``instrument()``), the pause's first ``--settle-s`` left
out. The threads' own counters (``Emitter.wakeups``, ``GapSource.wakeups``) are read
beside, where the arm has them.

Targets (the ``after`` arm, median over rounds of the threads' own counters, ``TARGETS``):
in steady state the emitter wakes <= 1 time a second and the gap sampler <= 1 (its own
looks once a second, ``ALARM_FLOOR_S``, where the tracker moves the overrun alarm: the C
tracker; five a second, once a ``gap_sample_s`` of 200 ms, before it; + 1 / --steady-s: the
window's edges), each <= 0.2 times a second while training is paused (its context switches and CPU are reported beside, and for arms without
counters). The run exits 1 on a miss.

Usage: ``python bench/bench_wakeups.py --arm before:/tmp/base --arm after:. --rounds 5
--out bench/results/wakeups-cpu.md``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_stats as stats  # noqa: E402

THREADS = ("otel-train-emitter", "otel-train-gap-sampler")
PHASES = ("steady", "paused")
#: own wake-ups a second, by thread and phase: the emitter once a drain interval; the gap
#: sampler once a second of its own (the overrun alarm wakes it where a step runs late);
#: both about never while training is paused
TARGETS = {"steady": {"otel-train-emitter": 1.0, "otel-train-gap-sampler": 1.0},
           "paused": {"otel-train-emitter": 0.2, "otel-train-gap-sampler": 0.2}}


# --- the child: one arm, one round ---------------------------------------------------------

def _task(tid: int) -> tuple[int, int]:
    """(context switches, on-CPU ns) of one thread of this process so far."""
    switches = 0
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                switches += int(line.split()[1])
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        cpu_ns = int(f.read().split()[0])
    return switches, cpu_ns


COUNTERS: dict[str, Any] = {}  # thread name -> the object whose ``wakeups`` it counts


def _snapshot() -> dict[str, tuple[int, int, int | None]]:
    out = {}
    for thread in threading.enumerate():
        if thread.name in THREADS and thread.native_id is not None:
            try:
                out[thread.name] = (*_task(thread.native_id),
                                    getattr(COUNTERS.get(thread.name), "wakeups", None))
            except OSError:
                pass
    return out


def _rates(before: dict[str, tuple[int, int, int | None]],
           after: dict[str, tuple[int, int, int | None]],
           wall_s: float) -> dict[str, dict[str, float]]:
    out = {}
    for name in before:
        if name not in after:
            continue
        (s0, c0, w0), (s1, c1, w1) = before[name], after[name]
        out[name] = {"switches_per_s": (s1 - s0) / wall_s, "cpu_ms_per_s": (c1 - c0) / 1e6 / wall_s}
        if w0 is not None and w1 is not None:
            out[name]["wakeups_per_s"] = (w1 - w0) / wall_s
    return out


def child(args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    import otel_train

    class Waits(nn.Module):
        """The host waiting inside the forward, as on a device."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(args.wait_s)
            return x

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), Waits(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)

    def train_for(seconds: float) -> int:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            n += 1
        return n

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, otel_train.instrument(
            model, optimizer=opt, output_dir=tmp) as inst:
        COUNTERS["otel-train-emitter"] = getattr(inst, "emitter", None)
        COUNTERS["otel-train-gap-sampler"] = next(
            (s for s in getattr(inst, "_sources", ()) if type(s).__name__ == "GapSource"), None)
        train_for(args.warmup_s)
        t0, s0 = time.monotonic(), _snapshot()
        steps = train_for(args.steady_s)
        t1, s1 = time.monotonic(), _snapshot()
        out["steady"] = _rates(s0, s1, t1 - t0)
        out["step_ms"] = 1e3 * (t1 - t0) / max(1, steps)
        time.sleep(args.settle_s)
        t2, s2 = time.monotonic(), _snapshot()
        time.sleep(args.idle_s)
        t3, s3 = time.monotonic(), _snapshot()
        out["paused"] = _rates(s2, s3, t3 - t2)
        out["counters"] = {name: getattr(obj, "wakeups", None) for name, obj in COUNTERS.items()}
        out["otel_train"] = otel_train.__file__
    print("RESULT " + json.dumps(out), flush=True)


# --- the parent: arms, rounds, statistics --------------------------------------------------

def run_child(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(path.resolve())}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--warmup-s", str(args.warmup_s),
           "--steady-s", str(args.steady_s), "--settle-s", str(args.settle_s),
           "--idle-s", str(args.idle_s), "--wait-s", str(args.wait_s)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          cwd=path.resolve())
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _figure(values: list[float]) -> dict[str, float]:
    s = stats.summarize(values)
    low, high = stats.bootstrap_median_ci(values)
    return {"median": s.median, "min": s.min, "max": s.max, "ci_low": low, "ci_high": high}


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for arm, rounds in results.items():
        for phase in PHASES:
            for name in THREADS:
                for key in ("wakeups_per_s", "switches_per_s", "cpu_ms_per_s"):
                    values = [r[phase][name][key] for r in rounds
                              if key in r[phase].get(name, {})]
                    if values:
                        table.setdefault(arm, {}).setdefault(phase, {}).setdefault(
                            name, {})[key] = _figure(values)
        table[arm]["step_ms"] = _figure([r["step_ms"] for r in rounds])
    return table


def render(table: dict[str, Any], env: dict[str, Any], args: argparse.Namespace,
           missed: list[str], results: dict[str, list[dict[str, Any]]]) -> str:
    rows = []
    for arm, phases in table.items():
        for phase in PHASES:
            for name, figs in phases.get(phase, {}).items():
                sw, cpu = figs["switches_per_s"], figs["cpu_ms_per_s"]
                wk = figs.get("wakeups_per_s")
                rows.append((arm, phase, name,
                             f"{wk['median']:.2f} [{wk['ci_low']:.2f}, {wk['ci_high']:.2f}]"
                             if wk else "-", f"{sw['median']:.2f}",
                             f"{sw['min']:.2f}-{sw['max']:.2f}",
                             f"[{sw['ci_low']:.2f}, {sw['ci_high']:.2f}]",
                             f"{cpu['median']:.3f}", f"{cpu['min']:.3f}-{cpu['max']:.3f}",
                             f"[{cpu['ci_low']:.3f}, {cpu['ci_high']:.3f}]"))
    counters = [(arm, i, json.dumps(r["counters"]), f"{r['step_ms']:.1f}")
                for arm, rounds in results.items() for i, r in enumerate(rounds)]
    lines = [
        "# Wake-ups of otel-train's threads in the training process",
        "",
        f"`python bench/bench_wakeups.py {' '.join(args.argv)}`: {args.rounds} rounds per arm, "
        f"alternating; per round {args.steady_s:g} s of steady training (steps "
        f"~{args.wait_s * 1e3:.0f} ms waiting in the forward plus a small MLP on the CPU) "
        f"after {args.warmup_s:g} s of warm-up, then {args.idle_s:g} s of a pause (training "
        f"thread asleep outside every phase) after {args.settle_s:g} s of it. Switches: "
        "voluntary + nonvoluntary context switches of the thread (/proc/self/task/<tid>/"
        "status), each one block and one wake-up (a wake-up into a held interpreter lock blocks "
        "again); own wake-ups: the thread's counter (arms that have it); CPU: its on-CPU "
        "time (schedstat). Median "
        "over rounds, spread (min-max) and the median's 95% bootstrap CI.",
        "",
        stats.environment_markdown(env),
        "",
        stats.markdown_table(["arm", "phase", "thread", "own wake-ups/s [95% CI]", "switches/s", "spread", "95% CI",
                              "CPU ms/s", "spread", "95% CI"], rows),
        "",
        "Per round, the threads' own wake-up counters over the whole child (warm-up, steady, "
        "pause; absent in arms without them) and the mean step:",
        "",
        stats.markdown_table(["arm", "round", "wake-ups (whole run)", "step ms"], counters),
        "",
        "Targets (arm `after`, medians of the threads' own counters): each otel-train thread "
        f"wake-ups/s steady {TARGETS['steady']} (+ 1/{args.steady_s:g} s: a window holds k "
        f"or k + 1 wake-ups of a periodic thread), paused {TARGETS['paused']}.",
        "",
        "Verdict: " + ("PASS" if not missed else "MISS: " + "; ".join(missed)),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", action="append", default=[], metavar="NAME:PATH",
                        help="an otel_train checkout to measure (repeat); default after:.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--wait-s", type=float, default=0.04)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.child:
        child(args)
        return 0
    arms = [(a.split(":", 1)[0], Path(a.split(":", 1)[1])) for a in args.arm or ["after:."]]
    env = stats.environment()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in arms}
    for r in range(args.rounds):
        for name, path in (arms if r % 2 == 0 else arms[::-1]):
            print(f"round {r} arm {name}", file=sys.stderr, flush=True)
            results[name].append(run_child(path, args))
    if args.json:  # the raw rounds first: a failure below keeps them
        args.json.write_text(json.dumps({"environment": env, "rounds": results}, indent=1))
    table = summarise(results)
    missed = []
    if "after" in table:
        # a window of W seconds holds k or k + 1 wake-ups of a once-a-second thread
        for phase, by_thread in TARGETS.items():
            for name in THREADS:
                limit = by_thread[name] + (1 / args.steady_s if phase == "steady" else 0.0)
                fig = table["after"].get(phase, {}).get(name, {}).get("wakeups_per_s")
                figures = {"v": fig["median"] if fig else None}
                missed += [f"{phase} {name}: {m}" for m in stats.verdict(
                    figures, [stats.Target("v", "<=", limit, "wake-ups/s")])]
    text = render(table, env, args, missed, results)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "table": table,
                                         "rounds": results, "missed": missed}, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
