"""A rank of the world sent nothing for the step: the telemetry cannot explain it, and says
which ranks (with what the blamed rank seen did)."""

from __future__ import annotations

from otel_train.analysis.causes.case import Description
from otel_train.analysis.report_model import SlowStep


class MissingTelemetry:
    name = "missing_telemetry"

    def describe(self, slow: SlowStep, said: Description) -> bool:
        if not said.missing:
            return False
        named = ", ".join(map(str, said.missing))
        seen = (f" (of the ranks seen, rank {slow.rank} {slow.phase.replace('_', ' ')} "
                f"{slow.phase_s:.3g} s)" if said.index is not None else "")
        slow.unexplained = f"no telemetry from rank {named} for this step{seen}"
        return True


DETAIL = MissingTelemetry()
