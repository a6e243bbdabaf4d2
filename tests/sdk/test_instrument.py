"""One process, one rank: the span tree, metrics with exemplars, logs with ids, teardown."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.request
import warnings
from collections import Counter, defaultdict

import pytest
import structlog
import torch
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from support import otlp_files, training
from torch.utils.data import dataloader as dl

import otel_train
from otel_train import identity, semconv
from otel_train.config import ConfigWarning


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "TRACEPARENT",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(tmp_path, accumulate=1, batches=8, **kwargs):
    model, opt, loader = training.setup(batches=batches, log_in_forward=kwargs.pop("log_fwd", False))
    with otel_train.instrument(model, output_dir=tmp_path, **kwargs) as inst:
        steps = training.train(model, opt, loader, accumulate=accumulate,
                               log_after_step=kwargs.get("run_id") == "logs")
    return inst, steps, otlp_files.only_run_dir(tmp_path)


def test_every_step_is_a_trace_with_rank_and_phase_spans(tmp_path):
    inst, steps, run_dir = _run(tmp_path)
    spans = otlp_files.spans(run_dir)
    names = Counter(s["name"] for s in spans)
    assert names[semconv.SPAN_STEP] == steps == 8
    assert names[semconv.SPAN_RANK_STEP] == 8
    for phase_span in semconv.PHASE_SPAN.values():
        assert names[phase_span] == 8, phase_span
    by_id = {s["spanId"]: s for s in spans}
    for span in spans:
        if span["name"] == semconv.SPAN_STEP:
            assert not span.get("parentSpanId")
            step = span["attrs"][semconv.ATTR_STEP]
            assert span["traceId"] == f"{identity.step_trace_id(inst.run_id, step):032x}"
        elif span["name"] == semconv.SPAN_RANK_STEP:
            assert by_id[span["parentSpanId"]]["name"] == semconv.SPAN_STEP
        elif span["name"] in semconv.PHASE_SPAN.values():
            parent = by_id[span["parentSpanId"]]
            assert parent["name"] == semconv.SPAN_RANK_STEP
            assert parent["traceId"] == span["traceId"]
            assert parent["attrs"][semconv.ATTR_STEP] == span["attrs"][semconv.ATTR_STEP]


def test_phases_lie_inside_their_step_and_steps_tile_the_run(tmp_path):
    _, _, run_dir = _run(tmp_path)
    spans = otlp_files.spans(run_dir)
    by_id = {s["spanId"]: s for s in spans}
    for span in spans:
        if span["name"] in semconv.PHASE_SPAN.values():
            parent = by_id[span["parentSpanId"]]
            assert int(parent["startTimeUnixNano"]) <= int(span["startTimeUnixNano"])
            assert int(span["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"])
    steps = sorted((s for s in spans if s["name"] == semconv.SPAN_RANK_STEP),
                   key=lambda s: s["attrs"][semconv.ATTR_STEP])
    for before, after in zip(steps, steps[1:]):
        assert before["endTimeUnixNano"] == after["startTimeUnixNano"]


def test_run_span_per_rank_with_setup_child(tmp_path):
    _, _, run_dir = _run(tmp_path)
    spans = otlp_files.spans(run_dir)
    runs = [s for s in spans if s["name"] == semconv.SPAN_RUN]
    setups = [s for s in spans if s["name"] == semconv.SPAN_SETUP]
    assert len(runs) == 1 and len(setups) == 1
    assert setups[0]["parentSpanId"] == runs[0]["spanId"]
    assert runs[0]["attrs"][semconv.ATTR_STATUS] == "ok"
    step_links = [s.get("links", []) for s in spans if s["name"] == semconv.SPAN_STEP]
    assert all(any(link["spanId"] == runs[0]["spanId"] for link in links) for links in step_links)


def test_gradient_accumulation_gives_a_phase_span_per_micro_batch(tmp_path):
    _, steps, run_dir = _run(tmp_path, accumulate=3, batches=9)
    assert steps == 3
    spans = otlp_files.spans(run_dir)
    per_step = defaultdict(Counter)
    micro = defaultdict(set)
    for s in spans:
        if s["name"] in semconv.PHASE_SPAN.values():
            per_step[s["attrs"][semconv.ATTR_STEP]][s["name"]] += 1
            micro[(s["attrs"][semconv.ATTR_STEP], s["name"])].add(
                s["attrs"][semconv.ATTR_MICRO_BATCH])
    for step in range(3):
        assert per_step[step][semconv.SPAN_FORWARD] == 3
        assert per_step[step][semconv.SPAN_BACKWARD] == 3
        assert per_step[step][semconv.SPAN_DATA_WAIT] == 3
        assert per_step[step][semconv.SPAN_OPTIMIZER] == 1
        assert micro[(step, semconv.SPAN_FORWARD)] == {0, 1, 2}
    rank_steps = [s for s in spans if s["name"] == semconv.SPAN_RANK_STEP]
    assert {s["attrs"][semconv.ATTR_MICRO_BATCHES] for s in rank_steps} == {3}
    assert {s["attrs"][semconv.ATTR_SAMPLES] for s in rank_steps} == {12}


def test_histograms_carry_exemplars_that_resolve_to_exported_spans(tmp_path):
    _, _, run_dir = _run(tmp_path)
    span_keys = {(s["traceId"], s["spanId"]) for s in otlp_files.spans(run_dir)}
    for metric in (semconv.METRIC_STEP_DURATION, semconv.METRIC_PHASE_DURATION):
        points = otlp_files.metric_points(run_dir, metric)
        assert points, metric
        exemplars = [e for p in points for e in p.get("exemplars", [])]
        assert exemplars, f"{metric} has no exemplars"
        for e in exemplars:
            assert (e["traceId"], e["spanId"]) in span_keys
        assert all(p["attrs"][semconv.ATTR_RANK] == 0 for p in points)
    step_points = otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)
    assert int(step_points[-1]["count"]) == 8
    samples = otlp_files.metric_points(run_dir, semconv.METRIC_SAMPLES)
    assert int(samples[-1]["asInt"]) == 32


def test_log_lines_carry_the_ids_of_the_span_they_were_written_in(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    model, opt, loader = training.setup(batches=4, log_in_forward=True)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        training.train(model, opt, loader, log_after_step=True)
    run_dir = otlp_files.only_run_dir(tmp_path)
    spans = {s["spanId"]: s for s in otlp_files.spans(run_dir)}
    records = otlp_files.logs(run_dir)
    forward_logs = [r for r in records if r["body"]["stringValue"] == "inside forward"]
    after_logs = [r for r in records if r["body"]["stringValue"].startswith("after step")]
    structlog_logs = [r for r in records if r["body"]["stringValue"] == "structlog after step"]
    assert len(forward_logs) == len(after_logs) == len(structlog_logs) == 4
    for record in forward_logs:
        span = spans[record["spanId"]]
        assert span["name"] == semconv.SPAN_FORWARD and span["traceId"] == record["traceId"]
        assert record["attrs"][semconv.LOG_STEP] == span["attrs"][semconv.ATTR_STEP]
    # a line logged after optimizer step k is counted in step k+1 (steps are contiguous), and
    # carries step k+1's ids; after the last step, those of a step that never ran
    assert sorted(r["attrs"][semconv.LOG_STEP] for r in after_logs) == [1, 2, 3, 4]
    for record in after_logs + structlog_logs:
        step = record["attrs"][semconv.LOG_STEP]
        assert record["traceId"] == f"{identity.step_trace_id(inst.run_id, step):032x}"
        if step < 4:
            span = spans[record["spanId"]]
            assert span["name"] == semconv.SPAN_RANK_STEP
            assert span["traceId"] == record["traceId"]
        assert record["attrs"][semconv.LOG_RUN_ID] == inst.run_id
        assert record["attrs"][semconv.LOG_RANK] == 0
    # the stdlib records themselves were stamped too, for the application's own formatters
    stamped = [r for r in caplog.records if r.getMessage() == "inside forward"]
    assert stamped and all(len(r.trace_id) == 32 and len(r.span_id) == 16 for r in stamped)
    step_logs = [r for r in records if r["body"]["stringValue"] == "training.step.end"]
    assert len(step_logs) == 4
    assert all(r["attrs"][semconv.LOG_PHASE] == "step" and r["attrs"][semconv.LOG_DURATION] > 0
               for r in step_logs)


def test_a_line_at_the_top_of_loop_iteration_k_carries_step_k(tmp_path, caplog):
    """Issue 16, item 1: a line logged after step k-1's optimizer step and before step k's
    first phase (the top of the loop, before the batch is fetched) is counted in step k's
    time and must carry step k's trace and a span of that trace: stdlib and structlog."""
    caplog.set_level(logging.WARNING)
    model, opt, loader = training.setup(batches=4)
    it = iter(loader)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        for k in range(4):
            training.user_log.warning("top of iteration %d", k)
            structlog.get_logger("user").warning("structlog top", k=k)
            training.one_step(model, opt, next(it))
    run_dir = otlp_files.only_run_dir(tmp_path)
    spans = {s["spanId"]: s for s in otlp_files.spans(run_dir)}
    records = [r for r in otlp_files.logs(run_dir)
               if r["body"]["stringValue"].startswith(("top of iteration", "structlog top"))]
    assert len(records) == 8
    for record in records:
        body = record["body"]["stringValue"]
        k = int(body.rsplit(" ", 1)[1]) if body.startswith("top") else record["attrs"]["k"]
        assert record["attrs"][semconv.LOG_STEP] == k
        assert record["traceId"] == f"{identity.step_trace_id(inst.run_id, k):032x}"
        span = spans[record["spanId"]]  # a span of that very trace
        assert span["traceId"] == record["traceId"] and span["attrs"][semconv.ATTR_STEP] == k
    stamped = [r for r in caplog.records if r.getMessage().startswith("top of iteration")]
    assert [r.trace_id for r in stamped] == [
        f"{identity.step_trace_id(inst.run_id, k):032x}" for k in range(4)]


