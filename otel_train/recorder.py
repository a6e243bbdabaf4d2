"""The hot-path buffer: the training thread appends plain tuples, the emitter drains them.

Appending is one length check and one ``deque.append`` (atomic under the GIL): no lock, no
allocation beyond the tuple, no I/O. When the buffer is full the record is dropped and
counted by the signal it would have become; the training thread never waits.

The emitter sleeps until there is work: it arms a length (:meth:`Recorder.arm`) and the
append that finds the buffer that long calls the emitter's ``wake`` (an ``Event.set``), once,
and disarms. The length check is the one the append makes anyway: the step tracker appends
itself while ``len(queue) < _capacity`` and calls :meth:`Recorder.put` past it, so an armed
recorder lowers the trackers' ``_capacity`` to the armed length, and the one append past it
goes through ``put``, which wakes the emitter and raises it back.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from typing import Any

from otel_train import semconv

# the record kinds (wire/hot_path.py says what their fields are), for the sources
from otel_train.wire.hot_path import EVENT, LOG, PHASE, STEP
from otel_train.wire.hot_path import SIGNAL_OF_KIND as _SIGNAL_OF_KIND

__all__ = ["EVENT", "LOG", "PHASE", "STEP", "Recorder"]


class Recorder:
    """A bounded, drop-newest buffer of records between the training thread and the emitter."""

    __slots__ = ("queue", "capacity", "dropped", "wake_at", "wake", "_appenders")

    def __init__(self, capacity: int) -> None:
        #: the records, oldest first: the step tracker appends to it itself while
        #: ``len(queue) < capacity`` (a call saved at every phase) and calls :meth:`put` past it
        self.queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self.capacity = capacity
        #: records dropped because the buffer was full, by signal
        self.dropped: collections.Counter[str] = collections.Counter()
        #: the length at which :meth:`put` calls ``wake`` (disarmed: never)
        self.wake_at = sys.maxsize
        #: what wakes the drainer (the emitter's Event.set); called on the appending thread
        self.wake: Callable[[], None] | None = None
        #: objects appending to ``queue`` themselves while ``len(queue) < obj._capacity``
        self._appenders: list[Any] = []

    def put(self, record: tuple[Any, ...]) -> None:
        n = len(self.queue)
        if n >= self.capacity:
            self.dropped[_SIGNAL_OF_KIND.get(record[0], semconv.SIGNAL_SPANS)] += 1
        else:
            self.queue.append(record)
        if n >= self.wake_at:
            self._fire()

    def add_appender(self, appender: Any) -> None:
        """``appender`` appends to ``queue`` itself while ``len(queue) < appender._capacity``
        and calls :meth:`put` past it (the step tracker): arming lowers its ``_capacity``."""
        appender._capacity = min(self.wake_at, self.capacity)
        self._appenders.append(appender)

    def arm(self, length: int) -> None:
        """Call ``wake`` at the first append that finds ``length`` records or more (0: the
        next append); once, then disarmed until armed again."""
        self.wake_at = length
        limit = min(length, self.capacity)
        for appender in self._appenders:
            appender._capacity = limit

    def _fire(self) -> None:
        self.wake_at = sys.maxsize  # before the call: a second append must not call it again
        for appender in self._appenders:
            appender._capacity = self.capacity
        wake = self.wake
        if wake is not None:
            wake()

    def put_always(self, record: tuple[Any, ...]) -> None:
        """Append past the capacity: for the few records of setup and teardown only."""
        self.queue.append(record)

    def drain(self, limit: int = 1 << 30) -> list[tuple[Any, ...]]:
        """Everything buffered so far (up to ``limit`` records), oldest first."""
        popleft = self.queue.popleft
        # what is there now; records put meanwhile wait for the next drain (only this
        # thread takes from the queue, so it never runs short)
        return [popleft() for _ in range(min(len(self.queue), limit))]

    def __len__(self) -> int:
        return len(self.queue)
