"""Where untimed time went: the stretches of a step that no phase covers, named by where
they lie, and the training thread's Python stack sampled inside them.

A rank that computes a loss, a metric or a checkpoint between its phases shows only as
"untimed" time. Here each such stretch of at least ``MIN_GAP_S`` becomes an event on the
rank's ``training.rank_step`` span (``training.gap``: "between forward and backward", its
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
overrun, lasts it looks again after SAMPLE_AGE_S, then three times that, and so on (a look
the alarm woke does so too, though the sampler slept towards an aimed look below). A
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

One module per thread, one for what they share:

- ``frames.py``: the stack helpers, the stretch names and what a sample is (pure: any
  thread);
- ``sampler.py``: the sampler thread (:class:`~.sampler.GapSampler`): when to look, the
  look, the overrun alarm;
- ``listener.py``: the emitter thread (:class:`~.listener.GapListener`): a finished step's
  stretches and data waits, matched to the samples, as events and totals;
- here: :class:`GapSource`, both put together, whose ``start`` and ``stop`` run on the
  training thread (``instrument()``'s): ``start`` makes the state the threads share (the
  ``samples`` deque the sampler appends to and the listener empties, the ``_lengths``
  deque, ``_emitted`` count and ``aim`` the listener sets and the sampler reads, the
  ``_stop`` event), then each thread's own, registers the listener and starts the sampler;
  ``stop`` sets ``_stop``, disarms the alarm and rings it, so the sampler wakes and ends.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from otel_train.sources.gaps.frames import (
    DATA_WAIT,
    LIBRARY,
    MAX_KINDS,
    OWN,
    SAMPLE_AGE_S,
    STACK_DEPTH,
    USER,
    Frame,
    Sample,
    code_kind,
    dataloader_next_code,
    named_top,
    segment_name,
    user_frames,
)
from otel_train.sources.gaps.listener import (
    AIM_MIN_S,
    AIM_MISSES,
    CARRY_RATIO,
    CARRY_S,
    MAX_EVENTS,
    MIN_GAP_S,
    GapListener,
    blocked_ns,
    gpu_outside_ns,
)
from otel_train.sources.gaps.sampler import (
    AIM_SETTLED,
    ALARM_FLOOR_S,
    BACKOFF,
    CHASE_MAX_S,
    FAST_FACTOR,
    LIVE_SPANS,
    MAX_SAMPLES,
    MIN_STEPS,
    OVERRUN,
    RECENT_STEPS,
    GapSampler,
)
from otel_train.sources.gpu.device import training_device
from otel_train.tracker import open_alarm, set_alarm

__all__ = [
    "AIM_MIN_S", "AIM_MISSES", "AIM_SETTLED", "ALARM_FLOOR_S", "BACKOFF", "CARRY_RATIO",
    "CARRY_S", "CHASE_MAX_S", "DATA_WAIT", "FAST_FACTOR", "LIBRARY", "LIVE_SPANS",
    "MAX_EVENTS", "MAX_KINDS", "MAX_SAMPLES", "MIN_GAP_S", "MIN_STEPS", "OVERRUN", "OWN",
    "RECENT_STEPS", "SAMPLE_AGE_S", "STACK_DEPTH", "USER", "Frame", "GapSource", "Sample",
    "blocked_ns", "code_kind", "gpu_outside_ns", "named_top", "segment_name", "user_frames",
]


class GapSource(GapSampler, GapListener):
    """Names a step's untimed stretches and long data waits; samples the stack in them."""

    # --- the training thread ---------------------------------------------------------
    def start(self, ctx: Any) -> None:
        self.tracker = ctx.tracker
        self.emitter = ctx.emitter
        self.interval_s = ctx.config.gap_sample_s
        # shared by the sampler thread and the emitter thread (see the modules' docstrings)
        #: the sampler's samples, waiting for their step's emission (the listener takes them)
        self.samples: collections.deque[Sample] = collections.deque(maxlen=MAX_SAMPLES)
        #: the recent steps' lengths (ns), appended on the emitter thread, and how many steps
        #: were (typical_ns, on the sampler thread, takes a new median when it changes)
        self._lengths: collections.deque[int] = collections.deque(maxlen=RECENT_STEPS)
        self._emitted = 0
        #: where in a step the recent steps' longest sampleable stretch can be sampled: ns
        #: from the step's start to the middle of its sampleable part, set on the emitter
        #: thread; None where the last steps had none
        self.aim: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # each thread's own
        stop_at = dataloader_next_code()
        self._init_sampler({id(stop_at): (stop_at, OWN)})
        self._init_listener(ctx, bool(ctx.config.cuda_timing)
                            and training_device(ctx.model) is not None)
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
