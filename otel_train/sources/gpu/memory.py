"""Memory per step from the CUDA caching allocator's statistics, and out-of-memory errors.

At each step end, on the training thread, one ``torch._C._cuda_memoryStats(device)`` call
(host-side: the allocator's counters under its own lock, no CUDA call; ``docs/gpu.md`` has
its measured cost) gives allocated and reserved bytes, their peaks and the allocation
retries; the emitter turns them into gauges and ``training.rank_step`` attributes. Peaks are
since the start (what ``torch.cuda.max_memory_allocated()`` reports) unless
``memory_peak_per_step`` resets them at every step end.

Out of memory: an allocator observer (``torch._C._cuda_attach_out_of_memory_observer``, which
the allocator calls before it raises, outside its lock) logs ``training.oom`` with the
allocator's summary under the current phase's span and marks that span as an error. The
observer cannot be detached, so one per process forwards to the active run only.
"""

from __future__ import annotations

from typing import Any

import torch

from otel_train import internal_errors, semconv, torch_compat
from otel_train.recorder import EVENT
from otel_train.sources import RunContext, step_uses
from otel_train.sources.gpu.device import training_device

RECORD = "otel_train.memory"
OOM_RECORD = "otel_train.oom"

_oom_target: MemorySource | None = None
_oom_attached = False


def _on_oom(device: int, requested: int, device_allocated: int, device_free: int) -> None:
    target = _oom_target
    if target is None:
        return
    try:  # whatever happens here, the allocator's own OutOfMemoryError must propagate
        target.on_oom(device, requested, device_free)
    except Exception as err:
        internal_errors.count("memory", err)


def read_stats(device: int) -> tuple[int, int, int, int, int, int]:
    """(allocated, allocated peak, reserved, reserved peak, alloc retries, OOMs) now."""
    stats = torch_compat.cuda_memory_stats(device)
    allocated = stats["allocated_bytes"]["all"]
    reserved = stats["reserved_bytes"]["all"]
    return (allocated["current"], allocated["peak"], reserved["current"], reserved["peak"],
            stats["num_alloc_retries"], stats["num_ooms"])


