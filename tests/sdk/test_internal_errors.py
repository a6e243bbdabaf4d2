"""Exceptions otel-train swallows on its hook paths are counted and logged once, never silent
(issue 16, item 5; otel_train/internal_errors.py).

A real fault on a real hook path: a batch of an exotic tensor type whose ``dim()`` raises
reaches the DataLoader hook, which reads samples and tokens off batch shapes. Training goes
on; the error is counted by component, exported as ``otel_train.internal.errors`` and logged
once (tests/gpu/test_no_sync.py asserts zero of them on a GPU run).
"""

from __future__ import annotations

import torch
from support import otlp_files, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train
from otel_train import internal_errors, semconv


class NoDims(torch.Tensor):
    """A tensor type that cannot say how many dimensions it has (an exotic batch)."""

    def dim(self) -> int:
        raise RuntimeError("exotic batch: no dim()")


def _collate(items):
    x = torch.stack([i[0] for i in items]).as_subclass(NoDims)
    return x, torch.stack([i[1] for i in items])


def test_a_failing_hook_is_counted_exported_and_logged_once(tmp_path, capfd) -> None:
    model, opt, _ = training.setup()
    data = TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
    loader = DataLoader(data, batch_size=4, collate_fn=_collate)
    before = internal_errors.snapshot().get("batch_size", 0)
    with otel_train.instrument(model, output_dir=tmp_path):
        for x, y in loader:
            nn.functional.mse_loss(model(x.as_subclass(torch.Tensor)), y).backward()
            opt.step()
            opt.zero_grad()
    assert internal_errors.snapshot().get("batch_size", 0) - before == 3  # training went on
    points = [p for p in otlp_files.metric_points(otlp_files.only_run_dir(tmp_path),
                                                  semconv.METRIC_INTERNAL_ERRORS)
              if p["attrs"].get(semconv.ATTR_COMPONENT) == "batch_size"]
    assert points and int(points[-1]["asInt"]) == 3
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "otel_train.internal_error" in line]
    assert len(lines) == 1 and "batch_size" in lines[0] and "no dim()" in lines[0]


def test_a_tally_counts_every_error_and_logs_only_the_first_few() -> None:
    tally = internal_errors.Tally(log_first=2)
    before = internal_errors.snapshot().get("tally_test", 0)
    logged = [tally.add(RuntimeError(str(i)), "tally_test") for i in range(4)]
    assert logged == [True, True, False, False]
    assert tally.errors == 4
    assert internal_errors.snapshot().get("tally_test", 0) - before == 4


def test_a_failing_tick_listener_is_counted_as_the_emitter_s_and_exported(tmp_path) -> None:
    """A source's tick listener that raises on the emitter thread: training and the emitter
    go on, and the error is in otel_train.internal.errors{component=emitter}."""
    model, opt, loader = training.setup(batches=3)
    before = internal_errors.snapshot().get("emitter", 0)

    def broken() -> None:
        raise RuntimeError("a source's tick failed")

    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        inst.emitter.on_tick(broken)
        assert training.train(model, opt, loader) == 3
    assert internal_errors.snapshot().get("emitter", 0) - before >= 1
    points = [p for p in otlp_files.metric_points(otlp_files.only_run_dir(tmp_path),
                                                  semconv.METRIC_INTERNAL_ERRORS)
              if p["attrs"].get(semconv.ATTR_COMPONENT) == "emitter"]
    assert points and int(points[-1]["asInt"]) >= 1
    spans = otlp_files.spans(otlp_files.only_run_dir(tmp_path))
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in spans) == 3  # nothing else lost
