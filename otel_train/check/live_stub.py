"""Live backends the checker does not query: said plainly, never faked.

Tempo's client is left out until it can be tested against a real server (Jaeger's and
Loki's, which are, live in jaeger.py and loki.py)."""

from __future__ import annotations

from otel_train.check.model import NOT_APPLICABLE, CheckResult

ITEMS = {
    "tempo": ("trace_coverage", "same_trace_across_ranks", "sampling_consistency",
              "launcher_context"),
}


def not_implemented(backend: str) -> list[CheckResult]:
    return [CheckResult(item, NOT_APPLICABLE, f"live {backend} checks are not implemented (no "
                        "server to test against)", "check the run directory, the collector's "
                        "file exporter output, or --jaeger URL for the trace items", backend)
            for item in ITEMS[backend]]
