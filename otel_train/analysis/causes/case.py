"""What every cause of a slow step works with: the blame's columns and typical values
(:class:`Blame`, one for the report), the step being explained (:class:`StepCase`), the
interfaces of a cause (:class:`Cause`) and of a detail (:class:`Detail`), and the shared
thresholds. The registry that orders them is the package's ``__init__``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import median
from typing import NamedTuple, Protocol

from otel_train import semconv as sc
from otel_train.analysis.device_waits import GpuIntervals
from otel_train.analysis.report_model import SlowStep
from otel_train.analysis.traces import UNTIMED, StepTable

#: waiting for other ranks is a symptom, never the cause of a slow step; so is a host
#: blocked on its device, which is followed to what the device waited for
NOT_A_CAUSE = frozenset({sc.PHASE_EXPOSED_COMM, sc.PHASE_DEVICE_WAIT})
DEVICE_WAIT = sc.PHASE_DEVICE_WAIT
#: the host blocked on its device while it ran work queued outside the phases: blocked time
#: too, followed like the rest of it (to that work, on the rank and in the step that queued it)
GPU_OUTSIDE = sc.PHASE_GPU_OUTSIDE_PHASES


def blocked_s(table: StepTable, index: int) -> float:
    """A row's time outside the phases the host spent blocked on its device (both parts)."""
    return table.untimed_parts[DEVICE_WAIT][index] + table.untimed_parts[GPU_OUTSIDE][index]
#: below this, a phase above typical or a throttled time explains nothing (clock noise)
MIN_EXPLAINING_S = 0.001
#: a slow step is explained when its blamed phase is at least this share of the step's time
#: above the typical step (else the phases do not hold where the time went)
EXPLAINED_SHARE_OF_EXCESS = 0.25

PhaseStarts = Callable[[int, str], dict[int, int]]
CollectiveSeconds = Callable[[int], dict[int, float]]
LateOfStep = Callable[[int], "tuple[int, float] | None"]


class Blamed(NamedTuple):
    """A (row, phase) blamed, and the phase's excess over typical there."""

    excess: float
    index: int | None  # the step table's row (None: no row)
    phase: str


@dataclass(frozen=True)
class Evidence:
    """What pass two of the traces says of a step, where the report read it (None: not):
    each rank's start of a phase (epoch ns), each rank's seconds in the step's collectives,
    and the rank that arrived late at its collectives, by how many seconds."""

    phase_starts: PhaseStarts | None = None
    collective_s: CollectiveSeconds | None = None
    late_of_step: LateOfStep | None = None


class Blame:
    """The columns and typical values the blame of every slow step compares against."""

    def __init__(self, table: StepTable, durations: dict[int, float],
                 world_ranks: set[int] | None, collectives: GpuIntervals | None) -> None:
        self.table, self.durations, self.collectives = table.pad(), durations, collectives
        self.world_ranks = world_ranks
        self.rows: dict[int, list[int]] = defaultdict(list)
        for index, step in enumerate(table.steps):
            self.rows[step].append(index)
        blocked = [blocked_s(table, i) for i in range(len(table))]
        #: what the blame compares: the phases, untimed time less its blocked part (the
        #: host's own), and the blocked part on its own
        self.cols = {**table.phases, DEVICE_WAIT: blocked}
        if any(blocked):
            self.cols[UNTIMED] = [max(u - b, 0.0) for u, b in zip(table.phases[UNTIMED], blocked)]
        self.typical = {p: median(col) if col else 0.0 for p, col in self.cols.items()}
        self.gpu_typical = {p: median(col) if col else 0.0
                            for p, col in table.gpu_phases.items()}
        self.typical_step = median(durations.values()) if durations else 0.0

    def worst(self, rows: list[int], skip: str | None = None, device: bool = False) -> Blamed:
        """The largest phase excess over typical among ``rows``; the blocked time counts
        only with ``device``."""
        best = Blamed(float("-inf"), None, sc.PHASE_DATA_WAIT)
        for index in rows:
            for phase, col in self.cols.items():
                if phase == skip or (phase in NOT_A_CAUSE
                                     and not (device and phase == DEVICE_WAIT)):
                    continue
                excess = col[index] - self.typical[phase]
                if excess > best[0]:
                    best = Blamed(excess, index, phase)
        return best

    def worst_own(self, rows: list[int], gpu_only: bool = False
                  ) -> tuple[float, int, str, bool] | None:
        """(excess, row, phase, on the GPU) of what the rank did itself: its host phases'
        excess (unless ``gpu_only``) or its phases' GPU time above typical."""
        best: tuple[float, int, str, bool] | None = None
        for index in rows:
            candidates = [] if gpu_only else [
                (col[index] - self.typical[p], p, False) for p, col in self.cols.items()
                if p not in NOT_A_CAUSE]
            candidates += [(col[index] - self.gpu_typical[p], p, True)
                           for p, col in self.table.gpu_phases.items() if col[index] > 0]
            for excess, phase, on_gpu in candidates:
                if best is None or excess > best[0]:
                    best = (excess, index, phase, on_gpu)
        return best


