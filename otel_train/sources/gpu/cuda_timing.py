"""GPU-true phase times: CUDA events at phase boundaries, resolved off the training thread.

Training thread (a ``StepTracker`` phase hook): at each forward, backward and optimizer phase
(and region the user named) begin and end, record a pooled ``torch.cuda.Event(enable_timing=True)`` on the current stream
(asynchronous: it only enqueues a marker; ``torch_compat.event_recorder`` skips the Python of
``current_stream()``) and put one record per phase. Nothing else.

Emitter thread: the step is held back (``Emitter.hold_steps``) until every event of the step
has completed, which is checked with ``Event.query()``, never waited for; then the GPU
durations are read with ``elapsed_time`` and the step's spans and metrics are built. A step
whose events are still pending after ``MAX_HELD`` later steps is emitted with host times
only, and its events go back to the pool once they complete.

GPU times onto the wall clock (:class:`GpuClock`): the GPU's own times are chained from step
to step in float64 (``elapsed_time`` is float32 milliseconds: it stays precise only over
short spans). Wall = GPU + offset, and every event bounds the offset from both sides: it
cannot complete before the host recorded it (lower bound) nor after the emitter first saw it
complete (upper bound). The estimate is the tightest lower bound over recent steps, which is
exact whenever the GPU was idle when a marker was recorded (the first step, a data wait,
any synchronising call), clipped by the upper bounds.

The emitter's reads go straight to the CUDA driver (``cuEventQuery``/``cuEventElapsedTime`` on
the events' raw handles, ``_fastpath.cuda_elapsed``) where the C extension is built and
``fastpath`` is on: torch's ``Event.query``/``elapsed_time`` wrap the same calls in a device
guard and Python argument handling, several microseconds each on the emitter's cold core,
a dozen times a step. The first read is checked against torch's; any driver error, or a
mismatch, puts the run back on torch's calls (counted in ``otel_train.internal.errors``).
"""

from __future__ import annotations

import collections
import time
from typing import Any

import torch

from otel_train import internal_errors, semconv, torch_compat
from otel_train.recorder import EVENT
from otel_train.sources import RunContext, step_uses
from otel_train.sources.gpu.device import training_device

try:  # the driver's event calls without torch's Python around them (_fastpath.c)
    from otel_train._fastpath import cuda_elapsed as _driver_elapsed
except ImportError:  # not built, or a build older than this source
    _driver_elapsed = None

RECORD = "otel_train.cuda_timing"
#: steps that may wait for their GPU events before they are emitted with host times only
MAX_HELD = 64
#: events in the pool at most (two per timed phase); past it phases go untimed
MAX_EVENTS = 4096
#: steps over which the clock offset's bounds are kept
CLOCK_WINDOW = 1024
#: the one phase not GPU-timed (host time by nature); forward, backward, optimizer and the
#: regions users name (otel_train.region) are
_UNTIMED = semconv.PHASE_DATA_WAIT


class EventPool:
    """Timing events, reused: taken on the training thread, given back by the emitter.

    ``deque.append``/``popleft`` are atomic under the GIL: no lock on either side.
    """

    def __init__(self, prealloc: int = 64, cap: int = MAX_EVENTS) -> None:
        self._free: collections.deque[torch.cuda.Event] = collections.deque(
            torch.cuda.Event(enable_timing=True) for _ in range(prealloc))
        self.created = prealloc
        self.cap = cap

    def take(self) -> torch.cuda.Event | None:
        try:
            return self._free.popleft()
        except IndexError:
            if self.created >= self.cap:
                return None
            self.created += 1
            return torch.cuda.Event(enable_timing=True)

    def give(self, event: torch.cuda.Event) -> None:
        self._free.append(event)


