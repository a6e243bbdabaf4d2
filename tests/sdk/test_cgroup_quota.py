"""CPU throttling per step, under a real CFS quota on one rank (issue 16, item 2).

Two gloo ranks train the same CPU-bound steps; rank 1 first moves itself into a cgroup of
its own with a CPU quota of 10% of one CPU (cgroup v1's cpu controller, or v2's ``cpu.max``),
which the kernel enforces by throttling it. Asserts: rank 1's throttled time is positive and
rank 0's zero, no step's ``training.cpu.throttled_s`` exceeds the step's duration, and the
report and the checklist name rank 1. Needs root and a writable cgroup hierarchy (this
project's machines have both; CI fails rather than skips without them).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from support import otlp_files
from support.binaries import binaries_required

from otel_train import semconv

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def _quota_root() -> tuple[str, Path] | None:
    if os.geteuid() != 0:
        return None
    if (V1 / "cpu.cfs_quota_us").exists() and os.access(V1, os.W_OK):
        return "v1", V1
    if (V2 / "cgroup.controllers").exists() and "cpu" in (V2 / "cgroup.controllers").read_text():
        return "v2", V2
    return None


def _enter_quota(kind: str, root: Path, name: str) -> Path:
    """Move this process into a new cgroup limited to 10% of a CPU; its directory."""
    group = root / name
    group.mkdir()
    if kind == "v1":
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("10000")
    else:
        (group / "cpu.max").write_text("10000 100000")
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


def _leave_quota(root: Path, group: Path) -> None:
    (root / "cgroup.procs").write_text(str(os.getpid()))
    group.rmdir()


def _rank(rank: int, port: int, out: str, kind: str, root: str, name: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import otel_train

    group = _enter_quota(kind, Path(root), name) if rank == 1 else None
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                          # rank 1's exporter process shares its 10% of a CPU: on a loaded
                          # machine its last flush can outlast the default 10 s, and this
                          # test is about throttling, not the shutdown budget
                          OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="60")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(256, 512), torch.randn(256, 1)
        with otel_train.instrument(model, optimizer=opt, output_dir=out, run_id="quota"):
            for _ in range(8):
                for _ in range(20):  # CPU-bound work inside the step, ~20 ms unthrottled
                    nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        dist.destroy_process_group()
    finally:
        if group is not None:
            _leave_quota(Path(root), group)


def test_a_quotad_rank_is_throttled_per_step_and_named(tmp_path) -> None:
    found = _quota_root()
    if found is None:
        if binaries_required():
            pytest.fail("no writable cgroup cpu controller (root needed)")
        pytest.skip("no writable cgroup cpu controller (root needed)")
    kind, root = found
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = f"otel-train-test-{uuid.uuid4().hex[:8]}"
    sys.path.insert(0, str(Path(__file__).parent))
    mp.start_processes(_rank, args=(port, str(tmp_path), kind, str(root), name), nprocs=2,
                       join=True, start_method="spawn")
    assert not (root / name).exists()
    run_dir = otlp_files.only_run_dir(tmp_path)
    steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    by_rank: dict[int, list[dict]] = {0: [], 1: []}
    for span in steps:
        by_rank[int(span["attrs"][semconv.ATTR_RANK])].append(span)
    assert len(by_rank[0]) == len(by_rank[1]) == 8
    throttled = {r: [float(s["attrs"][semconv.ATTR_CPU_THROTTLED]) for s in spans]
                 for r, spans in by_rank.items()}
    assert sum(throttled[1]) > 0, throttled
    assert sum(throttled[0]) == 0, throttled
    for spans in by_rank.values():
        for span in spans:
            assert (float(span["attrs"][semconv.ATTR_CPU_THROTTLED])
                    <= float(span["attrs"][semconv.ATTR_STEP_DURATION]) + 1e-9), span["attrs"]

    from otel_train.analysis.build import build_report
    from otel_train.check.rundir import check_run_dir
    from otel_train.check.verdicts import PASS

    report = build_report(run_dir)
    worst = max(report.resources, key=lambda r: r.cpu_throttled_s or 0.0)
    assert worst.rank == 1 and (worst.cpu_throttled_s or 0) > 0
    # throttling named as the cause (issue 19): of the slowest steps and of the straggler
    slowest = report.slow_steps[0]
    assert slowest.rank == 1 and (slowest.throttled_s or 0) > 0, slowest.cause
    assert "CPU-throttled" in slowest.cause and "CPU quota" in slowest.cause, slowest.cause
    assert report.straggler == 1 and (report.straggler_throttled_s or 0) > 0, report.straggler
    from otel_train.analysis.terminal import straggler_lines

    assert "CPU quota throttled it" in straggler_lines(report)[0], straggler_lines(report)
    row = next(r for r in check_run_dir(run_dir) if r.id == "cpu_throttling_measured")
    assert row.status == PASS and "throttled: rank 1" in row.evidence, row
