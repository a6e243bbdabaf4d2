"""The first numbers a user reads add up (issue 51): on a real demo run (2 gloo ranks, FSDP2,
torch.compile), every rank step's parts add up to its ``training.rank_step`` span and the
counter of the parts to the step histogram's sum on every rank, and the demo's headline
step per rank is the mean steady ``training.rank_step``, its columns adding up to it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.step_parts import assert_parts_add_up, rank_steps

from otel_train import semconv as sc
from otel_train.analysis.metrics import read_metrics

pytestmark = pytest.mark.slow


def _table_rows(stdout: str) -> dict[int, list[float]]:
    """The demo table's rows: rank -> [step, column, column, ...] in ms."""
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) >= 3 and all(re.fullmatch(r"\d+(\.\d+)?", c) for c in cells):
            rows[int(cells[0])] = [float(c) for c in cells[1:]]
    return rows


#: the demo's default (FSDP2, compiled) and DDP run eagerly
SETTINGS = {"fsdp2-compiled": [], "ddp-eager": ["--ddp", "--no-compile"]}


@pytest.fixture(scope="module", params=list(SETTINGS))
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    env["COLUMNS"] = "200"
    done = subprocess.run(
        [sys.executable, "-m", "otel_train.cli", "demo", "--steps", "14", "--batch-size", "8",
         "--output-dir", str(out), *SETTINGS[request.param]],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Path(result["run_dir"]), done.stdout, request.param


def test_every_rank_step_s_parts_add_up_to_its_span(demo: tuple[Path, str, str]) -> None:
    steps = assert_parts_add_up(demo[0], {0, 1})
    assert len(steps) == 28
    compiled = any(s["parts"][sc.PART_COMPILE] > 0 for s in steps)
    assert compiled == (demo[2] == "fsdp2-compiled")
    if demo[2] == "fsdp2-compiled":  # FSDP2's all-gathers block on gloo: exposed, and a
        # part of their own inside forward and backward, not beside them (DDP's all-reduce
        # of this small model hides under backward)
        assert all(s["parts"][sc.PART_EXPOSED_COMM] > 0 for s in steps)


def test_the_demo_s_step_is_the_mean_steady_rank_step_and_its_columns_add_up(
        demo: tuple[Path, str, str]) -> None:
    run_dir, stdout, _ = demo
    steps = rank_steps(run_dir)
    warm = {min(s["step"] for s in steps)} | {
        s["step"] for s in steps if s["parts"][sc.PART_COMPILE] > 0}
    rows = _table_rows(stdout)
    assert set(rows) == {0, 1}, stdout[-3000:]
    for rank, (step_ms, *columns_ms) in rows.items():
        steady = [s["duration"] for s in steps if s["rank"] == rank and s["step"] not in warm]
        assert steady
        assert step_ms / 1e3 == pytest.approx(sum(steady) / len(steady), rel=0.02)
        # each column is rounded to 0.1 ms
        assert sum(columns_ms) == pytest.approx(step_ms, abs=0.05 * (len(columns_ms) + 1))


def test_the_goodput_of_every_rank_holds_its_steps_and_its_start_up(
        demo: tuple[Path, str, str]) -> None:
    metrics = read_metrics(demo[0])
    steps = metrics.per_rank_total(sc.METRIC_STEP_DURATION)
    goodput = metrics.per_rank_total(sc.METRIC_GOODPUT_TIME)
    for rank, seconds in steps.items():
        assert goodput[rank] > seconds
