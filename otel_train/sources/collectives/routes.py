"""Which routes of collectives the ledger builds, in which order, and which one supersedes
which: the one place that says so. A route (route.py's interface) in a file of its own
becomes one by a line in :data:`ROUTES`, or by :func:`register`.

- :data:`ROUTES`: every route, in order. At start the ledger builds each one (``build(parts)``
  gives None where the route is not available here: no NCCL process group, no plugin
  loaded), and calls the hooks of the active ones in this order: the wrappers' first (their
  Works are polled before NCCL's records are read, as the book has always had them), then
  NCCL's routes. A route's build sees the routes built before it (``parts.built``).
- :data:`SUPERSEDES`: the precedence of routes that read the same collectives. While a route
  is in the ledger, those it supersedes are built but not active (only
  ``read_at_next_tick`` reaches them); once it gives up (its tick returns False) they are.
  The one rule today: otel-train's NCCL profiler plugin supersedes NCCL's flight recorder
  (both read NCCL's collectives; the flight recorder is kept to notice that NCCL runs
  without the plugin, and then reads them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from otel_train import ordered
from otel_train.sources.collectives import fr_route, plugin_route, wrapper_route
from otel_train.sources.collectives.fr_route import FlightRecorderRoute
from otel_train.sources.collectives.plugin_route import PluginRoute
from otel_train.sources.collectives.route import Parts, Route
from otel_train.sources.collectives.wrapper_route import WrapperRoute

Build = Callable[[Parts], "Route | None"]


@dataclass(frozen=True)
class Entry:
    """A route's name (its ``Route.name``) and how it is built."""

    name: str
    build: Build


ROUTES: list[Entry] = [
    Entry(WrapperRoute.name, wrapper_route.build),
    Entry(FlightRecorderRoute.name, fr_route.build),
    Entry(PluginRoute.name, plugin_route.build),
]

SUPERSEDES: dict[str, frozenset[str]] = {
    PluginRoute.name: frozenset({FlightRecorderRoute.name}),
}


def register(name: str, build: Build, before: str | None = None) -> None:
    """Add a route to :data:`ROUTES`: last, or before the one named ``before``. Ledgers made
    from then on build it (in this process: a rank registers it before ``instrument()``)."""
    ordered.insert(ROUTES, Entry(name, build), before, "route")


def unregister(name: str) -> None:
    """Take the route named ``name`` out of :data:`ROUTES` (no error where it is not in)."""
    ordered.remove(ROUTES, name)


def build_routes(parts: Parts) -> list[Route]:
    """The routes available here, in :data:`ROUTES` order (``parts.built`` fills as they
    are)."""
    out = []
    for entry in ROUTES:
        route = entry.build(parts)
        if route is not None:
            parts.built[entry.name] = route
            out.append(route)
    return out


def active(routes: list[Route]) -> list[Route]:
    """The routes of ``routes`` that no other one of them supersedes, in order."""
    hidden: set[str] = set()
    for route in routes:
        hidden |= SUPERSEDES.get(route.name, frozenset())
    return [route for route in routes if route.name not in hidden]
