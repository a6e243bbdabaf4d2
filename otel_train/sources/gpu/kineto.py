"""What a torch.profiler (Kineto) trace says about the GPU: overlap, exposed comm, idle time.

Overlap follows HolisticTraceAnalysis's definition and rules exactly (``hta`` 0.5,
``CommunicationAnalysis.get_comm_comp_overlap``): GPU events are the trace's events with a
duration whose ``args.stream`` is an integer; a kernel is communication if its name matches
``^nccl.*Kernel``, memory if ``^Memcpy|^Memset|^dma``, computation unless it matches
HTA's non-compute pattern; each class's intervals are merged, and the overlap is the time
both classes run at once over the merged communication time; like HTA, a trace with
fractional (ns-resolution) timestamps has every event's start rounded up and end rounded
down to whole µs first (pytorch/pytorch#122425). No pandas, no HTA needed here:
``tests/gpu_on_cpu/test_gpu_sources_trace.py`` and ``bench/bench_gpu.py`` check agreement with HTA.

Run as ``python -m otel_train.sources.gpu.kineto TRACE.json[.gz] [--steps K]``: prints one
JSON object (what the profiler source puts on its span and metrics).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# HTA's patterns (hta/utils/utils.py), verbatim
NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NCCL_COMPUTE_KERNEL_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
COMM, MEMORY, COMPUTE, OTHER = "communication", "memory", "computation", "other"
_SKIPPED_CATEGORIES = frozenset(("Trace", "python_function"))

Interval = tuple[float, float]


def kernel_type(name: str) -> str:
    if NCCL_KERNEL_RE.match(name):
        return COMM
    if MEMORY_KERNEL_RE.match(name):
        return MEMORY
    if not NCCL_COMPUTE_KERNEL_RE.match(name):
        return COMPUTE
    return OTHER


def _stream(event: dict[str, Any]) -> int:
    args = event.get("args")
    raw = args.get("stream", -1) if isinstance(args, dict) else -1
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def gpu_events(events: Iterable[dict[str, Any]]) -> Iterator[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every event on a GPU stream, unrounded."""
    for event in events:
        dur = event.get("dur")
        cat = event.get("cat")
        if dur is None or cat is None or cat in _SKIPPED_CATEGORIES:
            continue
        if _stream(event) != -1:
            yield str(event.get("name", "")), float(event["ts"]), float(dur)


def hta_round(start: float, end: float) -> Interval:
    """HTA's rounding of ns-resolution events: start up, end down, to whole µs."""
    return float(math.ceil(start)), float(math.floor(end))


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """HTA's merge: sorted by start, an interval opens a new group when it starts after
    every earlier end (touching ones merge); a group spans its earliest start, latest end."""
    out: list[list[float]] = []
    latest_end = -math.inf
    for start, end in sorted(intervals, key=lambda iv: iv[0]):
        if out and start <= latest_end:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
        latest_end = max(latest_end, end)
    return [(s, e) for s, e in out]


def overlap_time(comm: list[Interval], comp: list[Interval]) -> float:
    """HTA's sweep: +1/-1 at merged communication starts/ends, +2/-2 at computation ones;
    the time from each point where the running sum is 3 to the next point is overlap."""
    points = sorted([(s, 1) for s, _ in comm] + [(e, -1) for _, e in comm]
                    + [(s, 2) for s, _ in comp] + [(e, -2) for _, e in comp],
                    key=lambda p: p[0])
    total, running = 0.0, 0
    for (time, delta), (next_time, _) in zip(points, points[1:]):
        running += delta
        if running == 3:
            total += next_time - time
    return total


def _length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def analyse(events: Iterable[dict[str, Any]], steps: int = 1, top: int = 5) -> dict[str, Any]:
    """Overlap, exposed communication, GPU idle share and top kernels of one trace."""
    events = list(events)
    rounded = any(isinstance(e.get("ts"), float) and not float(e["ts"]).is_integer()
                  for e in events)  # HTA rounds when pandas reads ts as float64
    by_type: dict[str, list[Interval]] = collections.defaultdict(list)
    hta_comm: list[Interval] = []
    hta_comp: list[Interval] = []
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, ts, dur in gpu_events(events):
        kind = kernel_type(name)
        by_type[kind].append((ts, ts + dur))
        if kind in (COMM, COMPUTE):
            interval = hta_round(ts, ts + dur) if rounded else (ts, ts + dur)
            (hta_comm if kind == COMM else hta_comp).append(interval)
        stats = kernels[name]
        stats[0] += dur
        stats[1] += 1
    comm, comp = merge(hta_comm), merge(hta_comp)
    exact_comm = merge(by_type[COMM])
    exact_overlap_us = overlap_time(exact_comm, merge(by_type[COMPUTE]))
    busy = merge(iv for ivs in by_type.values() for iv in ivs)
    comm_us, overlap_us = _length(comm), overlap_time(comm, comp)
    window_us = busy[-1][1] - busy[0][0] if busy else 0.0
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    steps = max(steps, 1)
    return {
        "overlap": overlap_us / comm_us if comm_us > 0 else None,
        "comm_s": comm_us / 1e6,
        "compute_s": _length(comp) / 1e6,
        "overlap_s": overlap_us / 1e6,
        # the same without HTA's rounding to whole µs
        "overlap_unrounded": (exact_overlap_us / _length(exact_comm)
                              if _length(exact_comm) > 0 else None),
        "exposed_comm_s": (comm_us - overlap_us) / 1e6,
        "exposed_comm_per_step_s": (comm_us - overlap_us) / 1e6 / steps,
        "gpu_busy_s": _length(busy) / 1e6,
        "gpu_window_s": window_us / 1e6,
        "gpu_idle": 1.0 - _length(busy) / window_us if window_us > 0 else None,
        "kernels": sum(int(v[1]) for v in kernels.values()),
        "comm_kernels": len(by_type[COMM]),
        "top_kernels": [{"name": name[:200], "total_s": v[0] / 1e6, "count": int(v[1])}
                        for name, v in ranked],
        "steps": steps,
    }


#: NCCL's kernel for a one-rank communicator (``onerank.cu``): no ``nccl...Kernel`` name, so
#: HTA (and :func:`analyse`) count it as computation
ONE_RANK_KERNEL_RE = re.compile(r".*onerank", re.IGNORECASE)


def relabel_one_rank_kernels(doc: dict[str, Any]) -> int:
    """Rename NCCL's one-rank kernels as NCCL names its ring kernels, in place; return how many.

    For checks on one GPU only: there NCCL runs no ``nccl...Kernel``, so overlap is undefined
    for HTA and for :func:`analyse` alike; renamed, both see real communication kernels with
    their real times on NCCL's stream.
    """
    count = 0
    for event in doc.get("traceEvents", []):
        if isinstance(event.get("name"), str) and _stream(event) != -1 \
                and ONE_RANK_KERNEL_RE.match(event["name"]):
            event["name"] = "ncclDevKernel_OneRank_" + event["name"][:80]
            count += 1
    return count


def load_events(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc.get("traceEvents", []) if isinstance(doc, dict) else doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args(argv)
    json.dump(analyse(load_events(args.trace), args.steps), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
