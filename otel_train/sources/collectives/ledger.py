"""The emitter thread's side of collectives: what the emitter calls (a record, a tick, a
finished step) and what it hands each part. The parts:

- ``book.py``: the collectives seen one by one (the capture's records, the flight
  recorder's entries), pending until they complete, then their step's;
- ``assembly.py``: a step's collectives made into exposed communication and rows to send;
- the routes (``route.py``'s interface; which ones, in which order: ``routes.py``):
  ``wrapper_route.py`` (the wrappers' records), ``plugin_route.py`` (NCCL's collectives from
  otel-train's profiler plugin), ``fr_route.py`` (from NCCL's flight recorder, where the
  plugin is not loaded or NCCL runs without it);
- ``reads.py``: what reading NCCL's records costs and loses, whichever route reads them;
- ``stall.py``: collectives pending past the stall timeout.

The ledger calls its active routes through the interface, in order, and knows none of them:
a route that gives up (its tick returns False) leaves, and the routes it superseded take
over. At most one route reads NCCL's collectives (the capture then skips the nccl backend);
while a route that holds steps has not read a step's, the emitter holds the step back (the
gate, :meth:`Ledger._ready`). Definitions of the numbers: docs/collectives.md."""

from __future__ import annotations

import time
from typing import Any

from otel_train import internal_errors, nccl, semconv
from otel_train.sources.collectives import routes as routes_mod
from otel_train.sources.collectives.assembly import Assembly
from otel_train.sources.collectives.book import Book, Collective
from otel_train.sources.collectives.capture import FLUSH, RECORD
from otel_train.sources.collectives.flight_recorder import FlightRecorder
from otel_train.sources.collectives.fr_route import FlightRecorderRoute, first_interval_ns
from otel_train.sources.collectives.plugin_route import PluginRoute
from otel_train.sources.collectives.reads import ReadAccount
from otel_train.sources.collectives.route import Parts, Route
from otel_train.sources.collectives.stall import StallWatch

__all__ = ["Collective", "Ledger"]

#: steps held back at most, waiting for a route's gate: the steps of a drain interval
#: (emit_interval_s) can wait, fast ones too
MAX_HELD_STEPS = 512


class Ledger:
    """What the emitter calls for collectives: each record, tick and step goes to the book,
    the active routes (in order) and the stall watch."""

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
        #: every route built, in order (superseded ones too); ``active``: those called
        self.routes: list[Route] = routes_mod.build_routes(
            Parts(ctx, self.book, self.assembly, self.stall, self.account))
        self._activate(routes_mod.active(self.routes))
        for route in self.active:
            route.start()
        if any(route.holds_steps for route in self.routes):
            emitter.hold_steps(self._ready, max_held=MAX_HELD_STEPS, with_end=True)
        emitter.on_event(RECORD, self.on_record)
        emitter.before_step(self._guarded(self.before_step))
        emitter.on_step(self._guarded(self.on_step))
        emitter.on_tick(self.tick)
        self._errors = internal_errors.Tally(log_first=3)

    def _activate(self, active: list[Route]) -> None:
        self.active: list[Route] = active
        self._gates = [route for route in active if route.holds_steps]

    # --- what the rest of the package and its tests read ------------------------------
    def route(self, name: str) -> Route | None:
        """The active route named ``name``, if there is one."""
        return next((route for route in self.active if route.name == name), None)

    @property
    def plugin(self) -> nccl.Plugin | None:
        """otel-train's NCCL profiler plugin, while it is the route."""
        route = self.route(PluginRoute.name)
        return route.plugin if isinstance(route, PluginRoute) else None

    @property
    def flight_recorder(self) -> FlightRecorder | None:
        """NCCL's flight recorder, while it is the route."""
        route = self.route(FlightRecorderRoute.name)
        return route.fr if isinstance(route, FlightRecorderRoute) else None

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
        for route in self.routes:
            route.read_at_next_tick()  # the last read is never skipped
        for route in self.active:
            route.complete()
        self.tick()
        for route in self.active:
            route.flush()
        self.emitter.release_steps(final=True)  # steps held for this read go first
        self.book.flush(payload[1])
        for route in self.active:
            route.flush_rows()

    def tick(self) -> None:
        self.assembly.publish()  # the overlap of the steps emitted since the last tick
        now = time.perf_counter_ns()
        gave_up = [route for route in self.active if not route.tick(now)]
        if gave_up:  # the routes they superseded read from now on (from the next tick)
            self.routes = [route for route in self.routes if route not in gave_up]
            self._activate(routes_mod.active(self.routes))
        _, deadline = self.stall.check(list(self.book.pending.values()), now)
        if deadline is not None:  # a training thread blocked in it records nothing else
            self.emitter.wake_within((deadline - now) / 1e9)
        # the next issue is drained (its deadline known) before it can stall: binds only
        # where the stall timeout is shorter than the drain interval (or the keep-alive)
        self.emitter.wake_within(self.stall.timeout_ns / 1e9)

    def _ready(self, step: int, end_perf: int) -> bool:
        """The gate of held steps: whether every active route has read what the step
        issued."""
        for route in self._gates:
            if not route.ready(end_perf):
                return False
        return True

    def before_step(self, info: Any) -> None:
        for route in self.active:
            route.before_step(info)
        self.book.before_step(info)

    def on_step(self, info: Any) -> None:
        for route in self.active:
            route.on_step(info)
        self.book.on_step(info)