class GpuClock:
    """GPU event times (float64 ns since the first reference event) and their wall offset."""

    def __init__(self, window: int = CLOCK_WINDOW) -> None:
        self.ref: Any = None  # a completed event whose GPU time is known
        self.ref_ns = 0.0
        self.window = window
        self._n = 0  # bounds taken so far
        # the window's largest lower bound and smallest upper bound, kept as monotonic
        # deques of (index, bound): O(1) a step, where a scan of the window cost ~70 us
        self._lowers: collections.deque[tuple[int, float]] = collections.deque()
        self._uppers: collections.deque[tuple[int, float]] = collections.deque()
        self.offset_ns: float | None = None
        self.uncertainty_ns = 0.0

    def rebase(self, event: Any, after_ref_ms: float | None = None) -> float:
        """GPU time of a completed ``event``, which becomes the reference for the next one
        (``after_ref_ms``: its time after the reference, where already read)."""
        if self.ref is None:
            gpu_ns = 0.0
        else:
            if after_ref_ms is None:
                after_ref_ms = self.ref.elapsed_time(event)
            gpu_ns = self.ref_ns + after_ref_ms * 1e6
        self.ref, self.ref_ns = event, gpu_ns
        return gpu_ns

    def update(self, lower_ns: float, upper_ns: float) -> float:
        """Take one step's bounds on (wall - gpu); return the offset estimate over the last
        ``window`` steps' bounds."""
        i = self._n
        self._n += 1
        lowers, uppers = self._lowers, self._uppers
        while lowers and lowers[-1][1] <= lower_ns:
            lowers.pop()
        lowers.append((i, lower_ns))
        while uppers and uppers[-1][1] >= upper_ns:
            uppers.pop()
        uppers.append((i, upper_ns))
        oldest = i - self.window
        while lowers[0][0] <= oldest:
            lowers.popleft()
        while uppers[0][0] <= oldest:
            uppers.popleft()
        lower, upper = lowers[0][1], uppers[0][1]
        # bounds from far apart in time can cross by clock drift: the latest step wins then
        self.offset_ns = lower if lower <= upper else lower_ns
        self.uncertainty_ns = max(upper - lower, 0.0)
        return self.offset_ns


