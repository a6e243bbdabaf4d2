"""``otel-train report`` on generated run directories: what it attributes, and to whom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.report_fixtures import RunSpec, write_run

from otel_train import semconv as sc
from otel_train.analysis import attribution as st
from otel_train.analysis.build import build_report
from otel_train.analysis.otlp import (
    DamagedFileWarning,
    decode_attributes,
    iter_spans,
    signal_files,
)
from otel_train.analysis.terminal import straggler_lines
from otel_train.analysis.traces import UNTIMED, StepTable
from otel_train.cli import main

SPEC = RunSpec(ranks=4, steps=200, straggler_rank=2, spike_steps=(37, 120, 151))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(SPEC, tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def report(run_dir: Path):
    return build_report(run_dir, top=6)


def test_otlp_values_decode_to_python_types() -> None:
    attrs = decode_attributes([
        {"key": "i", "value": {"intValue": "123"}},
        {"key": "d", "value": {"doubleValue": 1.5}},
        {"key": "s", "value": {"stringValue": "x"}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}]}}},
    ])
    assert attrs == {"i": 123, "d": 1.5, "s": "x", "b": True, "a": [1]}


def test_exponential_histogram_points_read_as_histograms(tmp_path: Path) -> None:
    """OTLP JSON of an exponential histogram (scale 0: base 2) reads as the explicit one it
    equals: sum, count, exemplars, and buckets as bounds (positive bucket i is (2**i,
    2**(i+1)]; zero and below in the first)."""
    from otel_train.analysis.otlp import iter_metric_points

    point = {"attributes": [{"key": "training.rank", "value": {"intValue": "1"}}],
             "startTimeUnixNano": "1", "timeUnixNano": "2", "count": "6", "sum": 70.5,
             "scale": 0, "zeroCount": "1", "positive": {"offset": 3, "bucketCounts": ["2", "3"]},
             "exemplars": [{"asDouble": 9.0, "traceId": "ab", "spanId": "cd"}]}
    line = {"resourceMetrics": [{"resource": {"attributes": []}, "scopeMetrics": [{
        "metrics": [{"name": "training.step.duration", "unit": "s",
                     "exponentialHistogram": {"dataPoints": [point]}}]}]}]}
    path = tmp_path / "metrics.rank-1.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (got,) = list(iter_metric_points([path]))
    assert (got.kind, got.value, got.count, got.rank) == ("histogram", 70.5, 6, 1)
    assert got.bounds == [8.0, 16.0, 32.0] and got.bucket_counts == [1, 2, 3, 0]
    assert got.exemplars[0]["traceId"] == "ab"


def test_first_compile_is_the_slowest_step(report) -> None:
    first = report.slow_steps[0]
    assert (first.step, first.phase) == (0, sc.PHASE_COMPILE)


def test_the_first_compile_step_is_shown_apart_with_its_cause(report) -> None:
    first = report.warmup_steps[0]
    assert (first.step, first.phase, first.warmup) == (0, sc.PHASE_COMPILE, True)
    assert report.slow_steps[0].cause.endswith(" (warm-up)")


def test_data_wait_spikes_are_blamed_on_the_straggler(report) -> None:
    blamed = {s.step: s for s in report.slow_steps if s.phase == sc.PHASE_DATA_WAIT}
    assert set(blamed) == set(SPEC.spike_steps)
    for slow in blamed.values():
        assert slow.rank == SPEC.straggler_rank
        assert slow.phase_s == pytest.approx(SPEC.spike_s, abs=0.02)
        assert 0.85 < slow.share < 0.95


def test_cause_reads_as_one_line(report) -> None:
    slow = next(s for s in report.slow_steps if s.step == 37)
    assert slow.cause.startswith("step 37: rank 2 data wait 1.9")
    assert "% of step" in slow.cause and "\n" not in slow.cause


def test_recompile_step_is_blamed_on_compile(report) -> None:
    recompile = next(s for s in report.slow_steps if s.step == SPEC.recompile_step)
    assert recompile.phase == sc.PHASE_COMPILE
    assert SPEC.recompile_step in [s.step for s in report.warmup_steps]


def test_straggler_is_the_rank_with_the_most_own_work(report) -> None:
    assert report.straggler == SPEC.straggler_rank
    assert report.straggler_busy_ratio > 1.05


def test_per_rank_breakdown_covers_every_rank_and_phase(report) -> None:
    assert [r.rank for r in report.rank_rows] == list(range(SPEC.ranks))
    # the steady state's steps: the first and the recompile step are shown apart
    assert report.steady_steps == SPEC.steps - 2 == SPEC.steps - len(report.warmup_steps)
    assert all(r.steps == report.steady_steps for r in report.rank_rows)
    assert set(report.phases) == {*sc.TIMED_PHASES, sc.PHASE_EXPOSED_COMM, sc.PHASE_COMPILE}
    waits = {r.rank: r.phase_mean_s[sc.PHASE_DATA_WAIT] for r in report.rank_rows}
    assert max(waits, key=waits.get) == SPEC.straggler_rank
    comm = {r.rank: r.phase_mean_s[sc.PHASE_EXPOSED_COMM] for r in report.rank_rows}
    assert min(comm, key=comm.get) == SPEC.straggler_rank  # the others wait for it


def test_collectives_are_summed_by_op(report) -> None:
    (row,) = report.collectives
    assert row.op == "all_reduce"
    assert row.count == SPEC.ranks * SPEC.steps * 2
    assert row.bytes == SPEC.ranks * SPEC.steps * 75_000_000
    assert row.mean_bus_bw_gbps and row.max_bus_bw_gbps >= row.mean_bus_bw_gbps


def test_compiles_and_recompiles_are_counted_with_reasons(report) -> None:
    assert report.compile.compilations == SPEC.ranks * 2
    assert report.compile.recompiles == SPEC.ranks
    assert report.compile.reasons["first compile"] == SPEC.ranks
    assert report.compile.graph_breaks == SPEC.ranks


def test_resources_come_per_rank(report) -> None:
    throttled = {r.rank: r.cpu_throttled_s for r in report.resources}
    assert throttled[SPEC.straggler_rank] == pytest.approx(0.002 * SPEC.steps)
    assert all(r.memory_peak_bytes > 20e9 for r in report.resources)
    assert report.samples_per_s > 0 and report.dropped == {"spans": 0, "metrics": 0, "logs": 0}


def test_timeline_of_a_slow_step_has_every_rank_and_its_collectives(report) -> None:
    timeline = report.timelines[0]
    assert {b.rank for b in timeline.bars} == set(range(SPEC.ranks))
    kinds = {b.kind for b in timeline.bars}
    assert {*sc.TIMED_PHASES, sc.PHASE_COMPILE, "collective"} <= kinds
    assert all(0 <= b.start_s <= b.end_s <= timeline.duration_s + 1e-6 for b in timeline.bars)


def test_breakdown_over_time_spans_all_sampled_steps(report) -> None:
    bins = report.over_time
    assert bins[0].first_step == 0 and bins[-1].last_step == SPEC.steps - 1
    assert sum(b.phase_mean_s[sc.PHASE_COMPILE] for b in bins) > 0


def test_collector_file_exporter_output_reads_the_same(run_dir: Path, tmp_path: Path) -> None:
    """The collector writes one traces.jsonl for every rank: the report must not change."""
    for signal in ("traces", "metrics", "logs"):
        with open(tmp_path / f"{signal}.jsonl", "w", encoding="utf-8") as out:
            for path in signal_files(run_dir, f"{signal}*.jsonl"):
                out.write(path.read_text(encoding="utf-8"))
    merged, per_rank = build_report(tmp_path, top=6), build_report(run_dir, top=6)
    assert merged.to_dict() == per_rank.to_dict()


def test_sampled_run_reports_sampled_of_trained_steps(tmp_path: Path) -> None:
    run = write_run(RunSpec(ranks=2, steps=120, sample_ratio=0.3, spike_steps=()), tmp_path)
    report = build_report(run)
    assert report.trained_steps == 120
    assert 15 < report.sampled_steps < 60


def test_a_torn_last_line_is_left_out_and_named_truncated(run_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    text = signal_files(run_dir, sc.TRACES_GLOB)[0].read_text(encoding="utf-8")
    path.write_text(text + text.splitlines()[0][:500], encoding="utf-8")  # killed mid-line
    whole = sum(1 for _ in iter_spans([signal_files(run_dir, sc.TRACES_GLOB)[0]]))
    with pytest.warns(DamagedFileWarning, match=r"truncated: its last line, line \d+,"):
        assert sum(1 for _ in iter_spans([path])) == whole


def test_cli_json_is_the_report(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--json", "--top", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == SPEC.ranks
    assert data["slow_steps"][0]["cause"].startswith("step 0: rank")
    assert len(data["slow_steps"]) == 3


def test_cli_terminal_names_the_cause(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir.parent)]) == 0  # the root: its newest run is read
    out = capsys.readouterr().out
    assert "straggler: rank 2" in out
    assert "step 37: rank 2 data wait" in out


def test_cli_without_telemetry_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no traces" in capsys.readouterr().err


def test_run_id_picks_one_run_out_of_shared_files(tmp_path: Path) -> None:
    """A collector's file exporter appends every run to the same files."""
    for run_id, ranks in (("first", 2), ("second", 3)):
        run = write_run(RunSpec(ranks=ranks, steps=30, run_id=run_id, spike_steps=()),
                        tmp_path / "runs")
        for path in run.glob("*.jsonl"):
            signal = path.name.split(".")[0]
            with open(tmp_path / f"{signal}.jsonl", "a", encoding="utf-8") as out:
                out.write(path.read_text(encoding="utf-8"))
    assert build_report(tmp_path, run_id="second").ranks == [0, 1, 2]
    assert build_report(tmp_path, run_id="first").ranks == [0, 1]
    assert build_report(tmp_path).run_id == "first,second"  # says it mixed them


