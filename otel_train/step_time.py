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
   is left of a compute phase is its own compute), or a region the user named
   (``otel_train.region``: any other phase name), ``regions``. A collective in flight during
   a data wait or a region does not take its time: the host waited for data, or was in
   code the user named, whatever the network did;
4. outside every phase: ``device_wait``, ``gpu_outside_phases`` (the host blocked while its
   device ran work queued outside the phases) and ``host_busy`` as the gap sampler measured
   them (sources/gaps/), capped to what is left; of the rest, the time a collective was in
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
from collections.abc import Iterable, Mapping, Sequence

from otel_train import semconv as sc
from otel_train.collectives_math import Interval

#: the phases in the order an instant inside several of them is given to one
_PHASE_ORDER = (sc.PHASE_DATA_WAIT, sc.PHASE_FORWARD, sc.PHASE_BACKWARD, sc.PHASE_OPTIMIZER)
_COMPUTE = (sc.PART_FORWARD, sc.PART_BACKWARD, sc.PART_OPTIMIZER)


#: the intervals an instant can be in, as bits of a mask: compile, communication in flight,
#: the phases in order, a region the user named (any other phase name: ``regions``)
_COMPILE, _COMM = 0, 1
_PHASE_INDEX = {phase: 2 + i for i, phase in enumerate(_PHASE_ORDER)}
_OTHER_PHASE = 2 + len(_PHASE_ORDER)
_BITS = _OTHER_PHASE + 1
_COMPUTE_BITS = sum(1 << _PHASE_INDEX[p] for p in _COMPUTE)
_PHASE_BITS = sum(1 << (2 + i) for i in range(len(_PHASE_ORDER) + 1))
#: what an instant is given to, by where it is: the categories above, and outside every
#: phase with or without a collective in flight
_OUTSIDE, _OUTSIDE_COMM = _BITS, _BITS + 1
_PART_OF = (sc.PART_COMPILE, sc.PART_EXPOSED_COMM, *_PHASE_ORDER, sc.PART_REGIONS)


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


#: each part's place in the lists of :func:`partition_ns` (``semconv.PARTS``' order), and
#: each goodput bucket's in :func:`goodput_list`'s (``semconv.GOODPUT_BUCKETS``')
_AT = {part: i for i, part in enumerate(sc.PARTS)}
_B = {bucket: i for i, bucket in enumerate(sc.GOODPUT_BUCKETS)}
_CATEGORY_AT = tuple(_AT[part] for part in _PART_OF)
_COMPUTE_AT = tuple(_AT[p] for p in _COMPUTE)
_PHASE_AT = {phase: _AT[phase] for phase in _PHASE_ORDER}
_DATA_WAIT_AT, _COMM_AT, _COMPILE_AT = (_AT[sc.PART_DATA_WAIT], _AT[sc.PART_EXPOSED_COMM],
                                        _AT[sc.PART_COMPILE])
_DEVICE_AT, _BUSY_AT, _NOT_EXPLAINED_AT = (_AT[sc.PART_DEVICE_WAIT], _AT[sc.PART_HOST_BUSY],
                                           _AT[sc.PART_NOT_EXPLAINED])
_GPU_OUTSIDE_AT, _REGIONS_AT = _AT[sc.PART_GPU_OUTSIDE_PHASES], _AT[sc.PART_REGIONS]


def partition(lo: int, hi: int, phases: Iterable[tuple[str, int, int]],
              exposed: Iterable[Interval] = (), compiles: Iterable[Interval] = (),
              outside: Mapping[str, int] | None = None) -> dict[str, int]:
    """The step ``[lo, hi)`` (ns, one clock) split into ``semconv.PARTS``, in ns.

    ``phases``: (phase, start, end) of the step's phase spans; ``exposed``: the intervals of
    exposed communication; ``compiles``: the compilations; ``outside``: ns of the time
    outside the phases the host was blocked on the device (``device_wait``; while the
    device ran work queued outside the phases: ``gpu_outside_phases``) or busy
    (``host_busy``). Every part is present (0 where none); the values add up to ``hi - lo``.
    """
    outside = outside or {}
    return dict(zip(sc.PARTS, partition_ns(
        lo, hi, [(phase, 0, start, end) for phase, start, end in phases], list(exposed),
        list(compiles), int(outside.get(sc.PART_DEVICE_WAIT, 0)),
        int(outside.get(sc.PART_HOST_BUSY, 0)),
        int(outside.get(sc.PART_GPU_OUTSIDE_PHASES, 0))), strict=True))


def partition_ns(lo: int, hi: int, phases: Sequence[tuple[str, int, int, int]],
                 exposed: Sequence[Interval], compiles: Sequence[Interval],
                 device_wait: int, host_busy: int, gpu_outside: int = 0) -> list[int]:
    """:func:`partition` as the emitter thread calls it once a step: the phases as the
    tracker records them, (phase, micro-batch, start, end); the parts' ns in
    ``semconv.PARTS``' order.

    A step without communication or compile intervals whose phases follow one another (a
    GPU run's, the usual) is added up in one pass over its phases; any other step takes one
    sweep over its intervals' edges (a sort), each stretch between two edges given to its
    category."""
    parts = [0] * len(sc.PARTS)
    if hi <= lo:
        return parts
    if not exposed and not compiles:
        covered = _phases_in_order(lo, hi, phases, parts)
        if covered is not None:
            return _outside(parts, hi - lo - covered, 0, device_wait, host_busy, gpu_outside)
        parts = [0] * len(sc.PARTS)
    ns = _sweep(lo, hi, phases, exposed, compiles)
    for category, at in enumerate(_CATEGORY_AT):
        parts[at] += ns[category]
    return _outside(parts, ns[_OUTSIDE] + ns[_OUTSIDE_COMM], ns[_OUTSIDE_COMM], device_wait,
                    host_busy, gpu_outside)


