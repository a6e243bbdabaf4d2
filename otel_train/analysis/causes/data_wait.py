"""A data wait: named by its sampled line or the DataLoader worker it waited for (the
``training.data_wait`` event of the blamed rank's step that held most of the host's
time)."""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis.causes.case import Description
from otel_train.analysis.report_model import SlowStep


class DataWait:
    name = "data_wait"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if slow.phase != sc.PHASE_DATA_WAIT or slow.on_gpu or said.index is None:
            return False
        waits = [g for g in said.table.gaps.get(said.index, ()) if g.kind == sc.EVENT_DATA_WAIT]
        if waits:
            wait = max(waits, key=lambda g: g.host_s)
            slow.location, slow.worker = wait.location, wait.worker
        return True


DETAIL = DataWait()
