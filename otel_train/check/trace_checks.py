"""Checklist items read from a run directory's traces: coverage, one trace per step,
consistent sampling, and how each rank's run ended."""

from __future__ import annotations

from collections.abc import Callable

from otel_train import semconv as sc
from otel_train.analysis.fates import rank_fates
from otel_train.analysis.report_model import RankFate
from otel_train.check.evidence import RunEvidence, TraceEvidence
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS, CheckResult

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
    counts = ev.metrics.per_rank_count(sc.METRIC_STEP_DURATION)
    trained = f" of {max(counts.values())} trained" if counts else ""
    if not sampled:
        return _result("trace_coverage", False, f"no training.rank_step spans{trained}",
                       "instrument the run with otel_train.instrument() and check "
                       "OTEL_TRACES_SAMPLER is not always_off")
    orphans = [f"step {s}" for s in sampled if s not in t.roots
               or t.rank_step_parents[s] - {t.roots[s]}]
    missing_ranks = sorted(set(range(world(t))) - t.ranks)
    evidence = f"{len(sampled)} sampled steps{trained}"
    if orphans:
        evidence += f"; {len(orphans)} without their training.step root: {_examples(orphans)}"
    if missing_ranks:
        evidence += f"; ranks without any span: {missing_ranks}"
    if not orphans and not missing_ranks:
        evidence += f", every rank_step under its training.step root, all {world(t)} ranks traced"
    return _result("trace_coverage", not orphans and not missing_ranks, evidence,
                   "rank 0 must export training.step and every rank parent its rank_step on the "
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


def fates(t: TraceEvidence) -> list[RankFate]:
    """The ranks whose run did not end well, first failure first (analysis/fates.py)."""
    return rank_fates(world(t), t.run_ends, t.last_steps)


def _gone_after(t: TraceEvidence) -> dict[int, int]:
    """rank -> its last step with telemetry, for each rank that crashed, vanished or was
    stopped: the steps after it are missing because the rank was, not because of sampling."""
    return {fate.rank: fate.last_step for fate in fates(t)}


def sampling_consistency(ev: RunEvidence) -> CheckResult:
    t = ev.traces
    size = world(t)
    kinds = sorted({kind for _, kind in t.rank_masks})
    gone = _gone_after(t)
    bad, excused = [], 0
    for (step, kind), mask in sorted(t.rank_masks.items()):
        missing = [r for r in range(size) if not mask >> r & 1]
        if missing and all(step > gone.get(r, step) for r in missing):
            excused += 1  # a failed rank's absence after its last step: ranks_finished says
        elif missing:
            bad.append(f"step {step} {kind}: ranks {missing} missing")
    uneven = _uneven_counts(t)
    if not t.rank_masks:
        return _result("sampling_consistency", False, "no sampled step spans", SAMPLER_FIX)
    ok = not bad and not uneven
    steps = len({s for s, _ in t.rank_masks})
    after = (f"; {excused} (step, phase) pairs after a failed rank's last step are short of "
             f"it (ranks_finished names it)" if excused else "")
    evidence = (f"{steps} sampled steps x {len(kinds)} span kinds ({', '.join(kinds)}): "
                f"all {size} ranks each{after}" if ok else "; ".join(filter(None, [
                    f"{len(bad)} (step, phase) pairs short of {size} ranks: {_examples(bad)}"
                    if bad else "",
                    f"uneven span counts across ranks: {_examples(uneven)}" if uneven else ""])))
    return _result("sampling_consistency", ok, evidence, SAMPLER_FIX)


def ranks_finished(ev: RunEvidence) -> CheckResult:
    """Every rank's run ended well; else the first rank to fail is named (crashed: the step
    and its exception; vanished: no telemetry after its last step) and the others' ends
    are said as its consequence."""
    t = ev.traces
    if not t.run_ends and not t.last_steps:
        return CheckResult("ranks_finished", NOT_APPLICABLE, "no training.run or training.rank_step "
                           "spans", "", SOURCE)
    failed = fates(t)
    if not failed:
        return _result("ranks_finished", True,
                       f"all {world(t)} ranks' runs ended with status ok", "")
    first = failed[0]
    fix = (f"the training failed, not its telemetry: start from rank {first.rank}'s "
           + ("stderr and its training.run span's exception" if first.fate == "crashed"
              else "exit (SIGKILL, the kernel's OOM killer, its node)")
           + "; `otel-train report` shows the steps before it")
    return _result("ranks_finished", False, "; ".join(f.sentence for f in failed), fix)


def _uneven_counts(t: TraceEvidence) -> list[str]:
    """(step, kind) pairs whose spans do not divide evenly among the ranks that sent them."""
    out = []
    for (step, kind), count in sorted(t.span_counts.items()):
        ranks = bin(t.rank_masks[(step, kind)]).count("1")
        if count % ranks:
            out.append(f"step {step} {kind}: {count} spans from {ranks} ranks")
    return out


CHECKS: tuple[Callable[[RunEvidence], CheckResult], ...] = (
    trace_coverage, same_trace_across_ranks, sampling_consistency, ranks_finished)
