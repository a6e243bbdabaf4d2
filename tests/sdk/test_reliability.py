"""Faults that training always survives, without a collector: signals, forks, disks, input.

The collector faults (absent, killed, slow, refusing, TLS) are in test_reliability_collector.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import structlog
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import otlp_files, training

import otel_train
from otel_train import config, identity, redact, semconv
from otel_train.config import ConfigWarning

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OTEL_", "TORCHELASTIC_")) or name == "TRACEPARENT":
            monkeypatch.delenv(name)


# --- preemption ----------------------------------------------------------------------------


def test_sigterm_flushes_telemetry_and_ends_the_run_as_preempted(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "sigterm_train.py"),
                             str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the child says when it has done real steps
            if line.strip() == "step 6":
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, "it still dies of the signal"
    assert took < 15, f"flush took {took:.1f}s, over the shutdown bound"
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    run = next(s for s in spans if s["name"] == semconv.SPAN_RUN)
    assert run["attrs"][semconv.ATTR_STATUS] == "preempted"
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) >= 6


def test_a_sigterm_during_the_flush_waits_for_it(tmp_path):
    """torchrun stops the other ranks with SIGTERM once one has failed; those ranks are then
    flushing after their own error (a peer's socket closed). The signal must not cut that
    flush (seen in CI: two ranks with nothing exported but their first metrics): the rank
    flushes, then dies of it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "sigterm_in_flush_train.py"),
         str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr[-2000:])
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    run = next((s for s in spans if s["name"] == semconv.SPAN_RUN), None)
    assert run is not None, "the run span was not flushed"
    assert run["attrs"][semconv.ATTR_STATUS] == "error", "the run ended on its own error"
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == 6


def test_an_application_sigterm_handler_is_kept_and_chained(tmp_path):
    called = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: called.append(signum))
    try:
        model, opt, loader = training.setup(batches=3)
        with otel_train.instrument(model, output_dir=tmp_path):
            training.train(model, opt, loader)
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while not called and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs between bytecodes of this thread
        assert called == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    run = next(s for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path))
               if s["name"] == semconv.SPAN_RUN)
    assert run["attrs"][semconv.ATTR_STATUS] == "preempted"


# --- forked DataLoader workers -------------------------------------------------------------


