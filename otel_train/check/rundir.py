"""The checklist verdicts of a run directory."""

from __future__ import annotations

from pathlib import Path

from otel_train.check import signal_checks, trace_checks
from otel_train.check.evidence import gather
from otel_train.check.model import NOT_APPLICABLE, CheckResult

SOURCE = trace_checks.SOURCE


def check_run_dir(run_dir: Path) -> list[CheckResult]:
    evidence = gather(run_dir)
    results = [check(evidence) for check in trace_checks.CHECKS + signal_checks.CHECKS]
    results.append(CheckResult("throttling_alert", NOT_APPLICABLE,
                               "alert rules live in Prometheus, not in a run directory",
                               "run with --prometheus URL to check the rule is loaded", SOURCE))
    return results
