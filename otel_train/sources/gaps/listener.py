"""The gap source's step listener: a finished step's untimed stretches and long data waits
named, matched to the sampler's samples, and added to the step.

Runs on the emitter thread only: :meth:`GapListener._on_step` is a pre-step listener
(``Emitter.before_step``), :meth:`GapListener._add_untimed` a tick listener. What it shares,
and how:

- with the sampler thread (sampler.py): it takes the samples up to each step's end out of
  ``samples`` (a bounded deque the sampler appends to: popleft is atomic, and samples
  arrive in time order), appends each emitted step's length to ``_lengths`` (a bounded
  deque) and then raises ``_emitted`` (the sampler takes a new median when it changes), and
  sets ``aim`` (one attribute: where in a step the sampler should look next; None for
  nowhere);
- with the other pre-step listeners, through the step (``StepWork``, emitter/work.py): it
  reads ``gpu_ends`` and ``gpu_between``, which the CUDA timing source writes (declared
  with ``step_uses``: the emitter runs that listener first), and writes ``events`` and
  ``extra_attributes``.

The rest (the last phase of the step before, the carried locations, the GPU ends of the
step before, the untimed time not yet added) is this thread's alone.
"""

from __future__ import annotations

import collections
from collections import Counter
from typing import Any

from otel_train import semconv
from otel_train.sources import step_uses
from otel_train.sources.gaps.frames import (
    DATA_WAIT,
    SAMPLE_AGE_S,
    Frame,
    Sample,
    segment_name,
)

#: a stretch outside every phase, or a data wait, at least this long becomes an event
MIN_GAP_S = 0.01
#: events of each kind per step at most (the longest)
MAX_EVENTS = 3
#: an emitted step's stretch (or data wait) this much longer than SAMPLE_AGE_S or more is
#: aimed at in the steps after it, until AIM_MISSES emitted steps in a row have none
AIM_MIN_S = 0.01
AIM_MISSES = 3
#: a stretch (or data wait) with no sample of its own is given the location last sampled in
#: one of the same segment at most CARRY_S before, within CARRY_RATIO of its length, and the
#: step that was sampled in (``training.gap.location_step``)
CARRY_S = 10.0
CARRY_RATIO = 2.0
_CARRY_NS = int(CARRY_S * 1e9)
#: a phase's host end and the stretch after it are one instant; their clocks' readings may
#: differ by this much
_SAME_INSTANT_NS = 1_000_000

_HOST_BUSY, _DEVICE_WAIT = semconv.PHASE_HOST_BUSY, semconv.PHASE_DEVICE_WAIT
_GPU_OUTSIDE = semconv.PHASE_GPU_OUTSIDE_PHASES
_HOST_BUSY_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + _HOST_BUSY
_DEVICE_WAIT_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + _DEVICE_WAIT
_GPU_OUTSIDE_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + _GPU_OUTSIDE


