"""Ordered registries of named entries (the slow-step causes, the collectives' routes): one
insert-before-by-name and one removal, so that every registry refuses and orders alike."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


def insert(entries: list[T], entry: T, before: str | None, kind: str) -> None:
    """Put ``entry`` in ``entries`` just before the one named ``before`` (None: last).
    ValueError where one of its name is there already, or none is named ``before``
    (``kind`` names what they are in the message: "cause", "route")."""
    if any(e.name == entry.name for e in entries):
        raise ValueError(f"a {kind} named {entry.name!r} is registered already")
    at = len(entries)
    if before is not None:
        found = next((i for i, e in enumerate(entries) if e.name == before), None)
        if found is None:
            raise ValueError(f"no {kind} named {before!r}")
        at = found
    entries.insert(at, entry)


def remove(entries: list[T], name: str) -> None:
    """Take the entry named ``name`` out of ``entries`` (no error where it is not in)."""
    entries[:] = [e for e in entries if e.name != name]
