"""NCCL's collectives read from its flight recorder, the route where otel-train's profiler
plugin is not loaded. Each read dumps and parses the whole ring buffer with the GIL held
(torch offers no incremental read), which is too dear around every step: the buffer is read
every ``nccl_harvest_interval_s`` on the emitter's ticks, and finished steps are held (by
the emitter) until the first read begun after their end, so that their exposed
communication counts their NCCL collectives. The ring overwrites its oldest entries: the
interval shortens to the rate of collectives seen, so that a read comes before it wraps, and
what was lost anyway is counted. Entries become the book's collectives, keyed by
``-1 - record_id`` (the capture's keys are positive). Built wherever the flight recorder can
be read (an NCCL process group, a dump function, a buffer); the plugin's route supersedes it
while that one reads (routes.py)."""

from __future__ import annotations

import time
from typing import Any

from otel_train.sources.collectives.book import Book, Collective
from otel_train.sources.collectives.flight_recorder import (
    FlightRecorder,
    buffer_size,
    read_interval_s,
)
from otel_train.sources.collectives.reads import ReadAccount
from otel_train.sources.collectives.route import Parts, Route

_SOURCE = "nccl_flight_recorder"


def first_interval_ns(config: Any) -> int:
    """The interval before the second read: short, the rate is unknown until two reads."""
    return int(min(1.0, config.nccl_harvest_interval_s) * 1e9)


class FlightRecorderRoute(Route):
    """Reads the flight recorder when due, books its entries, and gates held steps."""

    name = mechanism = _SOURCE
    covers = frozenset({"nccl"})
    holds_steps = True

    def __init__(self, fr: FlightRecorder, ctx: Any, book: Book, account: ReadAccount) -> None:
        self.fr = fr
        self.emitter = ctx.emitter
        self.log = ctx.log
        self.offset = ctx.emitter.offset
        self.book = book
        self.account = account
        self.harvested_at = 0  # perf ns of the last read
        #: perf ns at which the last completed read began: a step that ended before it has
        #: every collective it issued in that read (the gate of held steps)
        self.read_began = 0
        self._configured_interval_s = ctx.config.nccl_harvest_interval_s
        self._interval_ns = first_interval_ns(ctx.config)
        self._buffer = buffer_size()
        self._last_read: tuple[int, int] | None = None  # (perf ns, highest record id)
        self._rate = 0.0  # entries a second, the recent peak (halving at each quiet read)
        # reads happen on the emitter's ticks, which wake for them (wake_within), up to a
        # drain's length late
        self._tick_s = min(ctx.config.emit_interval_s, 0.2)

    def start(self) -> None:
        """The route from the start: learn the newest record before instrumentation."""
        self.fr.baseline()

    def read_at_next_tick(self) -> None:
        self.harvested_at = 0

    def ready(self, end_perf: int) -> bool:
        """Every collective issued before the step ended is in a dump begun after it."""
        return end_perf < self.read_began

    def tick(self, now: int) -> bool:
        if now - self.harvested_at > self._interval_ns:
            self.harvest()
        # the next read before the ring can wrap, not at the next drain
        self.emitter.wake_within((self.harvested_at + self._interval_ns - now) / 1e9)
        return True

    def harvest(self) -> None:
        self.harvested_at = started = time.perf_counter_ns()
        try:
            with self.account.timed(started):
                self.read()
        finally:
            self.read_began = started

    def take_over(self, entries: list[dict[str, Any]], now: int) -> None:
        """Become the route from now on, with the entries just polled (at ``now``)."""
        self.harvested_at = now
        self.read(entries)
        self.read_began = now

    def read(self, entries: list[dict[str, Any]] | None = None) -> None:
        fr = self.fr
        if entries is None:
            entries = fr.poll()
        self._account_for_the_ring()
        pending = self.book.pending
        for entry in entries:
            key = -1 - int(entry["record_id"])
            coll = pending.get(key)
            if coll is None:
                created = int(entry.get("time_created_ns") or 0) - self.offset
                coll = Collective(
                    key, entry["op"], "nccl:" + str(entry.get("profiling_name", "")), "nccl",
                    entry["group"], entry["group_size"], entry["nbytes"],
                    str((entry.get("input_dtypes") or [""])[0]),
                    tuple((entry.get("input_sizes") or [[]])[0]), True, created,
                    # the issuing step (held steps count): stall logs and spans carry it
                    self.emitter.step_at(created), int(entry.get("collective_seq_id") or 0),
                    _SOURCE)
                pending[key] = coll
            if not entry["terminal"]:
                continue
            del pending[key]
            duration_ms = entry.get("duration_ms")
            if duration_ms is not None:
                coll.gpu_duration_s = float(duration_ms) / 1e3
            completed = entry.get("time_discovered_completed_ns")
            coll.done = (int(completed) - self.offset if completed
                         else coll.issue + int((coll.gpu_duration_s or 0) * 1e9))
            self.book.finish(coll)

    def _account_for_the_ring(self) -> None:
        """Drop what the ring overwrote before it finished (never a stall: it completed, we
        cannot know when), count it with what was never seen, and adapt the read interval."""
        fr = self.fr
        lost, fr.unseen = fr.unseen, 0
        if fr.lowest is not None:
            pending = self.book.pending
            gone = [k for k, c in pending.items() if c.source == _SOURCE and -1 - k < fr.lowest]
            for key in gone:
                del pending[key]
            lost += len(gone)
        if lost and self.account.lose(lost):
            self.log.warning(
                "otel_train.nccl_flight_recorder_overflow", lost=lost, buffer=self._buffer,
                hint="raise TORCH_FR_BUFFER_SIZE (entries overwritten before a read are "
                     "lost); the read interval now follows the rate of collectives")
        now = time.perf_counter_ns()
        if fr.highest is not None:
            if self._last_read is not None and now > self._last_read[0]:
                rate = (fr.highest - self._last_read[1]) / ((now - self._last_read[0]) / 1e9)
                self._rate = max(rate, self._rate / 2)  # bursts come back: forget slowly
                interval_s = read_interval_s(self._configured_interval_s, self._buffer,
                                             self._rate, self._tick_s)
                self._interval_ns = int(1e9 * interval_s)
                self.account.shortest_interval_s = min(self.account.shortest_interval_s,
                                                       interval_s)
            self._last_read = (now, fr.highest)


def build(parts: Parts) -> FlightRecorderRoute | None:
    """The flight recorder's route, where it can be read (None elsewhere)."""
    recorder = FlightRecorder(parts.ctx.identity.world_size)
    if not recorder.available():
        return None
    return FlightRecorderRoute(recorder, parts.ctx, parts.book, parts.account)
