"""The hot-path buffer: the training thread appends plain tuples, the emitter drains them.

Appending is one length check and one ``deque.append`` (atomic under the GIL): no lock, no
allocation beyond the tuple, no I/O. When the buffer is full the record is dropped and
counted by the signal it would have become; the training thread never waits.
"""

from __future__ import annotations

import collections
from typing import Any

from otel_train import semconv

# Record kinds: the first element of every record tuple.
PHASE = "phase"  # (PHASE, step, phase, micro, start_ns, end_ns, span_id)
STEP = "step"  # (STEP, step, start_ns, end_ns, micro_batches, samples, tokens)
LOG = "log"  # (LOG, time_ns, level, event, fields, scope): the ids ride in fields (log_capture.py)
EVENT = "event"  # (EVENT, source, payload): records of the sources/ modules

_SIGNAL_OF_KIND = {
    PHASE: semconv.SIGNAL_SPANS,
    STEP: semconv.SIGNAL_SPANS,
    LOG: semconv.SIGNAL_LOGS,
    EVENT: semconv.SIGNAL_SPANS,
}


class Recorder:
    """A bounded, drop-newest buffer of records between the training thread and the emitter."""

    __slots__ = ("queue", "capacity", "dropped")

    def __init__(self, capacity: int) -> None:
        #: the records, oldest first: the step tracker appends to it itself while
        #: ``len(queue) < capacity`` (a call saved at every phase) and calls :meth:`put` past it
        self.queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self.capacity = capacity
        #: records dropped because the buffer was full, by signal
        self.dropped: collections.Counter[str] = collections.Counter()

    def put(self, record: tuple[Any, ...]) -> None:
        if len(self.queue) >= self.capacity:
            self.dropped[_SIGNAL_OF_KIND.get(record[0], semconv.SIGNAL_SPANS)] += 1
            return
        self.queue.append(record)

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