class GapListener:
    """The emitter thread's part of ``GapSource``: the step listener and the tick."""

    # set by GapSource.start (the training thread), before the listeners are registered
    emitter: Any
    # shared with the sampler thread (sampler.py): see the module's docstring
    samples: collections.deque[Sample]
    _lengths: collections.deque[int]
    _emitted: int
    aim: int | None

    def _init_listener(self, ctx: Any, on_device: bool) -> None:
        """The emitter thread's own state, made on the training thread before the listeners
        are registered."""
        self._last_phase: str | None = None  # the previous step's last phase
        # a run on a GPU with its phases GPU-timed: a stretch is split into the part the
        # host was blocked on the device and the part it was busy (else all of it is busy)
        self._on_device = on_device
        self._gpu_ends: list[tuple[int, int]] | None = []  # the previous step's
        self._gpu_between: list[tuple[str, str, int, int, int]] | None = []  # likewise
        self._untimed = semconv.create(ctx.meter, semconv.METRIC_UNTIMED_TIME)
        base = {semconv.ATTR_RANK: ctx.identity.rank, semconv.ATTR_RUN_ID: ctx.identity.run_id}
        self._part_attrs = {part: {**base, semconv.ATTR_UNTIMED_PART: part}
                            for part in (_DEVICE_WAIT, _GPU_OUTSIDE, _HOST_BUSY)}
        #: training.untimed.time not yet added, by part, in ns: the steps' sum, added once a
        #: drain (:meth:`_add_untimed`, on the emitter's tick), not once a step
        self._untimed_ns: dict[str, int] = {}
        self._aim_misses = 0
        #: by segment (or DATA_WAIT): the last stretch located by its own samples, as
        #: (step, its end in perf ns, its length in ns, its code.* attributes)
        self._located: dict[str, tuple[int, int, int, dict[str, Any]]] = {}

    @step_uses(reads=("gpu_ends", "gpu_between"), writes=("events", "extra_attributes"))
    def _on_step(self, info: Any) -> None:
        record = info.record  # the step's wire fields (the work's own: gpu_ends, intervals)
        offset = self.emitter.offset
        start, end = record.start_ns - offset, record.end_ns - offset  # perf_counter ns
        self._lengths.append(end - start)
        self._emitted += 1
        gaps, waits = self._segments(info.phase_intervals, start, end)
        self._aim_at(gaps, waits, start)
        samples = self._take_samples(end)
        blocked = self._device_waits(info, gaps, offset)
        outside = self._gpu_outside(info, gaps, blocked, offset)
        self._split_totals(record.extra_attributes, gaps, blocked, outside)
        if not gaps and not waits:
            return
        events = record.events
        ordered = sorted(zip(gaps, blocked), key=lambda g: g[0][2] - g[0][3])
        for (after, before, g_start, g_end), waited in ordered[:MAX_EVENTS]:
            attrs = {semconv.ATTR_GAP_SEGMENT: segment_name(after, before),
                     semconv.ATTR_GAP_AFTER: after or "", semconv.ATTR_GAP_BEFORE: before or "",
                     semconv.ATTR_GAP_DURATION: (g_end - g_start) / 1e9}
            if waited is not None and self._on_device:
                attrs[semconv.ATTR_GAP_DEVICE_WAIT] = waited / 1e9
            _where(attrs, [s for s in samples if g_start <= s[0] <= g_end] if samples else [])
            self._carry(attrs[semconv.ATTR_GAP_SEGMENT], attrs, record.step, g_start, g_end)
            events.append((semconv.EVENT_GAP, g_start + offset, attrs))
        for w_start, w_end in sorted(waits, key=lambda w: w[0] - w[1])[:MAX_EVENTS]:
            attrs = {semconv.ATTR_GAP_DURATION: (w_end - w_start) / 1e9}
            inside = [s for s in samples if w_start <= s[0] <= w_end]
            workers = Counter(s[2] for s in inside if s[2] is not None) if inside else None
            if workers:
                attrs[semconv.ATTR_DATA_WORKER] = workers.most_common(1)[0][0]
            _where(attrs, inside)
            self._carry(DATA_WAIT, attrs, record.step, w_start, w_end)
            events.append((semconv.EVENT_DATA_WAIT, w_start + offset, attrs))

    def _carry(self, key: str, attrs: dict[str, Any], step: int, start: int, end: int) -> None:
        """A stretch located by its own samples is remembered by its segment (``key``); one
        with no sample of its own takes the location last remembered for its segment, if
        that stretch ended at most CARRY_S before and its length is within CARRY_RATIO of
        this one's, with the step it was sampled in: a recurring stretch, sampled once
        every few steps, is named in all of them, and says where the name comes from."""
        length = end - start
        if semconv.ATTR_CODE_FUNCTION in attrs:
            self._located[key] = (step, end, length, {k: attrs[k] for k in _CODE_ATTRS})
            return
        known = self._located.get(key)
        if known is None or attrs[semconv.ATTR_GAP_SAMPLES]:  # sampled: its own answer
            return
        sampled_step, sampled_end, sampled_length, code = known
        if (end - sampled_end <= _CARRY_NS and length <= CARRY_RATIO * sampled_length
                and sampled_length <= CARRY_RATIO * length):
            attrs.update(code)
            attrs[semconv.ATTR_GAP_LOCATION_STEP] = sampled_step

    def _aim_at(self, gaps: list[tuple[str | None, str | None, int, int]],
                waits: list[tuple[int, int]], start: int) -> None:
        """Where the sampler aims in the steps to come (:attr:`aim`): the middle of the
        sampleable part (older than SAMPLE_AGE_S) of this step's longest stretch or data wait
        of SAMPLE_AGE_S + AIM_MIN_S or more; kept through AIM_MISSES - 1 steps without one."""
        age = int(SAMPLE_AGE_S * 1e9)
        least = age + int(AIM_MIN_S * 1e9)
        best = None
        for a, b in [(g[2], g[3]) for g in gaps] + waits:
            if b - a >= least and (best is None or b - a > best[1] - best[0]):
                best = (a, b)
        if best is None:
            self._aim_misses += 1
            if self._aim_misses >= AIM_MISSES:
                self.aim = None
            return
        self._aim_misses = 0
        a, b = best
        self.aim = a + (age + b - a) // 2 - start

    def _device_waits(self, info: Any, gaps: list[tuple[str | None, str | None, int, int]],
                      offset: int) -> list[int | None]:
        """Per stretch, the ns of it the host was blocked on the device, or None where that
        is not known (the GPU times of this step or the one before are missing).

        A stretch [a, b] follows phases whose GPU work may still be running: the GPU ends
        ``X`` of the latest phase the host ended by ``a`` (cuda_timing's events, on the wall
        clock). Everything issued before ``a`` runs without waiting for the host, so the
        GPU was busy with it until ``X``; a host that resumes only then was blocked on it
        (a pageable copy, ``.item()``, a tensor of a collective the GPU still waits in). The
        host's own work in the stretch is what lies after ``X``. A host that computes while
        the GPU is behind is counted as blocked: that time does not lengthen the step."""
        if not self._on_device:
            return [0] * len(gaps)
        earlier, self._gpu_ends = self._gpu_ends, info.gpu_ends
        if info.gpu_ends is None:
            return [None] * len(gaps)
        return blocked_ns([(a + offset, b + offset) for _, _, a, b in gaps],
                          (earlier or []) + info.gpu_ends, earlier is not None)

    def _gpu_outside(self, info: Any, gaps: list[tuple[str | None, str | None, int, int]],
                     blocked: list[int | None], offset: int) -> int:
        """The GPU's work queued outside the phases (cuda_timing's ``gpu_between``: the
        device's stretches between one timed phase's work and the next one's, wall clock).

        Such a stretch is the device running what was queued between the two phases, or
        idle, waiting for the host to queue the next phase. It was certainly busy (or
        behind the host) while the host was blocked on it, and once the host had queued the
        next phase's start. So the stretch's GPU work is its overlap with the host's blocked
        time and with the time after the host started the next phase: on the rank step as
        ``training.rank_step.gpu_outside_phases_s``, with the stretch that held most
        (``...segment``). Returns the ns of this step's blocked time that lay in any such
        stretch (this step's or the step before's): the host waited for work no phase holds
        (the part ``gpu_outside_phases``, taken out of ``device_wait``)."""
        if not self._on_device:
            return 0
        earlier, self._gpu_between = self._gpu_between, info.gpu_between
        between = info.gpu_between
        if between is None:
            return 0
        waits = [(a + offset, a + offset + w) for (_, _, a, _), w in zip(gaps, blocked) if w]
        queued, blocked_in = gpu_outside_ns(between, earlier or [], waits)
        extra = info.record.extra_attributes
        extra[semconv.ATTR_GPU_OUTSIDE_PHASES] = sum(queued) / 1e9
        if any(queued):
            most = max(range(len(queued)), key=queued.__getitem__)
            extra[semconv.ATTR_GPU_OUTSIDE_SEGMENT] = segment_name(*between[most][:2])
        return blocked_in

    def _split_totals(self, extra: dict[str, Any],
                      gaps: list[tuple[str | None, str | None, int, int]],
                      blocked: list[int | None], outside: int = 0) -> None:
        """The step's time outside the phases, split: blocked on the device (``outside``
        ns of it while the device ran work queued outside the phases), busy on the host
        (each stretch of at least ``MIN_GAP_S``); shorter stretches and those whose device
        time is not known stay unexplained. On the rank step's span (beside the phase
        totals: ``extra``, its extra attributes) and in ``training.untimed.time``."""
        device = busy = 0
        for (_, _, g_start, g_end), waited in zip(gaps, blocked):
            if waited is not None:
                device += waited
                busy += g_end - g_start - waited
        pending = self._untimed_ns
        extra[_HOST_BUSY_TOTAL] = busy / 1e9
        pending[_HOST_BUSY] = pending.get(_HOST_BUSY, 0) + busy
        if self._on_device:
            outside = min(outside, device)
            device -= outside
            extra[_DEVICE_WAIT_TOTAL] = device / 1e9
            extra[_GPU_OUTSIDE_TOTAL] = outside / 1e9
            pending[_DEVICE_WAIT] = pending.get(_DEVICE_WAIT, 0) + device
            pending[_GPU_OUTSIDE] = pending.get(_GPU_OUTSIDE, 0) + outside

    def _add_untimed(self) -> None:
        """Add the untimed time of the steps emitted since the last call to
        ``training.untimed.time`` (the emitter's tick: after the drain's steps, before its
        commit; the last drain's too). A part a step gave, even 0 s, is added."""
        if not self._untimed_ns:
            return
        pending, self._untimed_ns = self._untimed_ns, {}
        for part, ns in pending.items():
            self._untimed.add(ns / 1e9, self._part_attrs[part])

    def _segments(self, intervals: list[tuple[str, int, int, int]], start: int, end: int
                  ) -> tuple[list[tuple[str | None, str | None, int, int]],
                             list[tuple[int, int]]]:
        """The stretches of [start, end] no phase covers, with the phases around them, and
        the data waits, each at least ``MIN_GAP_S`` long."""
        min_ns = int(MIN_GAP_S * 1e9)
        gaps: list[tuple[str | None, str | None, int, int]] = []
        waits: list[tuple[int, int]] = []
        cursor, after = start, self._last_phase
        for phase, _micro, p_start, p_end in sorted(intervals, key=lambda r: r[2]):
            if p_start - cursor >= min_ns:
                gaps.append((after, phase, cursor, p_start))
            if phase == DATA_WAIT and p_end - p_start >= min_ns:
                waits.append((p_start, p_end))
            if p_end > cursor:
                cursor, after = p_end, phase
        if end - cursor >= min_ns:
            gaps.append((after, None, cursor, end))
        self._last_phase = after
        return gaps, waits

    def _take_samples(self, end: int) -> list[Sample]:
        """The samples taken up to ``end`` (they arrive in time order); later ones wait for
        their own step."""
        out = []
        samples = self.samples
        while samples and samples[0][0] <= end:
            out.append(samples.popleft())
        return out


