"""The checklist verdicts of a run directory."""

from __future__ import annotations

from pathlib import Path

from otel_train.analysis.otlp import no_such_run
from otel_train.check import signal_checks, trace_checks
from otel_train.check.evidence import gather
from otel_train.check.verdicts import NOT_APPLICABLE, CheckResult

SOURCE = trace_checks.SOURCE


def check_run_dir(run_dir: Path, run_id: str | None = None,
                  live_exemplars: frozenset[tuple[str, str]] | None = None,
                  workers: int | None = None) -> list[CheckResult]:
    """Every checklist item a run directory can answer; ``run_id`` picks one run out of
    files that hold several (a collector's output); ``live_exemplars`` (from a live
    Prometheus) are resolved against the files' spans too; ``workers``: processes reading
    the traces files (None: as many as pay off). FileNotFoundError where the files hold
    nothing of run ``run_id``."""
    evidence = gather(run_dir, run_id, live_exemplars or frozenset(), workers)
    if run_id and not (evidence.traces.spans or evidence.metrics.last or evidence.logs.records):
        raise FileNotFoundError(no_such_run(run_dir, run_id))
    results = [check(evidence) for check in trace_checks.CHECKS + signal_checks.CHECKS]
    if live_exemplars is not None:
        results.append(signal_checks.live_exemplars_resolve(evidence))
    results.append(CheckResult("throttling_alert", NOT_APPLICABLE,
                               "alert rules live in Prometheus, not in a run directory",
                               "run with --prometheus URL to check the rule is loaded", SOURCE))
    return results