def test_the_emitter_knows_which_step_a_moment_belonged_to(tmp_path):
    """Issue 16, item 3: NCCL operations found later (flight recorder, plugin) and their stall
    logs take their step from the time they were issued, not from how many steps the emitter
    has emitted (steps wait for the flight recorder's next read, up to 64 of them)."""
    model, opt, loader = training.setup(batches=4)
    it = iter(loader)
    tops = []
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        for _ in range(4):
            tops.append(time.perf_counter_ns())  # the top of the iteration: the gap
            training.one_step(model, opt, next(it))
            tops.append(time.perf_counter_ns())  # after the optimizer step: the next step's
    assert [inst.emitter.step_at(t) for t in tops] == [0, 1, 1, 2, 2, 3, 3, 4]


def _patch_state(model):
    from torch.optim import optimizer as optim_mod

    return (dl._BaseDataLoaderIter.__dict__["__next__"], torch.autograd.backward,
            dict(optim_mod._global_optimizer_pre_hooks), dict(optim_mod._global_optimizer_post_hooks),
            dict(model._forward_pre_hooks), dict(model._forward_hooks),
            model.__dict__.get("_compiled_call_impl"),
            logging.getLogRecordFactory(), list(logging.getLogger().handlers),
            structlog.is_configured(), structlog.get_config()["processors"])


