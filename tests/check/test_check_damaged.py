"""``otel-train check`` on damaged copies of a real run (the demo, 2 ranks on gloo): damaged
lines fail ``telemetry_complete`` with the file and line named, and the other items are
checked on the rest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import damage
from support.report_fixtures import run_demo

from otel_train.check.rundir import check_run_dir
from otel_train.check.verdicts import FAIL, PASS
from otel_train.cli import main

pytestmark = pytest.mark.slow
RUN_ID = "check-damaged"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # small export batches: several lines per traces file, so a damaged one has neighbours
    return run_demo(tmp_path_factory.mktemp("demo"), RUN_ID, steps=12,
                    env={"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "32"})


@pytest.fixture
def copy(real_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(real_run, tmp_path / real_run.name))


def check_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    status = main(["check", *args, "--json"])
    out, err = capsys.readouterr()
    return status, json.loads(out) if out else {}, err


def row(body: dict, item: str) -> dict:
    return next(c for c in body["checks"] if c["id"] == item)


def test_an_undamaged_run_has_complete_telemetry(real_run: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, body, err = check_json(capsys, str(real_run))
    assert row(body, "telemetry_complete")["status"] == PASS and err == ""


def test_a_torn_line_fails_telemetry_complete_naming_file_and_line(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was skipped silently, and the checklist passed."""
    path = copy / "traces.rank-1.jsonl"
    line = damage.tear_line(path, 2)
    status, body, _ = check_json(capsys, str(copy))
    assert status == 1 and body["ok"] is False
    complete = row(body, "telemetry_complete")
    assert complete["status"] == FAIL
    assert f"{path}: 1 damaged line (line {line}: torn), the other lines read" in \
        complete["evidence"]
    assert "torn last line is a writer killed mid-write" in complete["fix"]


def test_bytes_appended_are_a_line_of_the_table_and_the_verdict_fails(
        copy: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # a line a row: the evidence is not wrapped
    path = copy / "metrics.rank-0.jsonl"
    line = damage.append_random_bytes(path)
    assert main(["check", str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: 1 damaged line (line {line}: not UTF-8)" in out
    assert out.splitlines()[-1].startswith("FAIL: ")


def test_a_span_field_of_the_wrong_type_damages_only_its_line(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "traces.rank-1.jsonl"
    line = damage.retype_attribute(path, "training.step", "seven")
    status, body, _ = check_json(capsys, str(copy))
    assert status == 1
    assert (f"{path}: 1 damaged line (line {line}: a field of the wrong type (ValueError: "
            "invalid literal for int() with base 10: 'seven'))") in \
        row(body, "telemetry_complete")["evidence"]
    # the other lines were read: rank 1 still has spans
    assert "ranks without any span" not in row(body, "trace_coverage")["evidence"]


def test_a_truncated_file_is_named_truncated(copy: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "traces.rank-0.jsonl"
    line = damage.truncate_in_last_line(path)
    status, body, _ = check_json(capsys, str(copy))
    assert status == 1
    assert f"{path}: truncated: its last line, line {line}, ends mid-request" in \
        row(body, "telemetry_complete")["evidence"]


def test_damage_found_by_the_worker_processes_reaches_the_verdict(copy: Path) -> None:
    torn = damage.tear_line(copy / "traces.rank-1.jsonl", 1)
    cut = damage.truncate_in_last_line(copy / "traces.rank-0.jsonl")
    (complete,) = [r for r in check_run_dir(copy, workers=2) if r.id == "telemetry_complete"]
    assert complete.status == FAIL
    assert f"traces.rank-1.jsonl: 1 damaged line (line {torn}: torn)" in complete.evidence
    assert f"traces.rank-0.jsonl: truncated: its last line, line {cut}," in complete.evidence


# --- the items a damaged or missing rank file fails name it as their cause ---------------------


def failed_items(body: dict) -> dict[str, dict]:
    return {c["id"]: c for c in body["checks"]
            if c["status"] == FAIL and c["id"] != "telemetry_complete"}


def test_a_torn_rank_file_is_the_cause_named_by_each_item_it_fails(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was named only under telemetry_complete; the items it failed (a rank vanished,
    exemplars that resolve to no span) gave their own causes and fixes."""
    path = copy / "traces.rank-1.jsonl"
    line = damage.truncate_in_last_line(path)  # the rank's run span was in its last line
    status, body, _ = check_json(capsys, str(copy))
    assert status == 1
    failed = failed_items(body)
    assert "ranks_finished" in failed, body
    for item in failed.values():
        assert item["evidence"].startswith(
            f"files damaged or missing, the likely cause: {path} (truncated in line {line})"), \
            item
        assert item["fix"].startswith("see to those files first"), item


def test_missing_rank_files_are_named_and_fail_telemetry_complete(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run.json says 2 ranks and only rank 0's files are there: the checklist advised a
    ratio sampler and span parenting, and said no telemetry was lost."""
    gone = [copy / f"{signal}.rank-1.jsonl" for signal in ("traces", "metrics", "logs")]
    for path in gone:
        path.unlink()
    status, body, _ = check_json(capsys, str(copy))
    assert status == 1
    complete = row(body, "telemetry_complete")
    assert complete["status"] == FAIL
    assert complete["evidence"] == f"missing files: {', '.join(map(str, gone))}"
    failed = failed_items(body)
    assert {"trace_coverage", "sampling_consistency"} <= set(failed), body
    for item_id in ("trace_coverage", "sampling_consistency"):
        evidence, fix = failed[item_id]["evidence"], failed[item_id]["fix"]
        assert evidence.startswith(f"files damaged or missing, the likely cause: {gone[0]} "
                                   "(missing); what the files read show: "), evidence
        # the set-up's fix comes after, for a whole copy of the run that still fails
        assert fix.startswith("see to those files first") and "if a whole copy" in fix


def test_a_whole_run_names_no_file(real_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, body, _ = check_json(capsys, str(real_run))
    assert not any("damaged or missing" in c["evidence"] for c in body["checks"])
