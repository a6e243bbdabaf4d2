"""Goodput: the run's wall clock split into productive step time and named losses.

Each rank counts its run time, from its start to its last step's end, by bucket
(``training.goodput.time`` by ``training.goodput.bucket``, semconv.GOODPUT_BUCKETS). The
report averages the buckets over the ranks, and what the mean rank's buckets leave of the
run's wall clock (the first rank's start to the last rank's end) is named too: the time
after the last step to the run span's end (final export, teardown), ``after_last_step``,
and the rest (ranks that started later or ended sooner than the first and the last),
``other``; so the buckets add up to the wall clock. A run recorded before the counter
existed gets the same buckets from its run and step spans where every step was sampled
(else it says the goodput was not recorded: the report never makes numbers up).
"""

from __future__ import annotations

from otel_train import semconv as sc
from otel_train.analysis.metrics import MetricsDigest
from otel_train.analysis.report_model import (
    GOODPUT_AFTER_LAST_STEP,
    GOODPUT_OTHER,
    GOODPUT_RESTART,
    Goodput,
    GoodputRank,
)
from otel_train.analysis.traces import UNTIMED, TraceDigest

#: the buckets of a report, in the order every surface shows them
BUCKETS = (*sc.GOODPUT_BUCKETS, GOODPUT_AFTER_LAST_STEP, GOODPUT_RESTART, GOODPUT_OTHER)
#: the compute parts of a step: its productive time when it is a steady step
COMPUTE = (sc.PART_FORWARD, sc.PART_BACKWARD, sc.PART_OPTIMIZER)
#: the steady steps' parts that are losses of their own bucket
STEADY_LOSSES = (sc.GOODPUT_DATA_WAIT, sc.GOODPUT_EXPOSED_COMM)


def goodput(metrics: MetricsDigest, traces: TraceDigest, by_rank: dict[int, list[int]],
            warm: set[int], wall_s: float, trained_steps: dict[int, int]) -> Goodput:
    """The run's goodput: from the ranks' ``training.goodput.time`` counters, else from
    ``traces`` (``by_rank``: every row of each rank; ``warm``: the warm-up and compile
    steps) where they hold every trained step (``trained_steps`` per rank, from the step
    histogram), else not recorded (``source`` None, ``note`` says why)."""
    per_rank = _from_metrics(metrics)
    source = "metrics"
    if not per_rank:
        per_rank, why = _from_traces(traces, by_rank, warm, trained_steps)
        source = "traces"
        if not per_rank:
            return Goodput(wall_s=wall_s, note=f"not recorded: no {sc.METRIC_GOODPUT_TIME} "
                           f"in the metrics (runs before it), and {why}")
    throttled = metrics.per_rank_total(sc.METRIC_CPU_THROTTLED_TIME)
    ranks = [GoodputRank(rank, {b: buckets.get(b, 0.0) for b in sc.GOODPUT_BUCKETS},
                         sum(buckets.values()), throttled.get(rank))
             for rank, buckets in sorted(per_rank.items())]
    n = len(ranks)
    mean = {b: sum(r.buckets_s[b] for r in ranks) / n for b in sc.GOODPUT_BUCKETS}
    total = sum(mean.values())
    note = None
    restarted = any(n > 1 for n in traces.attempts.values())
    if traces.account_starts and traces.run_spans:  # the ranks' run spans say where
        earlier = (min(start for start, _ in traces.run_spans.values())
                   - min(traces.account_starts.values())) / 1e9
    elif restarted:  # an account of several attempts is not one account's length
        earlier = None
    else:
        earlier = _account_lead_s(traces, ranks, by_rank, trained_steps)
    if earlier is not None and earlier > 0 and traces.run_spans:
        # a rank's account starts at its process start, before its run span: the wall clock
        # runs from the first rank's start, whichever it is
        note = (f"the wall clock runs from the first rank's process start, {earlier:.3g} s "
                "before the first run span (the header's wall clock)")
        wall_s += earlier
    if total > wall_s:  # accounts whose start is not known began before the run spans
        note = (f"the mean rank's account ({total:.3f} s) is longer than the run spans' wall "
                f"clock ({wall_s:.3f} s): the wall clock is taken as the account")
        wall_s = total
    rest = wall_s - total
    after = _after_last_step(traces, [r.rank for r in ranks], by_rank, trained_steps)
    mean[GOODPUT_AFTER_LAST_STEP] = min(after, rest) if after is not None else 0.0
    left = rest - mean[GOODPUT_AFTER_LAST_STEP]
    # a restart under the run id: what no attempt's account holds lies between attempts
    mean[GOODPUT_RESTART], mean[GOODPUT_OTHER] = (left, 0.0) if restarted else (0.0, left)
    known = [r.cpu_throttled_s for r in ranks if r.cpu_throttled_s is not None]
    productive = mean[sc.GOODPUT_PRODUCTIVE]
    return Goodput(source=source, wall_s=wall_s, buckets_s=mean, productive_s=productive,
                   ratio=productive / wall_s if wall_s > 0 else None, ranks=ranks,
                   cpu_throttled_s=sum(known) / len(known) if known else None, note=note)


