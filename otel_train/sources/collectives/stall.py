"""Stall detection: a collective pending longer than ``stall_timeout_s`` is reported, from the
emitter thread, once, when its deadline comes (the emitter, asleep while nothing is recorded,
is asked to wake for it): an error log naming op, sequence number, sizes and process group, and
(when it ends, or at exit) a ``training.collective.stalled`` event and attribute on its span.

The rank that is behind is the one *not* reporting the collective at that sequence number
of that group: every other rank waits for it there.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from otel_train import identity, semconv


class StallWatch:
    def __init__(self, timeout_s: float, log: Any, run_id: str) -> None:
        self.timeout_ns = int(timeout_s * 1e9)
        self.log = log
        self.run_id = run_id
        self.reported = 0
        self._rand = random.Random()

    def check(self, pending: Iterable[Any], now_perf: int) -> tuple[int, int | None]:
        """Flag and report every collective of ``pending`` past the timeout: how many, and
        the perf ns at which the next of the others would stall (None: none pending)."""
        found = 0
        deadline: int | None = None
        for coll in pending:
            if coll.stalled_at:
                continue
            due = coll.issue + self.timeout_ns
            if now_perf < due:
                deadline = due if deadline is None else min(deadline, due)
                continue
            coll.stalled_at = coll.issue + self.timeout_ns
            coll.span_id = coll.span_id or (self._rand.getrandbits(64) or 1)
            self._report(coll, now_perf)
            found += 1
        self.reported += found
        return found, deadline

    def _report(self, coll: Any, now_perf: int) -> None:
        trace_id = identity.step_trace_id(self.run_id, coll.step)
        self.log.error(
            semconv.LOG_COLLECTIVE_STALLED,
            pending_s=round((now_perf - coll.issue) / 1e9, 3),
            timeout_s=self.timeout_ns / 1e9,
            # the training.collective span's attribute names
            **{semconv.ATTR_COLLECTIVE_OP: coll.op, semconv.ATTR_COLLECTIVE_SEQ: coll.seq,
               semconv.ATTR_COLLECTIVE_GROUP: coll.group,
               semconv.ATTR_COLLECTIVE_GROUP_SIZE: coll.group_size,
               semconv.ATTR_COLLECTIVE_BACKEND: coll.backend,
               semconv.ATTR_COLLECTIVE_BYTES: coll.nbytes,
               semconv.ATTR_COLLECTIVE_SHAPE: list(coll.shape),
               semconv.ATTR_COLLECTIVE_DTYPE: coll.dtype,
               semconv.ATTR_COLLECTIVE_API: coll.api,
               semconv.CONSOLE_STEP: coll.step,
               semconv.CONSOLE_TRACE_ID: f"{trace_id:032x}",
               semconv.CONSOLE_SPAN_ID: f"{coll.span_id:016x}"})
