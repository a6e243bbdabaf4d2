"""One account of a run's time (issue 51): steady-state throughput, goodput and badput,
degenerate runs that read sensibly, and per-rank rows whose columns add up to the step."""

from __future__ import annotations

import io
import json
from pathlib import Path
from statistics import mean

import pytest
from rich.console import Console
from support.report_fixtures import (
    T0_NS,
    RunSpec,
    attr,
    drop_metric,
    each_span,
    rewrite_lines,
    write_run,
)

from otel_train import semconv as sc
from otel_train.analysis.build import build_report
from otel_train.analysis.goodput import BUCKETS
from otel_train.analysis.terminal import render_terminal

SPEC = RunSpec(ranks=4, steps=120, spike_steps=(37, 90), recompile_step=60)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_run(SPEC, tmp_path_factory.mktemp("goodput"))


def _terminal(report) -> str:
    out = io.StringIO()
    render_terminal(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def _rank_steps(run: Path) -> list[dict]:
    """Every rank_step span's rank, step, samples, tokens and duration, read independently
    of the report."""
    rows = []
    for path in sorted(run.glob("traces.rank-*.jsonl")):
        for line in path.read_text().splitlines():
            for _, span in each_span(json.loads(line)):
                if span["name"] == sc.SPAN_RANK_STEP:
                    rows.append({"rank": attr(span, sc.ATTR_RANK), "step": attr(span, sc.ATTR_STEP),
                                 "samples": attr(span, sc.ATTR_SAMPLES),
                                 "tokens": attr(span, sc.ATTR_TOKENS),
                                 "s": (int(span["endTimeUnixNano"])
                                       - int(span["startTimeUnixNano"])) / 1e9})
    return rows


# --- throughput ------------------------------------------------------------------------------


def _independent_steady_rate(run: Path, warm: set[int]) -> tuple[float, float]:
    """samples (tokens) per steady step over the steady step time, summed over ranks."""
    rows = [r for r in _rank_steps(run) if r["step"] not in warm]
    samples = tokens = 0.0
    for rank in {r["rank"] for r in rows}:
        mine = [r for r in rows if r["rank"] == rank]
        step_s = mean(r["s"] for r in mine)
        samples += mean(r["samples"] for r in mine) / step_s
        tokens += mean(r["tokens"] for r in mine) / step_s
    return samples, tokens


def test_steady_throughput_is_samples_per_steady_step_over_its_time(run_dir: Path) -> None:
    report = build_report(run_dir)
    warm = {w.step for w in report.warmup_steps}
    assert warm == {0, SPEC.recompile_step}
    samples, tokens = _independent_steady_rate(run_dir, warm)
    assert report.steady_samples_per_s == pytest.approx(samples, rel=0.05)
    assert report.steady_tokens_per_s == pytest.approx(tokens, rel=0.05)
    assert report.throughput_source == "spans"
    # the whole run's rate carries the 3 s first compile and the time between steps: lower
    trained = SPEC.ranks * SPEC.steps * SPEC.samples_per_step
    assert report.run_samples_per_s == pytest.approx(trained / report.wall_s, rel=1e-9)
    assert report.run_samples_per_s < 0.95 * report.steady_samples_per_s
    # per rank, and the sum is the run's
    assert sum(r.samples_per_s for r in report.rank_rows) == pytest.approx(
        report.steady_samples_per_s)
    text = _terminal(report)
    assert f"throughput: {report.steady_samples_per_s:,.1f} samples/s, " in text
    assert "tokens/s in the steady state (118 steps, summed over 4 ranks)" in text
    assert f"whole run, warm-up included: {report.run_samples_per_s:,.1f} samples/s" in text
    data = report.to_dict()
    assert {"steady_samples_per_s", "steady_tokens_per_s", "run_samples_per_s",
            "run_tokens_per_s"} <= set(data)


def test_throughput_without_samples_on_the_spans_comes_from_the_counters(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=2, steps=40, spike_steps=(), step_samples=False), tmp_path)
    report = build_report(run)
    assert report.throughput_source == "counters"
    warm = {w.step for w in report.warmup_steps}
    steady = [r for r in _rank_steps(run) if r["step"] not in warm]
    expected = sum(32 / mean(r["s"] for r in steady if r["rank"] == rank) for rank in (0, 1))
    assert report.steady_samples_per_s == pytest.approx(expected, rel=0.05)


