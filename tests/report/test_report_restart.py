"""A job its launcher restarts under the same run id (torchrun --max-restarts, a PyTorchJob's
restart policy) is one run of two attempts: the report counts both attempts' steps, runs its
wall clock from the first attempt's start to the last one's end, and names the time between
the attempts as the goodput's restart loss (issue 51). Two real demo runs, one run id, one
output folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_train.analysis.build import build_report

pytestmark = pytest.mark.slow
STEPS = 6


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("restart")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    for _ in range(2):  # the launcher's second attempt: the same run id, the same folder
        done = subprocess.run(
            [sys.executable, "-m", "otel_train.cli", "demo", "--steps", str(STEPS),
             "--no-compile", "--workers", "0", "--run-id", "restarted", "--output-dir",
             str(out), "--no-log-lines"], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    return out / "restarted"


def test_both_attempts_steps_are_counted(restarted: Path) -> None:
    report = build_report(restarted, top=0, timelines=0)
    assert report.trained_steps == 2 * STEPS


def test_the_time_between_the_attempts_is_the_restart_loss(restarted: Path) -> None:
    goodput = build_report(restarted, top=0, timelines=0).goodput
    assert goodput.source == "metrics"
    assert goodput.buckets_s["restart"] > 0
    assert goodput.buckets_s["other"] == 0
    assert sum(goodput.buckets_s.values()) == pytest.approx(goodput.wall_s, rel=1e-9)
    # the wall clock holds both attempts: more than either rank's two accounts
    assert goodput.wall_s > max(r.total_s for r in goodput.ranks)
