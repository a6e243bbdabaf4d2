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


# --- --prometheus: the runs' totals from a real Prometheus ---------------------------------

#: rows whose figures come from the metrics (the run totals)
FROM_METRICS = ("peak_memory", "reserved_memory", "comm_overlap", "compile_time",
                "recompiles", "goodput")


def _openmetrics(run_dirs: list[Path], at_s: float) -> str:
    """The runs' metrics that ``compare --prometheus`` reads, each series' last point as
    Prometheus would hold it (the contract's Prometheus names and labels, each series from
    two scrape jobs), at ``at_s``:
    OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``."""
    from otel_train.analysis.live import PROMETHEUS_METRICS
    from otel_train.analysis.metrics import read_metrics

    families: dict[str, list[str]] = {}
    for run_dir in run_dirs:
        digest = read_metrics(run_dir)
        for name in PROMETHEUS_METRICS:
            metric = sc.METRICS[name]
            for point in digest.series(name):
                attrs = {**point.attributes, sc.ATTR_RUN_ID: run_dir.name}
                labels = ",".join(f'{sc.prometheus_label(k)}="{v}"'
                                  for k, v in sorted(attrs.items()))
                samples = ([(f"{metric.prometheus}_sum", point.value),
                            (f"{metric.prometheus}_count", float(point.count))]
                           if metric.kind == sc.HISTOGRAM else
                           [(metric.prometheus, point.value)])
                # each series twice, as Prometheus holds it when it scrapes a rank's own
                # endpoint and the collector: compare must count it once
                for sample, value in samples:
                    for job in ("otel-train-ranks", "otel-train-collector"):
                        families.setdefault(sample, []).append(
                            f'{sample}{{{labels},job="{job}"}} {value!r} {at_s:.3f}')
    lines = []
    for sample, rows in families.items():
        lines += [f"# TYPE {sample} unknown", *rows]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prometheus(live, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import subprocess

    from support.pipeline_fixtures import Prometheus, promtool_binary

    _, base, slow = live
    workdir = tmp_path_factory.mktemp("compare-prometheus")
    text = _openmetrics([base, slow], time.time() - 30)
    assert "training_goodput_time_seconds_total{" in text, text[:2000]
    (workdir / "runs.om.txt").write_text(text)
    data = workdir / "prometheus" / "data"
    data.mkdir(parents=True)
    subprocess.run([promtool_binary(), "tsdb", "create-blocks-from", "openmetrics",
                    str(workdir / "runs.om.txt"), str(data)], check=True, capture_output=True,
                   timeout=300)
    server = Prometheus(workdir, targets={"otel-train-collector": [], "otel-train-ranks": [],
                                          "otelcol": []}).start()
    try:
        wait_for("the runs' series loaded", lambda: server.query(
            f'last_over_time(training_goodput_time_seconds_total'
            f'{{training_run_id="{slow.name}"}}[10m])'), 60, on_timeout=server.log_tail)
        yield server.url
    finally:
        server.kill()


def test_runs_totals_read_from_prometheus_compare_as_their_files_do(live, prometheus,
                                                                     capsys) -> None:
    jaeger, base, slow = live
    _, from_files = _json(capsys, str(base), str(slow))
    _, from_live = _json(capsys, "--jaeger", jaeger.url, "--prometheus", prometheus,
                         base.name, slow.name)
    rows = {r["key"]: r for r in from_live["rows"]}
    compared = 0
    for row in from_files["rows"]:
        if row["key"] not in FROM_METRICS or row["values"] == [None, None]:
            continue
        compared += 1
        live_row = rows[row["key"]]
        assert live_row["values"] == pytest.approx(row["values"], rel=1e-6), row["key"]
        assert [c["verdict"] for c in live_row["changes"]] == \
            [c["verdict"] for c in row["changes"]], row["key"]
    assert compared >= 2, [r["key"] for r in from_files["rows"] if r["values"] != [None, None]]
    assert rows["goodput"]["changes"][0]["verdict"] != "not recorded"
    # the per-step rows are still the traces'
    assert rows["step_time"]["changes"][0]["verdict"] == "worse"
    assert from_live["runs"][0]["path"] == f"{jaeger.url} + {prometheus} {base.name}"


def test_prometheus_without_jaeger_is_refused(capsys) -> None:
    code = main(["compare", "--prometheus", "http://127.0.0.1:9", "a", "b"])
    err = capsys.readouterr().err
    assert code == 2 and "give --jaeger URL too" in err, err
