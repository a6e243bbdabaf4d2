"""The book of collectives seen one by one: the capture's records (issue, completion, a Work
to poll) and the flight recorder's entries. A collective is pending by key until it
completes, then finished until the step that issued it (by time on the perf_counter clock)
takes it; one that completes after its step was emitted is sent on its own, in that step.
An asynchronous one still pending when its step ends counts as communication up to the
step's end, and its span follows when it completes."""

from __future__ import annotations

import dataclasses
from typing import Any

from otel_train.sources.collectives.capture import DONE, ISSUE, WORK

#: how often Works without a future (gloo's asynchronous reduce_scatter) are polled for
#: their completion while one is in flight: the resolution of their durations
_WORK_POLL_S = 0.05


@dataclasses.dataclass(slots=True, eq=False)
class Collective:
    key: int
    op: str
    api: str
    backend: str
    group: str
    group_size: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    async_op: bool
    issue: int  # perf_counter ns
    step: int
    seq: int
    source: str
    done: int | None = None
    error: str | None = None
    work: Any = None
    stalled_at: int = 0
    span_id: int = 0
    gpu_duration_s: float | None = None
    owner: Any = None  # the StepRecord it was counted in, when it completes after its step

    def seconds(self) -> float:
        if self.gpu_duration_s is not None:
            return self.gpu_duration_s
        return max(0, (self.done or self.issue) - self.issue) / 1e9


class Book:
    """Pending collectives by key, finished ones waiting for their step, and each step's."""

    def __init__(self, emitter: Any, assembly: Any) -> None:
        self.emitter = emitter
        self.assembly = assembly
        self.offset = emitter.offset
        self.pending: dict[int, Collective] = {}
        self.finished: list[Collective] = []
        self._for_spans: dict[int, list[Collective]] = {}

    def on_record(self, payload: tuple[Any, ...]) -> None:
        kind = payload[0]
        if kind == ISSUE:
            # (ISSUE, key, op, api, backend, group, group_size, nbytes, dtype, shape,
            #  async_op, t0, step, seq, source): Collective's first fields, in order
            self.pending[payload[1]] = Collective(*payload[1:])
        elif kind == DONE:
            coll = self.pending.pop(payload[1], None)
            if coll is not None:
                coll.done, coll.error = payload[2], payload[3]
                self.finish(coll)
        elif kind == WORK:
            coll = self.pending.get(payload[1])
            if coll is not None:
                coll.work = payload[2]

    def finish(self, coll: Collective) -> None:
        coll.work = None
        if coll.owner is None:
            self.finished.append(coll)
            return
        self.assembly.send([coll], coll.owner)  # its step is out already: on its own

    def poll_works(self, now: int) -> None:
        """Finish the pending collectives whose Work (one without a future) has completed."""
        polled = [c for c in self.pending.values() if c.work is not None]
        for coll in polled:
            if coll.work.is_completed():  # non-blocking; Works without a future only
                del self.pending[coll.key]
                coll.done = now
                self.finish(coll)
        if any(c.done is None for c in polled):
            # their completion is seen when polled: keep the resolution they always had
            self.emitter.wake_within(_WORK_POLL_S)

    def before_step(self, info: Any) -> None:
        """The step takes what it issued: its exposed communication now, its spans in
        :meth:`on_step`."""
        if not self.finished and not self.pending:  # the NCCL plugin's route: nothing here
            return
        hi = info.end_ns - self.offset
        mine = [c for c in self.finished if c.issue < hi]
        self.finished = [c for c in self.finished if c.issue >= hi]
        late = [c for c in self.pending.values() if c.owner is None and c.issue < hi]
        for coll in late:
            coll.owner = info
        if not mine and not late:
            return
        comm = [(c.issue, c.done or c.issue) for c in mine] + [(c.issue, hi) for c in late]
        blocking = ([(c.issue, c.done or c.issue) for c in mine if not c.async_op]
                    + [(c.issue, hi) for c in late if not c.async_op])
        self.assembly.count_exposed(info, comm, blocking)
        self._for_spans[info.step] = mine

    def on_step(self, info: Any) -> None:
        colls = self._for_spans.pop(info.step, [])
        if colls:
            self.assembly.send(colls, info)

    def flush(self, end_perf: int) -> None:
        """Instrumentation ends: what never completed becomes an unfinished span; what ran
        after the last step counts in the metrics only."""
        for coll in list(self.pending.values()):  # never finished: a span, no points
            if coll.owner is not None and coll.owner.sampled:
                self.assembly.send([coll], coll.owner, end_perf, points=False)
        self.pending.clear()
        if self.finished:  # after the last step: points, no spans
            self.assembly.send_after_steps(self.finished)
        self.finished = []