@pytest.mark.parametrize("fail", [False, True], ids=["normal-exit", "exception"])
def test_leaving_restores_everything_that_was_patched(tmp_path, fail):
    model, opt, loader = training.setup(batches=2)
    before = _patch_state(model)
    with pytest.raises(RuntimeError) if fail else warnings.catch_warnings():
        with otel_train.instrument(model, output_dir=tmp_path) as inst:
            assert _patch_state(model) != before
            training.train(model, opt, loader)
            if fail:
                raise RuntimeError("boom")
    assert _patch_state(model) == before
    assert inst.flushed
    assert not [t for t in threading.enumerate() if t.name == "otel-train-emitter"]
    run = next(s for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path))
               if s["name"] == semconv.SPAN_RUN)
    assert run["attrs"][semconv.ATTR_STATUS] == ("error" if fail else "ok")
    assert (run["status"].get("code") == 2) == fail


def _spy_on_span_building(monkeypatch):
    """The names of the threads of this process that build OpenTelemetry spans."""
    from opentelemetry.sdk import trace as sdk_trace

    threads = set()
    original = sdk_trace.ReadableSpan.__init__  # every SDK span is one, _Span included

    def spy(self, *args, **kwargs):
        threads.add(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(sdk_trace.ReadableSpan, "__init__", spy)
    return threads


def test_no_span_is_built_in_the_training_process(tmp_path, monkeypatch):
    threads = _spy_on_span_building(monkeypatch)
    model, opt, loader = training.setup(batches=4)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        assert inst._pipeline.pid not in (None, os.getpid())  # an exporter process
        training.train(model, opt, loader)
    assert threads == set()
    names = {s["name"] for s in otlp_files.spans(otlp_files.only_run_dir(tmp_path))}
    assert {semconv.SPAN_RUN, semconv.SPAN_RANK_STEP, semconv.SPAN_FORWARD} <= names


def test_in_process_export_builds_spans_on_the_emitter_thread_only(tmp_path, monkeypatch):
    threads = _spy_on_span_building(monkeypatch)
    model, opt, loader = training.setup(batches=4)
    with otel_train.instrument(model, output_dir=tmp_path, export_process=False):
        training.train(model, opt, loader)
    assert threads == {"otel-train-emitter"}


@pytest.mark.parametrize("export_process", [True, False])
def test_healthy_export_accounts_for_every_span_exactly(tmp_path, export_process):
    model, opt, loader = training.setup(batches=6)
    with otel_train.instrument(model, output_dir=tmp_path, export_process=export_process) as inst:
        training.train(model, opt, loader)
    accounts = inst.telemetry
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
        assert accounts["dropped"][signal] == 0, accounts
        assert accounts["produced"][signal] == accounts["exported"][signal] > 0, accounts
    assert accounts["produced"][semconv.SIGNAL_SPANS] == len(spans)  # every one in the file


def test_a_full_buffer_drops_and_counts_and_never_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRAIN_EMIT_INTERVAL_MS", "600000")  # drained only at exit
    model, opt, loader = training.setup(batches=40)
    with pytest.warns(ConfigWarning, match="telemetry dropped"):
        # two records: a step makes more at once than a woken emitter can take in between
        with otel_train.instrument(model, output_dir=tmp_path, queue_size=2) as inst:
            assert training.train(model, opt, loader) == 40
    assert inst.dropped[semconv.SIGNAL_SPANS] > 0
    run_dir = otlp_files.only_run_dir(tmp_path)
    points = otlp_files.metric_points(run_dir, semconv.METRIC_TELEMETRY_DROPPED)
    last = {p["attrs"][semconv.ATTR_SIGNAL]: int(p["asInt"]) for p in points}
    assert last[semconv.SIGNAL_SPANS] == inst.dropped[semconv.SIGNAL_SPANS]


def test_mark_step_covers_loops_without_an_optimizer(tmp_path):
    model, _, loader = training.setup(batches=5)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        with torch.no_grad():
            for x, _ in loader:
                with inst.step():
                    model(x)
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == 5
    assert sum(s["name"] == semconv.SPAN_FORWARD for s in spans) == 5
    assert not any(s["name"] == semconv.SPAN_OPTIMIZER for s in spans)


def test_a_nested_instrument_warns_and_does_nothing(tmp_path):
    model, opt, loader = training.setup(batches=3)
    with otel_train.instrument(model, output_dir=tmp_path / "outer"):
        with pytest.warns(ConfigWarning, match="already active"):
            with otel_train.instrument(model, output_dir=tmp_path / "inner") as inner:
                training.train(model, opt, loader)
        assert inner.run_id is None
    assert not (tmp_path / "inner").exists()
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path / "outer"))
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == 3


