"""CPU-side behaviour of the GPU sources and of the emitter hooks they use (docs/gpu.md)."""

from __future__ import annotations

import importlib
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import otlp_files, training

import otel_train
from otel_train import config as config_mod
from otel_train import semconv
from otel_train.sources.gpu import mfu
from otel_train.sources.gpu.cuda_timing import GpuClock

instrument_mod = importlib.import_module("otel_train.instrument")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "TRACEPARENT",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(tmp_path, batches=8, **kwargs):
    model, opt, loader = training.setup(batches=batches)
    with otel_train.instrument(model, output_dir=tmp_path, console_log_level="warning",
                               **kwargs) as inst:
        steps = training.train(model, opt, loader)
    return inst, steps, otlp_files.only_run_dir(tmp_path)


# --- sources used by these tests (real sources, registered like the shipped ones) -------
class HoldingSource:
    """Holds every step until three more pumps have passed: a GPU that lags the host."""

    def start(self, ctx):
        self.emitter = ctx.emitter
        self.checks: Counter[int] = Counter()
        ctx.emitter.hold_steps(self.ready, max_held=1000)

    def ready(self, step):
        self.checks[step] += 1
        return self.checks[step] > 3

    def stop(self):
        pass


class NeverReadySource(HoldingSource):
    def ready(self, step):
        return False


class OverridingSource:
    """Gives every forward span new times, an attribute and an error status, by span id."""

    def start(self, ctx):
        self.tracker = ctx.tracker
        self.forwards: dict[int, list[int]] = {}
        ctx.tracker.phase_hooks = (*ctx.tracker.phase_hooks, self.hook)
        ctx.emitter.before_step(self.before)

    def hook(self, begin, now):
        if begin and self.tracker.phase == semconv.PHASE_FORWARD:
            self.forwards.setdefault(self.tracker.step, []).append(self.tracker.phase_span_id)

    def before(self, info):
        for span_id in self.forwards.pop(info.step, []):
            info.phase_overrides[span_id] = {
                "start_ns": info.start_ns + 1000, "end_ns": info.start_ns + 2000,
                "attributes": {"test.moved": True}, "error": "moved"}

    def stop(self):
        self.tracker.phase_hooks = ()


def test_phase_overrides_set_times_attributes_and_status(tmp_path, monkeypatch):
    monkeypatch.setattr(instrument_mod, "SOURCES", ("test_gpu_sources:OverridingSource",))
    _, steps, run_dir = _run(tmp_path)
    spans = otlp_files.spans(run_dir)
    starts = {s["attrs"][semconv.ATTR_STEP]: int(s["startTimeUnixNano"])
              for s in spans if s["name"] == semconv.SPAN_RANK_STEP}
    forwards = [s for s in spans if s["name"] == semconv.SPAN_FORWARD]
    assert len(forwards) == steps
    for span in forwards:
        start = starts[span["attrs"][semconv.ATTR_STEP]]
        assert int(span["startTimeUnixNano"]) == start + 1000
        assert int(span["endTimeUnixNano"]) == start + 2000
        assert span["attrs"]["test.moved"] is True
        assert span["status"]["code"] == 2  # ERROR
    backward = next(s for s in spans if s["name"] == semconv.SPAN_BACKWARD)
    assert "test.moved" not in backward["attrs"]


def test_held_steps_are_all_emitted_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(instrument_mod, "SOURCES",
                        ("test_gpu_sources:HoldingSource",), raising=True)
    _, steps, run_dir = _run(tmp_path, emit_interval_s=0.01)
    rank_steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    assert sorted(s["attrs"][semconv.ATTR_STEP] for s in rank_steps) == list(range(steps))


def test_a_step_never_ready_is_emitted_at_the_end_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(instrument_mod, "SOURCES",
                        ("test_gpu_sources:NeverReadySource",), raising=True)
    inst, steps, run_dir = _run(tmp_path)
    names = Counter(s["name"] for s in otlp_files.spans(run_dir))
    assert names[semconv.SPAN_RANK_STEP] == steps == 8
    assert inst.flushed


def test_cpu_run_has_no_gpu_telemetry(tmp_path):
    _, _, run_dir = _run(tmp_path, flops_per_step=1e6)
    spans = otlp_files.spans(run_dir)
    for span in spans:
        assert semconv.ATTR_TIMING not in span["attrs"]
        assert not any(k.startswith(semconv.ATTR_PHASE_GPU_TOTAL_PREFIX) for k in span["attrs"])
    for metric in (semconv.METRIC_PHASE_GPU_DURATION, semconv.METRIC_MEMORY_ALLOCATED_PEAK,
                   semconv.METRIC_MEMORY_RESERVED, semconv.METRIC_COMM_OVERLAP):
        assert otlp_files.metric_points(run_dir, metric) == [], metric


def test_throughput_and_mfu_from_given_flops_and_peak(tmp_path):
    _, _, run_dir = _run(tmp_path, flops_per_step=2e9, peak_tflops=100.0)
    rank_steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    for span in rank_steps:
        a = span["attrs"]
        seconds = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
        assert a[semconv.ATTR_SAMPLES_PER_S] == pytest.approx(4 / seconds, rel=1e-6)
        assert a[semconv.ATTR_TFLOPS] == pytest.approx(2e9 / seconds / 1e12, rel=1e-6)
        assert a[semconv.ATTR_MFU] == pytest.approx(a[semconv.ATTR_TFLOPS] / 100.0, rel=1e-9)
    mfu_points = otlp_files.metric_points(run_dir, semconv.METRIC_MFU)
    assert mfu_points and all(0 < p["asDouble"] < 1 for p in mfu_points)
    assert otlp_files.metric_points(run_dir, semconv.METRIC_THROUGHPUT_SAMPLES)


