"""``otel-train compare``: changes with intervals from the steps, verdicts, where the time
moved, the gate's exit code; on synthetic runs with a planted slowdown and on real demo runs
that differ in one setting."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from support import report_fixtures as rf

from otel_train import semconv as sc
from otel_train.analysis.compare import (
    BETTER,
    DEFAULT_THRESHOLDS,
    NO_DIFFERENCE,
    SCHEMA,
    TOO_FEW_STEPS,
    WORSE,
    Comparison,
    compare,
    labels,
    parse_gate,
)
from otel_train.analysis.compare_runs import FIGURES, load_run
from otel_train.analysis.compare_stats import (
    Quantile,
    RatioOfSums,
    block_length,
    replicates,
    wilson_interval,
)
from otel_train.cli import main

SLOW_RANK, STEPS = 1, 120
#: no data-wait spikes: three 1.9 s steps in 120 would hide a 10 ms change of the mean
QUIET = {"steps": STEPS, "spike_steps": ()}


def slowed_backward(rank: int, factor: float) -> Callable[..., list[rf.RankStep]]:
    """report_fixtures' step, with ``rank``'s backward ``factor`` times longer: the others
    then wait for it in the all-reduce (their exposed communication grows), as in
    synchronous training."""
    simulate = rf.simulate_step

    def step(spec: rf.RunSpec, rng: random.Random, step: int,
             start_ns: int) -> list[rf.RankStep]:
        out = simulate(spec, rng, step, start_ns)
        done = [_before_all_reduce(rs) for rs in out]
        margin = done[0] + out[0].phases[sc.PHASE_EXPOSED_COMM] - max(done)
        out[rank].phases[sc.PHASE_BACKWARD] *= factor
        done[rank] = _before_all_reduce(out[rank])
        barrier = max(done) + margin
        for rs, ready in zip(out, done, strict=True):
            rs.phases[sc.PHASE_EXPOSED_COMM] = barrier - ready
            rs.end_ns = start_ns + int((barrier + rs.phases[sc.PHASE_OPTIMIZER]) * 1e9)
        return out

    return step


def _before_all_reduce(rs: rf.RankStep) -> float:
    return sum(s for p, s in rs.phases.items()
               if p not in (sc.PHASE_OPTIMIZER, sc.PHASE_EXPOSED_COMM))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    base = rf.write_run(rf.RunSpec(run_id="base", seed=1, **QUIET), root)
    again = rf.write_run(rf.RunSpec(run_id="again", seed=3, **QUIET), root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", slowed_backward(SLOW_RANK, 1.10))
        slow = rf.write_run(rf.RunSpec(run_id="slow", seed=2, **QUIET), root)
    return {"base": base, "again": again, "slow": slow}


def scaled_compute(factor: float) -> Callable[..., list[rf.RankStep]]:
    """report_fixtures' step with every rank's forward, backward and optimizer ``factor``
    times as long: what a slower machine does to a whole run."""
    simulate = rf.simulate_step

    def step(spec: rf.RunSpec, rng: random.Random, step: int,
             start_ns: int) -> list[rf.RankStep]:
        out = simulate(spec, rng, step, start_ns)
        for rs in out:
            extra = 0.0
            for phase in (sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER):
                extra += rs.phases[phase] * (factor - 1)
                rs.phases[phase] *= factor
            rs.end_ns += int(extra * 1e9)
        return out

    return step


def _compare(*paths: Path) -> Comparison:
    return compare([load_run(p, label) for p, label in zip(paths, labels(list(paths)),
                                                          strict=True)], resamples=500)


def _row(result: Comparison, key: str):
    return next(row for row in result.rows if row.figure.key == key)


# --- the statistics ---------------------------------------------------------------------------


def test_block_length_grows_as_the_cube_root() -> None:
    assert [block_length(n) for n in (1, 8, 19, 120, 10_000)] == [1, 2, 3, 5, 22]


def test_replicates_of_a_constant_series_are_the_constant() -> None:
    stats = {"mean": RatioOfSums([([2.0] * 30, [1.0] * 30)]),
             "median": Quantile([2.0] * 30, 0.5)}
    reps = replicates(stats, 30, 50, seed=0)
    assert set(reps["mean"]) == {2.0} and set(reps["median"]) == {2.0}


def test_the_interval_of_a_mean_covers_it_about_95_percent_of_the_time() -> None:
    # AR(1) steps (phi 0.5): an interval from single-step resampling would be too narrow
    rng, covered, trials = random.Random(5), 0, 60
    for trial in range(trials):
        x, series = 0.0, []
        for _ in range(200):
            x = 0.5 * x + rng.gauss(0, 1)
            series.append(x + 10)
        reps = replicates({"m": RatioOfSums([(series, [1.0] * 200)])}, 200, 300, seed=trial)
        ordered = sorted(reps["m"])
        covered += ordered[7] <= 10 <= ordered[292]
    assert covered >= 0.85 * trials


def test_wilson_interval() -> None:
    low, high = wilson_interval(0, 5)
    assert low == 0 and 0.43 < high < 0.44
    low, high = wilson_interval(5, 10)
    assert 0.23 < low < 0.24 and 0.76 < high < 0.77


# --- synthetic runs ---------------------------------------------------------------------------


def test_a_planted_slowdown_of_backward_on_one_rank_is_found(synthetic) -> None:
    result = _compare(synthetic["base"], synthetic["slow"])
    step = _row(result, "step_time").cells[0]
    assert step.verdict == WORSE and step.change_interval[0] > 0, step
    assert _row(result, "samples_per_s").cells[0].verdict == WORSE
    assert _row(result, "backward").cells[0].verdict == WORSE
    assert _row(result, "forward").cells[0].verdict == NO_DIFFERENCE
    where = result.where[0]
    assert where.parts[0].part == sc.PART_BACKWARD and where.parts[0].ranks == [SLOW_RANK]
    # ~10% of a ~100 ms backward, on that rank
    assert 0.006 < where.parts[0].delta_s < 0.016, where.parts
    assert "backward +" in where.sentence and f"on rank {SLOW_RANK}" in where.sentence
    assert "longer than base's" in where.sentence, where.sentence
    assert "wait for it: exposed comm" in where.sentence, where.sentence


@pytest.fixture(scope="module", params=[(2, 1), (64, 37)], ids=["2-ranks", "64-ranks"])
def planted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[int, int, Path, Path]:
    """(ranks, slowed rank, baseline, slowed run), 60 steps: the same steps in both (one seed:
    every other rank's time the same), with one rank's backward 10% longer in the second, as
    replicas of one real run would differ."""
    ranks, slowed = request.param
    root = tmp_path_factory.mktemp(f"compare-{ranks}")
    spec = {"ranks": ranks, "steps": 60, "spike_steps": (), "metrics_every": 30,
            "straggler_rank": min(2, ranks - 1)}
    base = rf.write_run(rf.RunSpec(run_id="base", seed=1, **spec), root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", slowed_backward(slowed, 1.10))
        slow = rf.write_run(rf.RunSpec(run_id="slow", seed=1, **spec), root)
    return ranks, slowed, base, slow


@pytest.mark.slow
def test_a_planted_slowdown_is_found_on_its_rank_and_the_sentence_stays_short(planted) -> None:
    ranks, slowed, base, slow = planted
    result = _compare(base, slow)
    step = _row(result, "step_time").cells[0]
    assert step.verdict == WORSE and step.change_interval[0] > 0, step
    where = result.where[0]
    assert where.parts[0].part == sc.PART_BACKWARD, where.sentence
    assert where.parts[0].ranks == [slowed], where.sentence
    others = "rank 0 waits" if ranks == 2 else f"ranks 0-{slowed - 1}, {slowed + 1}-{ranks - 1} wait"
    assert "backward +" in where.sentence and f"on rank {slowed}" in where.sentence
    assert f"{others} for it: exposed comm +" in where.sentence, where.sentence
    assert len(where.sentence) < 200, where.sentence


def test_ranks_are_named_as_runs() -> None:
    from otel_train.analysis.compare import _ranks_words

    assert _ranks_words([3]) == "rank 3"
    assert _ranks_words([2, 0]) == "ranks 0, 2"
    assert _ranks_words([*range(3), *range(4, 1024)]) == "ranks 0-2, 4-1023"
    assert _ranks_words(list(range(0, 40, 2))) == (
        "ranks 0, 2, 4, 6, 8, 10, 12, 14 and 12 more")


def test_the_figures_are_the_reports(synthetic) -> None:
    run = load_run(synthetic["slow"], "slow")
    report = run.report
    assert run.value("samples_per_s") == pytest.approx(report.steady_samples_per_s, rel=1e-9)
    assert run.value("tokens_per_s") == pytest.approx(report.steady_tokens_per_s, rel=1e-9)
    assert run.value("goodput") == report.goodput.ratio
    assert run.value("straggler") == report.straggler == SLOW_RANK
    # the mean step is the mean of the ranks' mean steps, and its parts add up to it
    ranks = report.rank_rows
    assert run.value("step_time") == pytest.approx(sum(r.mean_s for r in ranks) / len(ranks))
    assert sum(run.value(p) for p in sc.PARTS) == pytest.approx(run.value("step_time"))


def test_the_same_configuration_shows_no_detectable_difference(synthetic) -> None:
    result = _compare(synthetic["base"], synthetic["again"])
    for row in result.rows:
        if row.figure.stepwise and row.figure.key not in ("straggler_wait", "mfu"):
            assert row.cells[0].verdict == NO_DIFFERENCE, (row.figure.key, row.cells[0])
    assert "no different from" in result.where[0].sentence
    assert _row(result, "mfu").cells[0].verdict == "not recorded"  # these steps say none


def test_a_run_against_itself_shows_no_difference_on_every_row(synthetic) -> None:
    result = _compare(synthetic["base"], synthetic["base"])
    for row in result.rows:
        cell = row.cells[0]
        assert cell.verdict not in (BETTER, WORSE), (row.figure.key, cell)
        assert not cell.delta, (row.figure.key, cell)
    assert not result.failures


def test_the_json_document(synthetic, capsys) -> None:
    code = main(["compare", str(synthetic["base"]), str(synthetic["slow"]), "--json",
                 "--resamples", "200"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["gate"]["passed"] and doc["schema"] == SCHEMA  # +2.6% < 5%
    assert [r["label"] for r in doc["runs"]] == ["base", "slow"] and doc["runs"][0]["baseline"]
    assert [r["key"] for r in doc["rows"]] == [f.key for f in FIGURES]
    step = next(r for r in doc["rows"] if r["key"] == "step_time")
    assert step["better"] == "lower" and step["interval"] is True
    assert set(step["changes"][0]) == {"run", "verdict", "delta", "change", "delta_interval",
                                       "change_interval"}
    assert doc["gate"]["thresholds"] == {"step_time": "+5%", "samples_per_s": "-5%"}
    assert doc["where"][0]["parts"][0]["part"] == "backward"


def test_every_compute_part_moving_alike_is_said(synthetic, tmp_path) -> None:
    """A run whose every compute part is 30% longer (a slower machine) is called so; the
    planted slowdown of one rank's backward is not."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", scaled_compute(1.3))
        slower = rf.write_run(rf.RunSpec(run_id="slower", seed=1, **QUIET), tmp_path)
    where = _compare(synthetic["base"], slower).where[0]
    assert where.alike is not None and "moved alike" in where.sentence, where.sentence
    assert where.alike.startswith("forward, backward and optimizer all +30%"), where.alike
    assert _compare(synthetic["base"], synthetic["slow"]).where[0].alike is None
    faster = _compare(slower, synthetic["base"]).where[0]
    assert faster.alike is not None and "faster or quieter" in faster.alike, faster.sentence


def test_mfu_where_the_steps_say_it(tmp_path) -> None:
    """MFU from the rank steps' ``training.mfu``: the time-weighted mean over the steady
    steps (the model FLOPs over their time), lower with backward 10% longer on one rank
    (every step longer), and ``not recorded`` where a run's steps do not say it."""
    spec = {"ranks": 2, "steps": 40, "spike_steps": (), "mfu_at_1s": 0.05}
    base = rf.write_run(rf.RunSpec(run_id="mfu-base", seed=1, **spec), tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rf, "simulate_step", slowed_backward(1, 1.5))
        slow = rf.write_run(rf.RunSpec(run_id="mfu-slow", seed=2, **spec), tmp_path)
    plain = rf.write_run(rf.RunSpec(run_id="no-mfu", seed=1, **{**spec, "mfu_at_1s": None}),
                         tmp_path)
    result = _compare(base, slow, plain)
    row = _row(result, "mfu")
    runs = [load_run(base, "b")]
    steady = runs[0].steady_steps
    assert steady >= 10 and row.values[0] is not None
    # the time-weighted mean: 0.05 s-worth of peak FLOPs a step over the mean step
    assert row.values[0] == pytest.approx(0.05 / runs[0].value("step_time"), rel=1e-9)
    assert row.cells[0].verdict == WORSE and row.cells[0].change_interval[1] < 0
    assert row.values[2] is None and row.cells[1].verdict == "not recorded"


def test_runs_too_short_for_an_interval_say_so(tmp_path) -> None:
    short = rf.write_run(rf.RunSpec(run_id="short", steps=8, spike_steps=()), tmp_path)
    result = _compare(short, short)
    assert _row(result, "step_time").cells[0].verdict == TOO_FEW_STEPS
    assert "too few steady steps" in result.where[0].sentence
    assert not result.failures  # no worse beyond a threshold: the gate passes


# --- the gate ---------------------------------------------------------------------------------


def test_the_gate_fails_a_worse_run_and_passes_the_same_run(synthetic, capsys) -> None:
    base, slow = str(synthetic["base"]), str(synthetic["slow"])
    # the planted slowdown makes the step ~2.6% longer: below the default 5%, above 1%
    assert main(["compare", base, slow, "--resamples", "200"]) == 0
    assert main(["compare", base, slow, "--gate", "step_time=+1%", "--resamples", "200"]) == 1
    out = capsys.readouterr().out
    assert "gate: FAILED" in out and "step_time" in out
    assert main(["compare", base, base, "--gate", "step_time=+1%",
                 "--gate", "backward=+1ms", "--resamples", "200"]) == 0
    assert main(["compare", base, slow, "--gate", "backward=+1ms", "--resamples", "200"]) == 1
    assert main(["compare", base, slow, "--gate", "samples_per_s=-1%",
                 "--gate", "step_time=off", "--resamples", "200"]) == 1
    # a part held to a share of the step: backward grew by ~2.6% of the step
    assert main(["compare", base, slow, "--gate", "backward=+1%step", "--resamples", "200"]) == 1
    assert main(["compare", base, slow, "--gate", "backward=+5%step", "--resamples", "200"]) == 0
    assert "backward +1%step" in capsys.readouterr().out


def test_every_row_at_its_default_threshold(synthetic) -> None:
    """DEFAULT_THRESHOLDS holds every ranked row: nothing fails for a run against itself, the
    planted slowdown (backward +10% on one rank: ~2.6% of the step) fails none of them either
    (the parts are held to 5% of the step), and at 1% of the step backward fails."""
    runs = [load_run(synthetic["base"], "base"), load_run(synthetic["slow"], "slow")]
    assert set(DEFAULT_THRESHOLDS) == {f.key for f in FIGURES
                                      if f.better is not None and f.relative}
    assert DEFAULT_THRESHOLDS["backward"].of_step
    assert DEFAULT_THRESHOLDS["goodput"].absolute  # points, not relative
    assert not compare([runs[0], runs[0]], gates=DEFAULT_THRESHOLDS, resamples=200).failures
    assert not compare(runs, gates=DEFAULT_THRESHOLDS, resamples=200).failures
    tight = {**DEFAULT_THRESHOLDS, "backward": parse_gate("backward=+1%step")[1]}
    failed = compare(runs, gates=tight, resamples=200).failures
    assert [(f.key, f.threshold) for f in failed] == [("backward", "+1%step")]


def test_the_gate_passes_a_better_run(synthetic) -> None:
    assert main(["compare", str(synthetic["slow"]), str(synthetic["base"]),
                 "--gate", "step_time=+1%", "--resamples", "200"]) == 0


def test_gate_syntax() -> None:
    assert parse_gate("step_time=+3%")[1].amount == pytest.approx(0.03)
    assert parse_gate("samples_per_s=3%")[1].amount == pytest.approx(0.03)
    threshold = parse_gate("straggler_wait=+2ms")[1]
    assert threshold.absolute and threshold.amount == pytest.approx(0.002)
    assert parse_gate("step_time=off") == ("step_time", None)
    share = parse_gate("exposed_comm=+5%step")[1]
    assert share.of_step and not share.absolute and share.amount == pytest.approx(0.05)


@pytest.mark.parametrize(("argv", "said"), [
    (["compare", "RUN"], "give at least two runs"),
    (["compare", "RUN", "/nonexistent/run"], "/nonexistent/run does not exist"),
    (["compare", "RUN", "RUN", "--gate", "step_time=3"], "is not KEY=+N%"),
    (["compare", "RUN", "RUN", "--gate", "speed=+3%"], "no figure 'speed'"),
    (["compare", "RUN", "RUN", "--gate", "samples_per_s=+3%"], "write samples_per_s=-3%"),
    (["compare", "RUN", "RUN", "--gate", "straggler_wait=+3%"], "in ms or s"),
    (["compare", "RUN", "RUN", "--gate", "step_time=+3%step"], "only a part of the step"),
    (["compare", "RUN", "RUN", "--html", "/nonexistent/x.html"], "does not exist"),
])
def test_argument_errors_are_one_line(synthetic, capsys, argv, said) -> None:
    argv = [str(synthetic["base"]) if a == "RUN" else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's errors (otel_train.cli.Parser)
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("otel-train compare: ") and said in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_html_puts_the_runs_side_by_side(synthetic, tmp_path, capsys) -> None:
    page = tmp_path / "compare.html"
    main(["compare", str(synthetic["base"]), str(synthetic["slow"]), "--html", str(page),
          "--resamples", "200"])
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http" not in text
    assert "slow vs base" in text and "backward +" in text and "gate: passed" in text


# --- real runs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("demos")
    return {seq: rf.run_demo(root, f"seq-{seq}", steps=80, extra_args=("--seq-len", seq))
            for seq in ("32", "128")}


@pytest.mark.slow
def test_a_longer_sequence_is_a_longer_step_and_the_parts_that_grew_say_why(demo_runs) -> None:
    result = _compare(demo_runs["32"], demo_runs["128"])
    step = _row(result, "step_time").cells[0]
    assert step.verdict == WORSE and step.change_interval[0] > 0, step
    assert _row(result, "tokens_per_s").cells[0].verdict == BETTER  # 4x the tokens a step
    where = result.where[0]
    assert where.parts, where.sentence
    # the compute on 4x the tokens grew; whatever else is named grew too
    assert where.parts[0].part in (sc.PART_FORWARD, sc.PART_BACKWARD), where.sentence
    for move in where.parts:
        assert move.delta_s > 0 and _row(result, move.part).cells[0].delta > 0, where.sentence
    assert where.sentence.startswith("seq-128's step is") and " longer than " in where.sentence


@pytest.mark.slow
def test_a_real_run_against_itself_shows_no_difference(demo_runs) -> None:
    result = _compare(demo_runs["32"], demo_runs["32"])
    for row in result.rows:
        assert row.cells[0].verdict not in (BETTER, WORSE), (row.figure.key, row.cells[0])
    assert main(["compare", str(demo_runs["32"]), str(demo_runs["32"])]) == 0
