"""TrainingStragglerRank on a real run's exported metrics: a 2-rank gloo DDP demo whose rank 1
sleeps before every 5th step writes its OTLP files; they are replayed through the real
collector (collector/configs/replay.yaml, remote write) into a real Prometheus with the
repository's rules, where the alert's own expression must name rank 1 by the collective wait
it causes (the synchronous run's step times are equal), and rank 1 only."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.alert_replay import evaluate
from support.pipeline_fixtures import collector_binary, prometheus_binary
from support.report_fixtures import run_demo

pytestmark = pytest.mark.slow
SHARE = "training_run_rank:collective_wait_caused:share_of_step5m"
PER_STEP = "training_run_rank:collective_duration_seconds:per_step5m"
OVER_MEDIAN = "training_run_rank:step_duration_seconds:over_run_median5m"
ARRIVAL_LAG = "training_run_rank:collective_arrival_lag_seconds:per_step5m"


def test_the_straggler_alert_names_the_slow_rank_on_replayed_metrics(tmp_path: Path) -> None:
    collector_binary()
    prometheus_binary()
    run_dir = run_demo(tmp_path / "runs", "replay-straggler", 25,
                       ("--slow-rank", "1", "--ddp", "--workers", "0"),
                       # a run of seconds, exported every half second: the points must
                       # reach the exporter as often (the default drains every two seconds)
                       env={"OTEL_METRIC_EXPORT_INTERVAL": "500",
                            "OTEL_TRAIN_EMIT_INTERVAL_MS": "200"})
    ev = evaluate(run_dir, tmp_path / "eval", "TrainingStragglerRank",
                  (SHARE, PER_STEP, OVER_MEDIAN, ARRIVAL_LAG), run_id="replay-straggler")
    assert ev.sent["requests"] >= 4 and ev.sent["points"] > 0, ev.sent
    share, per_step = ev.values(SHARE), ev.values(PER_STEP)
    assert set(share) == {"0", "1"}, ev.records
    # rank 0 waits in its all-reduces while rank 1 sleeps; rank 1 hardly waits
    assert per_step["0"] > per_step["1"], per_step
    assert share["1"] > 0.15 > share["0"], share
    # rank 1 arrives later than rank 0 by the wait it causes; rank 0 is the earliest
    lag = ev.values(ARRIVAL_LAG)
    assert lag["0"] == 0 and lag["1"] == pytest.approx(per_step["0"] - per_step["1"]), lag
    assert ev.named() == {"1": "collective_wait"}, ev.alert_expr
    # the alert itself is pending (its `for: 10m` cannot pass on a run of seconds)
    assert {(a["metric"]["training_rank"], a["metric"]["alertstate"]) for a in ev.alerts} == {
        ("1", "pending")}, ev.alerts
