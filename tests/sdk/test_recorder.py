"""The hot-path buffer is bounded, drops the newest when full, and counts by signal."""

from otel_train import semconv
from otel_train.recorder import LOG, PHASE, STEP, Recorder


def test_drain_returns_records_in_order():
    rec = Recorder(10)
    for i in range(5):
        rec.put((PHASE, i))
    assert [r[1] for r in rec.drain()] == [0, 1, 2, 3, 4]
    assert rec.drain() == [] and len(rec) == 0


def test_a_full_buffer_drops_the_newest_and_counts_by_signal():
    rec = Recorder(3)
    for i in range(3):
        rec.put((STEP, i))
    rec.put((STEP, 3))
    rec.put((LOG, 4))
    assert [r[1] for r in rec.drain()] == [0, 1, 2]
    assert rec.dropped == {semconv.SIGNAL_SPANS: 1, semconv.SIGNAL_LOGS: 1}


def test_put_always_ignores_the_capacity_for_teardown_records():
    rec = Recorder(1)
    rec.put((STEP, 0))
    rec.put_always((STEP, 1))
    assert len(rec.drain()) == 2 and not rec.dropped