def blocked_ns(stretches: list[tuple[int, int]], ends: list[tuple[int, int]],
               earlier_known: bool) -> list[int | None]:
    """Per stretch [a, b] (wall ns, in time order), the ns the host was blocked on the
    device: until the GPU end of the latest phase whose host end is at or before ``a``
    (``ends``: (host end, GPU end) of GPU-timed phases, in order), at most the stretch.
    A stretch with no such phase before it is not blocked when the step before was known
    (``earlier_known``: nothing was queued), else not known (None)."""
    out: list[int | None] = []
    k = -1
    for a, b in stretches:
        while k + 1 < len(ends) and ends[k + 1][0] <= a + _SAME_INSTANT_NS:
            k += 1
        if k < 0:
            out.append(0 if earlier_known else None)
        else:
            out.append(min(max(ends[k][1] - a, 0), b - a))
    return out


def gpu_outside_ns(between: list[tuple[str, str, int, int, int]],
                   earlier: list[tuple[str, str, int, int, int]],
                   waits: list[tuple[int, int]]) -> tuple[list[int], int]:
    """The GPU's work queued outside the phases (``GapListener._gpu_outside``), wall ns:
    per stretch of ``between`` (this step's: (phase before, phase after, GPU end of the one,
    GPU start of the other, host start of the other)), its ns the device was surely busy
    (the host blocked on it: ``waits``, this step's blocked intervals, disjoint; or past
    the host's start of the next phase); and the ns of ``waits`` inside any stretch of
    ``earlier`` (the step before's) or ``between``."""
    queued = [max(g1 - max(g0, h_next), 0) + _overlap((g0, min(g1, h_next)), waits)
              for _, _, g0, g1, h_next in between]
    stretches = [(g0, g1) for _, _, g0, g1, _ in earlier + between]
    return queued, sum(_overlap(wait, stretches) for wait in waits)


