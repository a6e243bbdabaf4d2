"""Where untimed time went: the stretches of a step that no phase covers, named by where
they lie, and the training thread's Python stack sampled inside them.

A rank that computes a loss, a metric or a checkpoint between its phases shows only as
"untimed" time. Here each such stretch of at least ``MIN_GAP_S`` becomes an event on the
rank's ``train.rank_step`` span (``training.gap``: "between forward and backward", its
seconds, and where the training thread was), and so does each data wait of that length
(``training.data_wait``: the ``__getitem__`` line when the dataset runs on the training
thread, the DataLoader worker waited for when it does not).

Where the thread was comes from a sampler thread in the spirit of py-spy and the continuous
profilers, within the project's cost budget. It sleeps until a step runs past its typical
length: where the tracker can (the C tracker on Linux, the Python one from Python 3.13), the
training thread moves a one-shot timer (the overrun alarm, ``tracker.open_alarm``) to
``OVERRUN`` times the recent steps' median into each step as the step starts, one
``timerfd_settime`` a step, and the sampler sleeps on it: while steps keep their length it
wakes only for its own looks, once every ``ALARM_FLOOR_S`` (1 s). Elsewhere it wakes where a
step could have run past that point, on the first step that point falls in ``gap_sample_s``
(200 ms) or more from now, the steps assumed to follow at their typical length. There it
reads a few attributes of the step tracker, and only when
the training thread has been outside every phase (or in one data wait) for ``SAMPLE_AGE_S``
does it read the thread's stack (``sys._current_frames``), keeping the innermost frames of
user code: no library frame, none of otel-train's hooks. While the stretch, or the step's
overrun, lasts it looks again after SAMPLE_AGE_S, then three times that, and so on. A
stretch that comes back step after step (a ``.item()``, a host copy, a wait on a peer: the
emitted steps show where in the step it lies) is aimed at instead: the look lands in the
middle of where it can be sampled, on the first step ``gap_sample_s`` or more from now, once
(another sample of it waits for that step), so a recurring stretch costs one wake-up a
``gap_sample_s`` at most, and is sampled alike wherever in the step it lies; with the alarm,
once ``AIM_SETTLED`` aimed looks in a row sampled it in one function, one every
``ALARM_FLOOR_S``.
A stretch left with no sample of its own is named by the last one of its segment that was
sampled (``CARRY_S``, ``training.gap.location_step``). Until the typical length is known it
lands four times as often. Nothing runs on the training thread
beyond one attribute store per phase end. The samples are matched to the stretches when
the step is emitted, on the emitter thread, and leave as span events with OpenTelemetry's ``code.*`` attributes: events
because the pinned collector's OTLP receiver and the Jaeger/Tempo backends keep span events
everywhere, while the OTLP profiles signal is still in development and not enabled in its
pipelines; events sit on the step's span, so "slow operations bound to a span id" holds.
"""

from __future__ import annotations

import collections
import os
import select
import sys
import sysconfig
import threading
import time
from collections import Counter
from typing import Any

from otel_train import internal_errors, semconv, torch_compat
from otel_train.sources.gpu.device import training_device
from otel_train.tracker import open_alarm, set_alarm

#: a stretch outside every phase, or a data wait, at least this long becomes an event
MIN_GAP_S = 0.01
#: events of each kind per step at most (the longest)
MAX_EVENTS = 3
#: user frames kept per sample (innermost first)
STACK_DEPTH = 6
#: samples waiting for their step's emission at most (the oldest go first)
MAX_SAMPLES = 4096
#: a stretch (outside every phase, or a data wait) is sampled once it is this old; while it
#: lasts (or its step's overrun), the sampler looks again after this, then BACKOFF times
#: as long, and so on...
SAMPLE_AGE_S = 0.05
_SAMPLE_AGE_NS = int(SAMPLE_AGE_S * 1e9)
BACKOFF = 3
#: ... up to this (a training loop paused outside every phase costs ~no wake-ups)
CHASE_MAX_S = 30.0
#: a step has run past its typical length at this multiple of the recent steps' median
OVERRUN = 1.5
#: the steps whose median is the typical length (at least MIN_STEPS of them)
RECENT_STEPS, MIN_STEPS = 32, 3
#: ... or, where shorter, the shortest mean step length between the last LIVE_SPANS looks
LIVE_SPANS = 8
#: until the typical length is known the sampler lands FAST_FACTOR times as often
FAST_FACTOR = 4
#: an emitted step's stretch (or data wait) this much longer than SAMPLE_AGE_S or more is
#: aimed at in the steps after it, until AIM_MISSES emitted steps in a row have none
AIM_MIN_S = 0.01
AIM_MISSES = 3
#: where the tracker can move the overrun alarm (a timer OVERRUN typical lengths into each
#: step, open_alarm), overruns wake the sampler: its own looks then come at most once every
#: ALARM_FLOOR_S, aimed ones too once AIM_SETTLED aimed looks in a row sampled one function
ALARM_FLOOR_S = 1.0
AIM_SETTLED = 3
#: a stretch (or data wait) with no sample of its own is given the location last sampled in
#: one of the same segment at most CARRY_S before, within CARRY_RATIO of its length, and the
#: step that was sampled in (``training.gap.location_step``)
CARRY_S = 10.0
CARRY_RATIO = 2.0
_CARRY_NS = int(CARRY_S * 1e9)
DATA_WAIT = semconv.PHASE_DATA_WAIT
#: a phase's host end and the stretch after it are one instant; their clocks' readings may
#: differ by this much
_SAME_INSTANT_NS = 1_000_000