def test_a_torn_line_continued_by_a_restarted_writer_keeps_the_whole_request_and_is_named(
        run_dir: Path, tmp_path: Path) -> None:
    lines = signal_files(run_dir, sc.TRACES_GLOB)[0].read_text(encoding="utf-8").splitlines()
    path = tmp_path / "traces.jsonl"
    path.write_text(lines[0][:300] + lines[1] + "\n", encoding="utf-8")
    whole = tmp_path / "whole.jsonl"
    whole.write_text(lines[1] + "\n", encoding="utf-8")
    with pytest.warns(DamagedFileWarning, match=r"\(line 1: torn, 1 whole request on it read\)"):
        kept = [s.span_id for s in iter_spans([path])]
    assert kept == [s.span_id for s in iter_spans([whole])]


def _table(rows: list[tuple[int, int, float, dict[str, float]]]) -> StepTable:
    table = StepTable()
    for step, rank, duration, phases in rows:
        table.steps.append(step)
        table.ranks.append(rank)
        table.durations.append(duration)
        for phase, column in table.phases.items():
            column.append(phases.get(phase, 0.0))
        table.throttled.append(phases.get("throttled", 0.0))
    return table


def test_a_rank_waiting_inside_a_phase_is_not_blamed() -> None:
    """Rank 1 sleeps 0.2 s before forward; rank 0 waits for it inside its forward (no
    exposed_comm recorded). Totals alone blame rank 0; the phase start times do not."""
    normal = {sc.PHASE_DATA_WAIT: 0.01, sc.PHASE_FORWARD: 0.03, sc.PHASE_BACKWARD: 0.05}
    rows = [(s, r, 0.09, normal) for s in range(4) for r in (0, 1)]
    rows += [(4, 0, 0.32, {**normal, sc.PHASE_FORWARD: 0.26}),
             (4, 1, 0.32, {**normal, UNTIMED: 0.2})]
    table = _table(rows)
    durations = st.step_durations(table, {})
    starts = {0: 1_000_000_000, 1: 1_200_000_000}  # rank 1 began forward 0.2 s later

    naive = st.slow_steps(table, durations, 1)[0]
    assert (naive.rank, naive.phase) == (0, sc.PHASE_FORWARD)
    fixed = st.slow_steps(table, durations, 1, lambda step, phase: starts)[0]
    assert (fixed.rank, fixed.phase, fixed.phase_s) == (1, UNTIMED, 0.2)


