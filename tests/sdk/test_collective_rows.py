"""Collectives as rows, made into spans and points where spans are built
(wire/collectives.py): the span policy, and loss counts that match what would be made."""

from __future__ import annotations

import collections

import pytest

from otel_train import semconv
from otel_train.wire import collectives as collective_rows
from otel_train.wire import messages
from otel_train.wire.messages import series_key

FWD = (1, 10, 1, False)


def _row(seq: int, issue: int, end: int, done: bool = True, gpu: float | None = None,
         stalled=None, error=None, nbytes: int = 64, op: str = "all_reduce"):
    return (op, "dist.all_reduce", "gloo", "0", 2, nbytes, "float32", (16,), False, issue, end,
            done, seq, "wrapper", gpu, stalled, error, 0)


def _spec(summary: bool, sampled: bool = True, points: bool = True):
    return collective_rows.Spec(7, sampled, summary, (1, 2, 1, False), [(FWD, 0, 10_000_000)],
                                {"rank": 0}, points)


def _made(spec, rows):
    spans, points = [], collections.Counter()

    def span(name, parent, start, end, attrs, span_id=0, trace_id=0, links=(), error=None,
             events=()):
        spans.append((parent.span_id, start, end, attrs, error, events))

    def point(kind):
        return lambda value, attrs, context=None: points.update([kind])

    n = collective_rows.expand(spec, rows, span, point("duration"), point("size"))
    assert n == len(rows)
    return spans, points


ROWS = [_row(1, 100, 1_100), _row(2, 2_000, 3_000), _row(3, 4_000, 5_000, nbytes=0),
        _row(4, 6_000, 60_000_000),  # slow: > 4 x the median and > 5 ms
        _row(5, 7_000, 8_000, stalled=(7_500, 30.0)),
        _row(6, 9_000, 9_500, done=False),
        _row(7, 20_000_000, 20_001_000)]  # issued after the forward phase: under the step


def test_each_collective_its_own_span_under_the_phase_that_issued_it():
    spans, points = _made(_spec(summary=False), ROWS)
    assert len(spans) == 7
    assert [s[0] for s in spans] == [10] * 6 + [2]
    assert spans[0][3][semconv.ATTR_COLLECTIVE_SHAPE] == [16]
    assert semconv.ATTR_COLLECTIVE_BUS_BW in spans[0][3]
    unfinished = spans[5]
    assert unfinished[3][semconv.ATTR_COLLECTIVE_COMPLETED] is False and unfinished[4]
    assert semconv.ATTR_COLLECTIVE_BUS_BW not in unfinished[3]
    assert spans[4][3][semconv.ATTR_COLLECTIVE_STALLED] and spans[4][5][0][1] == 7_500
    # every duration; the bytes summed into one addition per attribute set (gloo all_reduce)
    assert points == {"duration": 7, "size": 1}


def test_summary_keeps_slow_stalled_and_unfinished_ones_on_their_own():
    spans, points = _made(_spec(summary=True), ROWS)
    summaries = [s for s in spans if semconv.ATTR_COLLECTIVE_COUNT in s[3]]
    assert len(summaries) == 1
    (summary,) = summaries
    assert summary[3][semconv.ATTR_COLLECTIVE_COUNT] == 3  # seq 1-3
    assert (summary[3][semconv.ATTR_COLLECTIVE_SEQ], summary[3][semconv.ATTR_COLLECTIVE_SEQ_LAST]) \
        == (1, 3)
    alone = sorted(s[3][semconv.ATTR_COLLECTIVE_SEQ] for s in spans if s is not summary)
    assert alone == [4, 5, 6, 7]  # slow, stalled, unfinished; the only one under the step
    assert points == {"duration": 7, "size": 1}


@pytest.mark.parametrize("summary,sampled,points", [(False, True, True), (True, True, True),
                                                    (False, False, True), (True, True, False)])
def test_a_lost_batch_counts_its_spans_and_the_series_it_would_have_measured(summary, sampled,
                                                                            points):
    # metrics are counted in data points: one per series in a collection, however many
    # measurements made it, so a lost batch names its series and the caller counts them
    spec = _spec(summary, sampled, points)
    spans, _ = _made(spec, ROWS)
    measured = set()

    def instrument(name):
        return lambda value, attrs, context=None: measured.add(series_key(name, attrs))

    collective_rows.expand(spec, ROWS, lambda *a, **k: None,
                           instrument(semconv.METRIC_COLLECTIVE_DURATION),
                           instrument(semconv.METRIC_COLLECTIVE_SIZE))
    dropped: collections.Counter[str] = collections.Counter()
    series: set = set()
    messages.count_lost((messages.OP_COLLECTIVES, spec, ROWS), dropped, series, {})
    assert dropped[semconv.SIGNAL_SPANS] == len(spans)
    assert series == measured and (len(series) > 0) == points
    assert dropped[semconv.SIGNAL_METRICS] == 0


