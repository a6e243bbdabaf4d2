"""The overhead benchmarks' statistics, and the CPU collective benchmark end to end."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import overhead_stats as stats  # noqa: E402


def _rounds(slowdown: float, noise: float, n: int = 40, seed: int = 1
            ) -> tuple[list[float], list[float]]:
    """Paired rounds whose bare arm drifts a lot between rounds and whose pair shares it."""
    rng = random.Random(seed)
    bare, inst = [], []
    for _ in range(n):
        drift = 20.0 * (1 + rng.uniform(-0.1, 0.1))  # ±10% between rounds, like a real machine
        bare.append(drift * (1 + rng.gauss(0, noise)))
        inst.append(drift * slowdown * (1 + rng.gauss(0, noise)))
    return bare, inst


def test_a_known_one_percent_slowdown_is_resolved() -> None:
    r = stats.paired_ratio(*_rounds(1.01, 0.002))
    assert r.contains(1.01)
    assert not r.contains(1.0)
    assert r.ci_low > 1.0 and r.half_width < 0.005


def test_identical_arms_give_an_interval_around_one() -> None:
    bare, _ = _rounds(1.0, 0.002)
    r = stats.paired_ratio(bare, list(bare))
    assert r.contains(1.0)
    assert r.median_ratio == 1.0 and r.ratio_of_medians == 1.0


def test_equal_arms_with_noise_give_an_interval_containing_one() -> None:
    r = stats.paired_ratio(*_rounds(1.0, 0.01))
    assert r.contains(1.0)
    assert r.ci_low < 1.0 < r.ci_high


def test_the_bootstrap_is_reproducible() -> None:
    bare, inst = _rounds(1.02, 0.01)
    assert stats.paired_ratio(bare, inst) == stats.paired_ratio(bare, inst)


def test_pairing_cancels_drift_that_unpaired_spread_would_show() -> None:
    r = stats.paired_ratio(*_rounds(1.01, 0.001))
    # the bare arm alone varies by ~10%, yet the paired interval is far narrower
    assert r.bare.cv > 0.03
    assert r.half_width < 0.002


def test_paired_difference_resolves_a_known_added_cost() -> None:
    bare, _ = _rounds(1.0, 0.001)
    inst = [b + 0.25 + 0.01 * ((i % 5) - 2) for i, b in enumerate(bare)]
    d = stats.paired_difference(bare, inst)
    assert d.contains(0.25) and not d.contains(0.0)
    assert stats.paired_difference(bare, list(bare)).contains(0.0)


def test_paired_ratio_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no values"):
        stats.paired_ratio([], [])
    with pytest.raises(ValueError, match="positive"):
        stats.paired_ratio([0.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        stats.paired_ratio([1.0], [math.nan])


def test_summary_of_the_bare_arm() -> None:
    s = stats.summarize([float(v) for v in range(1, 101)])
    assert s.n == 100 and s.median == 50.5 and s.max == 100 and s.min == 1
    assert s.spread == (1, 100)
    assert s.p99 == pytest.approx(99.01)
    assert s.cv == pytest.approx(29.01 / 50.5, rel=1e-3)
    assert stats.summarize([3.0]).cv == 0.0


def test_length_difference_cancels_fixed_costs() -> None:
    fixed, per_step = 0.7, 0.002
    assert stats.length_difference(fixed + 20 * per_step, fixed + 80 * per_step, 20, 80) == \
        pytest.approx(per_step)
    with pytest.raises(ValueError):
        stats.length_difference(1.0, 2.0, 80, 20)


def test_verdict_lists_missed_and_unmeasured_targets() -> None:
    targets = [stats.Target("cpu_us", "<", 250, "CPU per step", "us"),
               stats.Target("ratio", "<=", 1.005)]
    assert stats.verdict({"cpu_us": 100.0, "ratio": 1.005}, targets) == []
    missed = stats.verdict({"cpu_us": 250.0, "ratio": 1.004}, targets)
    assert missed == ["CPU per step < 250 us: measured 250"]
    missed = stats.verdict({"cpu_us": math.nan}, targets)
    assert [m.split(":")[1].strip() for m in missed] == ["not measured", "not measured"]
    with pytest.raises(ValueError):
        stats.Target("x", "=", 1)


def test_environment_table_names_machine_versions_and_date() -> None:
    text = stats.environment_markdown()
    for key in ("platform", "cpu_count", "python", "torch", "opentelemetry-sdk", "commit",
                "date"):
        assert f"| {key} |" in text
    assert stats.markdown_table(["a"], [["x|y"]]).splitlines()[-1] == "| x\\|y |"


@pytest.mark.slow
def test_cpu_benchmark_quick_run_measures_and_judges_itself(tmp_path: Path) -> None:
    out_json = tmp_path / "overhead.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_overhead_cpu.py"), "--quick",
         "--json", str(out_json)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out_json.exists(), proc.stderr[-4000:]
    report = json.loads(out_json.read_text())
    for key in ("environment", "plan", "figures", "verdict", "ranks", "ranks_raw"):
        assert key in report
    figures = report["figures"]
    assert figures["collectives_per_step"] >= 8
    assert len(report["ranks"]) == 2
    for rank in report["ranks"]:
        arm = rank["arms"]["instrumented"]
        assert rank["bare"]["cpu_per_step_us"]["median"] > 0  # it measured a real step
        assert len(arm["cpu_added_per_step_us"]["values"]) == report["plan"]["repeats"]
        assert arm["ratio"]["rounds"] == report["plan"]["rounds"]
        assert arm["ratio"]["ci_low"] <= arm["ratio"]["median_ratio"] <= arm["ratio"]["ci_high"]
        assert arm["threads_added_per_step_us"]
        assert math.isfinite(arm["own_threads_cpu_per_step_us"]["median"])
        in_block = arm["in_block_cpu_added_per_step_us"]
        assert in_block["ci_low"] <= in_block["median"] <= in_block["ci_high"]
    assert all(math.isfinite(v) for v in figures.values())
    # the benchmark's verdict follows from its own numbers, and its exit status from the verdict
    targets = [stats.Target(**t) for t in report["verdict"]["target_specs"]]
    assert targets
    missed = stats.verdict(figures, targets)
    assert report["verdict"]["missed"] == missed
    assert proc.returncode == (1 if missed else 0), proc.stderr[-4000:]


def test_exporter_benchmark_quick_run_accounts_for_every_collective(tmp_path: Path) -> None:
    """bench_exporter.py through the real exporter process, briefly: every collective sent
    is accounted for (own spans, or summaries that stand for the rest of their step), the
    default arm's budget summarised some steps and not others, and it judges itself (the
    target is not asserted here: CI's two cores are too noisy to judge 50,000 a second)."""
    out = tmp_path / "exporter.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_exporter.py"), "--seconds", "2",
         "--per-step", "200", "--step-rate", "50", "--arms", "auto,summary", "--repeats", "2",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    auto, summary = doc["results"]["auto"], doc["results"]["summary"]
    for r in (auto, summary):
        assert r["collectives"] == 2 * 200 * 50 and r["flushed"] and not r["dropped"], r
    # 2000 spans a second, a second's worth at once: 10 whole steps at first, then 10 a second
    assert 0 < auto["steps_summarised"] < auto["steps"]
    assert summary["steps_summarised"] == summary["steps"]
    assert auto["spans"] > summary["spans"] >= summary["summary_spans"] > 0
    assert ("verdict: all targets met" in out.read_text()) == (proc.returncode == 0)


