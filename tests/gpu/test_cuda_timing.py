"""GPU-timed phases on a real GPU: span times, totals, and agreement with plain CUDA events."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_training  # noqa: E402
from support import otlp_files  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _instrumented(tmp_path, steps=12, **kwargs):
    model, opt, data = gpu_training.setup()
    gpu_training.train(model, opt, data, 3)  # warm-up: cuBLAS handles, allocator
    torch.cuda.synchronize()
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                               console_log_level="warning", **kwargs):
        gpu_training.train(model, opt, data, steps)
    return otlp_files.only_run_dir(tmp_path), (model, opt, data)


def test_phase_spans_carry_gpu_times(tmp_path):
    run_dir, _ = _instrumented(tmp_path)
    spans = otlp_files.spans(run_dir)
    timed = [s for s in spans if s["name"] in (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD,
                                                semconv.SPAN_OPTIMIZER)]
    assert len(timed) == 36
    assert all(s["attrs"][semconv.ATTR_TIMING] == semconv.TIMING_GPU for s in timed)
    rank_steps = {s["attrs"][semconv.ATTR_STEP]: s for s in spans
                  if s["name"] == semconv.SPAN_RANK_STEP}
    for span in timed:
        step = rank_steps[span["attrs"][semconv.ATTR_STEP]]
        phase = span["attrs"][semconv.ATTR_PHASE]
        seconds = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
        total = step["attrs"][semconv.ATTR_PHASE_GPU_TOTAL_PREFIX + phase]
        assert seconds == pytest.approx(total, abs=2e-6)
    # stream order: on the GPU each phase starts after the one before it ended
    ordered = sorted(timed, key=lambda s: (s["attrs"][semconv.ATTR_STEP],
                                           int(s["startTimeUnixNano"])))
    for before, after in zip(ordered, ordered[1:]):
        assert int(before["endTimeUnixNano"]) <= int(after["startTimeUnixNano"]) + 1000
    assert otlp_files.metric_points(run_dir, semconv.METRIC_PHASE_GPU_DURATION)


def test_gpu_forward_time_agrees_with_events_around_a_bare_forward(tmp_path):
    run_dir, (model, _, data) = _instrumented(tmp_path)
    forwards = [(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
                for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_FORWARD]
    bare = []
    for i in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x, _ = data[i % len(data)]
        start.record()
        model(x)
        end.record()
        end.synchronize()
        bare.append(start.elapsed_time(end) / 1e3)
    assert statistics.median(forwards[2:]) == pytest.approx(statistics.median(bare), rel=0.15)


def test_gpu_times_lie_after_the_host_launched_them(tmp_path):
    run_dir, _ = _instrumented(tmp_path)
    for span in otlp_files.spans(run_dir):
        if span["name"] == semconv.SPAN_RANK_STEP:
            assert span["attrs"][semconv.ATTR_GPU_LAG] >= 0
            assert span["attrs"][semconv.ATTR_STEP_GPU_DURATION] > 0


def test_cuda_timing_can_be_switched_off(tmp_path):
    run_dir, _ = _instrumented(tmp_path, cuda_timing=False)
    assert not any(semconv.ATTR_TIMING in s["attrs"] for s in otlp_files.spans(run_dir))


def test_event_recorder_marks_the_current_stream_as_event_record_does():
    """``torch_compat.event_recorder`` (the phase hook's record, without building a Stream
    each time) marks the stream that is current, a side stream inside ``torch.cuda.stream``
    too: an event recorded there after a long kernel is not done before the kernel is,
    while the default stream's is; and the same key finds the same stream again."""
    from otel_train import torch_compat

    record = torch_compat.event_recorder()
    assert record is not torch_compat._record_default
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    for _ in range(2):  # the second time through, both streams come from the cache
        on_side, on_default = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU spin on the side stream only
            record(on_side)
        record(on_default)
        on_default.synchronize()
        assert not on_side.query(), "recorded on the default stream, not the current one"
        side.synchronize()
        assert on_side.query()
    torch.cuda.synchronize()


def test_the_driver_reads_give_torchs_event_times_and_wait_for_nothing():
    """``_fastpath.cuda_elapsed`` (the emitter's route to the driver's event calls) gives
    torch's ``elapsed_time`` for the same events, and None, not a wait, for an event the GPU
    has not reached."""
    from otel_train import _fastpath

    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    events[0].record()
    torch.cuda._sleep(2_000_000)
    events[1].record()
    torch.cuda._sleep(2_000_000)
    events[2].record()
    events[2].synchronize()
    ms = _fastpath.cuda_elapsed(events[0].cuda_event, tuple(e.cuda_event for e in events), True)
    assert ms == tuple(0.0 if e is events[0] else events[0].elapsed_time(e) for e in events)
    assert 0.0 == ms[0] < ms[1] < ms[2]
    late = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(500_000_000)  # ~0.3 s of GPU time ahead of the host
    late.record()
    assert _fastpath.cuda_elapsed(events[0].cuda_event, (late.cuda_event,), True) is None
    assert _fastpath.cuda_elapsed(events[0].cuda_event, (late.cuda_event,), False) is None
    late.synchronize()
    assert _fastpath.cuda_elapsed(events[0].cuda_event, (late.cuda_event,), True)[0] > ms[2]


def test_a_run_reads_its_gpu_times_through_the_driver_and_stays_on_it(tmp_path):
    model, opt, data = gpu_training.setup()
    gpu_training.train(model, opt, data, 3)
    torch.cuda.synchronize()
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path,
                               console_log_level="warning") as inst:
        gpu_training.train(model, opt, data, 12)
        source = next(s for s in inst._sources if type(s).__name__ == "CudaTimingSource")
    assert source._driver_checked, "no step was read through the driver"
    assert source._driver is not None, "the driver's reads were given up (a mismatch, an error)"
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    timed = [s for s in spans if s["name"] == semconv.SPAN_FORWARD]
    assert len(timed) == 12
    assert all(s["attrs"][semconv.ATTR_TIMING] == semconv.TIMING_GPU for s in timed)
