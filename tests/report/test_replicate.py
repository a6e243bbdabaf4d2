"""tests/support/replicate.py, which makes the many-rank runs of the scale benchmark
(bench/bench_report_scale.py) out of a real run: each copy is a rank of its own, the report
reads them as one run, and a planted slowdown is found on its rank."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from support.replicate import main, replicate
from support.report_fixtures import RunSpec, write_run

from otel_train import semconv as sc
from otel_train.analysis.build import build_report


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = RunSpec(ranks=2, steps=12, run_id="real", spike_steps=(), metrics_every=4,
                   recompile_step=-1)
    return write_run(spec, tmp_path_factory.mktemp("real"))


def spans(path: Path) -> list[tuple[dict, dict]]:
    """(resource attributes, span) of every span of a traces file."""
    out = []
    for text in path.read_bytes().splitlines():
        for rs in json.loads(text)["resourceSpans"]:
            resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            out += [(resource, s) for ss in rs["scopeSpans"] for s in ss["spans"]]
    return out


def value(attributes: list[dict], key: str) -> object:
    found = [a["value"] for a in attributes if a["key"] == key]
    return next(iter(found[0].values())) if found else None


def test_each_copy_is_a_rank_of_the_new_run(real: Path, tmp_path: Path) -> None:
    out = replicate(real, tmp_path, 5, "copies")
    assert out == tmp_path / "copies"
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert names == sorted(f"{signal}.rank-{r}.jsonl" for signal in ("traces", "metrics", "logs")
                           for r in range(5))
    assert json.loads((out / "run.json").read_text())["world_size"] == 5
    ids = {}
    for rank in range(5):
        read = spans(out / f"traces.rank-{rank}.jsonl")
        for resource, span in read:
            assert resource[sc.RES_RUN_ID] == {"stringValue": "copies"}
            assert str(value(span["attributes"], sc.ATTR_RANK) or rank) == str(rank)
        names_of = Counter(s["name"] for _, s in read)
        assert (names_of[sc.SPAN_STEP] > 0) == (rank == 0)  # the step's root: rank 0's
        ids[rank] = {s["spanId"] for _, s in read}
    # rank 2 copies real rank 0: the same traces, spans of its own
    assert not ids[0] & ids[2]
    assert {s["traceId"] for _, s in spans(out / "traces.rank-2.jsonl")} <= \
        {s["traceId"] for _, s in spans(real / "traces.rank-0.jsonl")}
    report = build_report(out)
    assert report.ranks == list(range(5)) and report.world_size == 5
    assert report.run_id == "copies"


def test_a_planted_slowdown_is_found_on_its_rank(real: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(real), str(tmp_path), "--ranks", "6", "--slow", "3:backward:3"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == tmp_path / "replica-6"
    report = build_report(out)
    assert report.straggler == 3
    slow = {r.rank: r for r in report.rank_rows}
    assert slow[3].phase_mean_s[sc.PHASE_BACKWARD] > 2 * slow[2].phase_mean_s[sc.PHASE_BACKWARD]