def test_hot_path_hooks_only_arm_records_every_phase_and_restores_everything() -> None:
    """The ``--parts`` arm of bench_hot_path.py times the real hooks: each step records its
    four phases and its step, and leaving the arm restores what the hooks replaced."""
    import bench_hot_path
    import torch
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from otel_train import semconv
    from otel_train.recorder import PHASE, STEP

    model, opt, loader = bench_hot_path._setup()
    next_before, backward_before = _BaseDataLoaderIter.__next__, torch.autograd.backward
    arm = bench_hot_path._HooksOnly(model)
    with arm:
        bench_hot_path._steps(model, opt, loader, 5)
    records = arm.recorder.drain()
    phases = [r[2] for r in records if r[0] == PHASE]
    assert phases[:4] == list(semconv.TIMED_PHASES)
    assert len(phases) == 4 * 5
    assert sum(r[0] == STEP for r in records) == 4  # the fifth ends at the next phase
    assert _BaseDataLoaderIter.__next__ is next_before
    assert torch.autograd.backward is backward_before
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert model.__dict__.get("_compiled_call_impl") is None
    wrappers = bench_hot_path._WrappersOnly(model)
    with wrappers:
        bench_hot_path._steps(model, opt, loader, 3)
        assert model.__dict__.get("_compiled_call_impl") is not None  # the wrapper ran
    assert not wrappers.recorder.drain()  # its tracker declined every phase
    assert model.__dict__.get("_compiled_call_impl") is None


