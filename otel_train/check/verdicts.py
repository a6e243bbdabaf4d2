"""One verdict per checklist item, and how verdicts from several sources combine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "n/a"

#: the checklist of docs/design.md, then otel-train's own items, in order: (id, what is
#: checked)
ITEMS = (
    ("trace_coverage", "every sampled step of every rank lives in a step trace"),
    ("same_trace_across_ranks", "all ranks of a step share one trace id"),
    ("sampling_consistency", "spans per sampled step == world size, for each phase"),
    ("ranks_finished", "every rank's run ended well; a crashed or vanished rank is named"),
    ("exemplars", "latency histograms carry exemplars that resolve to traces"),
    ("log_fields", "logs carry their trace and span ids, training.run.id, training.rank and "
                   "training.step (+ training.phase, training.duration_s)"),
    ("launcher_context", "the launcher's trace context reaches every rank's run span"),
    ("per_rank_metrics", "metrics carry training.rank, so skew is visible, not averaged away"),
    ("cpu_throttling_measured", "CPU throttling is measured per rank"),
    ("throttling_alert", "the CPU throttling alert rule is loaded in Prometheus"),
    ("step_parts_add_up", "each rank's step parts add up to its step time"),
    ("telemetry_complete", "no telemetry was dropped"),
)
TITLES = dict(ITEMS)
#: the signals whose files each item of a run directory is read from: where one of them is
#: damaged or missing, the item failing names it as the likely cause, ahead of its own fix
#: (a sampler, span parenting), which is for whole files
READS = {
    "trace_coverage": ("traces",),
    "same_trace_across_ranks": ("traces",),
    "sampling_consistency": ("traces",),
    "ranks_finished": ("traces",),
    "exemplars": ("metrics", "traces"),
    "log_fields": ("logs",),
    "launcher_context": ("traces",),
    "per_rank_metrics": ("metrics",),
    "cpu_throttling_measured": ("metrics",),
    "step_parts_add_up": ("metrics",),
}


@dataclass
class CheckResult:
    id: str
    status: str
    evidence: str
    fix: str = ""
    source: str = ""

    @property
    def item(self) -> str:
        return TITLES.get(self.id, self.id)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "item": self.item}


def merge(results: list[CheckResult]) -> list[CheckResult]:
    """One row per item, in checklist order: a failure anywhere fails the item."""
    out = []
    for item_id, _ in ITEMS:
        rows = [r for r in results if r.id == item_id]
        if not rows:
            continue
        for status in (FAIL, PASS, NOT_APPLICABLE):
            chosen = [r for r in rows if r.status == status]
            if chosen:
                break
        out.append(CheckResult(
            item_id, status, "; ".join(f"[{r.source}] {r.evidence}" if len(rows) > 1
                                       else r.evidence for r in chosen),
            "; ".join(dict.fromkeys(r.fix for r in chosen if r.fix)),
            ",".join(r.source for r in chosen)))
    return out


def failed(results: list[CheckResult]) -> bool:
    return any(r.status == FAIL for r in results)
