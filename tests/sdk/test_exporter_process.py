"""The exporter process: spans, metrics and logs leave the training process as tuples and are
built, encoded and exported by a spawned process per rank (docs/overhead.md).

Faults here are real: the exporter is killed with SIGKILL, the training process is killed
with SIGKILL; nothing is simulated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from support import otlp_files, training
from support.waits import emitter_passes

import otel_train
from otel_train import semconv
from otel_train.config import ConfigWarning
from otel_train.export import remote
from otel_train.exporter import process as exporter_process

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (its parent has not reaped it yet) once its last
    # thread has exited too: the leader turns zombie first, and until the others are gone
    # its files (the socket among them) are still open
    try:
        zombie = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        return not zombie or len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def test_the_exporter_is_a_separate_process_that_imports_no_torch(tmp_path):
    model, opt, loader = training.setup(batches=3)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        pid = inst._pipeline.pid
        assert pid is not None and pid != os.getpid()
        maps = Path(f"/proc/{pid}/maps").read_text()
        training.train(model, opt, loader)
    assert "libtorch" not in maps  # a fresh interpreter, not a fork of this one
    assert _wait_gone(pid, 5.0), "the exporter ends with the run"
    names = {s["name"] for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path))}
    assert semconv.SPAN_RANK_STEP in names and semconv.SPAN_RUN in names


def test_a_killed_exporter_is_replaced_and_training_goes_on(tmp_path):
    model, opt, loader = training.setup(batches=12)
    it = iter(loader)
    with otel_train.instrument(model, output_dir=tmp_path, emit_interval_s=0.05) as inst:
        pipeline = inst._pipeline
        first = pipeline.pid
        for _ in range(4):
            training.one_step(model, opt, next(it))
        os.kill(first, signal.SIGKILL)
        assert _wait_gone(first, 5.0)
        training.one_step(model, opt, next(it))  # its telemetry finds the exporter gone
        # the emitter finds the exporter gone at its next send and starts another
        deadline = time.monotonic() + 10
        while pipeline.pid in (None, first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pipeline.restarts == 1 and pipeline.pid not in (None, first)
        steps = 5
        for batch in it:  # training never stopped; what follows goes to the new exporter
            training.one_step(model, opt, batch)
            steps += 1
        assert steps == 12
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    # the replacement exported what came after it: the run span is built at the very end
    assert any(s["name"] == semconv.SPAN_RUN for s in spans)
    assert max(s["attrs"][semconv.ATTR_STEP] for s in spans
               if s["name"] == semconv.SPAN_RANK_STEP) == 11
    # nothing lost uncounted: the killed exporter's unexported part is dropped, exactly
    accounts = inst.telemetry
    for sig in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
        assert accounts["produced"][sig] == (
            accounts["exported"][sig] + accounts["dropped"][sig]), accounts
    # what the killed exporter never applied (unacknowledged batches) is dropped before its
    # SDK, what it applied and had not exported would be dropped in its accounts
    assert inst.dropped[semconv.SIGNAL_SPANS] > accounts["dropped"][semconv.SIGNAL_SPANS]
    # what the files hold: at least what was confirmed, at most what was produced
    assert accounts["exported"][semconv.SIGNAL_SPANS] <= len(spans) \
        <= accounts["produced"][semconv.SIGNAL_SPANS]


def _written(run_dir: Path) -> dict[str, int]:
    """Spans, log records and metric data points a run directory holds."""
    return {semconv.SIGNAL_SPANS: len(otlp_files.spans(run_dir)),
            semconv.SIGNAL_LOGS: len(otlp_files.logs(run_dir)),
            semconv.SIGNAL_METRICS: otlp_files.data_points(run_dir)}


def _kill_exporter(inst, model, opt, batches) -> None:
    """SIGKILL the running exporter; one more step (its batch fetch ends the step before,
    whose telemetry finds the exporter gone); wait for the pipeline to notice."""
    pipeline = inst._pipeline
    pid, losses = pipeline.pid, pipeline.losses
    replaced = pipeline.restarts < remote.MAX_RESTARTS  # before the loss: it takes a restart
    emitter_passes(inst, 3)  # several drains have reached it: what the steps recorded too
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid, 5.0)
    training.one_step(model, opt, next(batches))
    deadline = time.monotonic() + 20
    while (pipeline.losses == losses or (replaced and pipeline.pid is None)) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pipeline.losses == losses + 1
    assert (pipeline.pid not in (None, pid)) == replaced


def _train_killing(out: Path, steps: int, kill_after: tuple[int, ...] = ()):
    """``steps`` steps to files, the exporter SIGKILLed after each step in ``kill_after``
    (each kill costs the step after it to find it gone)."""
    model, opt, loader = training.setup(batches=steps)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)  # "telemetry dropped": asserted below
        with otel_train.instrument(model, output_dir=out, emit_interval_s=0.05) as inst:
            for step, batch in enumerate(it):
                training.one_step(model, opt, batch)
                if step in kill_after:
                    _kill_exporter(inst, model, opt, it)
    return inst


def test_a_killed_exporters_metrics_are_counted_in_data_points(tmp_path):
    twin = _written(otlp_files.only_run_dir(_train_killing(tmp_path / "twin", 12).run_dir.parent))
    inst = _train_killing(tmp_path / "killed", 12, kill_after=(4,))
    written = _written(otlp_files.only_run_dir(tmp_path / "killed"))
    accounts = inst.telemetry
    # the collection the killed exporter never made: a point for each series it held (by
    # step 4 every series of the run, as many as the twin's one collection), not one for
    # each of its ~30 measurements
    assert inst.dropped[semconv.SIGNAL_METRICS] == twin[semconv.SIGNAL_METRICS], inst.dropped
    # the replacement's collection, what the files hold
    assert accounts["exported"][semconv.SIGNAL_METRICS] == written[semconv.SIGNAL_METRICS] > 0
    assert accounts["produced"][semconv.SIGNAL_METRICS] == (
        accounts["exported"][semconv.SIGNAL_METRICS]
        + accounts["dropped"][semconv.SIGNAL_METRICS]), accounts
    for sig in (semconv.SIGNAL_SPANS, semconv.SIGNAL_LOGS):  # all that the twin made
        assert accounts["exported"][sig] + inst.dropped.get(sig, 0) == twin[sig], (sig, accounts)


def test_every_lost_exporter_is_warned_and_counted_past_the_last_restart(tmp_path, capsys):
    kills = tuple(range(1, 1 + 2 * (remote.MAX_RESTARTS + 1), 2))  # one loss more than restarts
    inst = _train_killing(tmp_path, 2 * len(kills) + 4, kill_after=kills)
    lost = [json.loads(line)["detail"] for line in capsys.readouterr().err.splitlines()
            if '"otel_train.exporter_lost"' in line]
    assert [f"loss {n}" in text for n, text in enumerate(lost, 1)] == [True] * len(kills), lost
    assert "no restart left" in lost[-1] and inst._pipeline.losses == len(kills)
    assert inst._pipeline.restarts == remote.MAX_RESTARTS


def test_an_exporter_that_cannot_start_leaves_export_in_process(tmp_path, monkeypatch):
    # A fault we cannot cause for real without breaking the interpreter itself: the exporter
    # process failing to start. Stand in for it with an interpreter path that does not exist.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    model, opt, loader = training.setup(batches=3)
    with pytest.warns(ConfigWarning, match="exporting from the training process"):
        with otel_train.instrument(model, output_dir=tmp_path / "out") as inst:
            assert inst._pipeline.__class__.__name__ == "Pipeline"
            assert training.train(model, opt, loader) == 3
    names = {s["name"] for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path / "out"))}
    assert semconv.SPAN_RUN in names


_SIGKILLED_TRAINER = textwrap.dedent("""
    import os, signal, sys
    import otel_train
    from support import training
    from support.waits import emitter_passes
    model, opt, loader = training.setup(batches=1000)
    with otel_train.instrument(model, output_dir=sys.argv[1], emit_interval_s=0.05) as inst:
        print(inst._pipeline.pid, flush=True)
        for i, batch in enumerate(loader):
            training.one_step(model, opt, batch)
            if i == 5:
                emitter_passes(inst, 3)  # drains with steps 0-4 have reached the exporter
                os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_exporter_never_outlives_a_sigkilled_training_process(tmp_path):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "3"}
    # files, not pipes: an exporter that outlived the trainer would hold a pipe open and
    # hang this test instead of failing it
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.run([sys.executable, "-c", _SIGKILLED_TRAINER, str(tmp_path)],
                              env=env, stdout=stdout, stderr=stderr, timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.read_text()[-2000:]
    exporter = int(out.read_text().split()[0])
    # the socket closed with the trainer: the exporter flushes within the bound and ends
    gone = _wait_gone(exporter, 3 + 5)
    if not gone:
        os.kill(exporter, signal.SIGKILL)  # leave nothing behind, then fail
    assert gone, "the exporter outlived its training process"
    assert (set(os.listdir("/dev/shm")) if shm_before or os.path.isdir("/dev/shm")
            else set()) <= shm_before, "shared memory left behind"
    # what reached it before the kill was flushed, not lost
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert {s["attrs"][semconv.ATTR_STEP] for s in spans
            if s["name"] == semconv.SPAN_RANK_STEP} >= {0, 1, 2}


def test_only_setting_warnings_are_relayed_as_settings_others_keep_their_kind():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("otel-train: OTEL_BSP_SCHEDULE_DELAY='-1' is invalid", ConfigWarning,
                      stacklevel=1)
        warnings.warn("unclosed file <logs.rank-0.jsonl>", ResourceWarning, stacklevel=1)
    with pytest.warns(ResourceWarning, match="unclosed file") as issued:
        relayed = exporter_process._settings_warnings(caught)
    assert relayed == ["otel-train: OTEL_BSP_SCHEDULE_DELAY='-1' is invalid"]
    assert [w.category for w in issued] == [ResourceWarning]