_HOST_BUSY, _DEVICE_WAIT = semconv.PHASE_HOST_BUSY, semconv.PHASE_DEVICE_WAIT
_HOST_BUSY_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + _HOST_BUSY
_DEVICE_WAIT_TOTAL = semconv.ATTR_PHASE_TOTAL_PREFIX + _DEVICE_WAIT

_now = time.perf_counter_ns
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: the demo is the user's training script when it runs: its frames are user code
_OWN_USER_CODE = (os.path.join(_OWN_DIR, "demo.py"),)
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in
                              ("stdlib", "platstdlib", "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))
USER, LIBRARY, OWN = 0, 1, 2

Frame = tuple[str, str, int]  # (function, file, line)


def code_kind(filename: str) -> int:
    """USER, LIBRARY (standard library, site-packages, frozen) or OWN (otel-train's hooks)."""
    if filename.startswith("<"):
        return LIBRARY
    path = os.path.abspath(filename)
    if path.startswith(_OWN_DIR) and path not in _OWN_USER_CODE:
        return OWN
    if path.startswith(_LIBRARY_DIRS):
        return LIBRARY
    return USER


#: code kinds known at most (a run that makes code without end, exec'd or generated, starts
#: its cache again past it)
MAX_KINDS = 65536


_ANONYMOUS = frozenset({"<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>", "<lambda>"})


def named_top(stack: tuple[Frame, ...]) -> tuple[str, str] | None:
    """(function, file) of the innermost frame of ``stack`` that is not a generator
    expression, comprehension or lambda (``<genexpr>``, or ``f.<locals>.<genexpr>`` from
    Python 3.11): one is part of the function (or module) around it, and a loop's host
    work is sampled in either in turn. The innermost frame where every one is such; None
    for no frame."""
    for function, file, _ in stack:
        if function.rpartition(".")[2] not in _ANONYMOUS:
            return function, file
    return stack[0][:2] if stack else None


def user_frames(frame: Any, kinds: dict[int, tuple[Any, int]]) -> tuple[Frame, ...]:
    """The innermost user frames of a stack, innermost first, up to ``STACK_DEPTH``; the walk
    stops at otel-train's own hooks and the DataLoader iterator's ``__next__`` (what lies
    outside them is the loop, not the wait).

    ``kinds`` caches each code object's kind by its id, beside the code itself (held: its id
    is not reused while cached). Not by the code object: a code object's hash is taken
    afresh at every lookup over its constants, nested code included, so a script's
    ``<module>`` frame cost ~0.1 ms a sample on an H200 host's cold core."""
    out: list[Frame] = []
    while frame is not None and len(out) < STACK_DEPTH:
        code = frame.f_code
        known = kinds.get(id(code))
        if known is not None and known[0] is code:
            kind = known[1]
        else:
            if len(kinds) >= MAX_KINDS:  # again from the stops (the DataLoader's __next__)
                stops = [item for item in kinds.items() if item[1][1] == OWN]
                kinds.clear()
                kinds.update(stops)
            kind = code_kind(code.co_filename)
            kinds[id(code)] = (code, kind)
        if kind == OWN:
            break
        if kind == USER:
            out.append((getattr(code, "co_qualname", code.co_name), code.co_filename,
                        frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def _dataloader_next_code() -> Any:
    """The code of the DataLoader iterator's own ``__next__`` (behind otel-train's data-wait
    wrapper, which is C where the fast path is built and then leaves no frame): a data wait's
    stack walk stops there, as at the wrapper, so a batch's wait is named by the dataset's
    line or the worker waited for, never by the training loop's ``for batch in loader``."""
    fn = torch_compat.dataloader_iter_class().__dict__["__next__"]
    return getattr(getattr(fn, "__wrapped__", fn), "__code__", None)


def segment_name(after: str | None, before: str | None) -> str:
    if after and before:
        return f"between {after} and {before}"
    if before:
        return f"before {before}"
    if after:
        return f"after {after}"
    return "outside every phase"


class GapSource:
    """Names a step's untimed stretches and long data waits; samples the stack in them."""

    def start(self, ctx: Any) -> None:
        self.tracker = ctx.tracker
        self.emitter = ctx.emitter
        self.interval_s = ctx.config.gap_sample_s
        self.samples: collections.deque[tuple[int, tuple[Frame, ...], int | None]] = (
            collections.deque(maxlen=MAX_SAMPLES))
        self._last_phase: str | None = None  # the previous step's last phase
        stop_at = _dataloader_next_code()
        self._kinds: dict[int, tuple[Any, int]] = {id(stop_at): (stop_at, OWN)}
        # a run on a GPU with its phases GPU-timed: a stretch is split into the part the
        # host was blocked on the device and the part it was busy (else all of it is busy)
        self._on_device = bool(ctx.config.cuda_timing) and training_device(ctx.model) is not None
        self._gpu_ends: list[tuple[int, int]] | None = []  # the previous step's
        self._untimed = semconv.create(ctx.meter, semconv.METRIC_UNTIMED_TIME)
        base = {semconv.ATTR_RANK: ctx.identity.rank, semconv.ATTR_RUN_ID: ctx.identity.run_id}
        self._part_attrs = {part: {**base, semconv.ATTR_UNTIMED_PART: part}
                            for part in (semconv.PHASE_DEVICE_WAIT, semconv.PHASE_HOST_BUSY)}
        #: training.untimed.time not yet added, by part, in ns: the steps' sum, added once a
        #: drain (:meth:`_add_untimed`, on the emitter's tick), not once a step
        self._untimed_ns: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the recent steps' lengths (ns), appended on the emitter thread
        self._lengths: collections.deque[int] = collections.deque(maxlen=RECENT_STEPS)
        #: steps emitted (their lengths appended), and the median of _lengths as of when
        #: _median_of of them were (typical_ns, on the sampler thread)
        self._emitted = self._median_of = 0
        self._median: int | None = None
        self._chase = 0  # looks in a row that found the same stretch or overrun
        self._chasing: tuple[int, int | None] | None = None  # which: (step, stretch start)
        self._found_since = 0  # perf ns: when what the last look found began
        #: the training thread's (step, its start) at the last look, and the mean step
        #: lengths between the last few looks that saw steps begin (typical_ns)
        self._seen: tuple[int, int | None] = (0, None)
        self._spans: collections.deque[int] = collections.deque(maxlen=LIVE_SPANS)
        #: where in a step the recent steps' longest sampleable stretch can be sampled: ns
        #: from the step's start to the middle of its sampleable part, set on the emitter
        #: thread; None where the last steps had none
        self.aim: int | None = None
        self._aim_misses = 0
        self._aimed = False  # the next look is an aimed one
        #: the user frames of the last sample, and the (function, file) of the aimed looks'
        #: samples: which, and how many in a row (settled at AIM_SETTLED)
        self._last_stack: tuple[Frame, ...] = ()
        self._aim_top: tuple[str, str] | None = None
        self._aim_same = 0
        #: the overrun alarm (a file descriptor; None where the tracker cannot move one),
        #: and the ``_alarm_after_ns`` last given to the tracker
        self._alarm: int | None = None
        self._alarm_after = 0
        #: by segment (or DATA_WAIT): the last stretch located by its own samples, as
        #: (step, its end in perf ns, its length in ns, its code.* attributes)
        self._located: dict[str, tuple[int, int, int, dict[str, Any]]] = {}
        #: wake-ups, and of them those the alarm made, the looks that sampled a stretch, and
        #: those that found a step past its typical length (read by the benchmarks)
        self.wakeups = self.alarms = self.stretch_looks = self.overrun_looks = 0
        ctx.emitter.before_step(self._on_step)
        ctx.emitter.on_tick(self._add_untimed)
        if self.interval_s > 0:
            self._alarm = open_alarm(self.tracker)
            if self._alarm is not None:
                self.tracker._alarm_fd = self._alarm
            self._thread = threading.Thread(target=self._sample_loop, daemon=True,
                                            name="otel-train-gap-sampler")
            self._thread.start()

    def stop(self) -> None:
        # not joined: it notices when it next wakes and ends (a daemon, it holds nothing);
        # the alarm wakes it now, and it closes the alarm on its way out
        self._stop.set()
        alarm = self._alarm
        if alarm is not None:
            self._disarm()
            try:
                set_alarm(alarm, 1)
            except OSError:  # closed already
                pass

    # --- the sampler thread ----------------------------------------------------------
    def _sample_loop(self) -> None:
        """Sleep until the next look (:meth:`_next_look`), look, again. Each wake-up costs
        what it costs whatever it finds (~0.1 ms of thread CPU on a busy 2-CPU VM,
        docs/overhead.md): a run whose steps keep their typical length wakes it once a
        second where the overrun alarm rings for a late step, else once a
        ``gap_sample_s``; a step past its length, or a stretch, gets several samples. A look
        runs on a cold core, a few times a second: each call and each attribute it touches
        costs several times what it costs warm, so one clock reading and one typical
        length serve the whole look."""
        wait = self.interval_s / FAST_FACTOR
        alarm = self._alarm
        poll = None
        if alarm is not None:
            poller = select.poll()
            poller.register(alarm, select.POLLIN)
            poll = poller.poll
        try:
            while not self._stop.is_set():
                if poll is None:
                    time.sleep(wait)  # cheaper to wake from than Event.wait
                elif poll(max(wait, 1e-3) * 1e3) and not self._clear_alarm():
                    poll = None  # the alarm broke: the schedule without it from here
                self.wakeups += 1
                try:
                    now = _now()
                    self._observe_steps()
                    typical = self.typical_ns()
                    if poll is not None:
                        self._move_alarm(typical)
                    wait = self._next_look(self._look(now, typical), now, typical)
                except Exception as err:  # never let a sampling bug end the thread quietly
                    internal_errors.count("gaps", err)
                    wait = self.interval_s
        finally:
            if alarm is not None:
                self._alarm = None
                try:
                    os.close(alarm)
                except OSError:  # closed under it: nothing left to release
                    pass

    def _clear_alarm(self) -> bool:
        """The alarm rang (a step ran past its typical length): read it, so that it can ring
        again. False where it broke (then the sampler goes on without it)."""
        try:
            if len(os.read(self._alarm, 8)) != 8:  # type: ignore[arg-type]
                raise OSError("the overrun alarm's descriptor is no longer a timer")
            self.alarms += 1
        except BlockingIOError:  # read meanwhile (a spurious wake-up)
            pass
        except OSError as err:  # closed or replaced under it (a poll would return at once)
            internal_errors.count("gaps", err)
            self._disarm()
            self._alarm = None
            return False
        return True

    def _disarm(self) -> None:
        """The tracker moves the alarm no more."""
        self.tracker._alarm_fd, self.tracker._alarm_after_ns = -1, 0

    def _move_alarm(self, typical: int | None) -> None:
        """Where the tracker sets the alarm at each step's start: OVERRUN typical lengths in
        (not at all while the typical length is not known)."""
        after = int(OVERRUN * typical) if typical is not None else 0
        if after != self._alarm_after:
            self._alarm_after = self.tracker._alarm_after_ns = after

    def typical_ns(self) -> int | None:
        """The typical step length (ns): the median of the recent emitted steps (MIN_STEPS of
        them at least; None before), or, where shorter, what the training thread's own step
        counter shows between the sampler's looks (the shortest of the last few spans' mean
        step lengths: steps are emitted once a drain, so early in a run their median can
        still be that of the first, slow steps while the loop already runs short ones). Never
        the counter's alone: its first span holds a first step that compiles. The median is
        taken again only when steps were emitted since (once a drain, not once a look)."""
        emitted = self._median
        if self._median_of != self._emitted:
            self._median_of = self._emitted  # before the copy: a step appended meanwhile
            lengths = sorted(tuple(self._lengths))  # one copy: the emitter thread appends
            emitted = self._median = (lengths[len(lengths) // 2]
                                      if len(lengths) >= MIN_STEPS else None)
        spans = self._spans
        live = min(spans) if spans else None
        if emitted is not None and live is not None and live < emitted:
            return live
        return emitted

    def _observe_steps(self) -> None:
        """The mean length of the steps the training thread began since the last look."""
        tracker = self.tracker
        step, start = tracker.step, tracker.step_start_ns
        if start is None:
            return
        last_step, last_start = self._seen
        if last_start is not None and step > last_step and start > last_start:
            self._spans.append((start - last_start) // (step - last_step))
        self._seen = (step, start)

    def _look(self, now: int, typical: int | None) -> tuple[int, int | None] | None:
        """Sample the training thread if it is in a stretch ``SAMPLE_AGE_S`` old or older, or
        see whether its step has run past ``OVERRUN`` times its typical length (a stretch
        may follow): what it found, as (step, the stretch's start or None for an overrun),
        or None."""
        since = self._sample_once(_SAMPLE_AGE_NS, now)
        tracker = self.tracker
        if since is not None:
            self._found_since = since
            self.stretch_looks += 1
            return tracker.step, since
        start = tracker.step_start_ns
        if (tracker.enabled and typical is not None and start is not None
                and now - start > OVERRUN * typical):
            self._found_since = start
            self.overrun_looks += 1
            return tracker.step, None
        return None

    def _next_look(self, found: tuple[int, int | None] | None, now: int,
                   typical: int | None) -> float:
        """Seconds to the next look: SAMPLE_AGE_S, growing BACKOFF-fold, while looks find the
        same stretch or overrun (a new one, in another step or after another phase, starts
        again at SAMPLE_AGE_S: back-to-back slow steps are each sampled), but never longer
        than ``gap_sample_s`` or what it has lasted so far, whichever is longer (one that
        ends soon is not followed by a long sleep that a next one falls into). A look aimed
        at a recurring stretch that found one is not followed up: the next look comes as
        if it had found nothing (:meth:`_scheduled`), and chases the stretch from there if
        it still lasts. ``now`` and ``typical``: the look's."""
        aimed, self._aimed = self._aimed, False
        if aimed:
            self._settle(found)
        if found is not None:
            if found != self._chasing:
                self._chasing, self._chase = found, 0
                if aimed and found[1] is not None:
                    self._chase = 1  # a next look that finds it again chases it
                    return self._scheduled(now, typical)
            self._chase += 1
            lasted = max(self.interval_s, (now - self._found_since) / 1e9)
            return min(SAMPLE_AGE_S * BACKOFF ** (self._chase - 1), CHASE_MAX_S, lasted)
        self._chasing, self._chase = None, 0
        return self._scheduled(now, typical)

    def _settle(self, found: tuple[int, int | None] | None) -> None:
        """Count the aimed looks in a row that sampled the recurring stretch in one function
        (not one line: host work in a loop is sampled at its lines in turn; nor a generator
        expression, comprehension or lambda inside it: :func:`named_top`; a look that found
        no stretch, landed beside it, counts neither way)."""
        if found is None or found[1] is None:
            return
        top = named_top(self._last_stack)
        if top is not None and top == self._aim_top:
            self._aim_same += 1
        else:
            self._aim_top, self._aim_same = top, int(top is not None)

    def _scheduled(self, now: int, typical: int | None) -> float:
        """Seconds to the next look when nothing is chased: the first point ``OVERRUN``
        typical lengths into a step (the steps are assumed to follow the current one at
        their typical length), or where the recent steps' recurring stretch can be sampled
        (:attr:`aim`), ``gap_sample_s`` from now or later. A step that overruns by longer
        than that is always found: where looks are aimed, a look that finds its step
        already longer than typical looks again at that step's overrun point."""
        start = self.tracker.step_start_ns
        floor = self.interval_s
        if typical is None:
            floor /= FAST_FACTOR
        if typical is None or start is None:
            return floor
        aim = self.aim
        alarmed = self._alarm is not None  # the alarm watches for overruns
        if aim is None:
            offset = int(OVERRUN * typical)
            if alarmed:
                floor = max(floor, ALARM_FLOOR_S)
        else:
            overrun_at = start + int(OVERRUN * typical)
            if not alarmed and now - start > typical and overrun_at > now:
                return (overrun_at - now) / 1e9  # a late step: is it overrunning?
            if alarmed and self._aim_same >= AIM_SETTLED:
                floor = max(floor, ALARM_FLOOR_S)  # where it is is known: a look a second
            offset = aim
            self._aimed = True
        earliest = now + int(floor * 1e9)
        target = start + offset
        if target < earliest:
            target += -(-(earliest - target) // typical) * typical  # whole steps later
        # never later than a typical length after the floor (an aimed look: it lands where
        # the stretch is), or than the longer of the two (else: where the typical length is
        # still that of slower steps before, the first ones, the next look comes soon
        # enough to see what the shorter steps now do)
        latest = earliest - now + typical if self._aimed else max(earliest - now, typical)
        return min(target - now, latest) / 1e9

    def _sample_once(self, age_ns: int, now: int | None = None) -> int | None:
        """Sample the training thread if it has been outside every phase, or in one data
        wait, for ``age_ns`` or more; the sampled stretch's start (perf ns) if it did."""
        tracker = self.tracker
        if not tracker.enabled:
            return None
        phase = tracker.phase
        if phase is None:
            since = tracker.idle_since_ns
        elif phase == DATA_WAIT:
            since = tracker.phase_start_ns
        else:
            return None
        now = _now() if now is None else now
        if not since or now - since < age_ns:
            return None
        frame = sys._current_frames().get(tracker.thread_id)
        if frame is None or tracker.phase is not phase:  # it moved on meanwhile
            return None
        stack = user_frames(frame, self._kinds)
        del frame
        self._last_stack = stack
        worker = torch_compat.waited_worker(tracker.data_iter) if phase == DATA_WAIT else None
        self.samples.append((now, stack, worker))
        return since

    # --- the emitter thread ----------------------------------------------------------
    def _on_step(self, info: Any) -> None:
        offset = self.emitter.offset
        start, end = info.start_ns - offset, info.end_ns - offset  # perf_counter ns
        self._lengths.append(end - start)
        self._emitted += 1
        gaps, waits = self._segments(info.phase_intervals, start, end)
        self._aim_at(gaps, waits, start)
        samples = self._take_samples(end)
        blocked = self._device_waits(info, gaps, offset)
        self._split_totals(info, gaps, blocked)
        if not gaps and not waits:
            return
        events = info.events
        ordered = sorted(zip(gaps, blocked), key=lambda g: g[0][2] - g[0][3])
        for (after, before, g_start, g_end), waited in ordered[:MAX_EVENTS]:
            attrs = {semconv.ATTR_GAP_SEGMENT: segment_name(after, before),
                     semconv.ATTR_GAP_AFTER: after or "", semconv.ATTR_GAP_BEFORE: before or "",
                     semconv.ATTR_GAP_DURATION: (g_end - g_start) / 1e9}
            if waited is not None and self._on_device:
                attrs[semconv.ATTR_GAP_DEVICE_WAIT] = waited / 1e9
            _where(attrs, [s for s in samples if g_start <= s[0] <= g_end] if samples else [])
            self._carry(attrs[semconv.ATTR_GAP_SEGMENT], attrs, info.step, g_start, g_end)
            events.append((semconv.EVENT_GAP, g_start + offset, attrs))
        for w_start, w_end in sorted(waits, key=lambda w: w[0] - w[1])[:MAX_EVENTS]:
            attrs = {semconv.ATTR_GAP_DURATION: (w_end - w_start) / 1e9}
            inside = [s for s in samples if w_start <= s[0] <= w_end]
            workers = Counter(s[2] for s in inside if s[2] is not None) if inside else None
            if workers:
                attrs[semconv.ATTR_DATA_WORKER] = workers.most_common(1)[0][0]
            _where(attrs, inside)
            self._carry(DATA_WAIT, attrs, info.step, w_start, w_end)
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

    def _split_totals(self, info: Any, gaps: list[tuple[str | None, str | None, int, int]],
                      blocked: list[int | None]) -> None:
        """The step's time outside the phases, split: blocked on the device, busy on the
        host (each stretch of at least ``MIN_GAP_S``); shorter stretches and those whose
        device time is not known stay unexplained. On the rank step's span (beside the
        phase totals) and in ``training.untimed.time``."""
        device = busy = 0
        for (_, _, g_start, g_end), waited in zip(gaps, blocked):
            if waited is not None:
                device += waited
                busy += g_end - g_start - waited
        pending = self._untimed_ns
        info.extra_attributes[_HOST_BUSY_TOTAL] = busy / 1e9
        pending[_HOST_BUSY] = pending.get(_HOST_BUSY, 0) + busy
        if self._on_device:
            info.extra_attributes[_DEVICE_WAIT_TOTAL] = device / 1e9
            pending[_DEVICE_WAIT] = pending.get(_DEVICE_WAIT, 0) + device

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

    def _take_samples(self, end: int) -> list[tuple[int, tuple[Frame, ...], int | None]]:
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


def _where(attrs: dict[str, Any], samples: list[tuple[int, tuple[Frame, ...], int | None]]
           ) -> None:
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