def test_a_run_without_samples_says_no_throughput(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=2, steps=20, spike_steps=(), step_samples=False), tmp_path)
    drop_metric(run, sc.METRIC_SAMPLES)
    drop_metric(run, sc.METRIC_TOKENS)
    report = build_report(run)
    assert report.steady_samples_per_s is None and report.run_samples_per_s is None
    assert "samples/s" not in _terminal(report)


# --- goodput ---------------------------------------------------------------------------------


def test_goodput_buckets_add_up_to_the_wall_clock(run_dir: Path) -> None:
    report = build_report(run_dir)
    g = report.goodput
    assert g.source == "metrics" and g.note is None
    assert list(g.buckets_s) == list(BUCKETS)
    assert sum(g.buckets_s.values()) == pytest.approx(g.wall_s, abs=1e-6)
    assert g.wall_s == pytest.approx(report.wall_s)
    assert all(seconds >= 0 for seconds in g.buckets_s.values())
    assert g.ratio == pytest.approx(g.productive_s / g.wall_s)
    # the fixture's ranks start 2 s after their run span, and their steady steps' compute
    # (forward, backward, optimizer) is the productive time
    assert g.buckets_s[sc.GOODPUT_STARTUP] == pytest.approx(2.0)
    warm = {w.step for w in report.warmup_steps}
    by_rank = {r.rank: r for r in g.ranks}
    assert sorted(by_rank) == list(range(SPEC.ranks))
    rows = _rank_steps(run_dir)
    for rank, row in by_rank.items():
        assert sum(row.buckets_s.values()) == pytest.approx(row.total_s)
        steps = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["step"])
        # its start to its last step's end
        last_end = max(int(s["endTimeUnixNano"]) for path in run_dir.glob("traces.rank-*")
                       for line in path.read_text().splitlines()
                       for _, s in each_span(json.loads(line))
                       if s["name"] == sc.SPAN_RANK_STEP and attr(s, sc.ATTR_RANK) == rank)
        assert row.total_s == pytest.approx((last_end - T0_NS) / 1e9, abs=1e-6)
        assert row.buckets_s[sc.GOODPUT_WARMUP] + row.buckets_s[sc.GOODPUT_COMPILE] == \
            pytest.approx(sum(s["s"] for s in steps if s["step"] in warm), abs=1e-6)
    # the straggler's data-wait spikes are its loss
    assert by_rank[SPEC.straggler_rank].buckets_s[sc.GOODPUT_DATA_WAIT] > 3.0
    # CPU throttling is a cause beside the buckets, not one of them
    assert g.cpu_throttled_s == pytest.approx(0.002 * SPEC.steps / SPEC.ranks)
    assert "throttled" not in " ".join(g.buckets_s)
    text = _terminal(report)
    assert "Goodput" in text and f"goodput: {g.ratio:.0%} of the run's wall clock" in text
    assert "CPU throttling" in text and "not added to them" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["goodput"]["source"] == "metrics" and data["goodput"]["ratio"] == g.ratio


