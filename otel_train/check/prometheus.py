"""The checklist items a live Prometheus can answer, through its HTTP API (urllib only)."""

from __future__ import annotations

import time
from typing import Any

from otel_train import semconv as sc
from otel_train.check.http import api_data
from otel_train.check.verdicts import FAIL, NOT_APPLICABLE, PASS, CheckResult

SOURCE = "prometheus"
#: training.cpu.throttled.time, a counter in seconds, as Prometheus names it
PROM_CPU_THROTTLED = sc.PROM_CPU_THROTTLED
CADVISOR_THROTTLED = "container_cpu_cfs_throttled_periods_total"
TRACE_ITEMS = ("trace_coverage", "same_trace_across_ranks", "sampling_consistency", "ranks_finished",
               "launcher_context")


class PrometheusAPI:
    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base, self.timeout_s = base_url.rstrip("/"), timeout_s

    def get(self, path: str, **params: str) -> Any:
        return api_data(self.base, path, params, self.timeout_s, "Prometheus")

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=promql)["result"]

    def exemplars(self, promql: str, window_s: float = 6 * 3600) -> list[dict[str, Any]]:
        now = time.time()
        return self.get("/api/v1/query_exemplars", query=promql, start=f"{now - window_s:.3f}",
                        end=f"{now:.3f}")

    def rules(self) -> list[dict[str, Any]]:
        groups = self.get("/api/v1/rules")["groups"]
        return [rule for group in groups for rule in group.get("rules", ())]


def _sel(run_id: str | None, extra: str = "") -> str:
    parts = [f'{sc.PROM_RUN_LABEL}="{run_id}"'] if run_id else []
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


def _histogram(suffix: str, run_id: str | None, extra: str = "") -> str:
    """The step histogram's series whichever way Prometheus stores it: a native histogram
    (one series, the contract's name) or a classic one (its ``_bucket``/``_count`` series).
    """
    name = f'__name__=~"{sc.PROM_STEP_DURATION}(_{suffix})?"'
    return _sel(run_id, f"{extra},{name}" if extra else name)


def _row(item: str, ok: bool, evidence: str, fix: str) -> CheckResult:
    return CheckResult(item, PASS if ok else FAIL, evidence, "" if ok else fix, SOURCE)


def exemplars(api: PrometheusAPI, run_id: str | None) -> CheckResult:
    series = api.exemplars(_histogram("bucket", run_id))
    found = [e for s in series for e in s.get("exemplars", ())]
    with_ids = [e for e in found if e.get("labels", {}).get("trace_id")]
    evidence = (f"{len(with_ids)} exemplars with a trace_id on {sc.PROM_STEP_DURATION} in "
                "the last 6 h; resolving them needs the traces (give --jaeger URL or a run "
                "directory, with the run id)")
    if not with_ids:
        evidence = f"no exemplars with a trace_id on {sc.PROM_STEP_DURATION} in the last 6 h"
    return _row("exemplars", bool(with_ids), evidence,
                "start Prometheus with --enable-feature=exemplar-storage and scrape "
                "OpenMetrics (the otel-train endpoint or the collector's prometheus exporter "
                "with exemplars enabled)")


def live_exemplar_ids(base_url: str, run_id: str) -> set[tuple[str, str]]:
    """(trace id, span id) of run ``run_id``'s step-histogram exemplars in Prometheus."""
    series = PrometheusAPI(base_url).exemplars(_histogram("bucket", run_id))
    labels = [e.get("labels", {}) for s in series for e in s.get("exemplars", ())]
    return {(lb["trace_id"], lb.get("span_id", "")) for lb in labels if lb.get("trace_id")}