def test_hot_path_benchmark_quick_run_reports_parts_and_judges_itself(tmp_path: Path) -> None:
    out = tmp_path / "hot_path.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_hot_path.py"), "--blocks", "2",
         "--steps", "20", "--parts", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    text = out.read_text()
    assert "| the four hooks alone (no pipeline), against bare |" in text
    assert "| the running pipeline (instrumented against hooks alone) |" in text
    assert "| of which the wrappers alone (``begin`` declining at once), against bare |" in text
    assert ("verdict: all targets met" in text) == (proc.returncode == 0)


def test_collective_wrapper_benchmark_quick_run_compares_and_judges_itself(
        tmp_path: Path) -> None:
    out, before = tmp_path / "wrapper.md", tmp_path / "capture-before.py"
    before.write_text((REPO / "otel_train" / "sources" / "collectives" / "capture.py")
                      .read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_collective_wrapper.py"), "--calls", "200",
         "--repeats", "3", "--before", str(before), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    text = out.read_text()
    for case in ("| bare function |", "| covered, default group |", "| covered, group= |",
                 "| recorded (not covered), for scale |", "| before: covered, group= |"):
        assert case in text, text
    assert ("Verdict: PASS" in text) == (proc.returncode == 0)


def test_step_pairs_bare_steps_run_none_of_otel_train(tmp_path: Path) -> None:
    """bench_step_pairs.py's switch: in one instrumented run, the bare steps of the pairs
    are not tracked at all (no step, no phase), the instrumented ones are each one step with
    their four phases, and leaving restores what the hooks replaced."""
    import bench_step_pairs
    import torch
    from support import otlp_files
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from otel_train import semconv

    next_before, backward_before = _BaseDataLoaderIter.__next__, torch.autograd.backward
    pairs, warmup = 12, 3
    raw = bench_step_pairs.paired_run(bench_step_pairs.cpu_workload(), pairs, warmup,
                                      tmp_path, seed=1)
    assert len(raw["bare_wall_ns"]) == len(raw["inst_wall_ns"]) == pairs
    assert raw["steps_recorded"] == warmup + pairs
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    rank_steps = [s for s in spans if s["name"] == semconv.SPAN_RANK_STEP]
    assert len(rank_steps) == warmup + pairs
    for phase_span in semconv.PHASE_SPAN.values():
        assert sum(s["name"] == phase_span for s in spans) == warmup + pairs, phase_span
    assert _BaseDataLoaderIter.__next__ is next_before
    assert torch.autograd.backward is backward_before
    summary = bench_step_pairs.summarise(raw)
    assert summary["pairs"] == pairs and summary["ci_low"] <= summary["ratio"] <= summary["ci_high"]
    assert summary["bound"] >= summary["ratio"]  # background CPU only adds


def test_step_pairs_in_blocks_track_every_instrumented_step_and_none_of_the_bare(
        tmp_path: Path) -> None:
    """``--block``: each arm of a pair is several steps in a row; every instrumented one is a
    step of the run, no bare one is, and the figures are per step."""
    import bench_step_pairs
    from support import otlp_files

    from otel_train import semconv

    pairs, warmup, block = 6, 3, 4
    raw = bench_step_pairs.paired_run(bench_step_pairs.cpu_workload(), pairs, warmup,
                                      tmp_path, seed=1, block=block)
    assert len(raw["bare_wall_ns"]) == len(raw["inst_wall_ns"]) == pairs
    assert raw["steps_recorded"] == warmup + pairs * block and raw["block"] == block
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == warmup + pairs * block
    summary = bench_step_pairs.summarise(raw)
    assert summary["block"] == block and summary["bound"] >= summary["ratio"]
    # a block's figure is a step's: the same order as the one-step pairs' steps
    assert 0.2 < summary["bare_step_ms"] / (min(raw["bare_wall_ns"]) / 1e6) < 5


def test_step_pairs_quick_run_reports_the_ratio_and_its_bound(tmp_path: Path) -> None:
    out = tmp_path / "pairs.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_step_pairs.py"), "--pairs", "20",
         "--warmup", "5", "--out", str(out), "--json", str(tmp_path / "pairs.json")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "| **pair ratio, median [95% CI]** |" in text
    assert "| **bound: pair ratio + threads' CPU / bare step [95% CI]** |" in text
    assert "verdict: no target on the CPU" in text
    data = json.loads((tmp_path / "pairs.json").read_text())
    assert len(data["raw"]["bare_wall_ns"]) == 20 and data["summary"]["pairs"] == 20


