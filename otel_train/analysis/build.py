"""``build_report(run_dir)``: the two streaming passes over traces (the second folded into
per-step numbers as it is read: step_spans.py) and one over metrics."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from otel_train import semconv as sc
from otel_train.analysis import arrivals as arr
from otel_train.analysis import attribution as st
from otel_train.analysis.device_waits import GpuIntervals
from otel_train.analysis.fates import rank_fates
from otel_train.analysis.goodput import goodput
from otel_train.analysis.metrics import MetricsDigest, read_metrics
from otel_train.analysis.otlp import paused_gc, resolve_run_dir
from otel_train.analysis.report_model import (
    Bar,
    CollectiveRow,
    CompileSummary,
    Goodput,
    RankFate,
    RankResources,
    Report,
    SlowStep,
    StepTimeline,
)
from otel_train.analysis.step_spans import OneStep, start_step_spans
from otel_train.analysis.traces import PHASES, StepTable, TraceDigest, start_reading_traces

#: a timeline shows at most this many ranks (the ones that matter, then a spread: a chart
#: of 16,384 rows says nothing); report_model.StepTimeline.ranks_of counts them all
TIMELINE_RANKS = 32


def build_report(run: Path, top: int = 10, timelines: int = 3,
                 run_id: str | None = None, workers: int | None = None) -> Report:
    """The report of the run directory ``run`` (or the newest run under it); ``run_id``
    picks one run out of files that hold several (a collector's output); ``workers``
    processes read the traces files (None: one per CPU when the files are large; the
    report is the same whatever the number)."""
    return build_report_and_table(run, top, timelines, run_id, workers)[0]


def build_report_and_table(run: Path, top: int = 10, timelines: int = 3,
                           run_id: str | None = None, workers: int | None = None
                           ) -> tuple[Report, StepTable]:
    """:func:`build_report`, and the step table pass one made for it (one row per rank
    step: what ``compare`` resamples), so that a reader needing both reads the traces once."""
    with paused_gc():
        return _build(resolve_run_dir(run, run_id), top, timelines, run_id, workers)


def _build(run_dir: Path, top: int, timelines: int, run_id: str | None,
           workers: int | None) -> tuple[Report, StepTable]:
    reading = start_reading_traces(run_dir, run_id, workers)
    try:
        metrics = read_metrics(run_dir, run_id)  # while the workers read the traces
    finally:
        traces = reading()  # never leaves the workers behind
    table = traces.table
    all_rows = st.rows_by_rank(table)
    warm = st.warmup_steps(table)
    by_rank = st.steady_rows(table, all_rows, warm)  # the steady state leads
    durations = st.step_durations(table, traces.step_spans)
    warm_durations = {s: d for s, d in durations.items() if s in warm}
    slowest = sorted(durations, key=lambda s: durations[s], reverse=True)[:top]
    slowest += sorted(set(warm_durations) - set(slowest))
    step_of = {traces.step_trace[s]: s for s in slowest if s in traces.step_trace}
    # what the blame reads of the slowest steps' spans, noted by pass one as it read them
    marked = traces.marks.steps(step_of)
    lag = st.straggler(table, by_rank, _wait_shares(metrics))
    rank_rows = st.rank_breakdowns(table, by_rank)
    over_time = st.over_time(table)
    matching = arr.match(traces.arrivals)
    # a step number names one step only within a run: files mixing runs get no verdict
    # per step (their collectives are still matched within each run)
    lateness = arr.step_lateness(matching) if len(traces.run_ids) <= 1 else {}
    world = traces.world_size or len(by_rank)
    gpu = GpuIntervals(traces.arrivals, matching)

    def blamed(steps: set[int], n: int) -> list[SlowStep]:
        return st.slow_steps(table, durations, n,
                             lambda step, phase: _one(marked, step).phase_starts(phase),
                             lambda step: _one(marked, step).collective_s,
            set(range(world)) | set(by_rank),
            late_of_step=arr.late_of_step(lateness, durations), collectives=gpu,
            candidates=steps)

    # every step that stands out: a first compile can be the slowest; jitter is not listed
    rankable, slow_note = st.rankable_steps(durations, warm)
    slow = blamed(rankable, top) if rankable else []
    if len(slow) < top:
        # a step no longer than the typical one is listed still where its rank's cgroup
        # throttled it: a quota'd rank is slow in every step, so none stands out
        others = set(durations) - rankable - warm
        throttled = [s for s in blamed(others, top - len(slow)) if s.throttled_s is not None]
        if throttled:
            slow = sorted(slow + throttled, key=lambda s: s.duration_s, reverse=True)
            slow_note = None
    warmup = blamed(set(warm_durations), len(warm_durations)) if warm_durations else []
    warmup.sort(key=lambda s: s.step)
    for slow_step in slow + warmup:
        slow_step.late_arrival = lateness.get(slow_step.step)
        slow_step.warmup = slow_step.step in warm
    fates = rank_fates(world, traces.run_ends, traces.last_steps)
    _say_failures(slow + warmup, fates, lag)
    # a column shown where it holds time: below a microsecond a step it is clock rounding
    used = [p for p in PHASES if sum(table.phases[p]) > 1e-6 * max(len(table), 1)]
    wall = _wall_s(traces, metrics)
    samples_of = metrics.per_rank_total(sc.METRIC_SAMPLES)
    tokens_of = metrics.per_rank_total(sc.METRIC_TOKENS)
    samples, tokens = sum(samples_of.values()), sum(tokens_of.values())
    trained = _trained_steps_per_rank(metrics)
    per_step = {r: (samples_of.get(r, 0.0) / n, tokens_of.get(r, 0.0) / n)
                for r, n in trained.items() if n}
    rates, rate_source = st.steady_throughput(table, by_rank, per_step)
    for row in rank_rows:
        row.samples_per_s, row.tokens_per_s = rates.get(row.rank, (None, None))
    return Report(
        run_id=",".join(sorted(traces.run_ids)) or run_dir.name,
        world_size=traces.world_size or len(by_rank),
        ranks=list(by_rank), sampled_steps=len(durations),
        trained_steps=_trained_steps(metrics), wall_s=wall, phases=used,
        rank_rows=rank_rows, straggler=lag.rank,
        straggler_signal=lag.signal, straggler_busy_ratio=lag.busy_ratio,
        straggler_slowest_share=lag.slowest_share, straggler_wait_share=lag.wait_share,
        straggler_wait_rank=lag.wait_rank, straggler_throttled_s=lag.throttled_s,
        slow_steps=slow, timelines=_timelines(run_dir, run_id, workers, traces, slow[:timelines],
                                              lag.rank),
        over_time=over_time, collectives=_collectives(traces, metrics),
        compile=_compile(traces, metrics), resources=_resources(metrics),
        steady_samples_per_s=_total(r[0] for r in rates.values()),
        steady_tokens_per_s=_total(r[1] for r in rates.values()),
        throughput_source=rate_source,
        run_samples_per_s=samples / wall if samples and wall else None,
        run_tokens_per_s=tokens / wall if tokens and wall else None,
        goodput=goodput(metrics, traces, all_rows, warm, wall, trained)
        if len(traces.run_ids) <= 1 else Goodput(wall_s=wall, note=(
            f"not computed: the files mix {len(traces.run_ids)} runs (pick one: --run-id)")),
        slow_steps_note=slow_note,
        dropped={str(p.attributes.get(sc.ATTR_SIGNAL, "?")): p.value
                 for p in metrics.series(sc.METRIC_TELEMETRY_DROPPED)},
        arrivals=arr.summarise(traces.arrivals, matching, lateness, durations),
        rank_fates=fates, warmup_steps=warmup,
        steady_steps=len(set(durations) - warm) or len(durations),
        unreadable_ranks=_unreadable_ranks(run_dir, world, set(by_rank)),
    ), table


def _unreadable_ranks(run_dir: Path, world: int, seen: set[int]) -> list[int]:
    """Ranks none of whose spans were read though their own traces file (the file
    exporter's ``traces.rank-<N>.jsonl``) is not empty: damaged or truncated, not silent."""
    return [rank for rank in range(world) if rank not in seen
            and any(path.stat().st_size > 0
                    for path in run_dir.glob(f"traces.rank-{rank}.jsonl"))]


def _say_failures(slow: list[SlowStep], fates: list[RankFate], lag: st.Straggler) -> None:
    """A failed rank is no straggler and no mystery: the steps it sent nothing for say how it
    ended, and it is not named the straggler (its peers' waits for it are its failure)."""
    if not fates:
        return
    by_rank = {f.rank: f for f in fates if f.fate != "stopped"}
    if lag.rank in by_rank:
        lag.rank = lag.signal = None
    for step in slow:
        failed = [by_rank[r] for r in step.missing if r in by_rank]
        if failed and len(failed) == len(step.missing):
            step.unexplained = "; ".join(f.sentence for f in failed)


def _wait_shares(metrics: MetricsDigest) -> dict[int, float]:
    steps: dict[int, int] = {}
    for point in metrics.series(sc.METRIC_STEP_DURATION):
        if point.rank is not None:
            steps[point.rank] = steps.get(point.rank, 0) + point.count
    step_s = {r: s for r, s in metrics.per_rank_total(sc.METRIC_STEP_DURATION).items()
              if r >= 0}
    collective_s = {r: s for r, s in metrics.per_rank_total(
        sc.METRIC_COLLECTIVE_DURATION).items() if r >= 0}
    return st.collective_wait_shares(collective_s, steps, step_s)


def _wall_s(traces: TraceDigest, metrics: MetricsDigest) -> float:
    if traces.run_spans:
        starts, ends = zip(*traces.run_spans.values(), strict=True)
        return (max(ends) - min(starts)) / 1e9
    return metrics.window_s()


def _total(values: Iterable[float | None]) -> float | None:
    """The sum of the values that are known; None when none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _trained_steps_per_rank(metrics: MetricsDigest) -> dict[int, int]:
    """Each rank's trained steps: its step histogram's count."""
    out: dict[int, int] = {}
    for point in metrics.series(sc.METRIC_STEP_DURATION):
        if point.rank is not None:
            out[point.rank] = out.get(point.rank, 0) + point.count
    return out


def _trained_steps(metrics: MetricsDigest) -> int | None:
    counts = metrics.per_rank_count(sc.METRIC_STEP_DURATION)
    return max(counts.values()) if counts else None


def _one(steps: dict[int, OneStep], step: int) -> OneStep:
    return steps.get(step) or OneStep()


def _timelines(run_dir: Path, run_id: str | None, workers: int | None, traces: TraceDigest,
               slow: list[SlowStep], straggler: int | None) -> list[StepTimeline]:
    """The timelines of the ``slow`` steps: their spans read again (the one pass that reads
    spans of a step twice), of at most ``TIMELINE_RANKS`` ranks each."""
    step_of = {traces.step_trace[s.step]: s.step for s in slow if s.step in traces.step_trace}
    picked = {s.step: _shown_ranks(traces.table, s, straggler) for s in slow}
    shown = {step: ranks for step, (ranks, _) in picked.items() if ranks is not None}
    spans = start_step_spans(run_dir, step_of, run_id, traces.files, traces.lines, workers,
                             shown, traces.file_ranks)()
    origins = {step: traces.marks.origins.get(trace_id) for trace_id, step in step_of.items()}
    out = []
    for s in slow:
        step = spans.get(s.step)
        origin = origins.get(s.step) or step.origin or 0
        bars = [Bar(rank, kind, label, (start - origin) / 1e9, (end - origin) / 1e9)
                for rank, kind, label, start, end in step.bars]
        bars.sort(key=lambda b: (b.rank, b.start_s))
        ranks = picked[s.step][1]
        out.append(StepTimeline(s.step, s.duration_s, bars,
                                ranks_of=ranks if ranks > TIMELINE_RANKS else None))
    return out


def _shown_ranks(table: StepTable, slow: SlowStep, straggler: int | None
                 ) -> tuple[frozenset[int] | None, int]:
    """The ranks a step's timeline shows (None: every rank with a span in it, a rank that
    died in the step among them), and how many ranks the step has: every rank up to
    ``TIMELINE_RANKS``; beyond, the ranks its cause names (the slow rank, the one late to
    its collectives, the one its device waited for) and the run's straggler, then its
    slowest ranks and its fastest, then ranks spread evenly over the rest,
    ``TIMELINE_RANKS`` in all."""
    durations = {table.ranks[row]: table.durations[row]
                 for row, at in enumerate(table.steps) if at == slow.step}
    ranks = sorted(durations, key=lambda rank: (-durations[rank], rank))
    if len(ranks) <= TIMELINE_RANKS:
        return None, len(ranks)
    named = [slow.rank, straggler]
    if slow.late_arrival is not None:
        named.append(slow.late_arrival.rank)
    if slow.device_wait is not None:
        named += [r for r in (slow.device_wait.rank, slow.device_wait.waited_for)
                  if r is not None]
    shown = {r for r in named if r in durations}
    shown.update(ranks[:TIMELINE_RANKS // 4] + ranks[-(TIMELINE_RANKS // 8):])
    rest = sorted(set(ranks) - shown)
    room = TIMELINE_RANKS - len(shown)
    if room > 0 and rest:
        shown.update(rest[k * len(rest) // room] for k in range(min(room, len(rest))))
    return frozenset(shown), len(ranks)


def _collectives(traces: TraceDigest, metrics: MetricsDigest) -> list[CollectiveRow]:
    if traces.collectives:
        return [CollectiveRow(op, t.count, t.total_s, t.bytes,
                              t.bw_sum / t.bw_count if t.bw_count else None,
                              t.bw_max if t.bw_count else None)
                for op, t in sorted(traces.collectives.items())]
    rows: dict[str, CollectiveRow] = {}
    for point in metrics.series(sc.METRIC_COLLECTIVE_DURATION):
        op = str(point.attributes.get(sc.ATTR_COLLECTIVE_OP, "unknown"))
        row = rows.setdefault(op, CollectiveRow(op, 0, 0.0, 0, None, None))
        row.count += point.count
        row.total_s += point.value
    for point in metrics.series(sc.METRIC_COLLECTIVE_SIZE):
        op = str(point.attributes.get(sc.ATTR_COLLECTIVE_OP, "unknown"))
        rows.setdefault(op, CollectiveRow(op, 0, 0.0, 0, None, None)).bytes += int(point.value)
    return sorted(rows.values(), key=lambda r: r.op)


def _compile(traces: TraceDigest, metrics: MetricsDigest) -> CompileSummary:
    tally = traces.compiles
    summary = CompileSummary(tally.count, tally.total_s, tally.graph_breaks, 0, dict(tally.reasons))
    recompiles = metrics.per_rank_total(sc.METRIC_COMPILE_RECOMPILES)
    summary.recompiles = int(sum(recompiles.values()))
    if not tally.count:  # no compile spans: the counters, summed over ranks like the spans
        for point in metrics.series(sc.METRIC_COMPILE_DURATION):
            summary.compilations += point.count
            summary.total_s += point.value
        breaks = metrics.per_rank_total(sc.METRIC_COMPILE_GRAPH_BREAKS)
        summary.graph_breaks = int(sum(breaks.values()))
    return summary


def _resources(metrics: MetricsDigest) -> list[RankResources]:
    columns = {
        "memory_peak_bytes": metrics.per_rank_total(sc.METRIC_MEMORY_ALLOCATED_PEAK),
        "memory_reserved_bytes": metrics.per_rank_total(sc.METRIC_MEMORY_RESERVED),
        "comm_overlap": metrics.per_rank_total(sc.METRIC_COMM_OVERLAP),
        "cpu_throttled_s": metrics.per_rank_total(sc.METRIC_CPU_THROTTLED_TIME),
    }
    ranks = sorted({r for column in columns.values() for r in column})
    return [RankResources(rank, **{k: v.get(rank) for k, v in columns.items()}) for rank in ranks]