def test_launcher_traceparent_parents_the_run_span(tmp_path, monkeypatch):
    launcher_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    monkeypatch.setenv("TRACEPARENT", f"00-{launcher_trace}-00f067aa0ba902b7-01")
    _, _, run_dir = _run(tmp_path, batches=2)
    spans = otlp_files.spans(run_dir)
    run = next(s for s in spans if s["name"] == semconv.SPAN_RUN)
    assert run["traceId"] == launcher_trace and run["parentSpanId"] == "00f067aa0ba902b7"
    for step in (s for s in spans if s["name"] == semconv.SPAN_STEP):
        assert {"traceId": launcher_trace, "spanId": "00f067aa0ba902b7"} in [
            {"traceId": link["traceId"], "spanId": link["spanId"]} for link in step["links"]]


def test_a_malformed_traceparent_warns_and_starts_a_new_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEPARENT", "not-a-traceparent")
    with pytest.warns(ConfigWarning, match="TRACEPARENT"):
        _, _, run_dir = _run(tmp_path, batches=2)
    run = next(s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RUN)
    assert not run.get("parentSpanId")


def test_trace_id_ratio_sampling_keeps_the_same_steps_and_all_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.4")
    inst, steps, run_dir = _run(tmp_path, batches=30)
    sampler = TraceIdRatioBased(0.4)
    expected = {s for s in range(steps) if sampler.should_sample(
        None, identity.step_trace_id(inst.run_id, s), "x").decision.is_sampled()}
    spans = otlp_files.spans(run_dir)
    got = {s["attrs"][semconv.ATTR_STEP] for s in spans if s["name"] == semconv.SPAN_RANK_STEP}
    assert got == expected and 0 < len(got) < steps
    points = otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)
    assert int(points[-1]["count"]) == steps
    assert len(points[-1].get("exemplars", [])) <= len(expected)