def _overlap(span: tuple[int, int], intervals: list[tuple[int, int]]) -> int:
    """ns of ``span`` inside ``intervals`` (disjoint among themselves)."""
    a, b = span
    return sum(max(min(b, y) - max(a, x), 0) for x, y in intervals) if b > a else 0


def _where(attrs: dict[str, Any], samples: list[Sample]) -> None:
    """The sampled location into ``attrs``: how many samples, and the most frequent user
    frame with its stack (``code.*``). No sample, or none in user code: no location."""
    attrs[semconv.ATTR_GAP_SAMPLES] = len(samples)
    if not samples:  # the usual stretch: shorter than SAMPLE_AGE_S (a Counter costs us)
        return
    located = Counter(s[1][0] for s in samples if s[1])
    if not located:
        return
    (function, path, line), count = located.most_common(1)[0]
    stack = next(s[1] for s in samples if s[1] and s[1][0] == (function, path, line))
    attrs[semconv.ATTR_CODE_FUNCTION] = function
    attrs[semconv.ATTR_CODE_FILE] = path
    attrs[semconv.ATTR_CODE_LINE] = line
    attrs[semconv.ATTR_CODE_STACKTRACE] = _stacktrace(stack)
    attrs[semconv.ATTR_GAP_LOCATION_SHARE] = count / len(samples)


_CODE_ATTRS = (semconv.ATTR_CODE_FUNCTION, semconv.ATTR_CODE_FILE, semconv.ATTR_CODE_LINE,
               semconv.ATTR_CODE_STACKTRACE)

#: stack traces as text by stack, made once: a recurring stretch is sampled at the same
#: stack step after step (at most _MAX_TRACES kept: a run of ever new stacks starts again)
_TRACES: dict[tuple[Frame, ...], str] = {}
_MAX_TRACES = 1024


def _stacktrace(stack: tuple[Frame, ...]) -> str:
    text = _TRACES.get(stack)
    if text is None:
        if len(_TRACES) >= _MAX_TRACES:
            _TRACES.clear()
        text = _TRACES[stack] = "\n".join(f"{f} at {p}:{n}" for f, p, n in stack)
    return text
