"""One account of a step's time: each rank-step's wall time split into disjoint parts that
sum to it, and a rank's run split into goodput buckets (docs/telemetry.md, "The step's parts"
and "Goodput").

The parts of a step come from intervals on one clock (the host's), each instant of the step
given to one part, the first that matches:

1. ``compile``: a torch.compile compilation ran (it lies inside forward, mostly);
2. ``exposed_comm``: a collective was in flight inside a compute phase while no compute
   could run: the host blocked in a synchronous one (gloo), as
   ``collectives_math.exposed_and_total`` defines exposed;
3. the phase the host was in: ``data_wait``, ``forward``, ``backward``, ``optimizer`` (what
   is left of a compute phase is its own compute). A collective in flight during a data
   wait does not take its time: the host waited for data, whatever the network did;
4. outside every phase: ``device_wait`` and ``host_busy`` as the gap sampler measured them
   (sources/gaps.py), capped to what is left; of the rest, the time a collective was in
   flight is ``exposed_comm`` (the host waited and the network had work), and what remains
   is ``not_explained``.

So the parts are disjoint by construction and add up to the step to the nanosecond (an
interval given twice, or intervals that overlap, count once). The overlap of communication
with compute stays a ratio (``training.comm.overlap``), never a part; so does the exposed
communication of ``training.phase_total.exposed_comm``, which counts a collective in flight
during a data wait too. Pure functions: no torch, no OpenTelemetry; the emitter thread calls
them once a step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

from otel_train import semconv as sc
from otel_train.collectives_math import Interval

#: the phases in the order an instant inside several of them is given to one
_PHASE_ORDER = (sc.PHASE_DATA_WAIT, sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER)
_COMPUTE = (sc.PART_FORWARD, sc.PART_BACKWARD, sc.PART_OPTIMIZER)


#: the intervals an instant can be in, as bits of a mask: compile, communication in flight,
#: the phases in order, a phase the contract does not know (its time stays accounted for,
#: as not explained)
_COMPILE, _COMM = 0, 1
_PHASE_INDEX = {phase: 2 + i for i, phase in enumerate(_PHASE_ORDER)}
_OTHER_PHASE = 2 + len(_PHASE_ORDER)
_BITS = _OTHER_PHASE + 1
_COMPUTE_BITS = sum(1 << _PHASE_INDEX[p] for p in _COMPUTE)
_PHASE_BITS = sum(1 << (2 + i) for i in range(len(_PHASE_ORDER) + 1))
#: what an instant is given to, by where it is: the categories above, and outside every
#: phase with or without a collective in flight
_OUTSIDE, _OUTSIDE_COMM = _BITS, _BITS + 1
_PART_OF = (sc.PART_COMPILE, sc.PART_EXPOSED_COMM, *_PHASE_ORDER, sc.PART_NOT_EXPLAINED)


def _winner(mask: int) -> int:
    """The category an instant inside the intervals of ``mask`` is given to (module doc)."""
    if mask & 1 << _COMPILE:
        return _COMPILE
    phases = mask & _PHASE_BITS
    if not phases:
        return _OUTSIDE_COMM if mask & 1 << _COMM else _OUTSIDE
    phase = phases & -phases  # the first phase it is in
    return _COMM if mask & 1 << _COMM and phase & _COMPUTE_BITS else phase.bit_length() - 1


#: every mask's category, worked out once (the sweep looks one up per stretch)
_WINNER = tuple(_winner(mask) for mask in range(1 << _BITS))


def partition(lo: int, hi: int, phases: Iterable[tuple[str, int, int]],
              exposed: Iterable[Interval] = (), compiles: Iterable[Interval] = (),
              outside: Mapping[str, int] | None = None) -> dict[str, int]:
    """The step ``[lo, hi)`` (ns, one clock) split into ``semconv.PARTS``, in ns.

    ``phases``: (phase, start, end) of the step's phase spans; ``exposed``: the intervals of
    exposed communication; ``compiles``: the compilations; ``outside``: ns of the time
    outside the phases the host was blocked on the device (``device_wait``) or busy
    (``host_busy``). Every part is present (0 where none); the values add up to ``hi - lo``.

    One sweep over the intervals' edges (the emitter thread runs it every step: a few tens
    of edges, one sort), each stretch between two edges given to its category.
    """
    parts = dict.fromkeys(sc.PARTS, 0)
    if hi <= lo:
        return parts
    edges = []
    for category, intervals in ((_COMPILE, compiles), (_COMM, exposed)):
        for start, end in intervals:
            if end > start:
                edges.append((start, category, 1))
                edges.append((end, category, -1))
    index = _PHASE_INDEX.get
    for phase, start, end in phases:
        if end > start:
            category = index(phase, _OTHER_PHASE)
            edges.append((start, category, 1))
            edges.append((end, category, -1))
    edges.sort()
    open_ = [0] * _BITS
    mask = 0  # bit c set while an interval of category c is open
    ns = [0] * (_OUTSIDE_COMM + 1)
    winner = _WINNER
    prev = lo
    for at, category, delta in edges:
        if at > prev and prev < hi:
            upto = at if at < hi else hi
            ns[winner[mask]] += upto - prev
            prev = upto
        count = open_[category] = open_[category] + delta
        if count:
            mask |= 1 << category
        else:
            mask &= ~(1 << category)
    if prev < hi:
        ns[winner[mask]] += hi - prev
    for category, part in enumerate(_PART_OF):
        parts[part] += ns[category]
    left = ns[_OUTSIDE] + ns[_OUTSIDE_COMM]
    outside = outside or {}
    device = min(max(int(outside.get(sc.PART_DEVICE_WAIT, 0)), 0), left)
    busy = min(max(int(outside.get(sc.PART_HOST_BUSY, 0)), 0), left - device)
    rest = left - device - busy
    comm = min(ns[_OUTSIDE_COMM], rest)
    parts[sc.PART_DEVICE_WAIT] = device
    parts[sc.PART_HOST_BUSY] = busy
    parts[sc.PART_EXPOSED_COMM] += comm
    parts[sc.PART_NOT_EXPLAINED] += rest - comm
    return parts


def goodput(parts: Mapping[str, float], warmup: bool, before_s: float,
            before_bucket: str = sc.GOODPUT_BETWEEN_STEPS) -> dict[str, float]:
    """A step's contribution to the goodput buckets (``semconv.GOODPUT_BUCKETS``), seconds:
    its parts, and the ``before_s`` seconds since the rank's previous step ended (or since
    the process started, for the first step: ``before_bucket`` startup). A warm-up step's
    time other than compile is all ``warmup``; a steady step's compute is ``productive``."""
    out = dict.fromkeys(sc.GOODPUT_BUCKETS, 0.0)
    out[before_bucket] += max(before_s, 0.0)
    out[sc.GOODPUT_COMPILE] += parts.get(sc.PART_COMPILE, 0.0)
    if warmup:
        out[sc.GOODPUT_WARMUP] += sum(v for k, v in parts.items() if k != sc.PART_COMPILE)
        return out
    out[sc.GOODPUT_PRODUCTIVE] += sum(parts.get(p, 0.0) for p in _COMPUTE)
    out[sc.GOODPUT_DATA_WAIT] += parts.get(sc.PART_DATA_WAIT, 0.0)
    out[sc.GOODPUT_EXPOSED_COMM] += parts.get(sc.PART_EXPOSED_COMM, 0.0)
    out[sc.GOODPUT_DEVICE_WAIT] += parts.get(sc.PART_DEVICE_WAIT, 0.0)
    out[sc.GOODPUT_OUTSIDE_PHASES] += (parts.get(sc.PART_HOST_BUSY, 0.0)
                                       + parts.get(sc.PART_NOT_EXPLAINED, 0.0))
    return out


_process_start_taken = False


def run_start_ns(instrumented_ns: int) -> int:
    """Where a rank's run begins for goodput (epoch ns): its process's start, for the first
    instrumented run of the process (so that process-group init and model building count
    as start-up), else ``instrumented_ns`` (a later ``instrument()`` in the same process)."""
    global _process_start_taken
    if _process_start_taken:
        return instrumented_ns
    _process_start_taken = True
    started = _process_start_ns()
    return started if started is not None and started <= instrumented_ns else instrumented_ns


def _process_start_ns() -> int | None:
    """This process's start (epoch ns) from /proc (Linux), None elsewhere."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22: starttime
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        hz = os.sysconf("SC_CLK_TCK")
        started = boot * 10**9 + ticks * 10**9 // hz
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    # btime is whole seconds: a start "after now" would be the rounding, not the truth
    return min(started, time.time_ns())