def test_collective_wait_names_the_rank_the_others_wait_for() -> None:
    # synchronous steps of 2 s on 3 ranks: ranks 0 and 2 wait 0.8 s a step in collectives,
    # rank 1 (late) 0.2 s: the median rank loses 0.6 s, 30% of a step, to rank 1
    shares = st.collective_wait_shares({0: 80.0, 1: 20.0, 2: 80.0}, {0: 100, 1: 100, 2: 100},
                                       {0: 200.0, 1: 200.0, 2: 200.0})
    assert shares == pytest.approx({0: 0.0, 1: 0.3, 2: 0.0})
    # a balanced run: a few percent either way, below the threshold
    fair = st.collective_wait_shares({0: 50.0, 1: 55.0, 2: 46.0}, {0: 100, 1: 100, 2: 100},
                                     {0: 200.0, 1: 200.0, 2: 200.0})
    assert max(fair.values()) < st.STRAGGLER_WAIT_SHARE
    # one rank, or no steps: nothing to compare
    assert st.collective_wait_shares({0: 5.0}, {0: 10}, {0: 20.0}) == {}
    assert st.collective_wait_shares({0: 5.0, 1: 1.0}, {0: 0, 1: 0}, {}) == {}


def test_report_names_the_collective_wait_straggler_over_equal_step_times(tmp_path) -> None:
    spec = RunSpec(ranks=3, steps=40, straggler_rank=1, spike_steps=(10, 20, 30))
    report = build_report(write_run(spec, tmp_path))
    assert report.straggler == 1 and report.straggler_signal == "collective_wait"
    assert report.straggler_wait_rank == 1 and report.straggler_wait_share > 0.05
    out = straggler_lines(report)
    assert out and out[0].startswith("straggler: rank 1: the other ranks wait for it")


