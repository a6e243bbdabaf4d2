"""Evaluate the repository's Prometheus rules on a finished run: its exported metrics are
replayed (tools/replay_metrics.py, timestamps moved so that the run ends now) through a real
collector running collector/configs/replay.yaml into a real Prometheus (remote write receiver
on, prometheus/rules.yml loaded), and the alert's own expression is queried there.

Used by tests/pipeline/test_replay_alerts.py (a gloo run) and bench/multigpu/alert_eval.py (the
2-GPU NCCL runs)."""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support import REPO_ROOT
from support.pipeline_fixtures import CONFIGS_DIR, PROMETHEUS_DIR, Collector, Prometheus, wait_for

RULES = PROMETHEUS_DIR / "rules.yml"


def _replay_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "replay_metrics", REPO_ROOT / "tools" / "replay_metrics.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rule(name: str) -> dict[str, Any]:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for item in group["rules"]:
            if item.get("alert") == name or item.get("record") == name:
                return item
    raise KeyError(name)


@dataclass
class Evaluation:
    sent: dict[str, Any]
    alert_expr: list[dict[str, Any]]  # the alert's expression, queried now
    alerts: list[dict[str, Any]]  # ALERTS{alertname=...}: pending, as `for` has not passed
    records: dict[str, list[dict[str, Any]]]  # recording rules of the run, by name

    def named(self) -> dict[str, str]:
        """rank -> straggler_signal, from the alert's expression."""
        return {r["metric"]["training_rank"]: r["metric"].get("straggler_signal", "")
                for r in self.alert_expr}

    def values(self, record: str) -> dict[str, float]:
        return {r["metric"]["training_rank"]: float(r["value"][1])
                for r in self.records.get(record, [])}


def evaluate(run_dir: Path, workdir: Path, alert: str, records: tuple[str, ...],
             run_id: str | None = None, timeout: float = 150.0) -> Evaluation:
    """Replay ``run_dir``'s metrics and evaluate ``alert`` and ``records`` on them."""
    workdir.mkdir(parents=True, exist_ok=True)
    prometheus = Prometheus(workdir, targets={}, extra_args=["--web.enable-remote-write-receiver"])
    collector = Collector(CONFIGS_DIR / "replay.yaml", workdir)
    try:
        prometheus.start()
        collector.extra_env["PROMETHEUS_REMOTE_WRITE_ENDPOINT"] = f"{prometheus.url}/api/v1/write"
        collector.start()
        sent = _replay_module().replay(run_dir, collector.otlp_http, shift_to_now=True,
                                       run_id=run_id, progress=False)
        run = run_id or _run_id_of(prometheus)
        selector = f'{{training_run_id="{run}"}}'
        # rules run every 30 s (the group's interval): wait for an evaluation after the replay
        replayed_at = time.time()

        def evaluated_since_replay() -> bool:
            groups = prometheus.api("rules")["groups"]
            times = [g.get("lastEvaluation", "") for g in groups]
            return bool(times) and all(_epoch(t) > replayed_at for t in times)

        wait_for("a rule evaluation after the replay", evaluated_since_replay, timeout,
                 interval=1.0, on_timeout=prometheus.log_tail)
        # alerts read the recording rules: wait for every group to run once more after the
        # latest recording evaluation (the alert group runs every second, recording every 30)
        latest = max(_epoch(g.get("lastEvaluation", "")) for g in prometheus.api("rules")[
            "groups"])

        def evaluated_after_recording() -> bool:
            groups = prometheus.api("rules")["groups"]
            return all(_epoch(g.get("lastEvaluation", "")) > latest for g in groups
                       if any(r.get("type") == "alerting" for r in g.get("rules", ())))

        wait_for("the alerts evaluated on the recorded rules", evaluated_after_recording, 30,
                 interval=0.5, on_timeout=prometheus.log_tail)
        out = {name: prometheus.query(name + selector) for name in records}
        expr = rule(alert)["expr"]
        alert_expr = [r for r in prometheus.query(expr)
                      if r["metric"].get("training_run_id") == run]
        alerts_query = f'ALERTS{{alertname="{alert}",training_run_id="{run}"}}'
        alerts = prometheus.query(alerts_query)
        if alert_expr and not alerts:
            # the expression holds now; the alert group (every second) writes ALERTS at its
            # next evaluation, which may not have run since the last recording evaluation
            # brought the expression's inputs in: give it a few evaluations, then report
            deadline = time.monotonic() + 30.0
            while not alerts and time.monotonic() < deadline:
                time.sleep(0.5)
                alerts = prometheus.query(alerts_query)
        return Evaluation(sent=sent, alert_expr=alert_expr, alerts=alerts, records=out)
    finally:
        collector.kill()
        prometheus.kill()


def _run_id_of(prometheus: Prometheus) -> str:
    runs = wait_for("the replayed run in Prometheus", lambda: prometheus.api(
        "label/training_run_id/values"), 30)
    assert len(runs) == 1, runs
    return runs[0]


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    if not rfc3339 or rfc3339.startswith("0001"):
        return 0.0
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    tz = ""
    for sign in ("+", "-"):
        if sign in frac:
            frac, _, tz = frac.partition(sign)
            tz = sign + tz
    stamp = datetime.fromisoformat(head + (tz or "+00:00"))
    return stamp.timestamp() + (float("0." + frac) if frac else 0.0)
