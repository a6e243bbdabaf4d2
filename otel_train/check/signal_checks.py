"""Checklist items read from a run directory's metrics, logs and run spans: exemplars, log
fields, the launcher context, per-rank metrics, CPU throttling, dropped telemetry."""

from __future__ import annotations

from collections.abc import Callable

from otel_train import semconv as sc
from otel_train.check.evidence import RunEvidence
from otel_train.check.trace_checks import SOURCE, _examples, _result, world
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS, CheckResult

LATENCY_HISTOGRAMS = (sc.METRIC_STEP_DURATION, sc.METRIC_PHASE_DURATION)


def exemplars(ev: RunEvidence) -> CheckResult:
    found = [e for e in ev.metrics.exemplars if e.metric in LATENCY_HISTOGRAMS]
    fix = ("record histograms inside the step's span context and keep the trace-based "
           "exemplar filter (OTEL_METRICS_EXEMPLAR_FILTER=trace_based)")
    if not found:
        points = len([n for n in ev.metrics.names() if n in LATENCY_HISTOGRAMS])
        return _result("exemplars", False, f"no exemplars on {', '.join(LATENCY_HISTOGRAMS)} "
                       f"({points} of them exported, {ev.metrics.histogram_points} histogram "
                       "points in all)", fix)
    targets = {(e.trace_id, e.span_id) for e in found}
    unresolved = sorted(targets - ev.traces.resolved)
    evidence = (f"{len(found)} exemplars on the latency histograms, {len(targets)} distinct "
                f"spans, {len(targets) - len(unresolved)} found in the exported traces")
    if unresolved:
        no_trace = [t for t, _ in unresolved if t not in ev.traces.traces_seen_of_targets]
        examples = [f"{t[:8]}…/{s}" for t, s in unresolved]
        evidence += (f"; {len(unresolved)} do not resolve ({len(no_trace)} to no exported "
                     f"trace at all): {_examples(examples)}")
    return _result("exemplars", not unresolved, evidence,
                   fix + "; exemplars must name the sampled rank_step span that was exported")


def live_exemplars_resolve(ev: RunEvidence) -> CheckResult:
    """Prometheus's exemplars of this run, looked up among the spans of the files."""
    live = ev.live_exemplars
    resolved = live & ev.traces.resolved
    ok = bool(live) and resolved == live
    evidence = (f"{len(resolved)} of {len(live)} Prometheus exemplars of the run name a span "
                "in the files" if live else "Prometheus holds no exemplars of this run")
    return CheckResult("exemplars", PASS if ok else FAIL, evidence, "" if ok else
                       "Prometheus must scrape the run's own endpoints (or the collector) with "
                       "exemplar storage on; exemplars must name exported sampled spans",
                       "prometheus+run dir")


def log_fields(ev: RunEvidence) -> CheckResult:
    logs = ev.logs
    fix = ("log through structlog or logging while instrumented (the bridge adds the ids), "
           "and keep trace_id/span_id on records exported by other handlers")
    if not logs.records:
        reason = "no logs*.jsonl files" if not ev.has_logs else "log files hold no records"
        return _result("log_fields", False, reason, fix)
    problems = [f"{logs.missing[f]} of {logs.records} records lack {f} (e.g. "
                f"{logs.example_missing[f]!r})" for f in sc.LOG_REQUIRED_FIELDS
                if logs.missing[f]]
    if not logs.timed:
        problems.append(f"no timed events: no record has {sc.LOG_PHASE} and "
                        f"{sc.LOG_DURATION}")
    elif logs.timed_without_duration:
        problems.append(f"{logs.timed_without_duration} of {logs.timed} timed records lack "
                        f"{sc.LOG_DURATION}")
    evidence = "; ".join(problems) if problems else (
        f"all {logs.records} records carry {', '.join(sc.LOG_REQUIRED_FIELDS)}; "
        f"{logs.timed} timed records carry {sc.LOG_PHASE} and {sc.LOG_DURATION}")
    return _result("log_fields", not problems, evidence, fix)


def launcher_context(ev: RunEvidence) -> CheckResult:
    runs = ev.traces.run_spans
    size = world(ev.traces)
    item = "launcher_context"
    if not runs:  # e.g. a trace-id ratio sampler dropped the run's own (root) trace
        return CheckResult(item, NOT_APPLICABLE, "no training.run spans exported, so nothing "
                           "shows a launcher context (without TRACEPARENT a ratio sampler "
                           "may drop the run's own trace)", "launch with a sampled "
                           "TRACEPARENT: the run spans then follow the launcher's decision",
                           SOURCE)
    parents = {r: (s.trace_id, s.parent_id) for r, s in runs.items() if s.parent_id}
    if not parents:
        return CheckResult(item, NOT_APPLICABLE, f"{len(runs)} training.run spans, none with a "
                           "launcher parent: TRACEPARENT was not set for this run",
                           "have the launcher export TRACEPARENT to every rank", SOURCE)
    missing = sorted(set(range(size)) - set(parents))
    distinct = set(parents.values())
    ok = not missing and len(distinct) == 1
    evidence = (f"all {size} rank run spans are children of launcher span "
                f"{next(iter(distinct))[1]}" if ok else "; ".join(filter(None, [
                    f"ranks {missing} have no launcher parent" if missing else "",
                    f"{len(distinct)} different launcher parents" if len(distinct) > 1
                    else ""])))
    return _result(item, ok, evidence, "pass the launcher's TRACEPARENT to every rank's "
                   "environment (torchrun and the PyTorchJob pass the parent's env)")