def _scrape(port: int) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    return urllib.request.urlopen(request, timeout=10).read().decode()


def test_prometheus_endpoint_serves_exemplars_in_openmetrics(tmp_path):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model, opt, loader = training.setup(batches=4)
    with otel_train.instrument(model, output_dir=tmp_path, prometheus_port=port) as inst:
        training.train(model, opt, loader)
        count_line = (f'training_step_duration_seconds_count{{training_rank="0",'
                      f'training_run_id="{inst.run_id}"}} 4.0')
        deadline = time.monotonic() + 30
        body = _scrape(port)
        while count_line not in body and time.monotonic() < deadline:
            time.sleep(0.05)  # poll: the emitter publishes on its own schedule
            body = _scrape(port)
    assert count_line in body  # step 3 ended when the loop asked for one more batch
    exemplar_lines = [ln for ln in body.splitlines()
                      if ln.startswith("training_step_duration_seconds_bucket") and "# {" in ln]
    assert exemplar_lines and 'trace_id="' in exemplar_lines[0]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_an_optimizer_step_that_raises_does_not_derail_later_steps(tmp_path):
    model, opt, loader = training.setup(batches=4)
    calls = {"n": 0}

    def failing_second_step(optimizer, args, kwargs):
        # runs after otel-train's global pre-hook opened the optimizer phase
        calls["n"] += 1
        if calls["n"] == 2:
            raise FloatingPointError("nan in gradients")

    opt.register_step_pre_hook(failing_second_step)
    with otel_train.instrument(model, output_dir=tmp_path):
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            try:
                opt.step()
            except FloatingPointError:
                pass
            opt.zero_grad()
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert sum(s["name"] == semconv.SPAN_FORWARD for s in spans) == 4
    assert sum(s["name"] == semconv.SPAN_BACKWARD for s in spans) == 4
    assert sum(s["name"] == semconv.SPAN_OPTIMIZER for s in spans) == 4


