"""Naming the cause, not just the rank (issue 19): untimed time explained to the line of
code, a slow ``__getitem__`` found in the data wait, and what the report cannot know.

Real runs: two gloo ranks under DDP where rank 1 computes for ~0.3 s between forward and
backward in some steps and rank 0's dataset is slow for one batch; one process whose slow
batch comes from a DataLoader worker; one with sampling off. Checked from the exported spans
(the ``training.gap`` / ``training.data_wait`` events of ``training.rank_step``) and from
``otel-train report --json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from support import otlp_files
from support.pipeline_fixtures import free_port

from otel_train import semconv as sc
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS = 8
HEAVY_STEPS = (3, 6)  # rank 1 computes between forward and backward
SLOW_ITEM_STEP = 5  # rank 0's dataset sleeps for this step's batch
HEAVY_S, SLOW_ITEM_S = 0.3, 0.4


def heavy(seconds: float) -> float:
    """Pure-Python work the way a stray metric loop looks: the training thread holds the
    interpreter, no phase is open."""
    total, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += sum(i * 0.5 for i in range(200))
    return total


class SlowItems:
    """A map-style dataset whose item ``slow_index`` takes ``SLOW_ITEM_S`` to load."""

    def __init__(self, n: int, slow_index: int | None) -> None:
        self.n, self.slow_index = n, slow_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        import torch

        if index == self.slow_index:
            time.sleep(SLOW_ITEM_S)  # the slow read
        return torch.full((16,), float(index)), torch.ones(1)


def _train(out: str, run_id: str, rank: int, workers: int, slow_index: int | None,
           heavy_steps: tuple[int, ...] = ()) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    import otel_train

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    if torch.distributed.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(SlowItems(STEPS * 2, slow_index), batch_size=2, num_workers=workers)
    with otel_train.instrument(model, optimizer=opt, output_dir=out, run_id=run_id):
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            if step in heavy_steps:
                heavy(HEAVY_S)
            loss.backward()
            opt.step()
            opt.zero_grad()


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        _train(out, "causes", rank, 0, SLOW_ITEM_STEP * 2 if rank == 0 else None,
               HEAVY_STEPS if rank == 1 else ())
    finally:
        dist.destroy_process_group()


def _report_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["report", str(run_dir), "--json", "--top", str(STEPS)]) == 0
    return json.loads(capsys.readouterr().out)


def _events(run_dir: Path) -> dict[tuple[int, int], list[dict]]:
    """(rank, step) -> the events of that rank_step span, attributes decoded."""
    out = {}
    for span in otlp_files.spans(run_dir):
        if span["name"] == sc.SPAN_RANK_STEP:
            key = (int(span["attrs"][sc.ATTR_RANK]), int(span["attrs"][sc.ATTR_STEP]))
            out[key] = [{"name": e["name"], **otlp_files.attrs(e)}
                        for e in span.get("events", [])]
    return out


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("causes")
    sys.path.insert(0, str(Path(__file__).parent))
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=2, join=True, start_method="spawn")
    return otlp_files.only_run_dir(out)


def test_untimed_work_is_an_event_with_its_segment_and_line(ddp_run: Path) -> None:
    events = _events(ddp_run)
    for step in HEAVY_STEPS:
        gaps = [e for e in events[(1, step)] if e["name"] == sc.EVENT_GAP]
        assert gaps, events[(1, step)]
        gap = max(gaps, key=lambda e: e[sc.ATTR_GAP_DURATION])
        assert gap[sc.ATTR_GAP_SEGMENT] == "between forward and backward", gap
        assert HEAVY_S * 0.9 <= gap[sc.ATTR_GAP_DURATION] <= HEAVY_S * 3, gap
        assert gap[sc.ATTR_GAP_SAMPLES] >= 1, gap
        assert "heavy" in gap[sc.ATTR_CODE_FUNCTION], gap
        assert gap[sc.ATTR_CODE_FILE] == __file__, gap
        assert "heavy" in gap[sc.ATTR_CODE_STACKTRACE] and "_train" in gap[
            sc.ATTR_CODE_STACKTRACE], gap
    # rank 0 computed nothing between its phases in those steps: no such event
    for step in HEAVY_STEPS:
        assert not [e for e in events[(0, step)] if e["name"] == sc.EVENT_GAP
                    and e[sc.ATTR_GAP_DURATION] >= HEAVY_S / 2], events[(0, step)]


def test_the_report_names_the_segment_and_the_function(ddp_run: Path, capsys) -> None:
    slow = {s["step"]: s for s in _report_json(ddp_run, capsys)["slow_steps"]}
    for step in HEAVY_STEPS:
        cause = slow[step]
        assert cause["rank"] == 1 and cause["phase"] == "untimed", cause
        assert cause["segment"] == "between forward and backward", cause
        assert cause["location"].startswith("heavy") and "test_report_causes.py:" in cause[
            "location"], cause
        assert cause["unexplained"] is None, cause
        assert "between forward and backward" in cause["cause"] and "heavy" in cause["cause"]


def test_a_slow_getitem_is_found_in_the_data_wait(ddp_run: Path, capsys) -> None:
    waits = [e for e in _events(ddp_run)[(0, SLOW_ITEM_STEP)] if e["name"] == sc.EVENT_DATA_WAIT]
    assert waits and waits[0][sc.ATTR_GAP_DURATION] >= SLOW_ITEM_S * 0.9, waits
    assert waits[0][sc.ATTR_CODE_FUNCTION] == "SlowItems.__getitem__", waits
    slow = {s["step"]: s for s in _report_json(ddp_run, capsys)["slow_steps"]}
    cause = slow[SLOW_ITEM_STEP]
    assert cause["rank"] == 0 and cause["phase"] == "data_wait", cause
    assert cause["location"].startswith("SlowItems.__getitem__() at test_report_causes.py:")


def test_a_slow_worker_is_named_by_its_id(tmp_path: Path, capsys) -> None:
    # one process; batch SLOW_ITEM_STEP comes from worker SLOW_ITEM_STEP % 2
    _train(str(tmp_path), "worker", 0, 2, SLOW_ITEM_STEP * 2)
    run_dir = otlp_files.only_run_dir(tmp_path)
    waits = [e for events in _events(run_dir).values() for e in events
             if e["name"] == sc.EVENT_DATA_WAIT and e[sc.ATTR_GAP_DURATION] >= 0.3]
    assert waits, _events(run_dir)
    assert {e[sc.ATTR_DATA_WORKER] for e in waits} == {SLOW_ITEM_STEP % 2}, waits
    # the training thread only waited: no user code of the dataset was on its stack
    assert all(sc.ATTR_CODE_FUNCTION not in e for e in waits), waits
    slowest = _report_json(run_dir, capsys)["slow_steps"][0]
    assert slowest["phase"] == "data_wait" and slowest["worker"] == SLOW_ITEM_STEP % 2
    assert f"waiting for DataLoader worker {SLOW_ITEM_STEP % 2}" in slowest["cause"]


def test_untimed_time_nothing_sampled_is_said_to_be_unexplained(tmp_path: Path, capsys,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("OTEL_TRAIN_GAP_SAMPLE_MS", "0")
    _train(str(tmp_path), "unsampled", 0, 0, None, (2,))
    run_dir = otlp_files.only_run_dir(tmp_path)
    slowest = _report_json(run_dir, capsys)["slow_steps"][0]
    assert slowest["step"] == 2 and slowest["segment"] == "between forward and backward"
    assert slowest["location"] is None
    assert slowest["unexplained"] == "nothing was sampled there", slowest
    assert "not explained: nothing was sampled there" in slowest["cause"]