def test_step_pairs_emitter_parts_give_each_recorded_steps_emit_and_its_listeners(
        tmp_path: Path) -> None:
    """``--emitter-parts``: the paired run also times the emitter by part; each recorded
    step is emitted once (``emit_step`` one call a step), its listeners inside it cost less
    than it, and the table is in the report."""
    out = tmp_path / "pairs.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_step_pairs.py"), "--pairs", "20",
         "--warmup", "5", "--emitter-parts", "--out", str(out), "--json",
         str(tmp_path / "pairs.json")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = json.loads((tmp_path / "pairs.json").read_text())["summary"]["emitter_parts"]
    emit = parts["emit_step (with listeners)"]
    assert emit["calls_per_step"] == pytest.approx(1.0), emit  # 25 recorded, 25 emitted
    assert emit["us_per_step"] > 0
    inside = [v["us_per_step"] for k, v in parts.items() if k.startswith("before ")]
    assert inside and sum(inside) < emit["us_per_step"], parts
    text = out.read_text()
    assert "The emitter by part (`--emitter-parts`" in text
    assert "emit_step (with listeners)" in text


def test_step_pairs_find_the_emitters_passes_inside_steps_and_leave_their_pairs_out(
        ) -> None:
    """The drain diagnostic: a pass that lands in a step is counted for that step's arm, and
    the "clear" pair ratio is that of the pairs no pass touched. Passes and steps are planted
    (the emitter's timing on a GPU host is what the device runs record): 40 pairs, the
    instrumented step of every fourth pair 2% longer with a pass inside it."""
    import importlib

    pairs_mod = importlib.import_module("bench_step_pairs")
    assert pairs_mod.overlap_ns((100, 200), [(50, 120), (150, 160), (190, 400), (500, 600)]
                                ) == 20 + 10 + 10
    assert pairs_mod.overlap_ns((100, 200), [(0, 100), (200, 300)]) == 0
    n, step = 40, 1_000_000
    raw = {"bare_wall_ns": [], "inst_wall_ns": [], "bare_cpu_ns": [0] * n,
           "inst_cpu_ns": [0] * n, "first": ["bare"] * n, "elapsed_s": 1.0,
           "background_s": {"otel-train-emitter": 0.0}, "steps_recorded": n, "block": 1,
           "bare_drain_ns": [0] * n, "inst_drain_ns": []}
    for i in range(n):
        jitter = 1 + 0.001 * (i % 5)
        raw["bare_wall_ns"].append(int(step * jitter))
        hit = i % 4 == 0
        raw["inst_wall_ns"].append(int(step * jitter * (1.02 if hit else 1.0)))
        raw["inst_drain_ns"].append(20_000 if hit else 0)
    summary = pairs_mod.summarise(raw)
    drains = summary["drains"]
    assert drains["inst_share"] == pytest.approx(0.25) and drains["bare_share"] == 0
    assert drains["inst_ms_per_step"] == pytest.approx(0.02 * 10 / 40)
    assert drains["clear_pairs"] == 30
    assert drains["clear_ratio"][0] == pytest.approx(1.0)


def test_step_pairs_parts_measure_every_variant_and_restore_the_sources(tmp_path: Path) -> None:
    import importlib

    import bench_step_pairs

    from otel_train.sources import cgroup

    instrument_module = importlib.import_module("otel_train.instrument")
    sources_before, interval_before = instrument_module.SOURCES, cgroup.MIN_READ_INTERVAL_NS
    parts = bench_step_pairs.parts_run(bench_step_pairs.cpu_workload(), rounds=1, pairs=10,
                                       warmup=3, out_dir=tmp_path, seed=1)
    assert set(parts) == set(bench_step_pairs.PART_ARMS)
    assert all(v["pairs"] == 10 for v in parts.values())
    assert instrument_module.SOURCES == sources_before
    assert cgroup.MIN_READ_INTERVAL_NS == interval_before > 0
    assert "OTEL_TRAIN_FASTPATH" not in os.environ  # the python_tracker variant's, undone
    # each variant really ran as named: no source wrote a cgroup sample in "no_sources"
    from support import otlp_files

    from otel_train import semconv

    for arm, has_cgroup in (("no_sources", False),
                            ("default", cgroup.cpu_stat_path() is not None)):
        run_dir = otlp_files.only_run_dir(tmp_path / f"{arm}-0")
        steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
        assert steps and all((semconv.ATTR_CPU_THROTTLED in s["attrs"]) == has_cgroup
                             for s in steps), arm


