"""Checklist items read from a run directory's traces: coverage, one trace per step,
consistent sampling."""

from __future__ import annotations

from collections.abc import Callable

from otel_train import semconv as sc
from otel_train.check.evidence import RunEvidence, TraceEvidence
from otel_train.check.verdicts import FAIL, PASS, CheckResult

SOURCE = "run dir"
SAMPLER_FIX = ("use a trace-id ratio sampler (OTEL_TRACES_SAMPLER=traceidratio or "
               "parentbased_traceidratio), never a per-rank random decision")


def _result(item: str, ok: bool, evidence: str, fix: str) -> CheckResult:
    return CheckResult(item, PASS if ok else FAIL, evidence, "" if ok else fix, SOURCE)


def _examples(items: list[str], limit: int = 3) -> str:
    return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit
                                       else "")


def world(t: TraceEvidence) -> int:
    return t.world_size or (max(t.ranks) + 1 if t.ranks else 0)


def trace_coverage(ev: RunEvidence) -> CheckResult:
    t = ev.traces
    sampled = sorted(s for s, _ in t.rank_masks if _ == "rank_step")
    counts = [p.count for p in ev.metrics.series(sc.METRIC_STEP_DURATION)]
    trained = f" of {max(counts)} trained" if counts else ""
    if not sampled:
        return _result("trace_coverage", False, f"no train.rank_step spans{trained}",
                       "instrument the run with otel_train.instrument() and check "
                       "OTEL_TRACES_SAMPLER is not always_off")
    orphans = [f"step {s}" for s in sampled if s not in t.roots
               or t.rank_step_parents[s] - {t.roots[s]}]
    missing_ranks = sorted(set(range(world(t))) - t.ranks)
    evidence = f"{len(sampled)} sampled steps{trained}"
    if orphans:
        evidence += f"; {len(orphans)} without their train.step root: {_examples(orphans)}"
    if missing_ranks:
        evidence += f"; ranks without any span: {missing_ranks}"
    if not orphans and not missing_ranks:
        evidence += f", every rank_step under its train.step root, all {world(t)} ranks traced"
    return _result("trace_coverage", not orphans and not missing_ranks, evidence,
                   "rank 0 must export train.step and every rank parent its rank_step on the "
                   "step's derived span id; check that no rank's span export failed")


def same_trace_across_ranks(ev: RunEvidence) -> CheckResult:
    t = ev.traces
    split = [f"step {s}: {len(ids) + 1} trace ids" for s, ids in sorted(t.extra_traces.items())]
    owners: dict[str, int] = {}
    shared = []
    for step, trace_id in sorted(t.step_trace.items()):
        for tid in (trace_id, *t.extra_traces.get(step, ())):
            if owners.setdefault(tid, step) != step:
                shared.append(f"steps {owners[tid]} and {step}")
    ok = not split and not shared and bool(t.step_trace)
    if ok:
        evidence = f"{len(t.step_trace)} steps, each in exactly one trace"
    elif not t.step_trace:
        evidence = "no spans carry training.step"
    else:
        evidence = "; ".join(filter(None, [
            f"{len(split)} steps split over several traces: {_examples(split)}" if split else "",
            f"{len(shared)} traces shared by several steps: {_examples(shared)}" if shared
            else ""]))
    return _result("same_trace_across_ranks", ok, evidence,
                   "derive each step's trace id from (run id, step) on every rank, and agree "
                   "on one run id (set OTEL_TRAIN_RUN_ID or call instrument() after "
                   "init_process_group)")


def sampling_consistency(ev: RunEvidence) -> CheckResult:
    t = ev.traces
    size = world(t)
    full = (1 << size) - 1
    kinds = sorted({kind for _, kind in t.rank_masks})
    bad = []
    for (step, kind), mask in sorted(t.rank_masks.items()):
        if mask != full:
            missing = [r for r in range(size) if not mask >> r & 1]
            bad.append(f"step {step} {kind}: ranks {missing} missing")
    uneven = _uneven_counts(t)
    if not t.rank_masks:
        return _result("sampling_consistency", False, "no sampled step spans", SAMPLER_FIX)
    ok = not bad and not uneven
    steps = len({s for s, _ in t.rank_masks})
    evidence = (f"{steps} sampled steps x {len(kinds)} span kinds ({', '.join(kinds)}): "
                f"all {size} ranks each" if ok else "; ".join(filter(None, [
                    f"{len(bad)} (step, phase) pairs short of {size} ranks: {_examples(bad)}"
                    if bad else "",
                    f"uneven span counts across ranks: {_examples(uneven)}" if uneven else ""])))
    return _result("sampling_consistency", ok, evidence, SAMPLER_FIX)


def _uneven_counts(t: TraceEvidence) -> list[str]:
    """(step, kind) pairs whose spans do not divide evenly among the ranks that sent them."""
    out = []
    for (step, kind), count in sorted(t.span_counts.items()):
        ranks = bin(t.rank_masks[(step, kind)]).count("1")
        if count % ranks:
            out.append(f"step {step} {kind}: {count} spans from {ranks} ranks")
    return out


CHECKS: tuple[Callable[[RunEvidence], CheckResult], ...] = (
    trace_coverage, same_trace_across_ranks, sampling_consistency)