class MemorySource:
    def __init__(self) -> None:
        self.tracker: Any = None
        self._last_retries: int | None = None
        self._ooms: dict[int, tuple[Any, ...]] = {}
        self._by_step: dict[int, tuple[int, ...]] = {}  # steps held back by cuda_timing

    def start(self, ctx: RunContext) -> None:
        global _oom_target, _oom_attached
        device = training_device(ctx.model)
        if device is None:
            return
        self.device = device
        self.reset_peaks = ctx.config.memory_peak_per_step
        self.tracker = ctx.tracker
        self.log = ctx.log
        self.emitter = ctx.emitter
        self._put = ctx.recorder.put
        meter = ctx.meter
        self.gauges = {name: semconv.create(meter, name) for name in (
            semconv.METRIC_MEMORY_ALLOCATED_PEAK, semconv.METRIC_MEMORY_RESERVED,
            semconv.METRIC_MEMORY_ALLOCATED, semconv.METRIC_MEMORY_RESERVED_PEAK,
            semconv.METRIC_MEMORY_FRAGMENTATION)}
        self.retries = semconv.create(meter, semconv.METRIC_MEMORY_ALLOC_RETRIES)
        self.ooms = semconv.create(meter, semconv.METRIC_MEMORY_OOMS)
        self._attrs = ctx.emitter.ident.metric_attributes()
        self._latest: tuple[int, ...] | None = None
        ctx.emitter.on_event(RECORD, self._on_record)
        ctx.emitter.on_event(OOM_RECORD, self._on_oom_record)
        ctx.emitter.on_tick(self._publish)
        ctx.emitter.before_step(self._before_step)
        self._unhook = ctx.tracker.add_step_hook(self._step_hook)
        if not _oom_attached:
            torch_compat.attach_oom_observer(_on_oom)
            _oom_attached = True
        _oom_target = self

    def stop(self) -> None:
        global _oom_target
        if self.tracker is None:
            return
        self._unhook()
        if _oom_target is self:
            _oom_target = None

    # --- training thread -------------------------------------------------------------
    def _step_hook(self, step: int) -> None:
        try:
            self._put((EVENT, RECORD, (step, *read_stats(self.device))))
            if self.reset_peaks:
                torch_compat.reset_peak_memory_stats(self.device)
        except Exception as err:
            internal_errors.count("memory", err)

    def on_oom(self, device: int, requested: int, device_free: int) -> None:
        """In the allocator's OOM path, on the thread that allocated, before it raises."""
        tracker = self.tracker
        summary = torch.cuda.memory_summary(device, abbreviated=True)
        step, span_id = tracker.step, tracker.phase_span_id if tracker.phase else 0
        self.log.error(semconv.LOG_OOM, device=device, requested_bytes=requested,
                       device_free_bytes=device_free, allocator_summary=summary,
                       phase=tracker.phase)
        self._put((EVENT, OOM_RECORD, (step, span_id, requested, device_free, summary)))

    # --- emitter thread --------------------------------------------------------------
    def _on_record(self, payload: tuple[int, ...]) -> None:
        step, allocated, peak, reserved, reserved_peak, retries, ooms = payload
        if self._last_retries is None:
            self.retries.add(0, self._attrs)
        elif retries > self._last_retries:
            self.retries.add(retries - self._last_retries, self._attrs)
        self._last_retries = retries
        self._latest = payload  # the gauges take the drain's last step (_publish)
        self._by_step[step] = (peak, reserved, reserved - allocated, retries)
        if len(self._by_step) > 256:  # their step records were dropped
            del self._by_step[min(self._by_step)]

    def _publish(self) -> None:
        """Once a drain: a gauge keeps only its last value, so the drain's last step sets
        them (five measurements a step had cost the emitter ~5 us, and their sending more)."""
        latest, self._latest = self._latest, None
        if latest is None:
            return
        _, allocated, peak, reserved, reserved_peak, _, _ = latest
        attrs = self._attrs
        for name, value in ((semconv.METRIC_MEMORY_ALLOCATED_PEAK, peak),
                            (semconv.METRIC_MEMORY_RESERVED, reserved),
                            (semconv.METRIC_MEMORY_ALLOCATED, allocated),
                            (semconv.METRIC_MEMORY_RESERVED_PEAK, reserved_peak),
                            (semconv.METRIC_MEMORY_FRAGMENTATION, reserved - allocated)):
            self.gauges[name].set(value, attrs)

    def _on_oom_record(self, payload: tuple[Any, ...]) -> None:
        self._ooms[payload[0]] = payload
        self.ooms.add(1, self.emitter.ident.metric_attributes())

    @step_uses(writes=("extra_attributes", "phase_overrides"))
    def _before_step(self, info: Any) -> None:
        record = info.record
        latest = self._by_step.pop(record.step, None)
        if latest is not None:
            peak, reserved, fragmentation, retries = latest
            record.extra_attributes.update({
                semconv.ATTR_MEMORY_ALLOCATED_PEAK: peak,
                semconv.ATTR_MEMORY_RESERVED: reserved,
                semconv.ATTR_MEMORY_FRAGMENTATION: fragmentation,
                semconv.ATTR_MEMORY_ALLOC_RETRIES: retries})
        oom = self._ooms.pop(record.step, None)
        if oom is not None:
            _, span_id, requested, device_free, summary = oom
            error = f"CUDA out of memory: {requested} bytes requested, {device_free} free"
            record.extra_attributes[semconv.ATTR_OOM_REQUESTED] = requested
            if span_id:
                info.phase_overrides.setdefault(span_id, {})["error"] = error
                info.phase_overrides[span_id].setdefault("attributes", {}).update({
                    semconv.ATTR_OOM_REQUESTED: requested,
                    semconv.ATTR_OOM_DEVICE_FREE: device_free,
                    semconv.ATTR_OOM_SUMMARY: summary[:4000]})
