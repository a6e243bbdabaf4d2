"""The interface every route of collectives implements: what the ledger (ledger.py) calls on
the emitter thread, whichever route it is. A route is a way collectives reach the ledger:
the wrappers' own records (wrapper_route.py), NCCL's flight recorder (fr_route.py), otel-train's
NCCL profiler plugin (plugin_route.py). Which routes are built, in which order, and which one
supersedes which: routes.py.

The ledger calls each hook on its active routes in their order (routes.py's ``ROUTES``), so
a route only implements the hooks it needs; the others do nothing here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from otel_train.sources.collectives.assembly import Assembly
from otel_train.sources.collectives.book import Book
from otel_train.sources.collectives.reads import ReadAccount
from otel_train.sources.collectives.stall import StallWatch


@dataclass
class Parts:
    """What a route is built with: the instrumentation's context (``ctx``: config, emitter,
    identity, log) and the ledger's parts, and the routes built before it by name."""

    ctx: Any
    book: Book
    assembly: Assembly
    stall: StallWatch
    account: ReadAccount
    built: dict[str, Route] = field(default_factory=dict)


class Route:
    """A route of collectives, as the ledger sees it. Every hook runs on the emitter thread."""

    #: the route's name: routes.py's registry, precedence and ``Ledger.route`` use it
    name: ClassVar[str] = ""
    #: what the start log lists among the collectives' mechanisms (None: nothing)
    mechanism: ClassVar[str | None] = None
    #: backends this route reads instead of the wrappers (they skip them: ``Capture``)
    covers: ClassVar[frozenset[str]] = frozenset()
    #: whether finished steps wait for :meth:`ready` (the emitter holds them back)
    holds_steps: ClassVar[bool] = False

    def start(self) -> None:
        """The route is active from the start (not superseded then): begin reading."""

    def read_at_next_tick(self) -> None:
        """Instrumentation ends: the next tick reads, however recent the last read (the
        last read is never skipped). Asked of every route built, superseded ones too."""

    def complete(self) -> None:
        """Instrumentation ends, before the last tick: take in what finished since the
        route last looked (it would otherwise end unmeasured)."""

    def ready(self, end_perf: int) -> bool:
        """The gate of held steps (only where :attr:`holds_steps`): whether the route has
        read every collective issued before ``end_perf`` (the step's end, perf ns)."""
        return True

    def tick(self, now: int) -> bool:
        """The emitter's tick (``now``, perf ns): read what is due. False: the route gives
        up, and the ledger drops it (the routes it superseded take over)."""
        return True

    def before_step(self, info: Any) -> None:
        """A finished step, before its spans: its exposed communication."""

    def on_step(self, info: Any) -> None:
        """A finished step, its spans built: its collectives' rows."""

    def flush(self) -> None:
        """Instrumentation ends, after the last tick and before the held steps go: say what
        is still in flight."""

    def flush_rows(self) -> None:
        """Instrumentation ends, after the last step and the book's flush: what ran after the
        last step (points, no spans)."""