def test_peak_table_matches_device_names():
    assert mfu.peak_tflops("NVIDIA H200") == pytest.approx(989.4)
    assert mfu.peak_tflops("NVIDIA H200 NVL") == 835.0
    assert mfu.peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4)
    assert mfu.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert mfu.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert mfu.peak_tflops("NVIDIA B200") == 2250.0
    assert mfu.peak_tflops("NVIDIA GB200") == 2500.0
    assert mfu.peak_tflops("NVIDIA GeForce RTX 4090") is None


def test_count_flops_on_a_meta_model():
    with torch.device("meta"):
        model = torch.nn.Linear(64, 32, bias=False)
        x = torch.randn(8, 64)
    flops = mfu.count_flops(lambda: model(x).sum().backward())
    assert flops == 2 * (2 * 8 * 64 * 32)  # forward and the weight's gradient (x needs none)


def test_compiled_parts_are_detected():
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert not mfu.has_compiled_parts(plain)
    assert mfu.has_compiled_parts(torch.nn.Sequential(torch.compile(torch.nn.Linear(2, 2))))
    inner = torch.nn.Linear(2, 2)
    inner.compile()
    assert mfu.has_compiled_parts(torch.nn.Sequential(inner))


def test_profiler_window_on_cpu_gives_a_span_with_its_trace(tmp_path):
    _, _, run_dir = _run(tmp_path, batches=12, profile_every=4, profile_steps=2,
                         shutdown_timeout_s=60)
    windows = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_PROFILE]
    firsts = [w["attrs"][semconv.ATTR_PROFILE_FIRST_STEP] for w in windows]
    # step 8's window is skipped if step 4's is still being analysed: one at a time
    assert firsts in ([4], [4, 8])
    by_id = {s["spanId"]: s for s in otlp_files.spans(run_dir)}
    for window in windows:
        a = window["attrs"]
        assert a[semconv.ATTR_PROFILE_STEPS] == 2
        trace_path = a[semconv.ATTR_PROFILE_TRACE]
        assert trace_path.startswith(str(run_dir)) and trace_path.endswith(".json")
        import json
        with open(trace_path) as f:
            assert json.load(f)["traceEvents"]
        assert window.get("status", {}).get("code") != 2  # not ERROR
        assert semconv.ATTR_COMM_OVERLAP not in a  # no GPU kernels on a CPU run
        parent = by_id[window["parentSpanId"]]
        assert parent["name"] == semconv.SPAN_RANK_STEP
        assert parent["attrs"][semconv.ATTR_STEP] == a[semconv.ATTR_PROFILE_FIRST_STEP]


def test_profiler_is_off_by_default(tmp_path):
    _, _, run_dir = _run(tmp_path)
    assert not any(s["name"] == semconv.SPAN_PROFILE for s in otlp_files.spans(run_dir))
    assert not (run_dir / "profiles").exists()


def test_gpu_settings_from_environment():
    cfg = config_mod.load({"OTEL_TRAIN_CUDA_TIMING": "false", "OTEL_TRAIN_PROFILE_EVERY": "100",
                           "OTEL_TRAIN_PROFILE_STEPS": "3", "OTEL_TRAIN_FLOPS_PER_STEP": "1.5e15",
                           "OTEL_TRAIN_PEAK_TFLOPS": "989", "OTEL_TRAIN_PROFILE_DIR": "/tmp/p",
                           "OTEL_TRAIN_MEMORY_PEAK_PER_STEP": "1"})
    assert (cfg.cuda_timing, cfg.profile_every, cfg.profile_steps) == (False, 100, 3)
    assert (cfg.flops_per_step, cfg.peak_tflops, cfg.memory_peak_per_step) == (1.5e15, 989, True)
    assert str(cfg.profile_dir) == "/tmp/p"
    with pytest.warns(config_mod.ConfigWarning):
        assert config_mod.load({"OTEL_TRAIN_PROFILE_EVERY": "-1"}).profile_every == 0


# --- the GPU clock's mapping onto the wall clock ----------------------------------------
def test_clock_offset_is_the_tightest_lower_bound_within_the_upper_bounds():
    clock = GpuClock(window=4)
    assert clock.update(100.0, 500.0) == 100.0
    assert clock.update(80.0, 300.0) == 100.0  # a looser lower bound changes nothing
    assert clock.update(150.0, 400.0) == 150.0  # the GPU was idle: exact from here
    assert clock.uncertainty_ns == pytest.approx(150.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-1000, 1000), st.integers(-1000, 1000)), min_size=1,
                max_size=40), st.integers(1, 6))
def test_clock_window_agrees_with_a_scan_of_the_last_bounds(bounds, window):
    # the monotonic deques must give exactly what a scan of the window gives
    clock = GpuClock(window=window)
    for i, (lo, up) in enumerate(bounds):
        got = clock.update(float(lo), float(up))
        last = bounds[max(0, i + 1 - window):i + 1]
        lower, upper = max(b[0] for b in last), min(b[1] for b in last)
        assert got == (lower if lower <= upper else lo)
        assert clock.uncertainty_ns == max(upper - lower, 0)


def test_clock_follows_drift_once_old_bounds_leave_the_window():
    clock = GpuClock(window=2)
    clock.update(100.0, 120.0)
    clock.update(130.0, 150.0)  # crossing bounds (drift): the latest step wins
    assert clock.offset_ns == 130.0
    clock.update(131.0, 160.0)
    assert clock.offset_ns == 131.0 and not math.isnan(clock.uncertainty_ns)
