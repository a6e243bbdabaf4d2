"""``otel-train check`` on a real instrumented run (the demo, 2 ranks, launched under a
TRACEPARENT): it passes, and breaking one property in a copy of its files fails that item."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.report_fixtures import (
    attr,
    break_exemplars,
    break_log_ids,
    break_rank_sampling,
    break_step_trace_ids,
    drop_metric,
    each_span,
    rewrite_lines,
    run_demo,
)

from otel_train import semconv as sc
from otel_train.check.rundir import check_run_dir
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS
from otel_train.cli import main

pytestmark = pytest.mark.slow
STEPS = 10
LAUNCHER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-0af7651916cd43dd8448eb211c80319c-{LAUNCHER_SPAN}-01"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_demo(tmp_path_factory.mktemp("demo"), "check-real", STEPS,
                    env={"TRACEPARENT": TRACEPARENT})


@pytest.fixture
def copy(real_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(real_run, tmp_path / real_run.name))


def verdicts(run_dir: Path) -> dict[str, tuple[str, str]]:
    return {r.id: (r.status, r.evidence) for r in check_run_dir(run_dir)}


def test_real_run_passes_the_checklist(real_run: Path) -> None:
    results = verdicts(real_run)
    assert results.pop("throttling_alert")[0] == NOT_APPLICABLE
    # where the machine has no readable cgroup cpu.stat, only that item fails
    throttling = results.pop("cpu_throttling_measured")
    assert throttling[0] == PASS or throttling[1].startswith("no training.cpu.throttled.time")
    assert {item: status for item, (status, _) in results.items()} == dict.fromkeys(results, PASS)
    assert LAUNCHER_SPAN in results["launcher_context"][1]


def test_cli_exit_status_follows_the_verdict(real_run: Path) -> None:
    failing = {r.id for r in check_run_dir(real_run) if r.status == FAIL}
    assert main(["check", str(real_run), "--json"]) == (1 if failing else 0)


def test_logs_stripped_of_ids_fail(copy: Path) -> None:
    break_log_ids(copy)
    status, evidence = verdicts(copy)["log_fields"]
    assert status == FAIL and "lack trace_id" in evidence and "lack span_id" in evidence


def test_a_rank_sampling_differently_fails(copy: Path) -> None:
    break_rank_sampling(copy, rank=1)
    status, evidence = verdicts(copy)["sampling_consistency"]
    assert status == FAIL and "step 1 backward: ranks [1] missing" in evidence


def test_dropped_exemplars_fail(copy: Path) -> None:
    break_exemplars(copy)
    status, evidence = verdicts(copy)["exemplars"]
    assert status == FAIL and evidence.startswith("no exemplars on training.step.duration")


def test_no_throttling_metric_fails(copy: Path) -> None:
    drop_metric(copy, sc.METRIC_CPU_THROTTLED_TIME)
    status, evidence = verdicts(copy)["cpu_throttling_measured"]
    assert status == FAIL and evidence == "no training.cpu.throttled.time metric from any rank"


def test_a_rank_with_its_own_trace_ids_fails(copy: Path) -> None:
    break_step_trace_ids(copy, rank=1)
    status, evidence = verdicts(copy)["same_trace_across_ranks"]
    assert status == FAIL and f"{STEPS} steps split over several traces" in evidence


def test_missing_step_roots_fail_coverage(copy: Path) -> None:
    def drop_roots(request: dict) -> dict:
        for spans, span in each_span(request):
            if span["name"] == sc.SPAN_STEP:
                spans.remove(span)
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, drop_roots)
    status, evidence = verdicts(copy)["trace_coverage"]
    assert status == FAIL and f"{STEPS} without their training.step root" in evidence


def test_a_rank_losing_the_launcher_context_fails(copy: Path) -> None:
    def orphan_rank_1(request: dict) -> dict:
        for _, span in each_span(request):
            if span["name"] == sc.SPAN_RUN and attr(span, sc.ATTR_RANK) == 1:
                span["parentSpanId"] = ""
        return request

    rewrite_lines(copy, sc.TRACES_GLOB, orphan_rank_1)
    status, evidence = verdicts(copy)["launcher_context"]
    assert status == FAIL and evidence == "ranks [1] have no launcher parent"


def test_a_run_with_exponential_histograms_passes_the_same_checklist(tmp_path: Path) -> None:
    """The aggregation the series budget recommends for Prometheus
    (``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``) also shapes the files: the
    readers take exponential histograms (their exemplars, sums and counts) as they take
    explicit ones, so the checklist is the same."""
    run = run_demo(tmp_path, "check-exponential", STEPS, env={
        "TRACEPARENT": TRACEPARENT,
        "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION":
            "base2_exponential_bucket_histogram"})
    metrics = "".join(p.read_text() for p in run.glob("metrics*.jsonl"))
    assert '"exponentialHistogram"' in metrics and '"explicitBounds"' not in metrics
    results = verdicts(run)
    results.pop("throttling_alert")
    throttling = results.pop("cpu_throttling_measured")
    assert throttling[0] == PASS or throttling[1].startswith("no training.cpu.throttled.time")
    assert {item: status for item, (status, _) in results.items()} == dict.fromkeys(results, PASS)
