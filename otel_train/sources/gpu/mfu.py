"""Throughput and efficiency per step: samples/s, tokens/s, achieved TFLOP/s and MFU.

FLOPs per optimizer step come from ``flops_per_step`` (argument or
``OTEL_TRAIN_FLOPS_PER_STEP``; :func:`count_flops` measures them, e.g. on a meta-device copy
of the model), or, on a CUDA run, are counted once with ``torch.utils.flop_counter.
FlopCounterMode`` during step ``MEASURE_STEP``, but only where the model has no compiled parts: a dispatch mode
around a compiled region could cost a recompile, which otel-train never adds. The device's
peak comes from ``peak_tflops`` or :data:`PEAK_BF16_TFLOPS` (dense bf16: MFU is quoted
against it, whatever the dtype). Rates use the step's wall time: steps tile the wall clock,
so their sum is the run's time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from otel_train import internal_errors, semconv, torch_compat
from otel_train.recorder import EVENT
from otel_train.sources import RunContext, step_uses
from otel_train.sources.gpu.device import training_device

RECORD = "otel_train.flops"
MEASURE_STEP = 1  # step 0 carries one-time work (lazy init, allocator growth)

#: dense bf16 TFLOP/s by device name (vendor datasheets); the first substring match wins
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200 NVL", 835.0),
    ("H200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("A100", 312.0),
)


def peak_tflops(device_name: str, table: tuple[tuple[str, float], ...] = PEAK_BF16_TFLOPS
                ) -> float | None:
    for key, value in table:
        if key in device_name:
            return value
    return None


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """FLOPs ``fn(*args, **kwargs)`` performs (a forward and backward, say), by op shapes:
    works on meta tensors, so a meta-device copy of the model costs no GPU time."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def has_compiled_parts(model: torch.nn.Module) -> bool:
    optimized = torch_compat.optimized_module_class() or ()
    return any(isinstance(m, optimized) or torch_compat.compiled_call_impl(m) is not None
               for m in model.modules())


class MfuSource:
    def __init__(self) -> None:
        self.flops: float | None = None
        self.peak: float | None = None
        self.tracker: Any = None
        self._counter: Any = None

    def start(self, ctx: RunContext) -> None:
        cfg = ctx.config
        self.flops = cfg.flops_per_step
        device = training_device(ctx.model)
        self.peak = cfg.peak_tflops
        if self.peak is None and device is not None:
            self.peak = peak_tflops(torch.cuda.get_device_name(device))
        self.emitter = ctx.emitter
        meter = ctx.meter
        self.samples_rate = semconv.create(meter, semconv.METRIC_THROUGHPUT_SAMPLES)
        self.tokens_rate = semconv.create(meter, semconv.METRIC_THROUGHPUT_TOKENS)
        self.flops_rate = semconv.create(meter, semconv.METRIC_FLOPS_ACHIEVED)
        self.mfu = semconv.create(meter, semconv.METRIC_MFU)
        ctx.emitter.on_event(RECORD, self._on_flops)
        ctx.emitter.before_step(self._before_step)
        if (self.flops is None and device is not None and ctx.model is not None
                and not has_compiled_parts(ctx.model)):
            self.tracker = ctx.tracker
            self._put = ctx.recorder.put
            self._unhooks = [ctx.tracker.add_phase_hook(self._phase_hook),
                             ctx.tracker.add_step_hook(self._step_hook)]

    def stop(self) -> None:
        if self._counter is not None:
            self._finish_count(publish=False)
        self._unhook()

    def _unhook(self) -> None:
        tracker = self.tracker
        if tracker is not None:
            for unhook in self._unhooks:
                unhook()
            self.tracker = None

    # --- training thread: count one step's FLOPs -------------------------------------
    def _phase_hook(self, begin: bool, now: int) -> None:
        tracker = self.tracker
        if begin and self._counter is None and tracker.step == MEASURE_STEP:
            try:
                from torch.utils.flop_counter import FlopCounterMode

                counter = FlopCounterMode(display=False)
                counter.__enter__()
                self._counter = counter
            except Exception as err:
                internal_errors.count("mfu", err)
                self._unhook()

    def _step_hook(self, step: int) -> None:
        if self._counter is not None:
            self._finish_count(publish=True)
            self._unhook()

    def _finish_count(self, publish: bool) -> None:
        counter, self._counter = self._counter, None
        try:
            counter.__exit__(None, None, None)
            if publish:
                self._put((EVENT, RECORD, float(counter.get_total_flops())))
        except Exception as err:
            internal_errors.count("mfu", err)

    # --- emitter thread --------------------------------------------------------------
    def _on_flops(self, flops: float) -> None:
        if flops > 0:
            self.flops = flops

    @step_uses(writes=("extra_attributes",))
    def _before_step(self, info: Any) -> None:
        record = info.record
        seconds = (record.end_ns - record.start_ns) / 1e9
        if seconds <= 0:
            return
        attrs = self.emitter.ident.metric_attributes()
        extra = record.extra_attributes
        if record.samples:
            extra[semconv.ATTR_SAMPLES_PER_S] = record.samples / seconds
            self.samples_rate.set(record.samples / seconds, attrs)
        if record.tokens:
            extra[semconv.ATTR_TOKENS_PER_S] = record.tokens / seconds
            self.tokens_rate.set(record.tokens / seconds, attrs)
        if self.flops:
            achieved = self.flops / seconds
            extra[semconv.ATTR_TFLOPS] = achieved / 1e12
            self.flops_rate.set(achieved, attrs)
            if self.peak:
                extra[semconv.ATTR_MFU] = achieved / (self.peak * 1e12)
                self.mfu.set(achieved / (self.peak * 1e12), attrs)
