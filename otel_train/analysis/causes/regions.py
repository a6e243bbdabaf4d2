"""A region the user named (``otel_train.region``): the blamed ``regions`` time is named by
the rank step's largest region ("checkpoint")."""

from __future__ import annotations

from otel_train.analysis.causes.case import Description
from otel_train.analysis.report_model import SlowStep
from otel_train.analysis.traces import REGIONS


class Regions:
    name = "regions"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if slow.phase != REGIONS or slow.on_gpu or said.index is None:
            return False
        named = said.table.regions.get(said.index)
        slow.segment = named[0] if named is not None else None
        return True


DETAIL = Regions()
