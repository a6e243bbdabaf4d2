"""Collector faults that training always survives, against the real collector.

Each test trains for real while exporting OTLP to a collector that is absent, killed and
restarted, stalled behind a TCP proxy, refusing data, or behind a TLS mismatch. The
outcome each time: training completes, leaving ``instrument()`` takes no longer than its
shutdown bound, and whatever did not reach the collector is counted as dropped. Step-time
ratios against a healthy collector are measured in ``bench/bench_faults.py``, not here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import pipeline_fixtures as pf
from support import training
from support.collector_faults import REFUSING_CONFIG, StallingProxy

import otel_train
from otel_train import semconv

SHUTDOWN_BOUND_S = 4.0


@pytest.fixture(autouse=True)
def _otlp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ("OTEL_TRAIN_REQUIRE_BINARIES", "OTEL_TRAIN_COLLECTOR_BIN"):
            continue  # the test setup's own: without them CI would skip, not fail
        if name.startswith(("OTEL_", "TORCHELASTIC_")) or name == "TRACEPARENT":
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", str(SHUTDOWN_BOUND_S))


def _train(monkeypatch, endpoint: str, batches: int = 12, **kwargs):
    """Train ``batches`` steps exporting to ``endpoint``; returns (instrumentation, exit s)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    model, opt, loader = training.setup(batches=batches)
    with pytest.warns(otel_train.ConfigWarning, match="telemetry dropped"):
        inst = otel_train.instrument(model, **kwargs)
        with inst:
            assert training.train(model, opt, loader) == batches
            left = time.monotonic()
    return inst, time.monotonic() - left


_SIGNALS = (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS)


def _assert_accounts_exact(inst) -> dict[str, dict[str, int]]:
    """produced = exported + dropped for every signal, and every loss in inst.dropped."""
    accounts = inst.telemetry
    for signal in _SIGNALS:
        assert accounts["produced"][signal] == (
            accounts["exported"][signal] + accounts["dropped"][signal]), (signal, accounts)
        assert inst.dropped.get(signal, 0) >= accounts["dropped"][signal], (signal, accounts)
    return accounts


def _assert_bounded_and_counted(inst, exit_s: float) -> None:
    assert exit_s < SHUTDOWN_BOUND_S + 1.5, f"leaving instrument() took {exit_s:.1f}s"
    assert inst.dropped.get(semconv.SIGNAL_SPANS, 0) > 0
    assert inst.emitter.errors == 0
    _assert_accounts_exact(inst)


def _assert_nothing_exported(inst) -> None:
    """No collector confirmed anything: every span and log record produced was dropped."""
    accounts = inst.telemetry
    for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_LOGS):
        assert accounts["produced"][signal] > 0, accounts
        assert accounts["exported"][signal] == 0, accounts
        assert accounts["dropped"][signal] == accounts["produced"][signal], accounts


def test_collector_absent_from_the_start(monkeypatch):
    inst, exit_s = _train(monkeypatch, f"http://127.0.0.1:{pf.free_port()}")
    _assert_bounded_and_counted(inst, exit_s)
    assert inst.dropped[semconv.SIGNAL_SPANS] == 12 * 6 + 2, "every span is counted"
    _assert_nothing_exported(inst)
    assert inst.telemetry["produced"][semconv.SIGNAL_SPANS] == 12 * 6 + 2


@pytest.fixture
def stalling_proxy() -> Iterator[StallingProxy]:
    proxy = StallingProxy()
    yield proxy
    proxy.close()


def test_collector_stalled_behind_a_silent_link(monkeypatch, stalling_proxy):
    inst, exit_s = _train(monkeypatch, f"http://127.0.0.1:{stalling_proxy.port}")
    assert stalling_proxy.accepted, "the exporter did reach the stalled link"
    _assert_bounded_and_counted(inst, exit_s)
    _assert_nothing_exported(inst)  # cut off by the shutdown bound: all of it dropped


def test_a_flush_cut_short_by_the_shutdown_bound_counts_every_span(monkeypatch,
                                                                    stalling_proxy):
    # exports that outlast the bound (10 s export timeout against a 2 s bound): the flush is
    # cut short with spans queued and in flight, and each of them is counted, none twice
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "10")
    monkeypatch.setenv("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "2")
    inst, exit_s = _train(monkeypatch, f"http://127.0.0.1:{stalling_proxy.port}")
    assert exit_s < 2 + 1.5, f"leaving instrument() took {exit_s:.1f}s"
    assert not inst.flushed
    _assert_accounts_exact(inst)
    _assert_nothing_exported(inst)
    assert inst.telemetry["produced"][semconv.SIGNAL_SPANS] == 12 * 6 + 2


def test_tls_mismatch_is_counted(monkeypatch, tmp_path):
    with pf.running_collector(pf.CONFIGS_DIR / "local.yaml", tmp_path) as collector:
        https = collector.otlp_http.replace("http://", "https://")
        inst, exit_s = _train(monkeypatch, https)
    _assert_bounded_and_counted(inst, exit_s)


def test_collector_refusing_data_is_counted(monkeypatch, tmp_path):
    config = tmp_path / "refusing.yaml"
    config.write_text(REFUSING_CONFIG)  # memory_limiter at 1 MiB: it refuses everything
    with pf.running_collector(config, tmp_path) as collector:
        inst, exit_s = _train(monkeypatch, collector.otlp_http)
        refused = sum(v for name, _, v in collector.telemetry()
                      if name.startswith("otelcol_receiver_refused_spans"))
    _assert_bounded_and_counted(inst, exit_s)
    assert refused > 0, "the collector itself says it refused spans"


def _spans_of_steps(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(s["attrs"][semconv.ATTR_STEP]) for s in pf.read_spans(path)
            if s["name"] == semconv.SPAN_RANK_STEP}


def test_collector_killed_and_restarted_telemetry_resumes(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    with pf.running_collector(pf.CONFIGS_DIR / "local.yaml", tmp_path) as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.otlp_http)
        traces = collector.output_dir / "traces.jsonl"
        model, opt, loader = training.setup(batches=8)
        with pytest.warns(otel_train.ConfigWarning, match="telemetry dropped"):
            with otel_train.instrument(model) as inst:
                training.train(model, opt, loader)  # steps 0-7 (7 ends at the next fetch)
                pf.wait_for("steps before the outage", lambda: {0, 5} <= _spans_of_steps(traces),
                            timeout=30)
                collector.kill()
                training.train(model, opt, loader)  # steps 8-15 into the void
                pf.wait_for("the outage to be counted",
                            lambda: inst.emitter.total_dropped()[semconv.SIGNAL_SPANS] > 0,
                            timeout=30)
                collector.restart()
                training.train(model, opt, loader)  # steps 16-23
                pf.wait_for("telemetry to resume", lambda: 20 in _spans_of_steps(traces),
                            timeout=30)
    seen = _spans_of_steps(traces)
    produced = 24
    assert {0, 5, 20, 23} <= seen
    lost_steps = produced - len(seen)
    assert lost_steps > 0
    assert inst.dropped[semconv.SIGNAL_SPANS] >= lost_steps, "every lost step is counted"
    accounts = _assert_accounts_exact(inst)
    written = len(pf.read_spans(traces))
    # the collector wrote at most what was produced (what it accepted and then lost in its
    # kill is its own loss, in its own telemetry: "exported" means accepted by it)
    assert 0 < written <= accounts["produced"][semconv.SIGNAL_SPANS], (written, accounts)
    assert accounts["dropped"][semconv.SIGNAL_SPANS] > 0, accounts
