"""The emitter's step sampling decision is the configured OpenTelemetry sampler's."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace import sampling

from otel_train import semconv
from otel_train.config import Config
from otel_train.emitter.steps import _step_decision

NAMES = ("always_on", "always_off", "parentbased_always_on", "parentbased_always_off",
         "traceidratio", "parentbased_traceidratio")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("ratio", (0.0, 0.1, 0.5, 1.0))
def test_the_fast_decision_is_the_samplers_own(name, ratio):
    sampler = Config(sampler_name=name, sampler_arg=ratio).sampler()
    decide = _step_decision(sampler)
    rng = random.Random(7)
    # random ids, and ids at the ratio's bound (the rule compares the low 64 bits)
    bound = sampling.TraceIdRatioBased.get_bound_for_rate(ratio)
    ids = [rng.getrandbits(128) or 1 for _ in range(4000)]
    ids += [(rng.getrandbits(64) << 64) | max(1, min(bound + d, (1 << 64) - 1))
            for d in (-1, 0, 1)]
    kept = 0
    for trace_id in ids:
        expected = sampler.should_sample(None, trace_id, semconv.SPAN_STEP).decision.is_sampled()
        assert decide(trace_id) == expected, trace_id
        kept += expected
    if "traceidratio" in name and 0 < ratio < 1:
        assert 0 < kept < len(ids)  # both outcomes were compared


def test_a_sampler_of_its_own_is_asked():
    class EveryThird(sampling.Sampler):
        def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
            decision = (sampling.Decision.RECORD_AND_SAMPLE if trace_id % 3 == 0
                        else sampling.Decision.DROP)
            return sampling.SamplingResult(decision)

        def get_description(self) -> str:
            return "every third"

    decide = _step_decision(sampling.ParentBased(EveryThird()))
    assert [decide(i) for i in range(1, 7)] == [False, False, True, False, False, True]
