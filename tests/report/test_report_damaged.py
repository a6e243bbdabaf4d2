"""``otel-train report`` on damaged copies of a real run (the demo, 2 ranks on gloo): each
damaged line is named on stderr (file and line number) and the report is built from the rest;
what was asked and is not there (a path, a run id) is an error naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import damage
from support.report_fixtures import run_demo

from otel_train.analysis.build import build_report
from otel_train.analysis.cli import damage_on_stderr
from otel_train.cli import main

pytestmark = pytest.mark.slow
RUN_ID, STEPS = "report-damaged", 12


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # small export batches: several lines per traces file, so a damaged one has neighbours
    return run_demo(tmp_path_factory.mktemp("demo"), RUN_ID, steps=STEPS,
                    env={"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "32"})


@pytest.fixture
def copy(real_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(real_run, tmp_path / real_run.name))


def report(run_dir: Path, capsys: pytest.CaptureFixture[str], *args: str
           ) -> tuple[int, str, str]:
    status = main(["report", str(run_dir), *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_an_undamaged_run_warns_of_nothing(real_run: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = report(real_run, capsys)
    assert status == 0 and f"run {RUN_ID}: 2 ranks" in out
    assert err == ""


def test_bytes_appended_to_a_metrics_file_are_one_damaged_line(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "metrics.rank-0.jsonl"
    line = damage.append_random_bytes(path)
    status, out, err = report(copy, capsys, "--json")
    assert status == 0
    assert f"warning: {path}: 1 damaged line (line {line}: not UTF-8)" in err
    assert json.loads(out)["trained_steps"] == STEPS  # the lines before the bytes were read


def test_a_value_of_the_wrong_type_damages_only_its_line(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "metrics.rank-1.jsonl"
    line = damage.retype_first(path, "asDouble", "not a number")
    status, out, err = report(copy, capsys, "--json")
    assert status == 0
    assert f"{path}: 1 damaged line (line {line}: a field of the wrong type" in err
    assert "could not convert string to float: 'not a number'" in err
    assert json.loads(out)["ranks"] == [0, 1]  # the traces and the other metrics were read


def test_a_torn_line_is_named_and_the_lines_after_it_read(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "traces.rank-1.jsonl"
    assert len(damage.lines_of(path)) > 1
    line = damage.tear_line(path, 1)
    status, out, err = report(copy, capsys, "--json")
    assert status == 0
    assert f"{path}: 1 damaged line (line {line}: torn), the other lines read" in err
    assert 1 in json.loads(out)["ranks"]  # from its lines after the torn one


def test_a_truncated_traces_file_is_named_truncated(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue "What users read is true", item 5: the rank of a file cut mid-line was said to
    have sent nothing; the file is named as truncated, with the line."""
    path = copy / "traces.rank-0.jsonl"
    line = damage.truncate_in_last_line(path)
    status, _, err = report(copy, capsys)
    assert status == 0
    assert (f"{path}: truncated: its last line, line {line}, ends mid-request (its writer "
            "was killed while writing it, or is still writing it)") in err


def test_a_rank_whose_traces_file_is_cut_whole_is_unreadable_not_silent(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rank none of whose spans can be read (its traces file cut inside its first line) is
    named as unreadable, not as a rank that sent nothing or whose instrumentation failed."""
    path = copy / "traces.rank-1.jsonl"
    path.write_bytes(path.read_bytes()[:3000])
    status, out, err = report(copy, capsys)
    assert status == 0 and f"{path}: truncated: its last line, line 1" in err
    assert "ranks whose traces could not be read: [1]" in " ".join(out.split())
    assert "sent no telemetry" not in out
    status, out, _ = report(copy, capsys, "--json")
    data = json.loads(out)
    assert (data["unreadable_ranks"], data["missing_ranks"]) == ([1], [])


def test_a_phase_span_of_the_wrong_type_damages_its_line_in_pass_two(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Phase spans are read only for the slowest steps (pass two): a wrongly typed rank on
    one was a traceback from the report's arithmetic; it damages its line, named."""
    path = copy / "traces.rank-1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        request = json.loads(line)
        forward = [span for rs in request["resourceSpans"] for ss in rs["scopeSpans"]
                   for span in ss["spans"] if span["name"] == "training.forward"]
        for span in forward:
            for attribute in span["attributes"]:
                if attribute["key"] == "training.rank":
                    attribute["value"] = {"stringValue": "one"}
        if forward:
            lines[number - 1] = json.dumps(request).encode() + b"\n"
            break
    path.write_bytes(b"".join(lines))
    status, out, err = report(copy, capsys)
    assert status == 0 and f"run {RUN_ID}: 2 ranks" in out
    assert (f"{path}: 1 damaged line (line {number}: a field of the wrong type (ValueError: "
            "invalid literal for int() with base 10: 'one'))") in err


def test_damage_read_by_the_worker_processes_is_warned_of_too(
        copy: Path, capfd: pytest.CaptureFixture[str]) -> None:
    torn = damage.tear_line(copy / "traces.rank-1.jsonl", 1)
    cut = damage.truncate_in_last_line(copy / "traces.rank-0.jsonl")
    with damage_on_stderr():
        assert build_report(copy, workers=2).ranks
    err = capfd.readouterr().err
    assert f"traces.rank-1.jsonl: 1 damaged line (line {torn}: torn)" in err
    assert f"traces.rank-0.jsonl: truncated: its last line, line {cut}," in err


def test_a_run_id_no_run_has_is_an_error_naming_it(
        real_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = report(real_run.parent, capsys, "--run-id", "nope")
    assert status == 2 and out == ""
    assert f"no run 'nope' under {real_run.parent} (its runs: {RUN_ID})" in err


def test_a_run_id_that_shared_files_do_not_hold_is_an_error_naming_it(
        real_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A collector's files hold every run: ``--run-id`` picks one out of them."""
    status, out, err = report(real_run, capsys, "--run-id", "nope")
    assert status == 2 and out == ""
    assert f"no telemetry of run 'nope' in {real_run} (its files hold runs: {RUN_ID})" in err


def test_a_missing_path_is_not_an_empty_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-run"
    assert report(missing, capsys)[2] == f"otel-train report: {missing} does not exist\n"
    assert "no traces*.jsonl or metrics*.jsonl in" in report(tmp_path, capsys)[2]


def test_files_holding_nothing_readable_are_an_error(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in copy.glob("*.jsonl"):
        path.write_bytes(b"\xff\xfe not telemetry\n")
    status, out, err = report(copy, capsys)
    assert status == 2 and out == ""
    assert f"{copy}: its files hold no telemetry that could be read" in err
    assert f"{copy / 'traces.rank-0.jsonl'}: 1 damaged line (line 1: not UTF-8)" in err
def test_a_span_field_of_the_wrong_type_damages_only_its_line(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = copy / "traces.rank-1.jsonl"
    line = damage.retype_attribute(path, "training.step", "seven")
    status, out, err = report(copy, capsys, "--json")
    assert status == 0
    assert (f"{path}: 1 damaged line (line {line}: a field of the wrong type (ValueError: "
            "invalid literal for int() with base 10: 'seven')), the other lines read") in err
    assert json.loads(out)["ranks"] == [0, 1]  # rank 1's other lines were read