def _from_metrics(metrics: MetricsDigest) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for point in metrics.series(sc.METRIC_GOODPUT_TIME):
        if point.rank is None:
            continue
        bucket = str(point.attributes.get(sc.ATTR_GOODPUT_BUCKET, GOODPUT_OTHER))
        buckets = out.setdefault(point.rank, {})
        buckets[bucket] = buckets.get(bucket, 0.0) + float(point.value)
    return out


def _from_traces(traces: TraceDigest, by_rank: dict[int, list[int]], warm: set[int],
                 trained_steps: dict[int, int]) -> tuple[dict[int, dict[str, float]], str]:
    """Each rank's buckets from its spans, where they hold every step it trained and its
    run span; else none, and why."""
    table = traces.table.pad()
    out: dict[int, dict[str, float]] = {}
    for rank, rows in by_rank.items():
        trained = trained_steps.get(rank)
        if trained is None or len(rows) < trained:
            return {}, (f"rank {rank}'s traces hold {len(rows)} of "
                        f"{trained if trained is not None else 'its unknown number of'} "
                        "trained steps (sampled): the time between them is not known")
        if rank not in traces.run_spans or rank not in traces.first_steps \
                or rank not in traces.last_steps:
            return {}, f"rank {rank} has no run span (its run did not end, or was not traced)"
        run_start = traces.run_spans[rank][0]
        first_start, last_end = traces.first_steps[rank][1], traces.last_steps[rank][1]
        phases, parts = table.phases, table.untimed_parts
        buckets = dict.fromkeys(sc.GOODPUT_BUCKETS, 0.0)
        buckets[sc.GOODPUT_STARTUP] = max(first_start - run_start, 0) / 1e9
        for i in rows:
            compile_s = phases[sc.PART_COMPILE][i]
            buckets[sc.GOODPUT_COMPILE] += compile_s
            regions_s = phases[sc.PART_REGIONS][i]
            checkpoint_s = min(table.regions[i][1], regions_s) if i in table.regions else 0.0
            buckets[sc.GOODPUT_CHECKPOINT] += checkpoint_s
            if table.steps[i] in warm:
                buckets[sc.GOODPUT_WARMUP] += table.durations[i] - compile_s - checkpoint_s
                continue
            buckets[sc.GOODPUT_PRODUCTIVE] += sum(phases[p][i] for p in COMPUTE)
            for bucket in STEADY_LOSSES:
                buckets[bucket] += phases[bucket][i]
            device = parts[sc.PART_DEVICE_WAIT][i]
            buckets[sc.GOODPUT_DEVICE_WAIT] += device
            buckets[sc.GOODPUT_OUTSIDE_PHASES] += (max(phases[UNTIMED][i] - device, 0.0)
                                                   + regions_s - checkpoint_s)
        stepped = sum(table.durations[i] for i in rows)
        buckets[sc.GOODPUT_BETWEEN_STEPS] = max((last_end - first_start) / 1e9 - stepped, 0.0)
        out[rank] = buckets
    return out, ""


def _account_lead_s(traces: TraceDigest, ranks: list[GoodputRank],
                    by_rank: dict[int, list[int]], trained_steps: dict[int, int]
                    ) -> float | None:
    """How long before the first run span the first rank's account began (its last step's
    end less its account), where every rank's last step is in the traces; else None."""
    starts = []
    for row in ranks:
        trained = trained_steps.get(row.rank)
        if (row.rank not in traces.last_steps or trained is None
                or len(by_rank.get(row.rank, ())) < trained):
            return None
        starts.append(traces.last_steps[row.rank][1] - row.total_s * 1e9)
    if not starts or not traces.run_spans:
        return None
    first_span = min(start for start, _ in traces.run_spans.values())
    return (first_span - min(starts)) / 1e9


def _after_last_step(traces: TraceDigest, ranks: list[int], by_rank: dict[int, list[int]],
                     trained_steps: dict[int, int]) -> float | None:
    """The mean rank's seconds from its last step's end to its run span's end, where its
    traces hold its last step (every step sampled); else None."""
    seconds = []
    for rank in ranks:
        trained = trained_steps.get(rank)
        if (rank not in traces.run_spans or rank not in traces.last_steps or trained is None
                or len(by_rank.get(rank, ())) < trained):
            return None
        seconds.append(max(traces.run_spans[rank][1] - traces.last_steps[rank][1], 0) / 1e9)
    return sum(seconds) / len(seconds) if seconds else None
