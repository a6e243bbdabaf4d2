"""A run recorded under the names before 0.3.0 still reports (issue 54, item 1).

``tests/data/run-0.2.0.tar.gz`` is a real run directory: the demo (2 gloo ranks, FSDP2,
compiled, 12 steps) run by otel-train 0.2.0, whose spans were ``train.*`` and whose
collective and compile attributes had no prefix. ``run-0.2.0.report.json.gz`` is what
0.2.0's own ``otel-train report --json`` printed for it. Today's readers must give the same
report, the span names in it made the new ones, and ``check`` the same verdicts.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from otel_train import semconv
from otel_train.analysis import legacy
from otel_train.analysis.build import build_report

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def old_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("legacy")
    with tarfile.open(DATA / "run-0.2.0.tar.gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 and later
            tar.extractall(out, filter="data")
        else:
            tar.extractall(out)
    return out / "legacy-0-2"


def _renamed(value: Any) -> Any:
    """0.2.0's report with every old name in it made the new one."""
    if isinstance(value, dict):
        return {k: _renamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v) for v in value]
    if isinstance(value, str):
        return legacy.upgrade_name(value)
    return value


_ADDED = frozenset({"regions", "gpu_outside_phases", "checkpoint", "ranks_of"})


def _without_added(now: Any, recorded: Any) -> Any:
    """``now`` without the keys of ``_ADDED`` that ``recorded`` lacks, each asserted 0 (or
    None: a timeline's ``ranks_of``, said only of a step of more ranks than it shows)."""
    if isinstance(now, dict):  # one 0.2.0 had not at all (a timeline of another step)
        recorded = recorded if isinstance(recorded, dict) else {}
        out = {}
        for key, value in now.items():
            if key in _ADDED and key not in recorded:
                assert value in (0, None), (key, value)
                continue
            out[key] = _without_added(value, recorded.get(key))
        return out
    if isinstance(now, list) and isinstance(recorded, list):
        return [_without_added(a, b) for a, b in zip(now, recorded)] + [
            _without_added(a, None) for a in now[len(recorded):]]
    return now


def _report(run_dir: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "otel_train.cli", "report", str(run_dir),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_old_files_hold_the_old_names(old_run):
    traces = b"".join(p.read_bytes() for p in old_run.glob(semconv.TRACES_GLOB))
    assert b'"name":"train.rank_step"' in traces and b'"key":"compile.reason"' in traces
    assert b'"training.rank_step"' not in traces


def test_an_old_run_reports_as_it_did_with_the_new_names(old_run):
    recorded = json.loads(gzip.decompress((DATA / "run-0.2.0.report.json.gz").read_bytes()))
    now = _report(old_run)
    assert now["trained_steps"] == 12 and len(now["rank_rows"]) == 2
    assert now["compile"], "the compile spans were read under their new names"
    assert now["collectives"], "the collectives were read under their new names"
    labels = {bar["label"] for timeline in now["timelines"] for bar in timeline["bars"]}
    assert semconv.SPAN_FORWARD in labels and "train.forward" not in labels
    recorded = _renamed(recorded)
    # parts and buckets added since 0.2.0 (regions, gpu_outside_phases, checkpoint: issue
    # 53) are new keys that an old run holds nothing in: 0 wherever 0.2.0 had no such key;
    # so is a timeline's ranks_of (issue 52), None for a step of two ranks
    now = _without_added(now, recorded)
    # one change made on purpose since 0.2.0: a step's duration is its slowest rank's step
    # (0.2.0 took rank 0's, the training.step span). What it decides (which steps are the
    # slowest, their durations, their causes' share of them) may differ; all else may not
    changed = ("slow_steps", "warmup_steps", "timelines")
    assert {k: v for k, v in now.items() if k not in changed} == \
        {k: v for k, v in recorded.items() if k not in changed}
    assert [e["step"] for e in now["warmup_steps"]] == [e["step"] for e in recorded["warmup_steps"]]
    for key in changed:
        was = {entry["step"]: entry for entry in recorded[key]}
        for entry in now[key]:
            if entry["step"] in was:  # the same step: as long or longer, the same cause
                assert entry["duration_s"] >= was[entry["step"]]["duration_s"], (key, entry)
                assert _without_duration(entry) == _without_duration(was[entry["step"]])


def _without_duration(entry: dict[str, Any]) -> dict[str, Any]:
    """A slow step (or timeline) less what its duration decides: the duration, its cause's
    share of it (a field and the words ``93% of step``)."""
    import re

    out = {k: v for k, v in entry.items() if k not in ("duration_s", "share")}
    if "cause" in out:
        out["cause"] = re.sub(r"\d+% of step", "N% of step", out["cause"])
    return out


def test_without_the_upgrade_the_old_run_would_not_read(old_run, monkeypatch):
    """The test above, shown to fail: the readers without legacy.upgrade find no step."""
    with_upgrade = build_report(old_run).to_dict()
    monkeypatch.setattr(legacy, "upgrade", lambda line: line)
    without = build_report(old_run).to_dict()
    assert with_upgrade["rank_rows"] and with_upgrade["compile"]
    assert without != with_upgrade
    assert not without["rank_rows"]  # no training.rank_step span read


def test_check_gives_an_old_run_the_verdicts_it_had(old_run):
    done = subprocess.run([sys.executable, "-m", "otel_train.cli", "check", str(old_run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # what 0.2.0's check said of this run
    assert "PASS: 10 passed, 0 failed, 2 not applicable" in done.stdout, done.stdout


def test_a_new_line_is_left_as_it_is():
    """A line written from 0.3.0 on is not rewritten, even where a user's words look like an
    old name; a line of 0.2.0 is."""
    scope = b'"scope":{"name":"otel_train","version":"%s"}'
    new = b'{"resourceLogs":[{' + scope % b"0.3.0" + b',"body":"train.step"}]}'
    old = b'{"resourceLogs":[{' + scope % b"0.2.0" + \
        b',"name":"train.step","attributes":[{"key":"signal"},{"key":"compile.time.x"}],' \
        b'"body":{"stringValue":"signal"}}]}'
    assert legacy.upgrade(new) is new
    upgraded = legacy.upgrade(old)
    assert b'"name":"training.step"' in upgraded
    assert b'{"key":"otel_train.signal"}' in upgraded
    assert b'{"key":"training.compile.time.x"}' in upgraded
    assert b'"stringValue":"signal"' in upgraded  # a value is a word, not a name
