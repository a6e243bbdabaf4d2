"""Live trace and log backends the checker does not query yet: said plainly, never faked."""

from __future__ import annotations

from otel_train.check.model import NOT_APPLICABLE, CheckResult

ITEMS = {
    "jaeger": ("trace_coverage", "same_trace_across_ranks", "sampling_consistency",
               "launcher_context"),
    "tempo": ("trace_coverage", "same_trace_across_ranks", "sampling_consistency",
              "launcher_context"),
    "loki": ("log_fields",),
}


def not_implemented(backend: str) -> list[CheckResult]:
    return [CheckResult(item, NOT_APPLICABLE, f"live {backend} checks are not implemented yet",
                        "check the run directory or the collector's file exporter output",
                        backend) for item in ITEMS[backend]]