class CudaTimingSource:
    def __init__(self) -> None:
        self._open: tuple[Any, int] | None = None
        self._pending: dict[int, list[tuple[Any, ...]]] = collections.defaultdict(list)
        self._seen_done: dict[int, int] = {}  # step -> wall ns its events were first seen done
        #: step -> its events' GPU ns after its first event, (begin, end) per phase
        self._relative: dict[int, list[tuple[float, float]]] = {}
        self._orphans: list[Any] = []
        self.failures = 0
        self.tracker: Any = None
        #: the driver's calls (None: torch's); checked against torch's at the first read
        self._driver: Any = None
        self._driver_checked = False
        #: step -> (the clock's reference when it was read, the step's first event's ms
        #: after it): the driver's read of what GpuClock.rebase would ask torch
        self._after_ref: dict[int, tuple[Any, float]] = {}
        #: (phase, wall ns its GPU work ended) of the last resolved step's last timed phase:
        #: the GPU's stretch from there to the next step's first phase is that step's
        self._last_gpu_end: tuple[str, int] | None = None

    # --- start/stop (training thread) ------------------------------------------------
    def start(self, ctx: RunContext) -> None:
        if not ctx.config.cuda_timing:
            return
        device = training_device(ctx.model)
        if device is None:
            return  # CPU: nothing changes
        with torch.cuda.device(device):
            self.pool = EventPool()
        self.device = device
        self.clock = GpuClock()
        self.emitter = ctx.emitter
        self._put = ctx.recorder.put
        self._capturing = torch_compat.stream_capturing()
        self._record = torch_compat.event_recorder()
        self.tracker = ctx.tracker
        self.hist = semconv.create(ctx.meter, semconv.METRIC_PHASE_GPU_DURATION)
        ctx.emitter.on_event(RECORD, self._on_record)
        ctx.emitter.hold_steps(self._ready, MAX_HELD)
        ctx.emitter.before_step(self._before_step)
        self._unhook = ctx.tracker.add_phase_hook(self._phase_hook)
        if ctx.config.fastpath and _driver_elapsed is not None:
            self._driver = _driver_elapsed

    def stop(self) -> None:
        if self.tracker is not None:
            self._unhook()

    # --- hot path (training thread) --------------------------------------------------
    def _phase_hook(self, begin: bool, now: int) -> None:
        tracker = self.tracker
        if tracker.phase == _UNTIMED:
            return
        try:
            if begin:
                self._open = None
                if self._capturing():  # inside a CUDA graph capture: no timing events
                    return
                event = self.pool.take()
                if event is not None:
                    self._record(event)
                    self._open = (event, now)
                return
            opened, self._open = self._open, None
            if opened is None or self._capturing():
                return
            end = self.pool.take()
            if end is None:
                return
            self._record(end)
            self._put((EVENT, RECORD, (tracker.step, tracker.phase, tracker.phase_span_id,
                                       opened[0], end, opened[1], now)))
        except Exception as err:
            internal_errors.count("cuda_timing", err)
            self.failures += 1
            if self.failures >= 10:  # something is wrong with CUDA here: stop trying
                self.stop()

    # --- emitter thread --------------------------------------------------------------
    def _on_record(self, payload: tuple[Any, ...]) -> None:
        self._pending[payload[0]].append(payload)

    def _ready(self, step: int) -> bool:
        """Have the step's events completed? Then their GPU times, relative to the step's
        first event, are read now (kept for ``_before_step``). Few driver calls: each costs
        ~3 us on this thread while the training thread launches kernels (the driver's lock;
        bench/nccl/driver_calls.c): one query of the step's last event, then one
        ``elapsed_time`` per other event, which fails rather than waits on an event not yet
        complete (phases run on several streams)."""
        self._recycle_orphans()
        if step in self._seen_done:
            return True
        entries = self._pending.get(step)
        if not entries:
            return True
        first = entries[0][3]
        if self._driver is not None:
            rel = self._driver_read(entries)
            if rel is not None:
                if not rel:
                    return False
                self._seen_done[step] = time.time_ns()
                self._relative[step] = rel
                return True
        if not entries[-1][4].query():
            return False
        try:
            rel = [(0.0 if begin is first else first.elapsed_time(begin) * 1e6,
                    first.elapsed_time(end) * 1e6) for *_, begin, end, _, _ in entries]
        except RuntimeError:  # an event on another stream is not done yet
            return False
        self._seen_done[step] = time.time_ns()
        self._relative[step] = rel
        return True

    def _driver_read(self, entries: list[tuple[Any, ...]]) -> list[tuple[float, float]] | None:
        """The step's times through the driver: (begin, end) ns after its first event per
        phase, [] while not complete, None where the driver's calls are off (now or from
        here: a driver error, or a first read unlike torch's). A second call reads the step's
        first event after the clock's reference (``_after_ref``: what rebase asks)."""
        first = entries[0][3]
        events = []
        for entry in entries:
            events.append(entry[3])
            events.append(entry[4])
        ref = self.clock.ref
        driver = self._driver
        try:
            ms = driver(first.cuda_event, tuple(e.cuda_event for e in events), True)
            if ms is not None and not self._driver_checked:
                self._check_driver(first, events, ms)
            if ms is not None and ref is not None and ref is not first:
                after = driver(ref.cuda_event, (first.cuda_event,), False)
                if after is None:  # the first event on another stream, not done yet
                    return []
                self._after_ref[entries[0][0]] = (ref, after[0])
        except Exception as err:
            internal_errors.count("cuda_timing", err)
            self._driver = None
            return None
        if ms is None:
            return []
        return [(ms[i] * 1e6, ms[i + 1] * 1e6) for i in range(0, len(ms), 2)]

    def _check_driver(self, first: Any, events: list[Any], ms: tuple[float, ...]) -> None:
        """The first driver read against torch's own for the same events (once a run)."""
        self._driver_checked = True
        torch_ms = [0.0 if e is first else first.elapsed_time(e) for e in events]
        if any(abs(a - b) > 1e-3 for a, b in zip(ms, torch_ms, strict=True)):
            raise RuntimeError(f"the driver's event times {ms} differ from torch's {torch_ms}")

    @step_uses(writes=("gpu_ends", "gpu_between", "phase_overrides", "extra_attributes"))
    def _before_step(self, info: Any) -> None:
        step = info.record.step
        entries = self._pending.pop(step, [])
        seen = self._seen_done.pop(step, None)
        rel = self._relative.pop(step, None)
        after_ref = self._after_ref.pop(step, None)
        for stale in [s for s in self._pending if s < step]:
            self._orphans.extend(e for entry in self._pending.pop(stale) for e in entry[3:5])
            self._relative.pop(stale, None)
            self._after_ref.pop(stale, None)
        if not entries:
            return
        if seen is None or rel is None:  # released unresolved (too many held): host times
            self._orphans.extend(e for entry in entries for e in entry[3:5])
            self._last_gpu_end = None
            return
        try:
            self._resolve(info, entries, seen, rel, after_ref)
        finally:
            for entry in entries:
                for event in entry[3:5]:
                    if event is not self.clock.ref:
                        self.pool.give(event)

    def _resolve(self, info: Any, entries: list[tuple[Any, ...]], seen_wall: int,
                 rel: list[tuple[float, float]], after_ref: tuple[Any, float] | None = None
                 ) -> None:
        wall = self.emitter.wall
        first = entries[0][3]
        old_ref = self.clock.ref
        # the reference read with the step's events holds only if it is still the reference
        base = self.clock.rebase(first, after_ref[1] if after_ref is not None
                                 and after_ref[0] is old_ref else None)
        if old_ref is not None and old_ref is not first:
            self.pool.give(old_ref)
        times = []  # (phase, span id, gpu begin, gpu end, host begin, host end) ns
        for (_, phase, span_id, _, _, h_begin, h_end), (r_begin, r_end) in zip(entries, rel):
            times.append((phase, span_id, base + r_begin, base + r_end, wall(h_begin),
                          wall(h_end)))
        lower = max(max(t[4] - t[2], t[5] - t[3]) for t in times)
        upper = seen_wall - max(t[3] for t in times)
        offset = self.clock.update(lower, upper)
        totals: dict[str, float] = {}
        ctx = self.emitter.exemplar_context(info)
        extra = info.record.extra_attributes
        attrs = {semconv.ATTR_RANK: self.emitter.ident.rank,
                 semconv.ATTR_RUN_ID: self.emitter.ident.run_id}
        for phase, span_id, g_begin, g_end, h_begin, h_end in times:
            seconds = max(g_end - g_begin, 0.0) / 1e9
            totals[phase] = totals.get(phase, 0.0) + seconds
            over = info.phase_overrides.setdefault(span_id, {})
            over["start_ns"], over["end_ns"] = int(g_begin + offset), int(g_end + offset)
            over.setdefault("attributes", {}).update({
                semconv.ATTR_TIMING: semconv.TIMING_GPU,
                semconv.ATTR_HOST_DURATION: (h_end - h_begin) / 1e9})
        for phase, seconds in totals.items():
            extra[semconv.ATTR_PHASE_GPU_TOTAL_PREFIX + phase] = seconds
            self.hist.record(seconds, {**attrs, semconv.ATTR_PHASE: phase}, context=ctx)
        # when the GPU finished each phase's work, beside when the host ended the phase:
        # how long the host's next stretch outside the phases waited for it (sources/gaps/)
        info.gpu_ends = [(int(h_end), int(g_end + offset))
                         for _, _, _, g_end, _, h_end in times]
        info.gpu_between = self._between(times, offset)
        extra[semconv.ATTR_STEP_GPU_DURATION] = (
            max(t[3] for t in times) - min(t[2] for t in times)) / 1e9
        extra[semconv.ATTR_GPU_LAG] = max(
            times[0][2] + offset - times[0][4], 0.0) / 1e9
        extra[semconv.ATTR_GPU_CLOCK_UNCERTAINTY] = (
            self.clock.uncertainty_ns / 1e9)

    def _between(self, times: list[tuple[Any, ...]], offset: float
                 ) -> list[tuple[str, str, int, int, int]]:
        """The GPU's stretches between one timed phase's work and the next one's (the step
        before's last phase to this step's first, then within the step), on the wall
        clock: what the device ran there was queued outside every phase (a loss, a metric,
        gradient clipping, an EMA), or it waited for the host to queue the next phase. The
        gap listener tells the two apart by what the host did meanwhile. Phases on another
        stream than the one before (a stretch that ends before it begins) give none."""
        out = []
        last = self._last_gpu_end
        for phase, _, g_begin, g_end, h_begin, _ in sorted(times, key=lambda t: t[4]):
            begin = int(g_begin + offset)
            if last is not None and begin > last[1]:
                out.append((last[0], phase, last[1], begin, int(h_begin)))
            last = (phase, int(g_end + offset))
        self._last_gpu_end = last
        return out

    def _recycle_orphans(self) -> None:
        if not self._orphans:
            return
        keep = []
        for event in self._orphans:
            (self.pool.give if event.query() else keep.append)(event)
        self._orphans = keep