def test_a_slow_step_spent_waiting_in_collectives_is_blamed_on_the_rank_that_did_not_wait():
    # rank 0's forward ran 0.3 s over typical, and 0.28 s more of its step went to
    # collectives than rank 1's: it waited for rank 1, which is blamed instead
    assert st._waited_in_collectives(0, 0.3, {0: 0.30, 1: 0.02}) == 1
    # the blamed rank waited least itself: it is the late one
    assert st._waited_in_collectives(1, 0.3, {0: 0.30, 1: 0.02}) is None
    # a wait much smaller than the excess explains nothing; nor does a lone rank
    assert st._waited_in_collectives(0, 0.3, {0: 0.10, 1: 0.02}) is None
    assert st._waited_in_collectives(0, 0.3, {0: 0.30}) is None


def test_pass_two_by_line_offsets_reads_the_same_spans(run_dir: Path) -> None:
    """Pass two reads only the lines pass one saw a trace's spans on (by byte offset): the
    same spans as scanning every line for the trace ids."""
    from otel_train.analysis.traces import read_traces, spans_of_traces

    digest = read_traces(run_dir)
    wanted = {digest.step_trace[s] for s in (3, 37, 151)}
    by_offset = spans_of_traces(run_dir, wanted, digest=digest)
    by_scan = spans_of_traces(run_dir, wanted)
    key = lambda s: (s.trace_id, s.span_id)  # noqa: E731
    assert len(by_offset) > 3 * SPEC.ranks
    assert sorted(map(key, by_offset)) == sorted(map(key, by_scan))
    assert {s.trace_id for s in by_offset} == wanted


_NORMAL = {sc.PHASE_DATA_WAIT: 0.01, sc.PHASE_FORWARD: 0.03, sc.PHASE_BACKWARD: 0.05}


def test_a_slow_step_missing_a_rank_is_said_to_be_unexplained() -> None:
    # step 4 is slow, and rank 1 sent nothing for it: rank 0's forward may be a symptom
    rows = [(s, r, 0.09, _NORMAL) for s in range(4) for r in (0, 1)]
    rows += [(4, 0, 0.5, {**_NORMAL, sc.PHASE_FORWARD: 0.44})]
    table = _table(rows)
    slow = st.slow_steps(table, st.step_durations(table, {}), 1, world_ranks={0, 1})[0]
    assert slow.step == 4 and slow.unexplained is not None
    assert slow.unexplained.startswith("no telemetry from rank 1 for this step")
    assert slow.cause.startswith("step 4: not explained: no telemetry from rank 1")


def test_a_slow_step_where_no_phase_stands_out_is_said_to_be_unexplained() -> None:
    # every phase as usual, yet the step took longer (time the table does not hold)
    rows = [(s, r, 0.09, _NORMAL) for s in range(4) for r in (0, 1)]
    rows += [(4, r, 0.2, _NORMAL) for r in (0, 1)]
    table = _table(rows)
    slow = st.slow_steps(table, st.step_durations(table, {}), 1)[0]
    assert slow.step == 4
    assert slow.cause == ("step 4: not explained: its phases hold 0 s of the 0.11 s it took "
                          "over the typical step")


def test_a_cpu_throttled_rank_is_named_as_the_cause_of_its_slow_step() -> None:
    # rank 0 waits in backward for rank 1, whose cgroup throttled it 0.3 s in its forward
    rows = [(s, r, 0.09, _NORMAL) for s in range(4) for r in (0, 1)]
    rows += [(4, 0, 0.42, {**_NORMAL, sc.PHASE_BACKWARD: 0.38}),
             (4, 1, 0.42, {**_NORMAL, sc.PHASE_FORWARD: 0.34, "throttled": 0.3})]
    table = _table(rows)
    slow = st.slow_steps(table, st.step_durations(table, {}), 1)[0]
    assert (slow.rank, slow.phase, slow.throttled_s) == (1, sc.PHASE_FORWARD, 0.3)
    assert slow.cause.startswith("step 4: rank 1 CPU-throttled 0.3 s by its cgroup's CPU quota")
    # a little throttling beside a large excess explains nothing
    rows[-1] = (4, 1, 0.42, {**_NORMAL, "throttled": 0.02})
    table = _table(rows)
    slow = st.slow_steps(table, st.step_durations(table, {}), 1)[0]
    assert (slow.rank, slow.throttled_s) == (0, None)