def per_rank_metrics(ev: RunEvidence) -> CheckResult:
    without = ev.metrics.points_without_rank
    ranks = sorted({p.rank for p in ev.metrics.series(sc.METRIC_STEP_DURATION)
                    if p.rank is not None})
    if not ev.metrics.names():
        return _result("per_rank_metrics", False, "no metrics*.jsonl data",
                       "keep the metric exporter on (OTEL_METRICS_EXPORTER)")
    ok = not without and bool(ranks)
    if without:
        evidence = f"points without {sc.ATTR_RANK}: " + _examples(
            [f"{n} x{c}" for n, c in sorted(without.items())])
    elif not ranks:
        evidence = f"no {sc.METRIC_STEP_DURATION} series"
    else:
        evidence = (f"{sc.METRIC_STEP_DURATION} has series for ranks {ranks}; every "
                    f"training.* point carries {sc.ATTR_RANK}")
    return _result("per_rank_metrics", ok, evidence,
                   f"record every metric with the {sc.ATTR_RANK} attribute")


def cpu_throttling_measured(ev: RunEvidence) -> CheckResult:
    totals = ev.metrics.per_rank_total(sc.METRIC_CPU_THROTTLED_TIME)
    size = world(ev.traces)
    missing = sorted(set(range(size)) - set(totals))
    if not totals:
        evidence = f"no {sc.METRIC_CPU_THROTTLED_TIME} metric from any rank"
    elif missing:
        evidence = f"{sc.METRIC_CPU_THROTTLED_TIME} missing for ranks {missing}"
    else:
        worst = max(totals, key=lambda r: totals[r])
        evidence = (f"{sc.METRIC_CPU_THROTTLED_TIME} from all {len(totals)} ranks; most "
                    f"throttled: rank {worst}, {totals[worst]:.3g} s")
    return _result("cpu_throttling_measured", bool(totals) and not missing, evidence,
                   "run where the cgroup's cpu.stat is readable (cgroup v2), and keep the "
                   "cgroup source enabled")


def telemetry_complete(ev: RunEvidence) -> CheckResult:
    """Nothing dropped before export (the SDK's counter) nor lost after it (lines of the
    files that could not be read whole)."""
    dropped = {str(p.attributes.get(sc.ATTR_SIGNAL, "?")): p.value
               for p in ev.metrics.series(sc.METRIC_TELEMETRY_DROPPED) if p.value}
    problems, fixes = [], []
    if dropped:
        problems.append("dropped: " + ", ".join(f"{s} {v:.0f}" for s, v in sorted(dropped.items())))
        fixes.append("raise OTEL_BSP_MAX_QUEUE_SIZE / the recorder queue, or check the exporter "
                     "endpoint is reachable")
    if ev.damage:
        files = len(ev.damage.files)
        messages = ev.damage.messages()
        more = f" (+{files - 3} more files)" if files > 3 else ""
        problems.append(f"damaged lines in {files} file{'s' if files > 1 else ''}: "
                        + "; ".join(messages[:3]) + more)
        fixes.append("the files were damaged after export: a torn last line is a writer killed "
                     "mid-write (or one still writing); any other damaged line was changed "
                     "after it was written")
    evidence = "; ".join(problems) or f"{sc.METRIC_TELEMETRY_DROPPED} is zero or absent"
    return _result("telemetry_complete", not problems, evidence, "; ".join(fixes))


#: how far a rank's parts may be from its steps' sum (float sums of thousands of steps)
PARTS_TOLERANCE = 0.01


def step_parts_add_up(ev: RunEvidence) -> CheckResult:
    """One account of a step's time: on every rank the parts of its steps
    (``training.step.time`` by ``training.part``) add up to its steps' time (the sum of
    ``training.step.duration``), so that every surface's shares add up to 100%."""
    parts = ev.metrics.per_rank_total(sc.METRIC_STEP_TIME)
    steps = {r: s for r, s in ev.metrics.per_rank_total(sc.METRIC_STEP_DURATION).items()
             if s > 0}
    if not parts:
        return CheckResult("step_parts_add_up", NOT_APPLICABLE,
                           f"no {sc.METRIC_STEP_TIME} metric (a run recorded before the "
                           "step's parts: the report reads its phase totals)", "", SOURCE)
    off = [f"rank {r}: parts {parts.get(r, 0.0):.4g} s of {s:.4g} s" for r, s in sorted(
        steps.items()) if abs(parts.get(r, 0.0) - s) > PARTS_TOLERANCE * s]
    evidence = ("; ".join(off) if off else f"{sc.METRIC_STEP_TIME} adds up to "
                f"{sc.METRIC_STEP_DURATION}'s sum on all {len(steps)} ranks (within "
                f"{PARTS_TOLERANCE:.0%})")
    return _result("step_parts_add_up", not off, evidence,
                   "a rank whose parts fall short lost points of one of the two metrics "
                   "(telemetry_complete says which were dropped); one on an older otel-train "
                   "records no parts")


CHECKS: tuple[Callable[[RunEvidence], CheckResult], ...] = (
    exemplars, log_fields, launcher_context, per_rank_metrics, cpu_throttling_measured,
    step_parts_add_up, telemetry_complete)
