"""What reading NCCL's records costs and loses, whichever route reads them (the profiler
plugin's ring, the flight recorder's buffer): reads happen on the emitter thread, so their
time is the instrumentation's own cost, and what a ring overwrote before a read is telemetry
lost, counted where the user sees drops."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from otel_train import semconv


class ReadAccount:
    """Reads made, seconds spent in them, and NCCL records lost, over both routes."""

    def __init__(self, emitter: Any, first_interval_s: float) -> None:
        self.emitter = emitter
        self.reads = 0
        self.read_s = 0.0  # seconds spent reading (dump or copy, parse, book)
        self.lost = 0
        #: the shortest interval between flight-recorder reads chosen so far
        self.shortest_interval_s = first_interval_s

    @contextlib.contextmanager
    def timed(self, started: int | None = None) -> Iterator[None]:
        """One read, counted with its time (from ``started``, perf ns, if given), whether it
        raises or not."""
        if started is None:
            started = time.perf_counter_ns()
        try:
            yield
        finally:
            self.reads += 1
            self.read_s += (time.perf_counter_ns() - started) / 1e9

    def lose(self, lost: int) -> bool:
        """Count ``lost`` records as dropped telemetry; True the first time (to log it)."""
        self.lost += lost
        self.emitter.count_drop(semconv.SIGNAL_NCCL_ENTRIES, lost)
        return self.lost == lost
