"""Exceptions otel-train swallows to protect training are counted, never silent.

A hook on the training thread (memory statistics, CUDA timing, MFU, compile callbacks,
collective capture, batch sizes) must never raise into the user's loop, so it catches what
goes wrong. It must not hide it either: :func:`count` tallies the error by component (one
dictionary increment under a lock; errors are rare), and the emitter exports the tallies as
``otel_train.internal.errors{component}`` and logs the first error of each component once
(``otel_train.internal_error``). :func:`snapshot` is what tests assert on.

A :class:`Tally` is one owner's count of the errors it swallows (the emitter's, a collective
capture's, the exporter process's): it says whether an error is among the first few, the
ones the owner logs, so that a path failing on every record does not flood the log.
"""

from __future__ import annotations

import collections
import threading

_lock = threading.Lock()
_counts: collections.Counter[str] = collections.Counter()
_first: dict[str, str] = {}


def count(component: str, err: BaseException) -> None:
    """Tally one swallowed exception of ``component``; never raises."""
    try:
        with _lock:
            _counts[component] += 1
            if component not in _first:
                _first[component] = repr(err)[:300]
    except Exception:  # pragma: no cover - a counter must not fail the hook it protects
        pass


class Tally:
    """One owner's swallowed errors: :meth:`add` counts one and says whether to log it."""

    __slots__ = ("errors", "log_first")

    def __init__(self, log_first: int = 5) -> None:
        self.errors = 0
        self.log_first = log_first

    def add(self, err: BaseException, component: str | None = None) -> bool:
        """Count ``err`` (and, given a component, in that component's process-wide tally);
        True for the owner's first ``log_first`` errors: the ones to log."""
        self.errors += 1
        if component is not None:
            count(component, err)
        return self.errors <= self.log_first


def snapshot() -> dict[str, int]:
    """Errors swallowed so far in this process, by component."""
    with _lock:
        return dict(_counts)


def first_error(component: str) -> str:
    with _lock:
        return _first.get(component, "")