def _phases_in_order(lo: int, hi: int, phases: Sequence[tuple[str, int, int, int]],
                     parts: list[int]) -> int | None:
    """Add each phase's time in ``[lo, hi)`` to ``parts``; the ns they cover, or None where
    a phase begins before the one before it ended (they overlap: the sweep decides)."""
    covered = 0
    last_end = lo
    at = _PHASE_AT.get
    for phase, _, start, end in phases:
        if start < lo:
            start = lo
        if end > hi:
            end = hi
        if end <= start:
            continue
        if start < last_end:
            return None
        parts[at(phase, _REGIONS_AT)] += end - start
        covered += end - start
        last_end = end
    return covered


def _sweep(lo: int, hi: int, phases: Sequence[tuple[str, int, int, int]],
           exposed: Sequence[Interval], compiles: Sequence[Interval]) -> list[int]:
    """ns of ``[lo, hi)`` by category (the module doc's order, then outside every phase
    without and with a collective in flight)."""
    edges = []
    for category, intervals in ((_COMPILE, compiles), (_COMM, exposed)):
        for start, end in intervals:
            if end > start:
                edges.append((start, category, 1))
                edges.append((end, category, -1))
    index = _PHASE_INDEX.get
    for phase, _, start, end in phases:
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
    return ns


def _outside(parts: list[int], left: int, with_comm: int, device_wait: int,
             host_busy: int, gpu_outside: int = 0) -> list[int]:
    """The ``left`` ns outside every phase given out: blocked on the device, blocked while
    it ran work queued outside the phases, host busy (the gap sampler's figures, capped),
    then communication in flight (``with_comm`` of it), then not explained."""
    device = min(max(device_wait, 0), left)
    gpu = min(max(gpu_outside, 0), left - device)
    busy = min(max(host_busy, 0), left - device - gpu)
    rest = left - device - gpu - busy
    comm = min(with_comm, rest)
    parts[_DEVICE_AT] = device
    parts[_GPU_OUTSIDE_AT] = gpu
    parts[_BUSY_AT] = busy
    parts[_COMM_AT] += comm
    parts[_NOT_EXPLAINED_AT] += rest - comm
    return parts


def goodput(parts: Mapping[str, float], warmup: bool, before_s: float,
            before_bucket: str = sc.GOODPUT_BETWEEN_STEPS, checkpoint_s: float = 0.0
            ) -> dict[str, float]:
    """A step's contribution to the goodput buckets (``semconv.GOODPUT_BUCKETS``), seconds:
    its parts, and the ``before_s`` seconds since the rank's previous step ended (or since
    the process started, for the first step: ``before_bucket`` startup). A warm-up step's
    time other than compile and checkpoints is all ``warmup``; a steady step's compute is
    ``productive``. ``checkpoint_s``: the step's time in regions named ``checkpoint`` (of
    its ``regions`` part), the ``checkpoint`` loss."""
    values = [parts.get(part, 0.0) for part in sc.PARTS]
    return dict(zip(sc.GOODPUT_BUCKETS, goodput_list(
        values, warmup, before_s, before_bucket == sc.GOODPUT_STARTUP, checkpoint_s),
        strict=True))


def goodput_list(parts: Sequence[float], warmup: bool, before: float,
                 first: bool, checkpoint: float = 0) -> list[float]:
    """:func:`goodput` on :func:`partition_ns`'s list (any unit: ns on the emitter thread),
    in ``semconv.GOODPUT_BUCKETS``' order; ``first``: the time before is start-up;
    ``checkpoint``: the step's checkpoint regions (at most its ``regions`` part)."""
    out = [0] * len(sc.GOODPUT_BUCKETS)
    out[_B[sc.GOODPUT_STARTUP] if first else _B[sc.GOODPUT_BETWEEN_STEPS]] = max(before, 0)
    compile_time = parts[_COMPILE_AT]
    out[_B[sc.GOODPUT_COMPILE]] = compile_time
    checkpoint = min(max(checkpoint, 0), parts[_REGIONS_AT])
    out[_B[sc.GOODPUT_CHECKPOINT]] = checkpoint
    if warmup:
        out[_B[sc.GOODPUT_WARMUP]] = sum(parts) - compile_time - checkpoint
        return out
    out[_B[sc.GOODPUT_PRODUCTIVE]] = sum(parts[at] for at in _COMPUTE_AT)
    out[_B[sc.GOODPUT_DATA_WAIT]] = parts[_DATA_WAIT_AT]
    out[_B[sc.GOODPUT_EXPOSED_COMM]] = parts[_COMM_AT]
    out[_B[sc.GOODPUT_DEVICE_WAIT]] = parts[_DEVICE_AT]
    out[_B[sc.GOODPUT_OUTSIDE_PHASES]] = (parts[_REGIONS_AT] - checkpoint + parts[_GPU_OUTSIDE_AT]
                                          + parts[_BUSY_AT] + parts[_NOT_EXPLAINED_AT])
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
