"""The causes of slow steps, one module each, and the order they are asked in.

A slow step is explained in two turns:

1. **Who and what** (:data:`CAUSES`): each cause in order may claim the step, with the
   :class:`SlowStep` that names the rank and phase to blame (:class:`case.Cause`); the first
   claim wins. ``own_phase``, last, always claims. Causes that name the rank the blamed one
   waited for (:class:`case.WaitingCause`) also decide, in their order, whom
   ``cpu_throttled`` compares against (:attr:`case.StepCase.blamed`).
2. **What the telemetry says about it** (:data:`DETAILS`): for a claim made with
   :meth:`case.StepCase.explained`, each detail in order fills in the sampled line, the
   DataLoader worker, the untimed stretch, or why the step is not explained
   (:class:`case.Detail`); the first that returns True ends the turn.

A new cause is a module with a ``CAUSE`` (``name``, ``explain(case)``) and one line in
:data:`CAUSES`, or :func:`register` (before the cause it must precede)."""

from __future__ import annotations

from otel_train import ordered
from otel_train.analysis.causes import (
    arrived_late,
    cpu_throttled,
    data_wait,
    device_wait,
    gpu_outside,
    missing_telemetry,
    not_explained,
    own_phase,
    regions,
    untimed,
    waited_in_collectives,
    waited_in_phase,
    within_typical,
)
from otel_train.analysis.causes.case import Blame, Cause, Detail, Evidence, StepCase
from otel_train.analysis.report_model import SlowStep

__all__ = ["CAUSES", "DETAILS", "Blame", "Cause", "Detail", "Evidence", "StepCase", "explain",
           "register", "unregister"]

#: who and what, in the order asked; the first claim wins
CAUSES: list[Cause] = [
    device_wait.CAUSE,  # a host blocked on its device: followed to what the device waited for
    cpu_throttled.CAUSE,  # the step's most throttled rank, where throttling explains the step
    arrived_late.CAUSE,  # the rank late to the step's collectives (arrival times)
    waited_in_phase.CAUSE,  # the rank that started the blamed phase last (phase spans)
    waited_in_collectives.CAUSE,  # the rank that spent least in collectives (their spans)
    own_phase.CAUSE,  # the last resort: the blamed rank's own largest excess
]

#: what the telemetry says about the blamed time, in order; the first that ends it wins
DETAILS: list[Detail] = [
    missing_telemetry.DETAIL,  # ranks that sent nothing for the step
    cpu_throttled.DETAIL,  # a throttled rank: nothing more to say
    within_typical.DETAIL,  # no longer than the typical step
    not_explained.DETAIL,  # the phases hold too little of the step's excess
    data_wait.DETAIL,  # the data wait's line or DataLoader worker
    gpu_outside.DETAIL,  # GPU work queued outside the phases: its stretch and line
    regions.DETAIL,  # a region the user named: its name
    untimed.DETAIL,  # the untimed stretch and the user code sampled there
]


def register(cause: Cause, before: str | None = own_phase.CAUSE.name) -> None:
    """Put ``cause`` in :data:`CAUSES` just before the one named ``before`` (the last
    resort, ``own_phase``, by default; None: last)."""
    ordered.insert(CAUSES, cause, before, "cause")


def unregister(name: str) -> None:
    """Take the cause named ``name`` out of :data:`CAUSES` (no error where it is not in)."""
    ordered.remove(CAUSES, name)


def explain(blame: Blame, step: int, evidence: Evidence, skip: frozenset[str] = frozenset()
            ) -> SlowStep:
    """The first claim of :data:`CAUSES` on ``step`` (those named in ``skip`` not asked)."""
    case = StepCase(blame, step, evidence, tuple(c for c in CAUSES if c.name not in skip),
                    tuple(DETAILS))
    for cause in case.causes:
        slow = cause.explain(case)
        if slow is not None:
            return slow
    raise LookupError(f"no cause claimed step {step} (the last resort, "
                      f"{own_phase.CAUSE.name!r}, is not in CAUSES)")
