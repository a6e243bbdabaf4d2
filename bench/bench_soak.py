"""Soak: thousands of steps at a high span rate; memory and queues must stay flat.

Trains a tiny model with gradient accumulation (4 micro-batches: 15 spans, 6 histogram
points and one log line per step) for ``--steps`` steps with the file exporter, and samples
every ``--every`` steps: the process's resident memory, the hot-path buffer's length and the
span batch processor's queue length. Prints a table and the growth between the first and
last quarter of the run.

Usage: ``python bench/bench_soak.py [--steps 4000] [--every 250] [--out FILE.md]``
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import statistics
import tempfile
import time
from importlib import metadata
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1)), batch_size=8)
    log = logging.getLogger("soak")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with otel_train.instrument(model, output_dir=tmp, console_log_level="warning") as inst:
            processor = inst._pipeline.processors[0]._batch_processor
            step, start = 0, time.monotonic()
            while step < args.steps:
                for i, (x, y) in enumerate(loader):
                    (nn.functional.mse_loss(model(x), y) / 4).backward()
                    if (i + 1) % 4:
                        continue
                    opt.step()
                    opt.zero_grad()
                    log.warning("step %d", step)
                    step += 1
                    if step % args.every == 0:
                        rows.append((step, rss_mib(), len(inst.recorder),
                                     len(processor._queue), time.monotonic() - start))
                    if step >= args.steps:
                        break
        dropped = inst.dropped
        size_mib = sum(p.stat().st_size for p in Path(tmp).rglob("*.jsonl")) / 2**20
    quarter = max(1, len(rows) // 4)
    first = statistics.median(r[1] for r in rows[:quarter])
    last = statistics.median(r[1] for r in rows[-quarter:])
    lines = [
        "# Soak: memory and queues over a long run",
        "",
        f"- date {datetime.date.today().isoformat()}; {platform.machine()}, "
        f"{os.cpu_count()} cores; Python {platform.python_version()}; torch "
        f"{torch.__version__}; opentelemetry-sdk {metadata.version('opentelemetry-sdk')}",
        f"- {args.steps} steps x 4 micro-batches: {args.steps * 15} spans, {args.steps} log "
        f"lines; {len(rows)} samples; telemetry written {size_mib:.1f} MiB; dropped {dropped}",
        "",
        "| step | RSS MiB | hot-path buffer | span queue | elapsed s |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {s} | {m:.1f} | {b} | {q} | {t:.1f} |" for s, m, b, q, t in rows),
        "",
        f"RSS median, first quarter {first:.1f} MiB, last quarter {last:.1f} MiB: growth "
        f"{last - first:+.1f} MiB; max buffer {max(r[2] for r in rows)}, max span queue "
        f"{max(r[3] for r in rows)} (capacity 2048).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
