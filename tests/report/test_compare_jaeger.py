"""``otel-train compare --jaeger URL RUN_ID ...``: runs read live from a real Jaeger v2
(tools/jaeger, in-memory storage) give the figures their files give.

Two synthetic 4-rank runs (the second with rank 1's backward 10% longer, every other rank's
steps the same) are sent to Jaeger over OTLP/HTTP, as a collector would; compared live by
run id, the rows the traces hold and where the time moved are those of the same runs'
directories (span times to Jaeger's microsecond); the rows only metrics hold are not
recorded. A run id Jaeger never saw is one line and exit 2.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import report_fixtures as rf
from support.jaeger import Jaeger, running_jaeger, send_run
from support.pipeline_fixtures import json_lines, wait_for
from test_compare import slowed_backward

from otel_train import semconv as sc
from otel_train.check.jaeger import JaegerAPI, fetch_run
from otel_train.cli import main

pytestmark = pytest.mark.slow
SLOW_RANK = 1
#: rows whose every figure comes from the steps' spans
FROM_TRACES = ("step_time", "step_time_median", "step_time_p95", "forward", "backward",
               "optimizer", "exposed_comm", "data_wait")


def _shifted(value, by: int):
    """``value`` (decoded OTLP JSON) with every ``*UnixNano`` time moved ``by`` ns."""
    if isinstance(value, dict):
        return {k: str(int(v) + by) if k.endswith("UnixNano") and int(v or 0) else
                _shifted(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [_shifted(v, by) for v in value]
    return value


def _to_now(run_dir: Path) -> None:
    """The run's times moved to end now: Jaeger's searches look back a few days only, and the
    fixture's runs are dated in 2025."""
    ends = [int(span["endTimeUnixNano"]) for path in run_dir.glob(sc.TRACES_GLOB)
            for request in json_lines(path) for rs in request.get("resourceSpans", ())
            for ss in rs.get("scopeSpans", ()) for span in ss.get("spans", ())]
    by = time.time_ns() - max(ends)
    for path in run_dir.glob("*.jsonl"):
        lines = [json.dumps(_shifted(request, by)) for request in json_lines(path)]
        path.write_text("\n".join(lines) + "\n")


def _trace_ids(run_dir: Path) -> set[str]:
    return {span["traceId"] for path in run_dir.glob(sc.TRACES_GLOB)
            for request in json_lines(path) for rs in request.get("resourceSpans", ())
            for ss in rs.get("scopeSpans", ()) for span in ss.get("spans", ())}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Jaeger, Path, Path]]:
    root = tmp_path_factory.mktemp("compare-jaeger")
    tag = uuid.uuid4().hex[:8]
    spec = {"ranks": 4, "steps": 40, "spike_steps": (), "metrics_every": 20, "seed": 1}
    base = rf.write_run(rf.RunSpec(run_id=f"base-{tag}", **spec), root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", slowed_backward(SLOW_RANK, 1.10))
        slow = rf.write_run(rf.RunSpec(run_id=f"slow-{tag}", **spec), root)
    with running_jaeger(root) as jaeger:
        api = JaegerAPI(jaeger.url)
        for run_dir in (base, slow):
            _to_now(run_dir)
            assert send_run(jaeger, run_dir)
            want = len(_trace_ids(run_dir))
            wait_for(f"Jaeger to hold {run_dir.name}'s {want} traces",
                     lambda run_id=run_dir.name, want=want:
                     len(fetch_run(api, run_id).traces) >= want, 60)
        yield jaeger, base, slow


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json", "--resamples", "300"])
    return code, json.loads(capsys.readouterr().out)


def test_runs_read_from_jaeger_compare_as_their_files_do(live, capsys) -> None:
    jaeger, base, slow = live
    code, from_files = _json(capsys, str(base), str(slow))
    live_code, from_jaeger = _json(capsys, "--jaeger", jaeger.url, base.name, slow.name)
    assert live_code == code
    rows = {r["key"]: r for r in from_jaeger["rows"]}
    for row in from_files["rows"]:
        if row["key"] not in FROM_TRACES:
            continue
        live_row = rows[row["key"]]
        assert live_row["values"] == pytest.approx(row["values"], rel=1e-3, abs=2e-6), row["key"]
        assert [c["verdict"] for c in live_row["changes"]] == \
            [c["verdict"] for c in row["changes"]], row["key"]
    assert rows["step_time"]["changes"][0]["verdict"] == "worse"
    where, live_where = from_files["where"][0], from_jaeger["where"][0]
    assert [(p["part"], p["ranks"]) for p in live_where["parts"]] == \
        [(p["part"], p["ranks"]) for p in where["parts"]] == [("backward", [SLOW_RANK])]
    assert f"on rank {SLOW_RANK}" in live_where["sentence"]
    assert [r["path"] for r in from_jaeger["runs"]] == [
        f"{jaeger.url} {base.name}", f"{jaeger.url} {slow.name}"]
    # what only the metrics hold is not in Jaeger
    assert rows["goodput"]["changes"][0]["verdict"] == "not recorded", rows["goodput"]


def test_a_run_jaeger_never_saw_is_one_line(live, capsys) -> None:
    jaeger, base, _ = live
    code = main(["compare", "--jaeger", jaeger.url, base.name, "no-such-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "holds no span of run 'no-such-run'" in err, err