def test_a_ratio_sampler_never_loses_the_run_span(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.0")
    _, _, run_dir = _run(tmp_path, batches=3)
    names = Counter(s["name"] for s in otlp_files.spans(run_dir))
    assert names == {semconv.SPAN_RUN: 1, semconv.SPAN_SETUP: 1}


def test_cpu_throttling_is_measured_per_step_from_the_cgroup(tmp_path):
    from otel_train.sources import cgroup

    if cgroup.cpu_stat_path() is None:
        from support.binaries import binaries_required

        if binaries_required():  # CI machines have one: there a skip would hide a bug
            pytest.fail("no cgroup cpu.stat on this machine")
        pytest.skip("no cgroup cpu.stat on this machine")
    _, _, run_dir = _run(tmp_path, batches=3)
    points = otlp_files.metric_points(run_dir, semconv.METRIC_CPU_THROTTLED_TIME)
    assert points and points[-1]["attrs"][semconv.ATTR_RANK] == 0
    rank_steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    assert all(semconv.ATTR_CPU_THROTTLED in s["attrs"] for s in rank_steps)


def test_fast_steps_read_the_cgroup_at_most_every_10_ms(tmp_path, monkeypatch):
    """A read of ``cpu.stat`` is a system call on the training thread: steps far shorter
    than a CFS period share one read every 10 ms (and a last one at the end), each step
    still carries its throttled time, and the counter is exported. A spy counts the real
    reads of the source's descriptor from the training thread."""
    from otel_train.sources import cgroup

    if cgroup.cpu_stat_path() is None:
        from support.binaries import binaries_required

        if binaries_required():
            pytest.fail("no cgroup cpu.stat on this machine")
        pytest.skip("no cgroup cpu.stat on this machine")
    real_pread, main = os.pread, threading.get_ident()
    stat_fds: set[int] = set()
    reads = Counter()

    def pread(fd, n, offset):
        if threading.get_ident() == main and fd in stat_fds:
            reads["training thread"] += 1
        return real_pread(fd, n, offset)

    real_open = os.open

    def spy_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        if str(path).endswith("cpu.stat"):
            stat_fds.add(fd)
        return fd

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "pread", pread)
    model, opt, loader = training.setup(batches=200, batch_size=1)
    with otel_train.instrument(model, output_dir=tmp_path):
        started = time.perf_counter()
        steps = training.train(model, opt, loader)
        elapsed = time.perf_counter() - started
    assert steps == 200
    assert 2 <= reads["training thread"] <= elapsed / 0.010 + 3, (reads, elapsed)
    run_dir = otlp_files.only_run_dir(tmp_path)
    rank_steps = [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]
    assert len(rank_steps) == 200
    assert all(semconv.ATTR_CPU_THROTTLED in s["attrs"] for s in rank_steps)
    assert otlp_files.metric_points(run_dir, semconv.METRIC_CPU_THROTTLED_TIME)


def _phase_spans(run_dir, name):
    return sorted((s for s in otlp_files.spans(run_dir) if s["name"] == name),
                  key=lambda s: s["attrs"][semconv.ATTR_STEP])


def test_forward_is_timed_around_the_whole_call_without_module_hooks(tmp_path):
    """The forward wrapper sits in the call slot, not in module hooks (whose presence sends
    every call through ``_call_impl``'s slow path), and still covers the module's own
    pre-hooks (FSDP's unshard, for one): a pre-hook's moment lies inside the forward span."""
    model, opt, loader = training.setup(batches=3)
    moments: list[int] = []
    model.register_forward_pre_hook(lambda m, a: moments.append(time.time_ns()))
    hooks_before = (dict(model._forward_pre_hooks), dict(model._forward_hooks))
    with otel_train.instrument(model, output_dir=tmp_path):
        assert (dict(model._forward_pre_hooks), dict(model._forward_hooks)) == hooks_before
        training.train(model, opt, loader)
    assert model.__dict__.get("_compiled_call_impl") is None
    forwards = _phase_spans(otlp_files.only_run_dir(tmp_path), semconv.SPAN_FORWARD)
    assert len(forwards) == len(moments) == 3
    for span, moment in zip(forwards, moments, strict=True):
        assert int(span["startTimeUnixNano"]) <= moment <= int(span["endTimeUnixNano"])


class _OwnCall(torch.nn.Module):
    """A module whose class has its own ``__call__`` (never reaching the call slot)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_module_with_its_own_call_is_timed_by_forward_hooks(tmp_path):
    _, opt_unused, loader = training.setup(batches=3)
    model = _OwnCall()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with otel_train.instrument(model, output_dir=tmp_path):
        assert model._forward_pre_hooks and model._forward_hooks
        training.train(model, opt, loader)
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert len(_phase_spans(otlp_files.only_run_dir(tmp_path), semconv.SPAN_FORWARD)) == 3


def test_a_compile_inside_the_block_is_left_in_place_on_exit(tmp_path):
    """``model.compile()`` called inside ``instrument()`` replaces the forward wrapper in the
    call slot; leaving must not undo the user's compile."""
    model, opt, loader = training.setup(batches=2)
    with otel_train.instrument(model, output_dir=tmp_path):
        model.compile(backend="eager")
        compiled = model.__dict__["_compiled_call_impl"]
        training.train(model, opt, loader)
    assert model.__dict__["_compiled_call_impl"] is compiled


