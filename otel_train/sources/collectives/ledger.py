"""The emitter thread's side of collectives: what the emitter calls (a record, a tick, a
finished step) and what it hands each part. The parts:

- ``book.py``: the collectives seen one by one (the capture's records, the flight
  recorder's entries), pending until they complete, then their step's;
- ``assembly.py``: a step's collectives made into exposed communication and rows to send;
- ``plugin_route.py``: NCCL's collectives from otel-train's profiler plugin;
- ``fr_route.py``: NCCL's collectives from its flight recorder, where the plugin is not
  loaded or NCCL runs without it;
- ``reads.py``: what reading NCCL's records costs and loses, whichever route reads them;
- ``stall.py``: collectives pending past the stall timeout.

At most one route reads NCCL's collectives (the capture then skips the nccl backend); while
it has not read a step's, the emitter holds the step back (the gate, :meth:`Ledger._ready`).
Definitions of the numbers: docs/collectives.md."""

from __future__ import annotations

import time
from typing import Any

from otel_train import internal_errors, nccl, semconv
from otel_train.sources.collectives.assembly import Assembly
from otel_train.sources.collectives.book import Book, Collective
from otel_train.sources.collectives.capture import FLUSH, RECORD
from otel_train.sources.collectives.flight_recorder import FlightRecorder
from otel_train.sources.collectives.fr_route import FlightRecorderRoute, first_interval_ns
from otel_train.sources.collectives.plugin_choice import _nccl_groups_bound
from otel_train.sources.collectives.plugin_route import PluginRoute
from otel_train.sources.collectives.reads import ReadAccount
from otel_train.sources.collectives.stall import StallWatch

__all__ = ["Collective", "Ledger"]


class Ledger:
    """What the emitter calls for collectives: each record, tick and step goes to the book,
    the route that reads NCCL's collectives, and the stall watch."""

    def __init__(self, ctx: Any) -> None:
        self.emitter = emitter = ctx.emitter
        self.recorder = ctx.recorder
        self.offset = emitter.offset
        self.rank = ctx.identity.rank
        self.run_id = ctx.identity.run_id
        self.base = {semconv.ATTR_RANK: self.rank, semconv.ATTR_RUN_ID: self.run_id}
        self.log = ctx.log
        self.stall = StallWatch(ctx.config.stall_timeout_s, ctx.log, self.run_id)
        self.assembly = Assembly(ctx, self.base, self.stall)
        self.book = Book(emitter, self.assembly)
        self.account = ReadAccount(emitter, first_interval_ns(ctx.config) / 1e9)
        self.fr_route: FlightRecorderRoute | None = None
        self.plugin_route: PluginRoute | None = None
        recorder = FlightRecorder(ctx.identity.world_size)
        if recorder.available():
            self.fr_route = FlightRecorderRoute(recorder, ctx, self.book, self.account)
            plugin = nccl.loaded()
            confirmed = plugin is not None and plugin.has_comms()
            if plugin is not None and not confirmed and _nccl_groups_bound():
                plugin = None  # NCCL started without it: the flight recorder it is
            if plugin is not None:
                # the flight recorder is then read only to notice that NCCL did not load it
                self.plugin_route = PluginRoute(plugin, confirmed, ctx, self.assembly,
                                                self.stall, self.account, self.fr_route)
            else:
                recorder.baseline()
            # the steps of a drain interval (emit_interval_s) can wait, fast ones too
            emitter.hold_steps(self._ready, max_held=512, with_end=True)
        emitter.on_event(RECORD, self.on_record)
        emitter.before_step(self._guarded(self.before_step))
        emitter.on_step(self._guarded(self.on_step))
        emitter.on_tick(self.tick)
        self._errors = internal_errors.Tally(log_first=3)

    # --- what the rest of the package and its tests read ------------------------------
    @property
    def plugin(self) -> nccl.Plugin | None:
        """otel-train's NCCL profiler plugin, while it is the route."""
        return self.plugin_route.plugin if self.plugin_route is not None else None

    @property
    def flight_recorder(self) -> FlightRecorder | None:
        """NCCL's flight recorder, while it is the route."""
        if self.plugin_route is not None or self.fr_route is None:
            return None
        return self.fr_route.fr

    @property
    def pending(self) -> dict[int, Collective]:
        return self.book.pending

    @property
    def finished(self) -> list[Collective]:
        return self.book.finished

    @property
    def reads(self) -> int:
        return self.account.reads

    @property
    def read_s(self) -> float:
        return self.account.read_s

    @property
    def lost(self) -> int:
        return self.account.lost

    @property
    def shortest_interval_s(self) -> float:
        return self.account.shortest_interval_s

    @property
    def errors(self) -> int:
        """Exceptions of step listeners contained (the first three are logged)."""
        return self._errors.errors

    def _guarded(self, listener: Any) -> Any:
        """A step listener that raises would cost the whole step its telemetry: contain it."""
        def guarded(info: Any) -> None:
            try:
                listener(info)
            except Exception as err:
                if self._errors.add(err, "collectives"):
                    self.log.warning("otel_train.collectives_error", error=repr(err))

        return guarded

    # --- what the emitter calls ---------------------------------------------------------
    def on_record(self, payload: tuple[Any, ...]) -> None:
        if payload[0] != FLUSH:
            self.book.on_record(payload)
            return
        for route in (self.fr_route, self.plugin_route):
            if route is not None:
                route.read_at_next_tick()  # the last read is never skipped
        if self.plugin_route is not None:
            # what finished on the GPU since the poller's last pass: read it now, or the
            # last operations would end unmeasured (the poller passes only now and then)
            self.plugin_route.plugin.complete()
        self.tick()
        if self.plugin_route is not None:
            self.plugin_route.flush()
        self.emitter.release_steps(final=True)  # steps held for this read go first
        self.book.flush(payload[1])
        if self.plugin_route is not None:
            self.plugin_route.flush_rows()

    def tick(self) -> None:
        self.assembly.publish()  # the overlap of the steps emitted since the last tick
        now = time.perf_counter_ns()
        self.book.poll_works(now)
        if self.plugin_route is not None:
            if not self.plugin_route.tick(now):
                self.plugin_route = None  # the flight recorder reads from now on
        elif self.fr_route is not None:
            self.fr_route.tick(now)
        _, deadline = self.stall.check(list(self.book.pending.values()), now)
        if deadline is not None:  # a training thread blocked in it records nothing else
            self.emitter.wake_within((deadline - now) / 1e9)
        # the next issue is drained (its deadline known) before it can stall: binds only
        # where the stall timeout is shorter than the drain interval (or the keep-alive)
        self.emitter.wake_within(self.stall.timeout_ns / 1e9)

    def _ready(self, step: int, end_perf: int) -> bool:
        """The gate of held steps: whether the route has read what the step issued."""
        if self.plugin_route is not None:
            return self.plugin_route.ready(end_perf)
        return self.fr_route is None or self.fr_route.ready(end_perf)

    def before_step(self, info: Any) -> None:
        if self.plugin_route is not None:
            self.plugin_route.before_step(info)
        self.book.before_step(info)

    def on_step(self, info: Any) -> None:
        if self.plugin_route is not None:
            self.plugin_route.on_step(info)
        self.book.on_step(info)
