"""Regions users name: ``with otel_train.region("loss"): ...`` marks a region of the step as a
phase of its own (docs/telemetry.md "Regions you name").

A region is timed on the host, and on the GPU where the run is on one (the CUDA events the
phases use, on the current stream); it is a ``training.region`` span in the step's trace
(``training.phase``: its name), the step's part ``regions`` (its own time in
``training.phase_total.<name>``), a ``training.phase`` label of the phase histogram, and the
report names it. A region named ``checkpoint`` is the goodput's checkpoint loss.

Names are few and bounded: lower case, digits and underscores (``semconv.REGION_NAME``), not a
phase's or part's name, and at most ``semconv.MAX_REGIONS`` of them a process; a name beyond
that is recorded as ``other_regions`` (one warning says so). A bad name is a ``ValueError``
where the region is made.

What a region holds: code between the phases (a loss, metrics, clipping, an EMA, a
checkpoint, an evaluation). A phase that begins inside a region is the region's (an
evaluation's forward passes are the evaluation's), except the optimizer's step, which ends
the region: the step ends there. Outside an active ``otel_train.instrument``, or off the
training thread, a region does nothing. On the training thread a region costs one tracker
call at each end (the phases' own cost, docs/overhead.md).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import warnings
from typing import Any

from otel_train import semconv

__all__ = ["region"]

_VALID = re.compile(semconv.REGION_NAME)
#: names a region may not take: the phases', the parts', and what the report's columns use
_RESERVED = frozenset({*semconv.TIMED_PHASES, *semconv.PARTS, semconv.PHASE_EXPOSED_COMM,
                       semconv.PHASE_COMPILE, semconv.REGION_OTHER, "step", "untimed"})
_lock = threading.Lock()
#: the names recorded in this process, in the order first used (at most MAX_REGIONS)
_recorded: dict[str, str] = {}
_warned = False


def _check(name: Any) -> str:
    if not isinstance(name, str) or not _VALID.fullmatch(name):
        raise ValueError(f"otel-train: a region's name is lower case letters, digits and "
                         f"underscores, starting with a letter, at most 32 long: {name!r}")
    if name in _RESERVED:
        raise ValueError(f"otel-train: {name!r} is a phase's or part's name; name the "
                         f"region otherwise (reserved: {', '.join(sorted(_RESERVED))})")
    return name


def recorded_name(name: str) -> str:
    """The name ``name`` is recorded under: its own among the first ``MAX_REGIONS`` names of
    the process, ``other_regions`` beyond them (said once, as a warning)."""
    known = _recorded.get(name)
    if known is not None:
        return known
    global _warned
    with _lock:
        if name not in _recorded:
            if len(_recorded) < semconv.MAX_REGIONS:
                _recorded[name] = name
            else:
                _recorded[name] = semconv.REGION_OTHER
                if not _warned:
                    _warned = True
                    warnings.warn(
                        f"otel-train: more than {semconv.MAX_REGIONS} region names in this "
                        f"process: {name!r} and any further one are recorded as "
                        f"{semconv.REGION_OTHER!r} (the phase histogram's labels stay "
                        "bounded)", RuntimeWarning, stacklevel=4)
        return _recorded[name]


def _tracker() -> Any:
    instrument = sys.modules.get("otel_train.instrument")
    active = getattr(instrument, "_active", None) if instrument is not None else None
    return getattr(active, "tracker", None)


class region(contextlib.ContextDecorator):  # noqa: N801  (used as a function, like open())
    """``with otel_train.region("loss"): ...``, or ``@otel_train.region("ema")`` on a
    function: the block (the call) is a region of the step named ``name`` (module doc)."""

    def __init__(self, name: str) -> None:
        self.name = _check(name)
        self._open: list[tuple[Any, str] | None] = []  # one entry a use still open

    def __enter__(self) -> region:
        tracker = _tracker()
        entry = None
        if tracker is not None:
            try:
                name = recorded_name(self.name)
                if tracker.begin(name):
                    entry = (tracker, name)
            except Exception:  # never the training loop's problem
                entry = None
        self._open.append(entry)
        return self

    def __exit__(self, *exc: object) -> bool:
        entry = self._open.pop() if self._open else None
        if entry is not None:
            try:
                entry[0].end(entry[1])
            except Exception:  # never the training loop's problem
                pass
        return False
