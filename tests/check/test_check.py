"""``otel-train check`` on generated run directories: each item passes on a healthy run and
fails, with the right message, when that one property is broken."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.report_fixtures import (
    RunSpec,
    attr,
    break_exemplars,
    break_log_ids,
    break_rank_sampling,
    break_step_trace_ids,
    drop_metric,
    each_span,
    rewrite_lines,
    write_run,
)

from otel_train import semconv as sc
from otel_train.check.rundir import check_run_dir
from otel_train.check.verdicts import FAIL, ITEMS, NOT_APPLICABLE, PASS
from otel_train.cli import main

LAUNCHER = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = RunSpec(ranks=3, steps=60, straggler_rank=1, spike_steps=(20,), recompile_step=30,
                   metrics_every=10, traceparent=LAUNCHER)
    return write_run(spec, tmp_path_factory.mktemp("healthy"))


@pytest.fixture
def copy(healthy: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(healthy, tmp_path / healthy.name))


def verdicts(run_dir: Path) -> dict[str, tuple[str, str]]:
    return {r.id: (r.status, r.evidence) for r in check_run_dir(run_dir)}


def test_healthy_run_passes_every_item(healthy: Path) -> None:
    results = verdicts(healthy)
    assert results.pop("throttling_alert")[0] == NOT_APPLICABLE  # needs --prometheus
    assert {item: status for item, (status, _) in results.items()} == dict.fromkeys(results, PASS)


def test_logs_without_ids_fail_log_fields(copy: Path) -> None:
    break_log_ids(copy)
    status, evidence = verdicts(copy)["log_fields"]
    assert status == FAIL
    assert "lack trace_id" in evidence and "lack span_id" in evidence


def test_a_rank_sampling_on_its_own_fails_sampling_consistency(copy: Path) -> None:
    break_rank_sampling(copy, rank=2)
    status, evidence = verdicts(copy)["sampling_consistency"]
    assert status == FAIL
    assert "step 1 backward: ranks [2] missing" in evidence


def test_missing_exemplars_fail(copy: Path) -> None:
    break_exemplars(copy)
    status, evidence = verdicts(copy)["exemplars"]
    assert status == FAIL and evidence.startswith("no exemplars on training.step.duration")


def test_exemplars_pointing_at_unexported_spans_fail(copy: Path) -> None:
    def drop_rank_steps(request: dict) -> dict:
        for spans, span in each_span(request):
            if span["name"] == sc.SPAN_RANK_STEP:
                spans.remove(span)
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, drop_rank_steps)
    status, evidence = verdicts(copy)["exemplars"]
    assert status == FAIL and "do not resolve" in evidence


def test_no_throttling_metric_fails(copy: Path) -> None:
    drop_metric(copy, sc.METRIC_CPU_THROTTLED_TIME)
    status, evidence = verdicts(copy)["cpu_throttling_measured"]
    assert status == FAIL
    assert evidence == "no training.cpu.throttled.time metric from any rank"


def test_a_rank_with_its_own_trace_ids_fails_same_trace(copy: Path) -> None:
    break_step_trace_ids(copy, rank=1)
    status, evidence = verdicts(copy)["same_trace_across_ranks"]
    assert status == FAIL and "60 steps split over several traces" in evidence


def test_rank_steps_without_their_root_fail_trace_coverage(copy: Path) -> None:
    def drop_roots(request: dict) -> dict:
        for spans, span in each_span(request):
            if span["name"] == sc.SPAN_STEP:
                spans.remove(span)
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, drop_roots)
    status, evidence = verdicts(copy)["trace_coverage"]
    assert status == FAIL and "60 without their training.step root" in evidence


def test_a_rank_without_the_launcher_parent_fails(copy: Path) -> None:
    def orphan_rank_0_run(request: dict) -> dict:
        for _, span in each_span(request):
            if span["name"] == sc.SPAN_RUN and attr(span, sc.ATTR_RANK) == 0:
                span["parentSpanId"] = ""
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, orphan_rank_0_run)
    status, evidence = verdicts(copy)["launcher_context"]
    assert status == FAIL and evidence == "ranks [0] have no launcher parent"


def test_no_launcher_context_is_not_applicable(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=2, steps=5, spike_steps=()), tmp_path)
    status, evidence = verdicts(run)["launcher_context"]
    assert status == NOT_APPLICABLE and "TRACEPARENT was not set" in evidence


def test_dropped_telemetry_fails(copy: Path) -> None:
    def drop_spans(request: dict) -> dict:
        for rm in request.get("resourceMetrics", ()):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] == sc.METRIC_TELEMETRY_DROPPED:
                        for point in metric["sum"]["dataPoints"]:
                            point["asDouble"] = 17.0
        return request

    rewrite_lines(copy, sc.METRICS_GLOB, drop_spans)
    status, evidence = verdicts(copy)["telemetry_complete"]
    assert status == FAIL and "spans 17" in evidence


def test_cli_json_and_exit_status(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(copy), "--json"]) == 0
    healthy = json.loads(capsys.readouterr().out)
    assert healthy["ok"] is True and len(healthy["checks"]) == len(ITEMS)
    break_exemplars(copy)
    assert main(["check", str(copy), "--json"]) == 1
    broken = json.loads(capsys.readouterr().out)
    assert broken["ok"] is False
    (row,) = [c for c in broken["checks"] if c["status"] == FAIL]
    assert row["id"] == "exemplars" and row["fix"]


def test_cli_table_shows_every_item(healthy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(healthy)]) == 0
    out = capsys.readouterr().out
    assert "sampling_consistency" in out and "PASS: 11 passed, 0 failed, 1 not applicable" in out


def test_cli_without_a_source_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 2
    assert "give a run directory" in capsys.readouterr().err


def test_there_is_no_tempo_option(capsys: pytest.CaptureFixture[str]) -> None:
    """No real Tempo may run in the tests (AGPL), so no client: the option is gone rather
    than accepted and silently checking nothing."""
    with pytest.raises(SystemExit) as exc:
        main(["check", "--tempo", "http://127.0.0.1:9", "--json"])
    assert exc.value.code == 2 and "--tempo" in capsys.readouterr().err


def test_a_check_where_nothing_applied_is_not_a_pass() -> None:
    from otel_train.check.cli import exit_status
    from otel_train.check.verdicts import CheckResult

    def row(status: str) -> CheckResult:
        return CheckResult("trace_coverage", status, "evidence", "fix", "run dir")

    assert exit_status([row(NOT_APPLICABLE), row(NOT_APPLICABLE)]) == 2
    assert exit_status([]) == 2
    assert exit_status([row(NOT_APPLICABLE), row(PASS)]) == 0
    assert exit_status([row(PASS), row(FAIL)]) == 1


def test_no_run_spans_at_all_is_not_applicable(copy: Path) -> None:
    def drop_run_spans(request: dict) -> dict:
        for spans, span in each_span(request):
            if span["name"] in (sc.SPAN_RUN, sc.SPAN_SETUP):
                spans.remove(span)
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, drop_run_spans)
    status, evidence = verdicts(copy)["launcher_context"]
    assert status == NOT_APPLICABLE and evidence.startswith("no training.run spans exported")


def test_spans_uneven_across_ranks_fail_sampling_consistency(copy: Path) -> None:
    def duplicate_rank_0_forward(request: dict) -> dict:
        for spans, span in each_span(request):
            if span["name"] == sc.SPAN_FORWARD and attr(span, sc.ATTR_RANK) == 0 \
                    and attr(span, sc.ATTR_STEP) == 3:
                spans.append({**span, "spanId": "00000000000000ff"})
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, duplicate_rank_0_forward)
    status, evidence = verdicts(copy)["sampling_consistency"]
    assert status == FAIL and "step 3 forward: 4 spans from 3 ranks" in evidence
