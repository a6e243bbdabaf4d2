"""Evaluate TrainingStragglerRank on a multi-GPU run's exported metrics, per mode: the files
are replayed through the replay collector into a real Prometheus with prometheus/rules.yml
(tests/support/alert_replay.py) and the alert's expression is queried there. Prints JSON.

Usage: ``python bench/multigpu/alert_eval.py DIR [MODE ...]`` (DIR from run.py --out; modes
default to normal, straggler, straggler_gpu). Needs the collector (collector/build.sh) and
Prometheus (scripts/install-prometheus.sh).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "tests")]
from support import alert_replay  # noqa: E402

RECORDS = ("training_run_rank:collective_wait_caused:share_of_step5m",
           "training_run_rank:collective_duration_seconds:per_step5m",
           "training_run_rank:step_duration_seconds:over_run_median5m")


def main() -> None:
    root = Path(sys.argv[1])
    modes = sys.argv[2:] or ["normal", "straggler", "straggler_gpu"]
    out = {}
    for mode in modes:
        runs = sorted(p for p in (root / mode).iterdir() if p.is_dir())
        if not runs:
            continue
        ev = alert_replay.evaluate(runs[-1], Path(tempfile.mkdtemp(prefix=f"alert-{mode}-")),
                                   "TrainingStragglerRank", RECORDS)
        out[mode] = {"replayed": ev.sent, "alert_expression_names": ev.named(),
                     "alerts": [{k: a["metric"].get(k) for k in
                                 ("training_rank", "alertstate", "straggler_signal")}
                                for a in ev.alerts],
                     **{name: ev.values(name) for name in RECORDS}}
        print(f"{mode}: {json.dumps(out[mode]['alert_expression_names'])}", file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
