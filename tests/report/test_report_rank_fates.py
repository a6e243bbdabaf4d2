"""A crashed or killed rank is named, with its step and what it raised, and is not taken for
a straggler nor for a sampler's doing: a user's torchrun script (3 gloo ranks, DDP) in which
rank 1 raises at step 5, or SIGKILLs itself there; ``otel-train report`` and
``otel-train check`` on what the ranks exported."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.failing_train import SECRET

from otel_train.cli import main

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "failing_train.py"

pytestmark = pytest.mark.slow


def run_failing(tmp_path: Path, fail: str) -> Path:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TORCHELASTIC_")) and k != "TRACEPARENT"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), FAIL=fail,
               FAIL_RANK="1", FAIL_STEP="5", OTEL_TRAIN_LOG_LEVEL="error",
               # a loaded 2-core machine must not cut the failing rank's last flush (its run
               # span says how it ended): what is under test is the report, not the bound
               OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="30")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    # kept beside the run: what each rank printed as it ended, for a failure's reader
    (tmp_path / "torchrun.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    assert done.returncode != 0, "rank 1 failed: torchrun must say so"
    return tmp_path / "fates"


def report_of(run_dir: Path) -> tuple[dict, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["report", str(run_dir), "--json"])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        main(["report", str(run_dir)])
    return json.loads(out.getvalue()), text.getvalue()


def check_of(run_dir: Path) -> tuple[int, dict[str, dict], str]:
    """The exit status, the items by id, and the whole JSON text of ``otel-train check``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["check", str(run_dir), "--json"])
    items = {row["id"]: row for row in json.loads(out.getvalue())["checks"]}
    return status, items, out.getvalue()


@pytest.fixture(scope="module")
def crashed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_failing(tmp_path_factory.mktemp("crash"), "raise")


@pytest.fixture(scope="module")
def killed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_failing(tmp_path_factory.mktemp("kill"), "kill")


@pytest.fixture(scope="module")
def crashed(crashed_dir: Path) -> tuple[dict, str]:
    return report_of(crashed_dir)


@pytest.fixture(scope="module")
def killed(killed_dir: Path) -> tuple[dict, str]:
    return report_of(killed_dir)


def test_a_rank_that_raised_is_named_first_with_its_step_and_exception(crashed) -> None:
    report, _ = crashed
    first = report["rank_fates"][0]
    assert (first["rank"], first["fate"], first["step"]) == (1, "crashed", 5), first
    assert first["error"].startswith("RuntimeError: loss is NaN"), first


def test_the_crash_message_is_scrubbed(crashed) -> None:
    report, text = crashed
    assert SECRET not in json.dumps(report) and SECRET not in text
    assert "[REDACTED]" in report["rank_fates"][0]["error"]


def test_the_peers_are_said_to_have_failed_or_stopped_after_it(crashed) -> None:
    report, _ = crashed
    others = {f["rank"]: f for f in report["rank_fates"][1:]}
    assert set(others) <= {0, 2}, others
    assert all(f["after"] == 1 and f["fate"] in ("failed_after", "stopped")
               for f in others.values()), others


def test_a_crashed_rank_is_not_the_straggler(crashed) -> None:
    report, text = crashed
    assert report["straggler"] != 1, report["straggler"]
    assert "rank 1 crashed in step 5: RuntimeError: loss is NaN" in text, text[:2000]


def test_a_killed_rank_is_named_with_its_last_step(killed) -> None:
    report, text = killed
    first = report["rank_fates"][0]
    assert (first["rank"], first["fate"], first["last_step"]) == (1, "vanished", 4), first
    assert "rank 1 vanished: no telemetry after step 4" in text, text[:2000]
    assert all(f["after"] == 1 for f in report["rank_fates"][1:]), report["rank_fates"]


def test_check_names_the_crashed_rank_and_does_not_blame_the_sampler(crashed_dir) -> None:
    status, items, text = check_of(crashed_dir)
    assert status == 1, "a run whose rank crashed does not pass"
    finished = items["ranks_finished"]
    assert finished["status"] == "fail", finished
    assert finished["evidence"].startswith(
        "rank 1 crashed in step 5: RuntimeError: loss is NaN"), finished
    assert items["sampling_consistency"]["status"] == "pass", items["sampling_consistency"]
    assert "ratio sampler" not in text and SECRET not in text, text


def test_check_names_the_killed_rank_with_its_last_step(killed_dir) -> None:
    status, items, text = check_of(killed_dir)
    assert status == 1
    finished = items["ranks_finished"]
    assert finished["status"] == "fail", finished
    assert finished["evidence"].startswith("rank 1 vanished: no telemetry after step 4"), finished
    assert items["sampling_consistency"]["status"] == "pass", items["sampling_consistency"]
    assert "ratio sampler" not in text, text
