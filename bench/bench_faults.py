"""Step time under collector faults, as a ratio to the same run with a healthy collector.

One process trains a small model (a step of a few milliseconds) exporting OTLP to: a healthy
collector (built from ``collector/``, config ``local.yaml``), no collector at all, a link that
accepts connections and never answers, and a collector that refuses everything (its
memory_limiter at 1 MiB). Blocks of steps under each condition are interleaved (order rotated
each round), so drift hits all alike. A block lasts ``--block-s`` seconds of training (3 s: the
first span export is due after 200 ms, a stalled export times out after 1 s), and each faulty
block must have hit its fault *inside* the timed steps: the exporter's live drop reports must
show losses before the block ends (and the healthy block none), or the benchmark fails, since
a block that ends before the first export measures nothing. Per condition: the median, p99
and max step time, and the paired ratio to the healthy block of the same round with its 95%
bootstrap interval (bench/overhead_stats.py). Target (issue 10): ratio median under 1.02 for
every fault; exits 1 on a miss or an unhit fault.

Usage: ``python bench/bench_faults.py [--rounds 6] [--block-s 3] [--out FILE.md]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import overhead_stats as stats  # noqa: E402
from support import pipeline_fixtures as pf  # noqa: E402
from support.collector_faults import REFUSING_CONFIG, StallingProxy  # noqa: E402

import otel_train  # noqa: E402

TARGET_RATIO = 1.02


def _steps(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader,
           seconds: float) -> list[float]:
    """Train for ``seconds``; each step's time."""
    times = []
    it = iter(loader)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    return times


def _block(endpoint: str, model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader,
           seconds: float) -> tuple[list[float], int]:
    """Step times of one block, and the telemetry dropped before its last step ended."""
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the faulty ones warn about drops, by design
        with otel_train.instrument(model, console_log_level="error") as inst:
            times = _steps(model, opt, loader, seconds)
            pipeline = inst._pipeline  # live: the exporter process's reports so far
            poll = getattr(pipeline, "_take_replies", None)
            if poll is not None and getattr(pipeline, "_sock", None) is not None:
                with pipeline._send_lock:
                    poll(pipeline._inbox.poll(pipeline._sock))
            dropped = sum(inst.emitter.total_dropped().values())
    return times, dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block-s", type=float, default=3.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.update(OTEL_BSP_SCHEDULE_DELAY="200", OTEL_METRIC_EXPORT_INTERVAL="1000",
                      OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="2")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1)),
                        batch_size=64)
    _steps(model, opt, loader, 0.5)
    steps: dict[str, list[float]] = {}  # every step of every block
    medians: dict[str, list[float]] = {}  # per round
    dropped: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        refusing = work / "refusing.yaml"
        refusing.write_text(REFUSING_CONFIG)
        proxy = StallingProxy()
        with pf.running_collector(pf.CONFIGS_DIR / "local.yaml", work / "healthy") as healthy, \
                pf.running_collector(refusing, work / "refusing") as refuser:
            endpoints = {
                "healthy": healthy.otlp_http,
                "absent": f"http://127.0.0.1:{pf.free_port()}",
                "stalled": f"http://127.0.0.1:{proxy.port}",
                "refusing": refuser.otlp_http,
            }
            names = list(endpoints)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    times, lost = _block(endpoints[name], model, opt, loader, args.block_s)
                    steps.setdefault(name, []).extend(times)
                    medians.setdefault(name, []).append(statistics.median(times))
                    dropped.setdefault(name, []).append(lost)
        proxy.close()
    missed = []
    lines = [
        "# Step time under collector faults (ratio to a healthy collector)",
        "",
        f"- date {datetime.date.today().isoformat()}; {platform.machine()}, {os.cpu_count()} "
        f"cores; Python {platform.python_version()}; torch {torch.__version__}; "
        f"opentelemetry-sdk {metadata.version('opentelemetry-sdk')}",
        f"- {args.rounds} rounds, one block of {args.block_s:g} s of training per condition and "
        "round (order rotated); OTLP/HTTP; export timeout 1 s; every step sampled; the "
        "exporter process (default)",
        f"- target: paired ratio median < {TARGET_RATIO} for every fault, and every faulty "
        "block dropped telemetry before its last step (the fault was hit while timed)",
        "",
        "| condition | steps | median ms | p99 ms | max ms | ratio to healthy, median [95% CI] "
        "| blocks that hit the fault before they ended |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in medians:
        summary = stats.summarize(steps[name])
        hit = sum(1 for d in dropped[name] if d > 0)
        if name == "healthy":
            ratio_cell = "1"
            hit_cell = f"{hit} of {len(dropped[name])} dropped anything"
            if hit:
                missed.append(f"healthy: {hit} blocks dropped telemetry")
        else:
            ratio = stats.paired_ratio(medians["healthy"], medians[name])
            ratio_cell = (f"{ratio.median_ratio:.3f} [{ratio.ci_low:.3f}, "
                          f"{ratio.ci_high:.3f}]")
            hit_cell = f"{hit} of {len(dropped[name])}"
            if ratio.median_ratio >= TARGET_RATIO:
                missed.append(f"{name}: ratio {ratio.median_ratio:.3f}")
            if hit < len(dropped[name]):
                missed.append(f"{name}: {len(dropped[name]) - hit} blocks never hit the fault")
        lines.append(f"| {name} | {summary.n} | {1e3 * summary.median:.2f} | "
                     f"{1e3 * summary.p99:.2f} | {1e3 * summary.max:.2f} | {ratio_cell} | "
                     f"{hit_cell} |")
    lines += ["", f"verdict: {'; '.join(missed) or 'all targets met'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
