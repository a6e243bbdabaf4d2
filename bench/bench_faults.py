"""Step time under collector faults, as a ratio to the same run with a healthy collector.

One process trains a small model (a step of a few milliseconds) exporting OTLP to: a healthy
collector (built from ``collector/``, config ``local.yaml``), no collector at all, a link that
accepts connections and never answers, and a collector that refuses everything (its
memory_limiter at 1 MiB). Blocks of steps under each condition are interleaved, so drift
hits all alike; the ratio of median step times against the healthy one is reported with its
spread over blocks. Target (issue 10): under 1.02.

Usage: ``python bench/bench_faults.py [--blocks 5] [--steps 150] [--out FILE.md]``
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

import pipeline_fixtures as pf  # noqa: E402
from test_reliability_collector import _REFUSING_CONFIG, _StallingProxy  # noqa: E402

import otel_train  # noqa: E402


def _steps(model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader, n: int) -> float:
    times = []
    it = iter(loader)
    for _ in range(n):
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
    return statistics.median(times)


def _block(endpoint: str, model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader,
           steps: int) -> float:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the faulty ones warn about drops, by design
        with otel_train.instrument(model, console_log_level="error"):
            return _steps(model, opt, loader, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
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
    _steps(model, opt, loader, 50)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        refusing = work / "refusing.yaml"
        refusing.write_text(_REFUSING_CONFIG)
        proxy = _StallingProxy()
        with pf.running_collector(pf.CONFIGS_DIR / "local.yaml", work / "healthy") as healthy, \
                pf.running_collector(refusing, work / "refusing") as refuser:
            endpoints = {
                "healthy": healthy.otlp_http,
                "absent": f"http://127.0.0.1:{pf.free_port()}",
                "stalled": f"http://127.0.0.1:{proxy.port}",
                "refusing": refuser.otlp_http,
            }
            for _ in range(args.blocks):
                for name, endpoint in endpoints.items():
                    results.setdefault(name, []).append(
                        _block(endpoint, model, opt, loader, args.steps))
        proxy.close()
    base = results["healthy"]
    lines = [
        "# Step time under collector faults (ratio to a healthy collector)",
        "",
        f"- date {datetime.date.today().isoformat()}; {platform.machine()}, {os.cpu_count()} "
        f"cores; Python {platform.python_version()}; torch {torch.__version__}; "
        f"opentelemetry-sdk {metadata.version('opentelemetry-sdk')}",
        f"- {args.blocks} interleaved blocks of {args.steps} steps per condition; OTLP/HTTP; "
        "export timeout 1 s; every step sampled",
        "",
        "| condition | median step ms (blocks) | ratio to healthy, median (min–max) |",
        "| --- | --- | --- |",
    ]
    for name, values in results.items():
        ratios = [v / b for v, b in zip(values, base)]
        lines.append(f"| {name} | {statistics.median(values) * 1e3:.2f} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