def test_every_default_variant_of_the_step_pairs_is_one_it_knows() -> None:
    """``--device cuda`` checks its default variants even without ``--parts``: an unknown
    one stopped the CUDA run before its first step (seen on the H200)."""
    import bench_step_pairs

    for arms in (bench_step_pairs.PART_ARMS, bench_step_pairs.CUDA_PART_ARMS):
        for arm in arms:
            bench_step_pairs._configure(arm)
    bench_step_pairs._configure("default")
    assert "OTEL_TRAIN_FASTPATH" not in os.environ


def _multigpu_dry_run(out: Path, ranks: int, *args: str) -> None:
    """bench/multigpu/run.py --dry-run (gloo, a tiny model) on ``ranks`` ranks under torchrun,
    its results in ``out``; no OTEL_ variable of this environment leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", str(ranks),
         str(REPO / "bench" / "multigpu" / "run.py"), "--dry-run", *args, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_multigpu_pairs_mode_runs_on_two_gloo_ranks(tmp_path: Path) -> None:
    """bench/multigpu/run.py's pairs mode (the x2 measurement to come), checked end to end
    with --dry-run: two gloo ranks, FSDP2, the same steps switched on every rank."""
    _multigpu_dry_run(tmp_path, 2, "--modes", "pairs", "--pairs", "12", "--pairs-block", "2")
    firsts = []
    for rank in (0, 1):
        res = json.loads((tmp_path / f"result-rank{rank}.json").read_text())["modes"]["pairs"]
        assert "error" not in res, res
        assert res["pairs"] == 12 and res["steps_recorded"] == 3 + 12 * 2 and res["block"] == 2
        assert res["bound"] >= res["ratio"] and "verdict" in res
        firsts.append(res["first"])
    assert firsts[0] == firsts[1]  # every rank switched the same steps


def test_emitter_parts_mode_times_the_emitter_by_part(tmp_path: Path) -> None:
    """bench/multigpu/run.py's emitter_parts mode (bench/emitter_parts.py patches the emitter's
    methods by name: a rename there had broken it silently), one gloo rank, --dry-run."""
    _multigpu_dry_run(tmp_path, 1, "--modes", "emitter_parts", "--cost-long", "20")
    res = json.loads((tmp_path / "result-rank0.json").read_text())["modes"]["emitter_parts"]
    assert "error" not in res, res
    parts = res["parts"]
    assert parts["emit_step (with listeners)"]["calls_per_step"] == pytest.approx(1.0, abs=0.1)
    assert parts["emit_step: sampler decision"]["calls_per_step"] >= 0.9
    assert parts["pump (all)"]["us_per_step"] >= parts["emit_step (with listeners)"]["us_per_step"]
    assert (tmp_path / "emitter-parts-rank0.txt").read_text().count("us/step") == len(parts)


def test_step_pairs_bare_steps_do_not_ring_the_gap_samplers_overrun_alarm(
        tmp_path: Path) -> None:
    """The tracker moves the gap sampler's overrun alarm at each step's start; a bare step
    (that part switched off) must not find it where the instrumented step before it left
    it, or it rings in most bare steps, a step "past its typical length" only because the
    bench stopped moving it, and the bound charges wake-ups that a run with every step
    recorded never has (seen: ~0.75 rings a pair, the gap sampler's CPU a step unchanged
    by the alarm on the H100). Steps of ~60 ms spent inside the forward phase: nothing for
    the sampler but overruns."""
    import time

    import bench_step_pairs
    import torch

    import otel_train
    from otel_train import tracker

    if tracker.tracker_class() is not tracker.CStepTracker and sys.version_info < (3, 13):
        pytest.skip("this tracker cannot move the overrun alarm (the Python one before 3.13)")

    class Slow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.06)
            return self.lin(x)

    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, 4)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    runs: list = []

    def instrument():
        inst = otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                                     console_log_level="warning", emit_interval_s=0.2)
        runs.append(inst)
        return inst

    pairs = 24
    bench_step_pairs.paired_run((model, opt, step, lambda: None), pairs, 6, tmp_path,
                                seed=1, instrument=instrument)
    gaps = next(s for s in runs[0]._sources if type(s).__name__ == "GapSource")
    assert gaps.wakeups > 0  # the sampler ran
    # an instrumented step followed by a bare one: ~0.75 a pair (18 here) without the fix
    assert gaps.alarms <= 3, gaps.alarms
