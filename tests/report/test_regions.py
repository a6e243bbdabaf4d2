"""Regions users name (issue 53, item 2): ``otel_train.region("loss")`` marks a region of the
step as a phase of its own: a ``training.region`` span in the step's trace, the step's part
``regions``, a label of the phase histogram, the report's cause of a slow step, and, named
``checkpoint``, the goodput's checkpoint loss.

A real run: two gloo ranks under DDP, a ``loss`` region in every step and a ``metrics`` one
after the optimizer; rank 1 checkpoints for 0.6 s in step 5, inside a ``checkpoint`` region
between forward and backward. Then the API's edges: a bad name, more names than the bound,
a region off the training thread or with no instrumentation.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from support import otlp_files
from support.pipeline_fixtures import free_port
from support.step_parts import assert_parts_add_up

import otel_train
from otel_train import regions as regions_mod
from otel_train import semconv as sc
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS, CHECKPOINT_STEP, CHECKPOINT_S = 12, 5, 0.6


def _rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(8, 16), torch.randn(8, 1)

        @otel_train.region("metrics")
        def metrics(loss: torch.Tensor) -> float:
            time.sleep(0.005)
            return float(loss.detach())

        with otel_train.instrument(model, optimizer=opt, output_dir=out, run_id="regions"):
            for step in range(STEPS):
                out_ = model(x)
                with otel_train.region("loss"):
                    loss = nn.functional.mse_loss(out_, y)
                    time.sleep(0.01)
                if rank == 1 and step == CHECKPOINT_STEP:
                    with otel_train.region("checkpoint"):
                        time.sleep(CHECKPOINT_S)  # torch.save of a large model, say
                loss.backward()
                opt.step()
                opt.zero_grad()
                metrics(loss)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("regions")
    sys.path.insert(0, str(Path(__file__).parent))
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    return otlp_files.only_run_dir(out)


def test_a_region_is_a_span_of_the_step_and_a_part_of_its_own(run_dir: Path) -> None:
    steps = {(s["rank"], s["step"]): s
             for s in assert_parts_add_up(run_dir, {0, 1})}
    spans = otlp_files.spans(run_dir)
    regions = [s for s in spans if s["name"] == sc.SPAN_REGION]
    names = {s["attrs"][sc.ATTR_PHASE] for s in regions}
    assert names == {"loss", "metrics", "checkpoint"}, names
    rank_steps = {(s["attrs"][sc.ATTR_RANK], s["attrs"][sc.ATTR_STEP]): s for s in spans
                  if s["name"] == sc.SPAN_RANK_STEP}
    for span in regions:  # each in its rank's step's trace, under its rank_step span
        owner = rank_steps[(span["attrs"][sc.ATTR_RANK], span["attrs"][sc.ATTR_STEP])]
        assert (span["traceId"], span["parentSpanId"]) == (owner["traceId"], owner["spanId"])
    checkpoint = rank_steps[(1, CHECKPOINT_STEP)]["attrs"]
    assert checkpoint[sc.ATTR_PHASE_TOTAL_PREFIX + "checkpoint"] >= CHECKPOINT_S * 0.95
    part = checkpoint[sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_REGIONS]
    assert part >= CHECKPOINT_S + 0.01 * 0.9, checkpoint
    assert steps[(1, CHECKPOINT_STEP)]["parts"][sc.PART_REGIONS] == pytest.approx(part)
    # the loss region every step: its time is the part's, not "not explained"
    typical = rank_steps[(0, 3)]["attrs"]
    assert typical[sc.ATTR_PHASE_TOTAL_PREFIX + "loss"] >= 0.009, typical
    assert typical[sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_REGIONS] >= 0.009, typical


def test_the_phase_histogram_and_goodput_hold_the_regions(run_dir: Path) -> None:
    phases = {p["attrs"].get(sc.ATTR_PHASE) for p in
              otlp_files.metric_points(run_dir, sc.METRIC_PHASE_DURATION)}
    assert {"loss", "metrics", "checkpoint"} <= phases, phases
    buckets = {}
    for point in otlp_files.metric_points(run_dir, sc.METRIC_GOODPUT_TIME):
        if point["attrs"][sc.ATTR_RANK] == 1:
            buckets[point["attrs"][sc.ATTR_GOODPUT_BUCKET]] = float(point["asDouble"])
    assert buckets[sc.GOODPUT_CHECKPOINT] == pytest.approx(CHECKPOINT_S, rel=0.2), buckets


def test_the_report_names_the_region_that_made_the_step_slow(run_dir: Path, capsys) -> None:
    assert main(["report", str(run_dir), "--json", "--top", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    slow = {s["step"]: s for s in report["slow_steps"]}
    assert CHECKPOINT_STEP in slow, [s["cause"] for s in report["slow_steps"]]
    got = slow[CHECKPOINT_STEP]
    assert (got["rank"], got["phase"], got["segment"]) == (1, sc.PART_REGIONS, "checkpoint"), \
        got["cause"]
    assert got["cause"].startswith(f"step {CHECKPOINT_STEP}: rank 1 region checkpoint "), \
        got["cause"]
    goodput = report["goodput"]
    assert goodput["buckets_s"][sc.GOODPUT_CHECKPOINT] >= CHECKPOINT_S / 2 * 0.9, goodput


def test_a_bad_region_name_is_refused_where_the_region_is_made() -> None:
    for bad in ("", "Loss", "my-loss", "forward", "regions", "x" * 40, 3):
        with pytest.raises(ValueError, match="region"):
            otel_train.region(bad)  # type: ignore[arg-type]


def test_names_beyond_the_bound_are_recorded_as_one_with_one_warning(monkeypatch) -> None:
    monkeypatch.setattr(regions_mod, "_recorded", {})
    monkeypatch.setattr(regions_mod, "_warned", False)
    names = [f"r{i}" for i in range(sc.MAX_REGIONS)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none within the bound
        assert [regions_mod.recorded_name(n) for n in names] == names
    with pytest.warns(RuntimeWarning, match="other_regions"):
        assert regions_mod.recorded_name("one_more") == sc.REGION_OTHER
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert regions_mod.recorded_name("and_another") == sc.REGION_OTHER
        assert regions_mod.recorded_name("r0") == "r0"


def test_a_region_without_instrumentation_or_off_the_training_thread_does_nothing(
        tmp_path) -> None:
    with otel_train.region("loss"):  # nothing active: nothing happens, nothing raised
        pass
    from support import training

    model, opt, loader = training.setup(batches=3)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="offthread",
                               console_log_level="warning"):
        for x, y in loader:
            loss = torch_loss(model, x, y)
            worker = threading.Thread(target=lambda: otel_train.region("elsewhere").__enter__())
            worker.start()
            worker.join()
            loss.backward()
            opt.step()
            opt.zero_grad()
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert not [s for s in spans if s["name"] == sc.SPAN_REGION]
    assert {s["attrs"][sc.ATTR_STEP] for s in spans if s["name"] == sc.SPAN_RANK_STEP} == {
        0, 1, 2}


def torch_loss(model, x, y):
    import torch

    return torch.nn.functional.mse_loss(model(x), y)


def test_the_optimizer_step_inside_a_region_still_ends_the_step(tmp_path) -> None:
    """A region around ``opt.step()`` (a user's "update" block): the optimizer's step ends the
    region and the step, so steps stay steps; a forward inside a region is the region's."""
    from support import training

    model, opt, loader = training.setup(batches=4)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="update",
                               console_log_level="warning"):
        for x, y in loader:
            with otel_train.region("evaluate"):
                model(x)  # an evaluation's forward: the region's
            loss = torch_loss(model, x, y)
            loss.backward()
            with otel_train.region("update"):
                opt.step()
            opt.zero_grad()
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert {s["attrs"][sc.ATTR_STEP] for s in spans if s["name"] == sc.SPAN_RANK_STEP} == {
        0, 1, 2, 3}
    forwards = [s for s in spans if s["name"] == sc.SPAN_FORWARD]
    assert len(forwards) == 4, len(forwards)  # one a step: the evaluation's are not forwards
    assert len([s for s in spans if s["name"] == sc.SPAN_OPTIMIZER]) == 4
    assert {s["attrs"][sc.ATTR_PHASE] for s in spans if s["name"] == sc.SPAN_REGION} >= {
        "evaluate"}
