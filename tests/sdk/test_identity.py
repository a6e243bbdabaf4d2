"""Run ids and the ids every rank derives on its own."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from otel_train import identity
from otel_train.config import ConfigWarning


def test_step_ids_are_deterministic_and_distinct():
    assert identity.step_trace_id("run", 7) == identity.step_trace_id("run", 7)
    trace_ids = {identity.step_trace_id("run", s) for s in range(1000)}
    assert len(trace_ids) == 1000
    assert identity.step_trace_id("run", 7) != identity.step_trace_id("other", 7)
    span_ids = {identity.rank_step_span_id("run", 3, r) for r in range(64)}
    assert len(span_ids) == 64 and identity.step_span_id("run", 3) not in span_ids
    assert all(0 < t < 2**128 for t in trace_ids)
    assert all(0 < s < 2**64 for s in span_ids)


def test_the_emitters_step_ids_are_the_derived_ones():
    # StepIds hashes the run's prefix once (the emitter, each step); every other module and
    # rank derives the ids with the functions: they must agree, for any run id and rank
    for run_id in ("run", "", "ünï\x1fcode-ид", "a" * 200):
        for rank in (0, 7, 1023):
            ids = identity.StepIds(run_id, rank)
            for step in (*range(200), 10**15):
                assert ids.of(step) == (identity.step_trace_id(run_id, step),
                                        identity.rank_step_span_id(run_id, step, rank))


def test_trace_id_ratio_sampling_keeps_about_the_ratio():
    sampler = TraceIdRatioBased(0.25)
    kept = sum(sampler.should_sample(None, identity.step_trace_id("r", s), "x").decision
               .is_sampled() for s in range(4000))
    assert 850 < kept < 1150


def test_explicit_run_id_wins_over_the_launcher():
    env = {"TORCHELASTIC_RUN_ID": "elastic-1"}
    assert identity.agree_run_id("mine", env) == "mine"
    assert identity.agree_run_id(None, env) == "elastic-1"


def test_torchrun_default_none_is_not_a_run_id():
    run_id = identity.agree_run_id(None, {"TORCHELASTIC_RUN_ID": "none"})
    assert run_id != "none" and len(run_id) == 16


def test_run_ids_are_sanitized_into_a_path_token():
    assert identity.sanitize_run_id("job/42 x") == "job-42-x"
    assert identity.sanitize_run_id("..") != ".."


def test_several_ranks_without_a_process_group_warn():
    with pytest.warns(ConfigWarning, match="OTEL_TRAIN_RUN_ID"):
        identity.agree_run_id(None, {"WORLD_SIZE": "4"})


def test_traceparent_is_parsed():
    ctx = identity.launcher_context(
        {"TRACEPARENT": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    assert ctx is not None and ctx.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert ctx.span_id == 0x00F067AA0BA902B7 and ctx.is_remote
    assert identity.launcher_context({}) is None
