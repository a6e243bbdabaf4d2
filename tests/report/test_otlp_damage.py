"""The OTLP JSON-lines readers on damaged lines: each is counted and named (file, line number,
what was wrong), the whole requests a torn line still holds are kept, every other line is
read; with no :class:`~otel_train.analysis.otlp.Damage` to count in, one warning per file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from otel_train.analysis import otlp

RESOURCE = {"attributes": [{"key": "training.rank", "value": {"intValue": "0"}}]}


def request(name: str, **attributes: dict) -> bytes:
    """One export request of one span named ``name``, as a line."""
    span = {"name": name, "traceId": "ab" * 16, "spanId": "cd" * 8, "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [{"key": k, "value": v} for k, v in attributes.items()]}
    body = {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"spans": [span]}]}]}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def write(tmp_path: Path, *lines: bytes) -> Path:
    path = tmp_path / "traces.rank-0.jsonl"
    path.write_bytes(b"".join(lines))
    return path


def read(path: Path) -> tuple[list[str], otlp.Damage]:
    damage = otlp.Damage()
    return [span.name for span in otlp.iter_spans([path], damage=damage)], damage


def named(damage: otlp.Damage) -> list[tuple[int, str]]:
    (found,) = damage.files.values()
    return found.named


def test_invalid_utf8_damages_only_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, request("a") + b"\n", b"\xc0\xff\xfe\n", request("c") + b"\n")
    names, damage = read(path)
    assert names == ["a", "c"]
    assert named(damage) == [(2, "not UTF-8")]


def test_invalid_utf8_inside_a_value_damages_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, request("a") + b"\n", request("b?").replace(b"?", b"\xff") + b"\n")
    names, damage = read(path)
    assert names[0] == "a"
    assert named(damage) == [(2, "not UTF-8, 1 whole request on it read")]


def test_blank_lines_are_no_damage(tmp_path: Path) -> None:
    names, damage = read(write(tmp_path, b"\n", request("a") + b"\n", b"  \r\n"))
    assert names == ["a"] and not damage


def test_a_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    names, damage = read(write(tmp_path, b"hello\n", request("b") + b"\n"))
    assert names == ["b"] and named(damage) == [(1, "not JSON")]


def test_json_that_is_not_an_object_is_not_an_export_request(tmp_path: Path) -> None:
    names, damage = read(write(tmp_path, b"[1, 2]\n", request("b") + b"\n"))
    assert names == ["b"] and named(damage) == [(1, "not an export request (a JSON list)")]


def test_a_torn_line_continued_by_a_restarted_writer_keeps_the_whole_request(
        tmp_path: Path) -> None:
    path = write(tmp_path, request("a")[:40] + request("b") + b"\n")
    names, damage = read(path)
    assert names == ["b"]
    assert named(damage) == [(1, "torn, 1 whole request on it read")]


def test_a_last_line_without_its_end_is_truncated(tmp_path: Path) -> None:
    path = write(tmp_path, request("a") + b"\n", request("b")[:50])
    names, damage = read(path)
    assert names == ["a"]
    (found,) = damage.files.values()
    assert (found.lines, found.truncated_at, found.named) == (1, 2, [])
    assert found.message() == (
        f"{path}: truncated: its last line, line 2, ends mid-request (its writer was killed "
        "while writing it, or is still writing it), the lines before it read")


def test_a_cut_inside_a_character_is_truncation_not_invalid_utf8(tmp_path: Path) -> None:
    whole = request("é")  # é is two bytes: cut between them
    path = write(tmp_path, whole[:whole.index("é".encode()) + 1])
    assert read(path)[1].files[path].truncated_at == 1


def test_a_whole_last_line_without_a_newline_is_no_damage(tmp_path: Path) -> None:
    names, damage = read(write(tmp_path, request("a") + b"\n", request("b")))
    assert names == ["a", "b"] and not damage


@pytest.mark.parametrize("value, error", [
    ({"intValue": "seven"}, "ValueError: invalid literal for int() with base 10: 'seven'"),
    ({"boolValue": "false"}, "TypeError: boolValue 'false' is not true or false"),
    ({"arrayValue": "1,2"}, "AttributeError: 'str' object has no attribute 'get'"),
])
def test_a_value_of_the_wrong_type_damages_its_line(tmp_path: Path, value: dict,
                                                     error: str) -> None:
    path = write(tmp_path, request("a", x=value) + b"\n", request("b") + b"\n")
    names, damage = read(path)
    assert names == ["b"]
    assert named(damage) == [(1, f"a field of the wrong type ({error})")]


def test_damaged_lines_beyond_the_first_three_are_counted(tmp_path: Path) -> None:
    path = write(tmp_path, *[b"x\n"] * 5, request("a") + b"\n")
    (found,) = read(path)[1].files.values()
    assert found.message() == (f"{path}: 5 damaged lines (line 1: not JSON; line 2: not JSON; "
                               "line 3: not JSON; +2 more), the other lines read")


def test_without_a_damage_to_count_in_each_damaged_file_is_warned_of_once(
        tmp_path: Path) -> None:
    path = write(tmp_path, b"x\n", b"y\n", request("a") + b"\n")
    with pytest.warns(otlp.DamagedFileWarning) as warned:
        assert [s.name for s in otlp.iter_spans([path])] == ["a"]
    assert [str(w.message) for w in warned] == [
        f"{path}: 2 damaged lines (line 1: not JSON; line 2: not JSON), the other lines read"]


def test_a_caller_counting_the_damage_gets_no_warning(tmp_path: Path) -> None:
    path = write(tmp_path, b"x\n", request("a") + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(path)


def test_metric_points_and_log_records_count_their_damage_the_same(tmp_path: Path) -> None:
    metrics, logs = tmp_path / "metrics.jsonl", tmp_path / "logs.jsonl"
    point = {"attributes": [{"key": "training.rank", "value": {"stringValue": "zero"}}],
             "asDouble": 1.0}
    metric = {"name": "training.samples", "gauge": {"dataPoints": [point]}}
    metrics.write_text(json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        metric]}]}]}) + "\n")
    logs.write_text(json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": 7}]}]}]}) + "\n")
    damage = otlp.Damage()
    assert list(otlp.iter_metric_points([metrics], damage=damage)) == []
    assert list(otlp.iter_log_records([logs], damage=damage)) == []
    assert [f.named for f in damage.files.values()] == [
        [(1, "a field of the wrong type (ValueError: invalid literal for int() with base 10: "
             "'zero')")],
        [(1, "a field of the wrong type (TypeError: 7 is not a string)")]]


def test_skip_damaged_names_the_line_a_wrong_type_was_found_on(tmp_path: Path) -> None:
    path = write(tmp_path, request("a") + b"\n", request("b", step={"intValue": "x"}) + b"\n")
    damage, read_steps = otlp.Damage(), []
    for offset, _, spans in otlp.iter_span_batches(path, damage=damage):
        with otlp.skip_damaged(path, offset, damage):
            read_steps += [otlp.attribute(otlp.raw_attributes(s["attributes"]), "step", 0)
                           for s in spans]
    assert read_steps == [0]
    assert named(damage) == [(2, "a field of the wrong type (ValueError: invalid literal for "
                                 "int() with base 10: 'x')")]
