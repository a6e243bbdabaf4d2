"""What users read is true: against each collector fault, every signal's account adds up to
what the run made, each signal in its own unit (spans, log records, metric data points), in
``Instrumentation.dropped``, ``Instrumentation.telemetry`` and the end-of-run warning.

What the run made is what a file-export twin of it (the same steps and settings) wrote. The
metric reader's interval stays at its default (60 s), longer than the run, so each run's
only collection is its final one and both make the same points. The OTLP timeout stays at
its default (10 s), longer than the shutdown bound: flushing to a collector that never
answers, answers 503 or refuses the connection takes the whole bound, which once left no
time for the final metric collection, whose points were then lost uncounted.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator

import pytest
from support import otlp_files, training
from support import pipeline_fixtures as pf
from support.collector_faults import Answering503, StallingProxy

import otel_train
from otel_train import semconv

SHUTDOWN_BOUND_S = 4.0
STEPS = 12
SIGNALS = (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS)


def _clean_env(mp: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OTEL_", "TORCHELASTIC_")) or name == "TRACEPARENT":
            mp.delenv(name)
    mp.setenv("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", str(SHUTDOWN_BOUND_S))


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Spans, log records and metric data points the file-export twin wrote."""
    out = tmp_path_factory.mktemp("twin")
    with pytest.MonkeyPatch.context() as mp:
        _clean_env(mp)
        model, opt, loader = training.setup(batches=STEPS)
        with otel_train.instrument(model, output_dir=out) as inst:
            assert training.train(model, opt, loader) == STEPS
    assert not any(inst.dropped.values()), inst.dropped
    run_dir = otlp_files.only_run_dir(out)
    written = {semconv.SIGNAL_SPANS: len(otlp_files.spans(run_dir)),
               semconv.SIGNAL_LOGS: len(otlp_files.logs(run_dir)),
               semconv.SIGNAL_METRICS: otlp_files.data_points(run_dir)}
    assert all(written.values()), written  # some of each, or the comparisons say little
    return written


def _train_against(monkeypatch: pytest.MonkeyPatch, endpoint: str, **settings: object
                   ) -> tuple[otel_train.Instrumentation, str]:
    """The twin's run, exporting OTLP to ``endpoint``: (instrumentation, the warning)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    model, opt, loader = training.setup(batches=STEPS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with otel_train.instrument(model, **settings) as inst:
            assert training.train(model, opt, loader) == STEPS
            left = time.monotonic()
        exit_s = time.monotonic() - left
    assert exit_s < SHUTDOWN_BOUND_S + 1.5, f"leaving instrument() took {exit_s:.1f}s"
    (warning,) = [str(w.message) for w in caught if "telemetry dropped" in str(w.message)]
    return inst, warning


def _assert_every_signal_adds_up(inst: otel_train.Instrumentation, warning: str,
                                 made: dict[str, int]) -> None:
    assert set(inst.dropped) == set(SIGNALS), inst.dropped  # the metric signal's entry too
    for signal in SIGNALS:
        exported, dropped = inst.telemetry["exported"][signal], inst.dropped[signal]
        assert exported + dropped == made[signal], (signal, inst.dropped, inst.telemetry)
        assert inst.telemetry["produced"][signal] == made[signal], (signal, inst.telemetry)
        assert f"'{signal}': {dropped}" in warning, warning
    assert inst.dropped[semconv.SIGNAL_METRICS] == made[semconv.SIGNAL_METRICS] > 0, \
        "the final collection's points, every one counted as dropped"


@pytest.fixture
def stalling_proxy() -> Iterator[StallingProxy]:
    proxy = StallingProxy()
    yield proxy
    proxy.close()


@pytest.fixture
def answering_503() -> Iterator[Answering503]:
    server = Answering503()
    yield server
    server.close()


def test_against_a_collector_that_never_answers_every_signal_adds_up(monkeypatch, made,
                                                                     stalling_proxy):
    inst, warning = _train_against(monkeypatch, f"http://127.0.0.1:{stalling_proxy.port}")
    assert stalling_proxy.accepted, "the exporter did reach the silent link"
    _assert_every_signal_adds_up(inst, warning, made)


def test_exporting_in_process_against_a_collector_that_never_answers_every_signal_adds_up(
        monkeypatch, made, stalling_proxy):
    inst, warning = _train_against(monkeypatch, f"http://127.0.0.1:{stalling_proxy.port}",
                                   export_process=False)
    assert inst._pipeline.__class__.__name__ == "Pipeline"
    _assert_every_signal_adds_up(inst, warning, made)


def test_against_a_collector_answering_503_every_signal_adds_up(monkeypatch, made,
                                                                answering_503):
    inst, warning = _train_against(monkeypatch, f"http://127.0.0.1:{answering_503.port}")
    assert answering_503.answered > 0, "the exporter did reach the server"
    _assert_every_signal_adds_up(inst, warning, made)


def test_against_a_refused_port_every_signal_adds_up(monkeypatch, made):
    inst, warning = _train_against(monkeypatch, f"http://127.0.0.1:{pf.free_port()}")
    _assert_every_signal_adds_up(inst, warning, made)
