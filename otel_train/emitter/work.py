"""A finished step's working state on the emitter thread, and the order its listeners run in.

The emitter makes two objects a step: the :class:`~otel_train.wire.step.StepRecord`, every
field of which crosses to where spans are built, and a :class:`StepWork` beside it, which
holds the record and the listeners' scratch (span contexts, phase intervals, overrides, GPU
ends...) and is never sent. The sources' step listeners are given the StepWork: they read
and write a record field through it as if it were its own (``info.step``,
``info.extra_attributes``: properties that read and set the record's), the scratch
directly.

Pre-step listeners may depend on each other (the gap source reads the ``gpu_ends`` the CUDA
timing source writes). Each declares what it reads and writes (:func:`step_uses`, on the
listener), and the emitter runs them in an order where every listener runs after all the
others that write what it reads (:func:`order_listeners`, when one is registered or
removed: never per step). Otherwise the order is the registration order: the sources'
(``instrument.SOURCES``). A cycle is refused with the listeners and fields it is made of.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from opentelemetry.trace import SpanContext

from otel_train.wire import CtxTuple
from otel_train.wire.step import WIRE_FIELDS, StepRecord


@dataclasses.dataclass(eq=False, slots=True)
class StepWork:
    """A finished step on the emitter thread: its :class:`StepRecord` (``record``: what is
    sent) and what its listeners share while it is worked on (never sent). Every field of
    the record reads and writes through this object too (``work.step`` is
    ``work.record.step``)."""

    record: StepRecord
    #: the training.rank_step span's context (the record's ``trace_id``, ``rank_step_span_id``,
    #: ``sampled``)
    rank_step_context: SpanContext | None = None
    #: phase intervals on the training thread's perf_counter clock: (phase, micro, start, end),
    #: in the order the tracker recorded them (read-only: the phase spans are made of them)
    phase_intervals: tuple[tuple[str, int, int, int], ...] = ()
    #: changes to phase spans by span id, set by pre-step listeners: any of ``start_ns``,
    #: ``end_ns`` (wall clock, e.g. GPU-timed), ``attributes`` (added), ``error`` (status)
    phase_overrides: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: (host end, GPU end) of each GPU-timed phase, wall-clock ns, in order; None where the
    #: step's GPU times are not known (a CPU run, events unresolved): written by
    #: sources/gpu/cuda_timing.py, read by sources/gaps/listener.py
    gpu_ends: list[tuple[int, int]] | None = None
    #: the GPU's stretches between consecutive GPU-timed phases (the step before's last and
    #: this step's first, then within the step): (phase before, phase after, GPU end of the
    #: one, GPU start of the other, host start of the other), wall-clock ns, in order; None
    #: where not known. Written by cuda_timing.py, read by the gap listener
    gpu_between: list[tuple[str, str, int, int, int]] | None = None
    #: the step's exposed communication, perf_counter ns intervals (the collectives' route:
    #: sources/collectives/assembly.py), and its compilations, wall-clock ns intervals
    #: (sources/compile): what the step's parts are made of
    exposed_intervals: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    compile_intervals: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    #: phase span contexts with their wall-clock intervals: (phase, micro, ctx, start, end),
    #: ctx as ``wire.ctx_tuple`` gives it: what the collectives' rows carry (made after the
    #: pre-step listeners, sampled steps only)
    phase_spans: list[tuple[str, int, CtxTuple, int, int]] = dataclasses.field(
        default_factory=list)
    #: the metric points' exemplar context, made once (Emitter.exemplar_context)
    exemplar: Any = None


def _record_field(name: str) -> property:
    """A property of StepWork that reads and sets the record's field ``name``."""
    get = operator.attrgetter(f"record.{name}")

    def set_(work: StepWork, value: Any) -> None:
        setattr(work.record, name, value)

    return property(get, set_, doc=f"``record.{name}``")


_SCRATCH = frozenset(f.name for f in dataclasses.fields(StepWork)) - {"record"}
if _SCRATCH & set(WIRE_FIELDS):  # a property would hide the slot: one name, one place
    raise TypeError(f"StepWork's scratch and StepRecord's wire fields share "
                    f"{sorted(_SCRATCH & set(WIRE_FIELDS))}")
for _name in WIRE_FIELDS:
    setattr(StepWork, _name, _record_field(_name))
del _name

#: what a step listener may read or write by name: the record's fields and the scratch
STEP_FIELDS = frozenset(WIRE_FIELDS) | _SCRATCH
#: made by the emitter once the pre-step listeners have run: no pre-step listener reads or
#: writes them (the after-step listeners, ``Emitter.on_step``, find them made)
MADE_AFTER_PRE_STEP = frozenset({"phases", "phase_spans", "parts_ns"})

StepListener = Callable[[StepWork], None]
_L = TypeVar("_L", bound=Callable[..., Any])


def step_uses(*, reads: Iterable[str] = (), writes: Iterable[str] = ()) -> Callable[[_L], _L]:
    """Declare, on a pre-step listener, the step fields (:data:`STEP_FIELDS`) it ``reads``
    (needs complete: every other listener that writes one runs before it) and ``writes``
    (sets, or adds to). The emitter orders the listeners by it (:func:`order_listeners`);
    fields the emitter sets before any listener runs (the step, its times, its phase
    intervals...) need no declaring unless a listener writes them too."""
    declared = (frozenset(reads), frozenset(writes))

    def mark(listener: _L) -> _L:
        listener.step_uses = declared  # type: ignore[attr-defined]
        return listener

    return mark


def uses_of(listener: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str]]:
    """(reads, writes) a listener declared (:func:`step_uses`; none: nothing), checked:
    ValueError for a field that is not a step field, or one made after the pre-step
    listeners."""
    reads, writes = getattr(listener, "step_uses", (frozenset(), frozenset()))
    for field in reads | writes:
        if field not in STEP_FIELDS:
            raise ValueError(f"step listener {_name_of(listener)} declares {field!r}, which "
                             f"is not a step field (one of {sorted(STEP_FIELDS)})")
        if field in MADE_AFTER_PRE_STEP:
            raise ValueError(f"step listener {_name_of(listener)} declares {field!r}, which "
                             "the emitter makes after the pre-step listeners have run")
    return reads, writes


def order_listeners(listeners: Sequence[StepListener]) -> tuple[StepListener, ...]:
    """The pre-step listeners in the order they run: each after every other one that writes
    a field it reads (:func:`step_uses`), otherwise in the order given (registration).
    ValueError for an unknown field or a cycle, naming the listeners and fields in it."""
    uses = [uses_of(listener) for listener in listeners]
    waits_for = [{j for j, (_, writes) in enumerate(uses) if j != i and reads & writes}
                 for i, (reads, _) in enumerate(uses)]
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(listeners):
        ready = next((i for i in range(len(listeners))
                      if i not in done and waits_for[i] <= done), None)
        if ready is None:
            raise ValueError("step listeners wait for each other (a cycle): " + "; ".join(
                f"{_name_of(listeners[i])} reads {sorted(uses[i][0] & uses[j][1])} that "
                f"{_name_of(listeners[j])} writes"
                for i in range(len(listeners)) if i not in done
                for j in sorted(waits_for[i] - done)))
        order.append(ready)
        done.add(ready)
    return tuple(listeners[i] for i in order)


def _name_of(listener: Callable[..., Any]) -> str:
    return getattr(listener, "__qualname__", None) or repr(listener)
