"""The traces lines decoded by msgspec (otel_train/analysis/typed.py) read as json reads them:
a typed span answers as json's dict does, a line msgspec cannot read whole is read by json
(its damage named word for word as before), and report and check print what they printed
before with either reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.report_golden import CASES, GOLDEN, outputs

from otel_train.analysis import otlp, typed

pytestmark = pytest.mark.skipif(not typed.enabled(), reason="msgspec is not installed")

SPAN: dict[str, Any] = {
    "traceId": "ab", "spanId": "cd", "parentSpanId": "", "name": "training.forward", "kind": 1,
    "startTimeUnixNano": "100", "endTimeUnixNano": 200,
    "attributes": [{"key": "training.rank", "value": {"intValue": "3"}},
                   {"key": "x", "value": {"doubleValue": 0.1}}],
    "events": [{"name": "e", "timeUnixNano": "5"}], "status": {"code": 1, "message": "m"},
    "links": [{"traceId": "t", "spanId": "s"}]}


def line(*spans: Any, resource: list[Any] | None = None) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": resource or []},
                                          "scopeSpans": [{"spans": list(spans)}]}]}
                      ).encode() + b"\n"


def test_a_typed_span_answers_as_the_dict_json_makes_of_it() -> None:
    ((_, (full, bare)),) = typed.span_batches(line(SPAN, {"name": "bare"}), None, lambda r: {})
    assert type(full) is typed.TypedSpan
    for key in [*SPAN, "flags", "droppedAttributesCount", "traceState", "not-otlp"]:
        assert full.get(key) == SPAN.get(key)
        assert full.get(key, 7) == SPAN.get(key, 7)
        assert bare.get(key, "d") == {"name": "bare"}.get(key, "d")
    assert full["attributes"] == SPAN["attributes"]
    with pytest.raises(KeyError):
        bare["traceId"]
    assert full.ids() == ("training.forward", "ab", "cd", "")
    assert bare.ids() == ("bare", "", "", "")


def test_run_id_and_resource_are_read_as_json_reads_them() -> None:
    resource = [{"key": "training.run.id", "value": {"stringValue": "a"}}]
    text = line(SPAN, resource=resource)
    assert typed.span_batches(text, "b", lambda r: otlp._run_resource(r, "b")) == []
    ((got, _),) = typed.span_batches(text, "a", lambda r: otlp._run_resource(r, "a"))
    assert got == {"training.run.id": "a"}


@pytest.mark.parametrize("text", [
    line({**SPAN, "startTimeUnixNano": [1]}),  # a field of the wrong type
    line({**SPAN, "name": 7}),
    line({**SPAN, "attributes": [{"key": "x", "value": {"doubleValue": float("nan")}}]}),
    line({**SPAN, "name": "\ud800"}),  # a lone surrogate: json takes it
    line({**SPAN, "attributes": [{"key": "x", "value": {"stringValue": "é"}}]}
         ).replace(b"\\u00e9", b"\xe9"),  # not UTF-8 (inside the attributes' bytes)
    b'{"resourceSpans": [{"scopeSpans": [{"spans": {"a": 1}}]}]}\n',
    b'{"resourceSpans": null}\n', b"[1, 2]\n", b'{"resourceSpans": []} {"resou',
], ids=["wrong-type", "name-number", "nan", "surrogate", "not-utf8", "spans-object",
        "null", "array", "torn"])
def test_a_line_msgspec_cannot_read_whole_is_left_to_json(text: bytes) -> None:
    assert typed.span_batches(text, None, lambda r: {}) is None


def read(path: Path) -> tuple[list[Any], list[list[tuple[int, str]]]]:
    """What a pass over every span gets of ``path``: each span's name, times and decoded
    attributes, and the damage named."""
    damage, got = otlp.Damage(), []
    for offset, resource, spans in otlp.iter_span_batches(path, damage=damage):
        with otlp.skip_damaged(path, offset, damage):
            got.append([(s.get("name"), s.get("traceId", ""), int(s.get("startTimeUnixNano", 0)),
                         otlp.decode_attributes(s.get("attributes")), otlp.links_of(s),
                         resource) for s in spans])
    return got, [f.named for f in damage.files.values()]


def test_every_line_reads_the_same_with_either_reader(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "traces.rank-0.jsonl"
    path.write_bytes(b"".join([
        line(SPAN, {"name": "bare"}),
        line({**SPAN, "attributes": [{"key": "x", "value": {"intValue": "seven"}}]}),
        line({**SPAN, "startTimeUnixNano": "soon"}),
        line({**SPAN, "attributes": [{"key": "x", "value": {"doubleValue": 1e400}}]}
             ).replace(b"Infinity", b"1e400"),  # msgspec cannot hold it: json makes inf
        line({**SPAN, "startTimeUnixNano": [1]}),
        line({**SPAN, "name": "\ud800"}),
        b"not json\n",
        line({**SPAN, "links": None}),
        line(SPAN)[:-20] + b"\n",
        line(SPAN)]))
    fast = read(path)
    monkeypatch.setattr(typed, "JSON_ONLY", True)
    assert not typed.enabled()
    assert read(path) == fast
    assert len(fast[0]) == 4  # lines 1, 4, 6 and 10: the others are damaged
    assert fast[0][1] == [("training.forward", "ab", 100, {"x": float("inf")}, [("t", "s")],
                           {})]
    assert [n for n, _ in fast[1][0]] == [2, 3, 5]  # the first three damaged lines named


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_and_check_print_the_same_with_the_json_reader(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden outputs hold for the json reader too (test_report_outputs_unchanged.py
    checks them with msgspec's)."""
    run_dir = CASES[case][0](tmp_path)
    monkeypatch.setattr(typed, "JSON_ONLY", True)
    for file, text in outputs(run_dir, CASES[case][1]).items():
        assert text == (GOLDEN / f"{case}.{file}").read_text(encoding="utf-8"), file
