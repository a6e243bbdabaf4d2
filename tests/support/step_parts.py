"""What every run must show of one account of a step's time (issue 51): each
``training.rank_step``'s parts add up to the span, and the parts' counter to the step
histogram's sum on every rank. Used by the demo's, the gloo and the NCCL GPU tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_train import semconv as sc
from otel_train.analysis.metrics import read_metrics
from support import otlp_files


def rank_steps(run_dir: Path) -> list[dict]:
    """Every training.rank_step span: rank, step, duration and parts (seconds)."""
    out = []
    for span in otlp_files.spans(run_dir):
        if span["name"] != sc.SPAN_RANK_STEP:
            continue
        attrs = span["attrs"]
        out.append({"rank": int(attrs[sc.ATTR_RANK]), "step": int(attrs[sc.ATTR_STEP]),
                    "duration": (int(span["endTimeUnixNano"])
                                 - int(span["startTimeUnixNano"])) / 1e9,
                    "parts": {p: float(attrs[sc.ATTR_RANK_STEP_PART_PREFIX + p])
                              for p in sc.PARTS}})
    return out


def assert_parts_add_up(run_dir: Path, ranks: set[int]) -> list[dict]:
    """Every rank step's parts add up to it within 1%, on every rank; so do the parts'
    counter and the step histogram's sum. The rank steps, for more assertions."""
    steps = rank_steps(run_dir)
    assert {s["rank"] for s in steps} == ranks
    for s in steps:
        assert sum(s["parts"].values()) == pytest.approx(s["duration"], rel=0.01), s
    metrics = read_metrics(run_dir)
    histogram = metrics.per_rank_total(sc.METRIC_STEP_DURATION)
    parts = metrics.per_rank_total(sc.METRIC_STEP_TIME)
    assert set(histogram) == ranks
    for rank, seconds in histogram.items():
        assert parts[rank] == pytest.approx(seconds, rel=1e-6), rank
    return steps
