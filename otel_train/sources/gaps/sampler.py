"""The gap sampler's thread: it sleeps until a look is due, looks at the training thread,
and samples its stack when it is in a stretch outside every phase or in a data wait.

Runs on the ``otel-train-gap-sampler`` thread only (started by ``GapSource.start``, in
``__init__.py``). What it shares, and how:

- with the training thread: the step tracker's attributes, read without a lock (each one
  store on the training thread: ``phase``, ``idle_since_ns``, ``phase_start_ns``,
  ``step``, ``step_start_ns``...), and the training thread's stack
  (``sys._current_frames``); it sets the tracker's ``_alarm_after_ns`` (and
  ``_alarm_fd`` at start, ``-1`` when the alarm goes), which the training thread reads at
  each step's start to move the overrun alarm;
- with the emitter thread (listener.py): it appends its samples to ``samples`` (a bounded
  deque: append and popleft are atomic), and reads ``_lengths`` (the emitted steps'
  lengths: a deque the listener appends to, copied whole with ``tuple()``), ``_emitted``
  (a count the listener raises after each append) and ``aim`` (one attribute the listener
  sets);
- with ``stop()`` on the training thread: the ``_stop`` event, and the alarm, which
  ``stop()`` disarms and rings so that the loop wakes, sees ``_stop`` and closes it.

Everything else here (the chase, the aim's settling, the typical length's median, the
code-kind cache) is this thread's alone.
"""

from __future__ import annotations

import collections
import os
import select
import sys
import threading
import time
from typing import Any

from otel_train import internal_errors, torch_compat
from otel_train.sources.gaps.frames import (
    DATA_WAIT,
    SAMPLE_AGE_S,
    Frame,
    Sample,
    named_top,
    user_frames,
)

#: samples waiting for their step's emission at most (the oldest go first)
MAX_SAMPLES = 4096
_SAMPLE_AGE_NS = int(SAMPLE_AGE_S * 1e9)
#: while a stretch (or its step's overrun) lasts, the sampler looks again after
#: SAMPLE_AGE_S, then BACKOFF times as long, and so on...
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
#: where the tracker can move the overrun alarm (a timer OVERRUN typical lengths into each
#: step, open_alarm), overruns wake the sampler: its own looks then come at most once every
#: ALARM_FLOOR_S, aimed ones too once AIM_SETTLED aimed looks in a row sampled one function
ALARM_FLOOR_S = 1.0
AIM_SETTLED = 3

_now = time.perf_counter_ns


class GapSampler:
    """The sampler thread's part of ``GapSource``: :meth:`_sample_loop` and what it calls."""

    # set by GapSource.start (the training thread), before the thread starts
    tracker: Any
    interval_s: float
    _stop: threading.Event
    # shared with the emitter thread (listener.py): see the module's docstring
    samples: collections.deque[Sample]
    _lengths: collections.deque[int]
    _emitted: int
    aim: int | None
    # this thread's own, and the alarm's descriptor (closed here on the way out)
    _kinds: dict[int, tuple[Any, int]]
    _alarm: int | None

    def _init_sampler(self, kinds: dict[int, tuple[Any, int]]) -> None:
        """The sampler thread's own state, made on the training thread before it starts."""
        self._kinds = kinds
        #: the median of _lengths as of when _median_of steps were emitted (typical_ns)
        self._median_of = 0
        self._median: int | None = None
        self._chase = 0  # looks in a row that found the same stretch or overrun
        self._chasing: tuple[int, int | None] | None = None  # which: (step, stretch start)
        self._found_since = 0  # perf ns: when what the last look found began
        #: the training thread's (step, its start) at the last look, and the mean step
        #: lengths between the last few looks that saw steps begin (typical_ns)
        self._seen: tuple[int, int | None] = (0, None)
        self._spans: collections.deque[int] = collections.deque(maxlen=LIVE_SPANS)
        self._aimed = False  # the next look is an aimed one
        #: the user frames of the last sample, and the (function, file) of the aimed looks'
        #: samples: which, and how many in a row (settled at AIM_SETTLED)
        self._last_stack: tuple[Frame, ...] = ()
        self._aim_top: tuple[str, str] | None = None
        self._aim_same = 0
        #: the overrun alarm (a file descriptor; None where the tracker cannot move one),
        #: and the ``_alarm_after_ns`` last given to the tracker
        self._alarm = None
        self._alarm_after = 0
        #: wake-ups, and of them those the alarm made, the looks that sampled a stretch, and
        #: those that found a step past its typical length (read by the benchmarks)
        self.wakeups = self.alarms = self.stretch_looks = self.overrun_looks = 0

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
                elif poll(max(wait, 1e-3) * 1e3):
                    if self._clear_alarm():
                        # a step overran: this look is not the aimed one the sampler slept
                        # towards, and what it finds is chased (taken for the aimed look,
                        # it was not followed up: one sample of a slow step's stretch, or
                        # none, issue 53)
                        self._aimed = False
                    else:
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