class _ProbeDataset(torch.utils.data.Dataset):
    """Reports, from inside a forked worker, whether any OpenTelemetry export thread runs."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            live = [t.name for t in threading.enumerate()
                    if t.name.startswith(("Otel", "otel-train"))]
            if not live:
                return torch.tensor([float(index), 0.0])
            time.sleep(0.01)  # the SDK's restarted threads see the stop flag and exit
        return torch.tensor([float(index), float(len(live))])


def test_forked_dataloader_workers_run_no_telemetry_threads(tmp_path):
    loader = torch.utils.data.DataLoader(_ProbeDataset(), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with otel_train.instrument(model, output_dir=tmp_path):
        for batch in loader:
            seen.append(batch[:, 1])
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad()
    assert torch.cat(seen).tolist() == [0.0] * 8, "a worker still ran export threads"
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == 4
    pids = {s["resource"]["process.pid"] for s in spans}
    assert pids == {os.getpid()}


# --- the file exporter's disk --------------------------------------------------------------


def test_an_unwritable_output_directory_warns_and_training_continues(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the run directory should go")
    model, opt, loader = training.setup(batches=3)
    with pytest.warns(ConfigWarning, match="cannot set up the file exporters"):
        with otel_train.instrument(model, output_dir=blocker) as inst:
            assert training.train(model, opt, loader) == 3
    assert inst.run_dir is not None and not inst.run_dir.exists()


def test_a_full_disk_is_counted_as_dropped_and_training_continues(tmp_path):
    run_id = "disk-full"
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    (run_dir / "traces.rank-0.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    model, opt, loader = training.setup(batches=4)
    with pytest.warns(ConfigWarning, match="telemetry dropped"):
        with otel_train.instrument(model, output_dir=tmp_path, run_id=run_id) as inst:
            assert training.train(model, opt, loader) == 4
    assert inst.dropped[semconv.SIGNAL_SPANS] >= 4 * 6
    assert otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION), "metrics still written"


# --- application code and its own OpenTelemetry ------------------------------------------


def test_an_application_with_its_own_tracer_provider_is_left_alone(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    global_before = otel_trace.get_tracer_provider()
    model, opt, loader = training.setup(batches=2)
    with otel_train.instrument(model, output_dir=tmp_path):
        with tracer.start_as_current_span("app.epoch"):
            training.train(model, opt, loader)
    assert otel_trace.get_tracer_provider() is global_before
    assert [s.name for s in exporter.get_finished_spans()] == ["app.epoch"]
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert not any(s["name"] == "app.epoch" for s in spans)


# --- secrets and odd values ----------------------------------------------------------------


def test_secrets_in_log_fields_are_redacted_before_export(tmp_path):
    model, opt, loader = training.setup(batches=2)
    with otel_train.instrument(model, output_dir=tmp_path):
        training.train(model, opt, loader)
        structlog.get_logger("app").warning("connecting", db_password="hunter2",
                                            api_key="k-123", endpoint="https://host/v1",
                                            header="Bearer abcdefghijklmnop")
        logging.getLogger("app").warning("dsn postgres://admin:s3cret@db:5432/x")
    records = otlp_files.logs(otlp_files.only_run_dir(tmp_path))
    connecting = next(r for r in records if r["body"]["stringValue"] == "connecting")
    assert connecting["attrs"]["db_password"] == redact.REDACTED
    assert connecting["attrs"]["api_key"] == redact.REDACTED
    assert connecting["attrs"]["header"] == f"Bearer {redact.REDACTED}"  # scrubbed in place
    assert connecting["attrs"]["endpoint"] == "https://host/v1"
    text = otlp_files.only_run_dir(tmp_path).joinpath("logs.rank-0.jsonl").read_text()
    assert "hunter2" not in text and "s3cret" not in text and "k-123" not in text


def test_huge_binary_and_unserialisable_log_values_do_not_break_anything(tmp_path):
    class Opaque:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    model, opt, loader = training.setup(batches=2)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        training.train(model, opt, loader)
        structlog.get_logger("app").warning("odd values", huge="x" * 1_000_000,
                                            blob=b"\x00\xff\xfe", nested={"a": [1, 2]},
                                            名前="値")
        logging.getLogger("app").warning("opaque %s", "ok", extra={"thing": Opaque()})
    assert inst.emitter.errors == 0
    records = otlp_files.logs(otlp_files.only_run_dir(tmp_path))
    odd = next(r for r in records if r["body"]["stringValue"] == "odd values")
    assert len(odd["attrs"]["huge"]) <= 4096 and odd["attrs"]["名前"] == "値"
    assert any(r["body"]["stringValue"] == "opaque ok" for r in records)


# --- parsers never crash -------------------------------------------------------------------

_ENV_NAMES = ["OTEL_TRAIN_QUEUE_SIZE", "OTEL_TRAIN_EMIT_INTERVAL_MS", "OTEL_TRAIN_EXPORTER",
              "OTEL_TRAIN_PROMETHEUS_PORT", "OTEL_TRAIN_RUN_ID", "OTEL_TRAIN_LOG_LEVEL",
              "OTEL_TRAIN_CAPTURE_LOGS", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "OTEL_TRACES_SAMPLER",
              "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_TRAIN_OUTPUT_DIR"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_ENV_NAMES), st.text(max_size=40)))
def test_any_environment_gives_a_valid_config_or_warnings(env):
    env = {k: v for k, v in env.items() if "\x00" not in v}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = config.load(env)
    assert all(issubclass(w.category, ConfigWarning) for w in caught)
    assert cfg.queue_size > 0 and cfg.emit_interval_s > 0 and cfg.shutdown_timeout_s > 0
    assert cfg.exporter in config.EXPORTERS
    assert 0.0 <= cfg.sampler_arg <= 1.0
    cfg.sampler()  # always buildable


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_any_traceparent_parses_or_warns(value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = identity.launcher_context({"TRACEPARENT": value})
    assert ctx is None or (ctx.is_valid and ctx.is_remote)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_launcher_run_id_becomes_a_safe_path_token(value):
    token = identity.sanitize_run_id(value)
    assert 0 < len(token) <= 128 and token not in (".", "..")
    assert all(c.isalnum() or c in "-_." for c in token) and "/" not in token


def test_a_bug_in_step_tracking_never_reaches_the_training_loop(tmp_path):
    # A fault we cannot cause for real: a source's training-thread hook that raises
    # (standing in for a bug in otel-train). The loop must not see it.
    def broken_hook(begin: bool, now: int) -> None:
        raise ZeroDivisionError("bug in a phase hook")

    model, opt, loader = training.setup(batches=4)
    with pytest.warns(RuntimeWarning, match="step tracking failed"):
        with otel_train.instrument(model, output_dir=tmp_path) as inst:
            inst.tracker.phase_hooks = (broken_hook,)
            assert training.train(model, opt, loader) == 4
    assert not inst.tracker.enabled


def test_a_rank_killed_with_sigkill_leaves_the_others_telemetry_exported(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    out = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "sigkill_train.py"),
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert "rank 0 exit code 0" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "rank 0 exported" in out.stdout
    spans = otlp_files.spans(tmp_path / "sigkill")
    rank0_steps = {s["attrs"][semconv.ATTR_STEP] for s in spans
                   if s["name"] == semconv.SPAN_RANK_STEP and s["attrs"][semconv.ATTR_RANK] == 0}
    assert set(range(5)) <= rank0_steps, "rank 0's steps before the kill are exported"
    run = next(s for s in spans if s["name"] == semconv.SPAN_RUN
               and s["attrs"][semconv.ATTR_RANK] == 0)
    records = otlp_files.logs(tmp_path / "sigkill")
    stalled = [r for r in records if "stall" in r["body"]["stringValue"]]
    # gloo notices a dead peer (the survivor's collective raises) or the collective hangs
    # and the stall detection reports it: either way rank 0 says what happened
    assert run["attrs"][semconv.ATTR_STATUS] == "error" or stalled


def test_a_failing_start_leaves_training_uninstrumented_not_broken(tmp_path, monkeypatch):
    # A fault we cannot cause for real on one process (the run id broadcast failing, say):
    # stand in for it by making the identity step raise.
    from torch.utils.data import dataloader as dl

    def broken_resolve(*args, **kwargs):
        raise RuntimeError("store unreachable")

    monkeypatch.setattr(identity, "resolve", broken_resolve)
    model, opt, loader = training.setup(batches=3)
    before = (dl._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward,
              logging.getLogRecordFactory())
    with pytest.warns(ConfigWarning, match="could not start"):
        with otel_train.instrument(model, output_dir=tmp_path) as inst:
            assert training.train(model, opt, loader) == 3
    assert inst.run_id is None and not any(tmp_path.iterdir())
    assert (dl._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward,
            logging.getLogRecordFactory()) == before