def test_goodput_of_an_older_run_comes_from_its_spans_and_agrees(run_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Without ``training.goodput.time`` (runs before it) a fully sampled run's buckets are
    derived from its run and step spans: the same numbers."""
    older = write_run(SPEC, tmp_path)
    drop_metric(older, sc.METRIC_GOODPUT_TIME)
    from_metrics, from_spans = build_report(run_dir).goodput, build_report(older).goodput
    assert from_spans.source == "traces"
    for bucket in BUCKETS:
        assert from_spans.buckets_s[bucket] == pytest.approx(
            from_metrics.buckets_s[bucket], abs=1e-6), bucket


def test_goodput_not_recorded_is_said_not_made_up(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=2, steps=60, spike_steps=(), sample_ratio=0.5,
                            goodput=False), tmp_path)
    report = build_report(run)
    g = report.goodput
    assert g.source is None and g.ratio is None and not g.buckets_s
    assert g.note.startswith("not recorded: no training.goodput.time")
    assert "sampled" in g.note
    text = _terminal(report)
    assert "goodput: not recorded" in text and "Goodput:" not in text


def test_goodput_of_ranks_started_apart_names_the_rest_other(tmp_path: Path) -> None:
    """The run's wall clock runs from the first rank's start: a rank whose run span starts
    1 s before the others' accounts leaves that second to ``other``."""
    run = write_run(RunSpec(ranks=2, steps=30, spike_steps=()), tmp_path)

    def earlier(request: dict) -> dict:
        for _, span in each_span(request):
            if span["name"] == sc.SPAN_RUN and attr(span, sc.ATTR_RANK) == 0:
                span["startTimeUnixNano"] = str(T0_NS - 2_000_000_000)
        return request

    rewrite_lines(run, sc.TRACES_GLOB, earlier)
    g = build_report(run).goodput
    assert sum(g.buckets_s.values()) == pytest.approx(g.wall_s, abs=1e-6)
    assert g.buckets_s["other"] == pytest.approx(2.0, abs=0.01)


# --- degenerate runs -------------------------------------------------------------------------


def test_a_one_rank_five_step_run_reads_sensibly(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=1, steps=5, straggler_rank=0, spike_steps=(),
                            recompile_step=-1), tmp_path)
    report = build_report(run)
    # the first (compile) step is the only one above the typical step: not every step
    assert [s.step for s in report.slow_steps] == [0]
    text = _terminal(report)
    assert "0 s of the 0 s" not in text and "of the 0 s" not in json.dumps(report.to_dict())
    # a world of one: no cross-rank comparison, no straggler, nothing "not compared"
    assert report.arrivals.unmatched == 0 and report.arrivals.matched == 0
    assert "not compared" not in text and "late arrivals" not in text
    assert "straggler" not in text
    assert "run fixture-run: 1 rank," in text


def test_no_step_above_typical_lists_none_and_says_why(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=1, steps=6, straggler_rank=0, spike_steps=(),
                            recompile_step=-1), tmp_path)

    def no_compile(request: dict) -> dict:  # a run without compile: no slow first step
        for spans, span in each_span(request):
            if span["name"] == sc.SPAN_COMPILE:
                spans.remove(span)
            for a in span.get("attributes", ()):
                if a["key"] in (sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_COMPILE,
                                sc.ATTR_RANK_STEP_PART_PREFIX + sc.PART_COMPILE):
                    a["value"] = {"doubleValue": 0.0}
            if span["name"] in (sc.SPAN_RANK_STEP, sc.SPAN_STEP) and attr(span, sc.ATTR_STEP) == 0:
                span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) - 3_000_000_000)
                for a in span["attributes"]:
                    if a["key"] == sc.ATTR_STEP_DURATION and span["name"] == sc.SPAN_RANK_STEP:
                        a["value"] = {"doubleValue": a["value"]["doubleValue"] - 3.0}
        return request

    rewrite_lines(run, sc.TRACES_GLOB, no_compile)
    report = build_report(run)
    assert report.slow_steps == []
    assert report.slow_steps_note == "too few steps to rank (5 steady)"
    assert "slowest steps: none listed: too few steps to rank (5 steady)" in _terminal(report)


def test_jitter_is_not_listed_among_the_slowest(run_dir: Path) -> None:
    report = build_report(run_dir, top=10)
    # the two data-wait spikes and the two compile steps; the rest is within 20% of typical
    assert sorted(s.step for s in report.slow_steps) == sorted(
        [0, SPEC.recompile_step, *SPEC.spike_steps])


# --- the per-rank rows -----------------------------------------------------------------------


def test_the_per_rank_columns_add_up_to_the_mean_step(run_dir: Path) -> None:
    report = build_report(run_dir)
    rows = _rank_steps(run_dir)
    warm = {w.step for w in report.warmup_steps}
    for row in report.rank_rows:
        steady = [r["s"] for r in rows if r["rank"] == row.rank and r["step"] not in warm]
        assert row.mean_s == pytest.approx(mean(steady), rel=1e-6)
        assert sum(row.phase_mean_s.values()) == pytest.approx(row.mean_s, rel=1e-6)
    text = _terminal(report)
    for row in report.rank_rows:
        shares = [c for c in text.splitlines() if c.strip().startswith(f"│    {row.rank} │")]
        assert shares, text
    assert "mean" in text