@dataclass
class Description:
    """What the details (:class:`Detail`) look at to say what the telemetry holds about a
    blamed row's time: the row (None: none), its phase's excess over typical, the step's
    excess over the typical step, the world's ranks that sent nothing for the step, and
    whether the blame is the rank's CPU throttling."""

    table: StepTable
    index: int | None
    excess: float
    step_excess: float
    missing: list[int]
    throttled: bool


class Cause(Protocol):
    """A cause of slow steps: ``explain`` claims a step (the :class:`SlowStep` that names
    it, usually made by :meth:`StepCase.explained`) or passes (None)."""

    name: str

    def explain(self, case: StepCase) -> SlowStep | None: ...


class Detail(Protocol):
    """What the telemetry says about a blamed row's time, or why it cannot say: ``describe``
    fills the step's fields and returns True when nothing after it applies."""

    name: str

    def describe(self, slow: SlowStep, said: Description) -> bool: ...


class WaitingCause:
    """A cause by which the blamed rank waited for another one (the late rank): the step is
    then blamed on what the late rank did, its largest excess in another phase than the one
    the blamed rank waited in. :meth:`late_rank` gives the late rank (maybe the blamed rank
    itself: the blame stands) or None where this evidence says neither; the first waiting
    cause in the registry that names one decides (:attr:`StepCase.waited_for`)."""

    name = ""

    def late_rank(self, case: StepCase) -> int | None:
        raise NotImplementedError

    def explain(self, case: StepCase) -> SlowStep | None:
        late = case.late_rank_by(self)
        return None if late is None else case.explained(case.moved_to(late))


class StepCase:
    """One step being explained: its rows, its blame (the largest excess, moved to the rank it
    waited for), and the SlowStep made of a blame (:meth:`explained`, with the details)."""

    def __init__(self, blame: Blame, step: int, evidence: Evidence,
                 causes: Sequence[Cause], details: Sequence[Detail]) -> None:
        self.blame, self.step, self.evidence = blame, step, evidence
        self.table = blame.table
        self.rows = blame.rows.get(step, [])
        self.duration = blame.durations[step]
        self.causes, self.details = causes, details
        self._late: dict[int, int | None] = {}

    @cached_property
    def worst(self) -> Blamed:
        """The step's largest phase excess (the blocked time not counted)."""
        return self.blame.worst(self.rows)

    def late_rank_by(self, cause: WaitingCause) -> int | None:
        """``cause.late_rank(self)``, asked once."""
        key = id(cause)
        if key not in self._late:
            self._late[key] = cause.late_rank(self)
        return self._late[key]

    @cached_property
    def waited_for(self) -> int | None:
        """The late rank the first waiting cause of the registry names (None: none does)."""
        for cause in self.causes:
            if isinstance(cause, WaitingCause):
                late = self.late_rank_by(cause)
                if late is not None:
                    return late
        return None

    def moved_to(self, late: int) -> Blamed:
        """The step's blame where the blamed rank waited for ``late``: what ``late`` did,
        in another phase (where its step was exported; else the blame stands)."""
        worst = self.worst
        if worst.index is not None and late != self.table.ranks[worst.index]:
            late_rows = [i for i in self.rows if self.table.ranks[i] == late]
            if late_rows:
                return self.blame.worst(late_rows, skip=worst.phase)
        return worst

    @cached_property
    def blamed(self) -> Blamed:
        """The step's largest excess, moved to the rank it waited for where a waiting cause
        names one."""
        late = self.waited_for
        return self.worst if late is None else self.moved_to(late)

    def explained(self, blamed: Blamed, throttled: bool = False, step: int | None = None,
                  duration: float | None = None, on_gpu: bool = False) -> SlowStep:
        """The SlowStep of ``blamed`` (in ``step``, of ``duration``: this step's by default),
        with what the telemetry says about it (the registry's details, in order)."""
        table, blame = self.table, self.blame
        step = self.step if step is None else step
        duration = self.duration if duration is None else duration
        excess, index, phase = blamed
        if index is None:
            slow = SlowStep(step, duration, -1, phase, 0.0, 0.0)
        else:
            col = table.gpu_phases[phase] if on_gpu else blame.cols[phase]
            seconds = col[index]
            slow = SlowStep(step, duration, table.ranks[index], phase, seconds,
                            seconds / duration if duration else 0.0, on_gpu=on_gpu)
        seen = {table.ranks[i] for i in blame.rows.get(step, [])}
        slow.missing = sorted((blame.world_ranks or seen) - seen)
        said = Description(table, index, excess, duration - blame.typical_step, slow.missing,
                           throttled)
        for detail in self.details:
            if detail.describe(slow, said):
                break
        return slow
