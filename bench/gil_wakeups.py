"""What one wake-up of a background Python thread costs beside a busy training thread.

Why: on one H200 the gap sampler's thread used ~140 us of CPU per wake-up (docs/overhead.md,
tenth session) for a check that reads two attributes. The suspicion: the wake-up, not the
work. A thread returning from ``time.sleep`` must take the interpreter lock; while the
training thread holds it and keeps releasing and retaking it around C calls (kernel launches,
NCCL), each release signals the waiter, which wakes, finds the lock taken again, and sleeps:
CPU for nothing, until the switch interval (5 ms) forces a hand-over.

How: the benchmark's workload (bench_step_pairs.py's: the compiled FSDP2 GPT on CUDA, the tiny
MLP on the CPU) runs bare, with no otel-train, while a side thread wakes every ``--interval``
and does the gap sampler's check (two attribute reads). Per wake-up it records the thread's
CPU spent getting back (inside ``sleep``: the wake and the lock) apart from the CPU of the
check itself, and the same with the training thread idle (asleep), as the floor.

Usage: ``python bench/gil_wakeups.py --device cuda --steps 300 --out FILE.md``
(recorded: ``bench/results/gil-wakeups-h200.md``, ``gil-wakeups-cpu.md``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_stats as stats  # noqa: E402


class _State:
    phase: str | None = None
    idle_since_ns = 0


class SideThread:
    """Wakes every ``interval_s``; per wake-up, CPU to get back from sleep and CPU of the check."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.state = _State()
        self.back_ns: list[int] = []
        self.work_ns: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="side")

    def _loop(self) -> None:
        clock = time.thread_time_ns
        state = self.state
        while not self._stop.is_set():
            c0 = clock()
            time.sleep(self.interval_s)
            c1 = clock()
            _ = state.phase is None and time.perf_counter_ns() - state.idle_since_ns
            c2 = clock()
            self.back_ns.append(c1 - c0)
            self.work_ns.append(c2 - c1)

    def __enter__(self) -> SideThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(step: Any, sync: Any, steps: int, interval_s: float, idle_s: float | None
            ) -> dict[str, Any]:
    """Wake-ups during ``steps`` training steps, or during ``idle_s`` of an idle training
    thread (asleep) where given."""
    with SideThread(interval_s) as side:
        started = time.perf_counter()
        if idle_s is not None:
            time.sleep(idle_s)
        else:
            for _ in range(steps):
                step()
            sync()
        elapsed = time.perf_counter() - started
    back, work = side.back_ns[1:], side.work_ns[1:]  # the first wake-up: thread start-up
    return {"wakeups": len(back), "elapsed_s": elapsed,
            "back_us_median": statistics.median(back) / 1e3 if back else None,
            "back_us_mean": statistics.fmean(back) / 1e3 if back else None,
            "work_us_median": statistics.median(work) / 1e3 if work else None,
            "switch_interval_s": sys.getswitchinterval()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import bench_step_pairs

    workload = (bench_step_pairs.cuda_workload(False) if args.device == "cuda"
                else bench_step_pairs.cpu_workload())
    _, _, step, sync = workload
    for _ in range(20 if args.device == "cuda" else 200):
        step()
    sync()
    rows = []
    for r in range(args.rounds):
        busy = measure(step, sync, args.steps, args.interval, None)
        idle = measure(step, sync, args.steps, args.interval, busy["elapsed_s"])
        for name, res in (("training", busy), ("training thread idle", idle)):
            rows.append((r, name, res["wakeups"],
                         f"{res['back_us_median']:.1f}", f"{res['back_us_mean']:.1f}",
                         f"{res['work_us_median']:.1f}"))
    text = "\n".join([
        "# One wake-up of a background thread beside the training thread", "",
        f"`python bench/gil_wakeups.py --device {args.device} --steps {args.steps} "
        f"--interval {args.interval}`; switch interval {sys.getswitchinterval()} s.", "",
        stats.environment_markdown(stats.environment()), "",
        stats.markdown_table(["round", "training thread", "wake-ups",
                              "CPU to get back from sleep, µs (median)", "(mean)",
                              "CPU of the check, µs (median)"], rows), ""])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