def test_a_copy_made_inside_the_block_does_not_carry_the_forward_wrapper(tmp_path):
    """An EMA or evaluation copy (``copy.deepcopy``) made while instrumented must call its own
    ``_call_impl``, not the original model's through otel-train's wrapper."""
    import copy

    model, opt, loader = training.setup(batches=2)
    with otel_train.instrument(model, output_dir=tmp_path):
        ema = copy.deepcopy(model)
        with torch.no_grad():
            ema.net[0].weight.zero_()
        x = torch.randn(3, 8)
        assert not torch.equal(ema(x), model(x))
    assert ema.__dict__.get("_compiled_call_impl") is None


def test_phase_span_ids_made_off_thread_are_unique_and_match_the_logs(tmp_path, caplog):
    """Span ids of phases nobody asked about on the training thread are made by the emitter;
    a line logged inside a forward carries the id of the exported forward span."""
    caplog.set_level(logging.WARNING)
    _, _, run_dir = _run(tmp_path, log_fwd=True)
    spans = otlp_files.spans(run_dir)
    phase_ids = [s["spanId"] for s in spans if s["name"] in semconv.PHASE_SPAN.values()]
    assert len(phase_ids) == 4 * 8 == len(set(phase_ids))
    assert all(int(i, 16) for i in phase_ids)
    forward_ids = {s["spanId"] for s in spans if s["name"] == semconv.SPAN_FORWARD}
    logged = {r.span_id for r in caplog.records if r.getMessage() == "inside forward"}
    assert len(logged) == 8 and logged <= forward_ids


class _ThreadLogging(torch.nn.Module):
    """A forward that has another thread log a line (a helper thread of the model's)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        helper = threading.Thread(target=logging.getLogger("user.helper").warning,
                                  args=("from a helper thread",))
        helper.start()
        helper.join()
        return self.net(x)


def test_a_line_from_another_thread_inside_a_phase_resolves_to_an_exported_span(tmp_path,
                                                                               caplog):
    """Phase span ids are made on the training thread only; another thread's line inside a
    phase whose id is not made yet carries the rank step's span, never an id no span has."""
    caplog.set_level(logging.WARNING)
    _, opt_unused, loader = training.setup(batches=3)
    model = _ThreadLogging()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with otel_train.instrument(model, output_dir=tmp_path):
        training.train(model, opt, loader)
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    by_id = {s["spanId"]: s for s in spans}
    lines = [r for r in caplog.records if r.getMessage() == "from a helper thread"]
    assert len(lines) == 3
    for record in lines:
        assert by_id[record.span_id]["name"] == semconv.SPAN_RANK_STEP


@pytest.mark.parametrize(("batch", "expected"), [
    ((torch.zeros(4, 8), torch.zeros(4, 1)), (4, 0)),
    ([torch.zeros(3, 16, dtype=torch.long)], (3, 48)),
    (torch.zeros(5, 7, dtype=torch.int32), (5, 35)),
    ({"input_ids": torch.zeros(2, 9, dtype=torch.long), "labels": torch.zeros(2)}, (2, 18)),
    ((torch.zeros(2, 3, dtype=torch.bool),), (2, 6)),
    ((torch.zeros(6, 2, dtype=torch.complex64),), (6, 0)),
    ((torch.tensor(1.0),), (0, 0)),
    (("text", torch.zeros(3, 4, dtype=torch.long)), (3, 12)),
    ((), (0, 0)),
])
def test_samples_and_tokens_of_a_batch(batch, expected):
    from otel_train.tracker import _batch_size_of, _first_tensor, batch_size

    assert batch_size(batch) == expected
    assert _batch_size_of(_first_tensor(batch)) == expected  # the general path agrees


def test_the_data_wait_counts_samples_and_tokens_of_token_batches(tmp_path):
    ids = torch.randint(0, 100, (12, 5))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 4), torch.nn.Flatten(),
                                torch.nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with otel_train.instrument(model, output_dir=tmp_path):
        for (x,) in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    rank_steps = _phase_spans(otlp_files.only_run_dir(tmp_path), semconv.SPAN_RANK_STEP)
    assert [(s["attrs"][semconv.ATTR_SAMPLES], s["attrs"][semconv.ATTR_TOKENS])
            for s in rank_steps] == [(4, 20)] * 3