def test_points_every_duration_the_bytes_summed_and_the_slowest_carries_the_exemplar():
    """The SDK's cost is per measurement (~8 us on this machine): the size counter gets one
    addition per attribute set with the same sum, the duration histogram every value, and in
    a sampled step only the slowest of each attribute set is offered as the step's exemplar."""
    rows = [_row(1, 0, 1_000, nbytes=64), _row(2, 0, 9_000, nbytes=32),
            _row(3, 0, 2_000, nbytes=16, op="all_gather"), _row(4, 0, 3_000, nbytes=8)]
    durations, sizes = [], []
    collective_rows.expand(
        _spec(summary=False), rows, lambda *a, **k: None,
        lambda v, attrs, context=None: durations.append(
            (v, attrs[semconv.ATTR_COLLECTIVE_OP], context is not None)),
        lambda v, attrs, context=None: sizes.append((attrs[semconv.ATTR_COLLECTIVE_OP], v)))
    assert sorted(sizes) == [("all_gather", 16), ("all_reduce", 104)]
    assert sorted(durations) == [(1e-06, "all_reduce", False), (2e-06, "all_gather", True),
                                 (3e-06, "all_reduce", False), (9e-06, "all_reduce", True)]
    durations.clear()
    collective_rows.expand(_spec(summary=False, sampled=False), rows, lambda *a, **k: None,
                           lambda v, attrs, context=None: durations.append(context),
                           lambda *a, **k: None)
    assert durations == [None] * 4  # unsampled steps offer no exemplar


def test_the_span_budget_allows_a_rate_with_a_burst_and_summarises_whole_steps():
    second = 1_000_000_000
    budget = collective_rows.SpanBudget(per_s=100, burst_s=1.0)
    assert not budget.summarise(75, 0)  # 100 tokens: a step of 75 is its own spans
    assert budget.summarise(75, 0)  # 25 left: the next one is summarised, spends nothing
    assert not budget.summarise(25, 0)
    assert budget.summarise(1, 0)
    assert not budget.summarise(50, second // 2)  # refilled at 100 a second
    assert budget.summarise(101, 100 * second)  # never more than a second's worth
    assert not budget.summarise(100, 100 * second)
    # steps released together after a hold are judged by their own (earlier) clock: an
    # older step neither refills nor moves the clock back
    assert budget.summarise(1, 99 * second)
    assert not budget.summarise(10, 100 * second + second // 10)
    with pytest.raises(ValueError):
        collective_rows.SpanBudget(per_s=0)


def test_auto_mode_spans_real_fsdp_rates_one_by_one_and_summarises_past_the_budget():
    """The default budget (2000 spans a second) against two jobs: the 2 x H200 benchmark's
    74 collectives a step at ~8 steps a second (every step its own spans), and a job of
    500 collectives a step at 100 steps a second (50,000 a second: about one step in 25)."""
    from otel_train import config

    rate = config.load({}).collective_span_rate
    step_ns = 125_000_000
    budget = collective_rows.SpanBudget(rate)
    assert not any(budget.summarise(74, i * step_ns) for i in range(1000))
    budget = collective_rows.SpanBudget(rate)
    own = sum(not budget.summarise(500, i * 10_000_000) for i in range(1000))
    assert 35 <= own <= 45  # 10 s at 2000 a second: 40 steps of 500 (+ the first burst)


def test_the_budget_counts_collectives_not_bytes_of_the_plugins_records():
    """The plugin's records reach the collectives source as the bytes it wrote, 64 a
    collective: the budget must count 74 collectives a step as 74, not 74 x 64 (which would
    summarise every step of the 2 x H200 job)."""
    from types import SimpleNamespace

    from otel_train.sources.collectives.assembly import Assembly
    from otel_train.wire import nccl as nccl_rows

    record = (1, 7, 64, 100, 200, 0, 0, 2, 8, 0, 0, 0, 0, 2)
    packed = nccl_rows.pack([record] * 74)
    assert nccl_rows.count(packed) == 74 and nccl_rows.count([record] * 74) == 74
    assembly = Assembly.__new__(Assembly)
    assembly.summary = False
    assembly.budget = collective_rows.SpanBudget(2000)
    step_ns = 125_000_000
    decided = [assembly.summarise(SimpleNamespace(sampled=True, end_ns=i * step_ns), packed)
               for i in range(200)]
    assert not any(decided)  # 74 a step, 8 steps a second: all their own spans
    assert assembly.summarise(SimpleNamespace(sampled=True, end_ns=200 * step_ns),
                              nccl_rows.pack([record] * 2001))  # over a second's worth
    assembly.budget = None
    assert not assembly.summarise(SimpleNamespace(sampled=True, end_ns=0), packed)