def per_rank_metrics(api: PrometheusAPI, run_id: str | None) -> CheckResult:
    labeled = _histogram("count", run_id, f'{sc.PROM_RANK_LABEL}!=""')
    ranks = sorted(int(r["metric"][sc.PROM_RANK_LABEL]) for r in api.query(
        f"count by ({sc.PROM_RANK_LABEL}) ({labeled})"))
    # the native histogram's own name, or the classic histogram's _count
    names = sorted(r["metric"]["__name__"] for r in api.query(f"count by (__name__) ({labeled})"))
    count = " and ".join(names) or f"{sc.PROM_STEP_DURATION}[_count]"
    unlabeled_sel = _histogram("count", run_id, f'{sc.PROM_RANK_LABEL}=""')
    unlabeled = api.query(f"count({unlabeled_sel})")
    ok = bool(ranks) and not unlabeled
    evidence = f"{count} series for ranks {ranks}" if ranks else f"no {count} series"
    if unlabeled:
        evidence += f"; {unlabeled[0]['value'][1]} series without {sc.PROM_RANK_LABEL}"
    return _row("per_rank_metrics", ok, evidence,
                f"scrape every rank's endpoint and keep the {sc.PROM_RANK_LABEL} label "
                "(no aggregation before storage)")


def cpu_throttling_measured(api: PrometheusAPI, run_id: str | None) -> CheckResult:
    ranks = api.query(f"count by ({sc.PROM_RANK_LABEL}) ({PROM_CPU_THROTTLED}{_sel(run_id)})")
    containers = api.query(f"count({CADVISOR_THROTTLED})")
    parts = []
    if ranks:
        parts.append(f"{PROM_CPU_THROTTLED} for {len(ranks)} ranks")
    if containers:
        parts.append(f"{CADVISOR_THROTTLED}: {containers[0]['value'][1]} series")
    return _row("cpu_throttling_measured", bool(parts),
                "; ".join(parts) or f"neither {PROM_CPU_THROTTLED} nor {CADVISOR_THROTTLED}",
                "export the cgroup throttling metric (OTLP or the collector's prometheus "
                "exporter) and scrape cAdvisor (kubelet /metrics/cadvisor)")


def throttling_alerts(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Alerting rules that read CPU throttling, directly or through recording rules."""
    watched = {CADVISOR_THROTTLED, PROM_CPU_THROTTLED}
    recording = [r for r in rules if r.get("type") == "recording"]
    grown = True
    while grown:
        before = len(watched)
        watched |= {r["name"] for r in recording
                    if any(name in r.get("query", "") for name in watched)}
        grown = len(watched) > before
    return [r for r in rules if r.get("type") == "alerting"
            and any(name in r.get("query", "") for name in watched)]


def throttling_alert(api: PrometheusAPI, run_id: str | None) -> CheckResult:
    rules = throttling_alerts(api.rules())
    healthy = [r for r in rules if r.get("health", "ok") in ("ok", "unknown")]
    evidence = ", ".join(f"{r['name']} ({r.get('state', '?')}, health {r.get('health', '?')})"
                         for r in rules) or "no alerting rule reads CPU throttling"
    return _row("throttling_alert", bool(healthy), "loaded: " + evidence if rules else evidence,
                "load the repository's alert rules (rule_files in prometheus.yml) and reload")


def telemetry_complete(api: PrometheusAPI, run_id: str | None) -> CheckResult:
    total = f"sum by ({sc.PROM_SIGNAL_LABEL}) ({sc.PROM_TELEMETRY_DROPPED}{_sel(run_id)})"
    dropped = api.query(f"{total} > 0")
    evidence = ", ".join(f"{r['metric'].get(sc.PROM_SIGNAL_LABEL, '?')} {float(r['value'][1]):.0f}"
                         for r in dropped)
    return _row("telemetry_complete", not dropped, f"dropped: {evidence}" if dropped else
                f"{sc.PROM_TELEMETRY_DROPPED} is zero or absent",
                "raise the queue sizes or check the exporter endpoint is reachable")


CHECKS = (exemplars, per_rank_metrics, cpu_throttling_measured, throttling_alert,
          telemetry_complete)


def check_prometheus(base_url: str, run_id: str | None = None) -> list[CheckResult]:
    api = PrometheusAPI(base_url)
    results = [check(api, run_id) for check in CHECKS]
    results += [CheckResult(item, NOT_APPLICABLE, "traces are not in Prometheus",
                            "give --jaeger URL or a run directory (live Tempo "
                            "checks are not implemented)", SOURCE) for item in TRACE_ITEMS]
    results.append(CheckResult("log_fields", NOT_APPLICABLE, "logs are not in Prometheus",
                               "give --loki URL or a run directory", SOURCE))
    return results
