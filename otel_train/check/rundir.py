"""The checklist verdicts of a run directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from otel_train.analysis.otlp import no_such_run
from otel_train.check import signal_checks, trace_checks
from otel_train.check.evidence import RunEvidence, gather
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, READS, CheckResult

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
    return [name_damaged_files(r, evidence) for r in results]


def name_damaged_files(result: CheckResult, evidence: RunEvidence) -> CheckResult:
    """``result``, naming the damaged or missing files it was read from as the likely cause
    where it failed: a torn or missing rank file fails several items, whose own fixes (a
    ratio sampler, span parenting) sent the user after a set-up that was not at fault."""
    if result.id == "telemetry_complete":
        return _missing_files_are_lost_telemetry(result, evidence)
    causes = evidence.file_causes(READS.get(result.id, ()))
    if result.status != FAIL or not causes:
        return result
    return dataclasses.replace(
        result,
        evidence=f"files damaged or missing, the likely cause: {'; '.join(causes)}; what the "
                 f"files read show: {result.evidence}",
        fix=f"see to those files first (telemetry_complete says what is wrong with each): "
            f"this verdict is of what could be read; if a whole copy of the run still "
            f"fails, {result.fix}")


def _missing_files_are_lost_telemetry(result: CheckResult,
                                      evidence: RunEvidence) -> CheckResult:
    """telemetry_complete names the damaged lines; a rank's missing file is telemetry lost
    as well."""
    if not evidence.missing:
        return result
    names = ", ".join(str(path) for path in evidence.missing)
    missing = f"missing files: {names}"
    fix = ("a rank's files are missing where it never started instrumented (its stderr "
           "says why) or where the run directory was copied without them")
    if result.status != FAIL:
        return dataclasses.replace(result, status=FAIL, evidence=missing, fix=fix)
    return dataclasses.replace(result, evidence=f"{result.evidence}; {missing}",
                               fix=f"{result.fix}; {fix}")
