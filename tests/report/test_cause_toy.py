"""A new cause of slow steps is one module and one registration (analysis/causes/): a toy
cause, defined here, claims one planted step of a real run, and ``otel-train report`` names it
for that step and for no other; taken out again, the report says what it said before.

The run: the demo, 2 ranks on gloo, rank 1 sleeping 0.6 s before every 5th step's forward
(steps 4 and 9 of 12 stand out). The toy, registered first, claims step ``PLANTED`` (4),
which the report's own causes blame on rank 1's sleep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.report_fixtures import run_demo

from otel_train.analysis import causes
from otel_train.analysis.causes.case import StepCase
from otel_train.analysis.report_model import SlowStep
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS, SLOW_RANK, PLANTED = 12, 1, 4
TOY_PHASE = "toy_planted"


class ToyCause:
    """Claims the steps of ``steps``: rank 0, all of the step in ``toy_planted``."""

    name = "toy"

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.asked: list[int] = []

    def explain(self, case: StepCase) -> SlowStep | None:
        self.asked.append(case.step)
        if case.step not in self.steps:
            return None
        return SlowStep(case.step, case.duration, 0, TOY_PHASE, case.duration, 1.0)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_demo(tmp_path_factory.mktemp("demo"), "cause-toy", STEPS,
                    ("--slow-rank", str(SLOW_RANK), "--slow-s", "0.6"))


def _slow_steps(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[int, dict]:
    """``otel-train report --json``'s slowest steps and warm-up steps, by step."""
    assert main(["report", str(run_dir), "--json", "--top", str(STEPS)]) == 0
    report = json.loads(capsys.readouterr().out)
    return {s["step"]: s for s in report["slow_steps"] + report["warmup_steps"]}


def test_a_registered_cause_names_its_step_and_leaves_when_taken_out(
        run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _slow_steps(run_dir, capsys)
    # the planted step stands out, and the report's own causes name rank 1's sleep
    assert PLANTED in before and before[PLANTED]["rank"] == SLOW_RANK, before.get(PLANTED)
    assert TOY_PHASE not in json.dumps(before)

    toy = ToyCause({PLANTED})
    causes.register(toy, before=causes.CAUSES[0].name)  # asked first
    try:
        assert causes.CAUSES[0] is toy
        claimed = _slow_steps(run_dir, capsys)
        assert main(["report", str(run_dir), "--top", str(STEPS)]) == 0
        terminal = capsys.readouterr().out
    finally:
        causes.unregister(toy.name)
    assert set(claimed) <= set(toy.asked)  # asked first, of every step the report explains
    mine = claimed[PLANTED]
    assert (mine["rank"], mine["phase"]) == (0, TOY_PHASE), mine
    assert mine["cause"].startswith(f"step {PLANTED}: rank 0 toy planted "), mine["cause"]
    assert "toy planted" in terminal
    # every other step is explained as before
    assert set(claimed) == set(before)
    assert {s: v for s, v in claimed.items() if s != PLANTED} == {
        s: v for s, v in before.items() if s != PLANTED}

    assert "toy" not in [c.name for c in causes.CAUSES]
    assert _slow_steps(run_dir, capsys) == before  # taken out: what it said before


def test_order_is_the_rule(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """By default a cause goes just before the last resort, ``own_phase``; registered after
    it, it is never asked (the last resort claims every step), and the report is as before."""
    toy = ToyCause({PLANTED})
    causes.register(toy)
    try:
        assert [c.name for c in causes.CAUSES][-2:] == ["toy", "own_phase"]
    finally:
        causes.unregister(toy.name)
    before = _slow_steps(run_dir, capsys)
    causes.register(toy, before=None)
    try:
        assert causes.CAUSES[-1] is toy
        assert _slow_steps(run_dir, capsys) == before
    finally:
        causes.unregister(toy.name)
    assert toy.asked == []
    with pytest.raises(ValueError):
        causes.register(ToyCause(set()), before="no_such_cause")
