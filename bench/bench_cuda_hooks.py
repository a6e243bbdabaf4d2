"""What the GPU sources' hooks cost the training thread, per call (CUDA only).

The CUDA-timing source records two timing events per timed phase on the training thread
(six a step); the memory source reads the allocator's statistics once a step. This measures
each call as the hooks make it, against the call they made before:

- ``event.record()`` (``torch.cuda.Event.record``: builds a ``Stream`` through
  ``torch.cuda.current_stream()`` each time) against ``torch_compat.event_recorder()``
  (the current stream's key from one C call, the ``Stream`` object kept);
- ``torch.cuda.is_current_stream_capturing()`` against its C binding;
- the memory source's ``read_stats`` (one ``_cuda_memoryStats``), for scale.

Each figure: ``--repeats`` timings of ``--calls`` calls in a loop (wall clock, warm caches:
in situ, between torch's own work, each costs more), median and its bootstrap 95% CI over
repeats. Verdict: the kept-stream record at most half the default record's time.

    python bench/bench_cuda_hooks.py --out bench/results/gpu-h200-cuda-hooks.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import overhead_stats as stats  # noqa: E402

from otel_train import torch_compat  # noqa: E402
from otel_train.sources.gpu import memory  # noqa: E402


def per_call_us(fn: Any, calls: int, repeats: int) -> list[float]:
    fn()  # first call outside the timing (lazy init, caches)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return out


def measure(calls: int, repeats: int) -> dict[str, list[float]]:
    device = torch.cuda.current_device()
    event = torch.cuda.Event(enable_timing=True)
    record = torch_compat.event_recorder()
    capturing_c = torch_compat.stream_capturing()
    side = torch.cuda.Stream()

    def record_on_side_default() -> None:
        with torch.cuda.stream(side):
            event.record()

    def record_on_side_kept() -> None:
        with torch.cuda.stream(side):
            record(event)

    cases = {
        "event.record() (before)": event.record,
        "event_recorder()(event) (now)": lambda: record(event),
        "event.record() inside torch.cuda.stream(side)": record_on_side_default,
        "event_recorder()(event) inside torch.cuda.stream(side)": record_on_side_kept,
        "torch.cuda.is_current_stream_capturing() (before)":
            torch.cuda.is_current_stream_capturing,
        "its C binding (now)": capturing_c,
        "memory.read_stats (once a step)": lambda: memory.read_stats(device),
    }
    out = {}
    for name, fn in cases.items():
        out[name] = per_call_us(fn, calls, repeats)
        torch.cuda.synchronize()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda_hooks: needs CUDA", file=sys.stderr)
        return 2
    raw = measure(args.calls, args.repeats)
    rows, summary = [], {}
    for name, values in raw.items():
        med = stats.summarize(values)
        low, high = stats.bootstrap_median_ci(values)
        summary[name] = {"median_us": med.median, "ci95": [low, high], "cv": med.cv,
                         "min_us": med.min, "max_us": med.max}
        rows.append((name, f"{med.median:.2f}", f"[{low:.2f}, {high:.2f}]",
                     f"{med.min:.2f} .. {med.max:.2f}"))
    before = summary["event.record() (before)"]["median_us"]
    now = summary["event_recorder()(event) (now)"]["median_us"]
    missed = stats.verdict({"ratio": now / before},
                           [stats.Target("ratio", "<=", 0.5, "kept-stream record / default record")])
    verdict = ([f"**verdict: missed** {m}" for m in missed] if missed else
               [f"**verdict: met** (kept-stream record / default record = {now / before:.3f}"
                " <= 0.5)"])
    text = "\n".join([
        "# The GPU sources' training-thread calls, per call",
        "",
        f"`python bench/bench_cuda_hooks.py --calls {args.calls} --repeats {args.repeats}`"
        " (warm loops: in situ each costs more).",
        "",
        stats.environment_markdown(),
        "",
        stats.markdown_table(("call", "µs a call, median", "95% CI", "min .. max"), rows),
        "",
        *verdict,
        "",
    ])
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"env": stats.environment(), "summary": summary,
                                         "raw": raw}, indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
