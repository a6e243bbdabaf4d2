"""Compile telemetry under the hard rules and across ranks: the compile source adds no graph
break and no recompile (dynamo's counters are identical with and without it, for the clean
model under every wrapping and for the graph-break and recompile models), and two gloo ranks
that compiled different shapes are reported inconsistent, while equal ones are not."""

from __future__ import annotations

import importlib
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import otlp_files, training
from test_compile_invariance import (
    _ddp_compile,
    _fsdp2_compile,
    _module_compile,
    _torch_compile,
)
from test_compile_telemetry import MLP
from torch._dynamo.utils import counters

import otel_train
from otel_train import semconv

instrument_module = importlib.import_module("otel_train.instrument")  # the package's
# attribute of that name is the function


def _counters_and_spans(wrap, instrumented: bool, tmp_path: Path) -> tuple[dict, int]:
    torch._dynamo.reset()
    counters.clear()
    model, opt, loader = training.setup(batches=4)
    model = wrap(model)
    if instrumented:
        with otel_train.instrument(model, output_dir=tmp_path / "run") as inst:
            training.train(model, opt, loader, epochs=1)
        spans = otlp_files.spans(tmp_path / "run" / inst.run_id)
        compiles = sum(s["name"] == semconv.SPAN_COMPILE for s in spans)
    else:
        training.train(model, opt, loader, epochs=1)
        compiles = 0
    return {key: dict(value) for key, value in counters.items()}, compiles


@pytest.fixture(autouse=True)
def _only_the_compile_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is checked here is this source; other sources have their own invariance tests."""
    monkeypatch.setattr(instrument_module, "SOURCES",
                        ("otel_train.sources.compile:CompileSource",))


WRAPS = [_torch_compile, _module_compile]
DIST_WRAPS = [_fsdp2_compile, _ddp_compile]


@pytest.mark.parametrize("wrap", WRAPS, ids=["torch.compile(model)", "model.compile()"])
def test_compile_source_adds_no_break_or_recompile(wrap, tmp_path):
    _counters_and_spans(wrap, False, tmp_path)  # warm-up: one-time internals traced once
    bare, _ = _counters_and_spans(wrap, False, tmp_path)
    instrumented, compiles = _counters_and_spans(wrap, True, tmp_path)
    assert instrumented == bare
    assert compiles >= 1, "the compile source was active"


@pytest.mark.parametrize("wrap", DIST_WRAPS, ids=["fsdp2+compile", "ddp+compile"])
def test_compile_source_adds_no_break_or_recompile_distributed(wrap, tmp_path,
                                                               single_rank_group):
    _counters_and_spans(wrap, False, tmp_path)
    bare, _ = _counters_and_spans(wrap, False, tmp_path)
    instrumented, compiles = _counters_and_spans(wrap, True, tmp_path)
    assert instrumented == bare
    assert compiles >= 1


def _break_and_recompile(instrumented: bool, tmp_path: Path) -> dict:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = torch.compile(MLP(graph_break=True), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        for bs in (4, 4, 6):
            torch.nn.functional.mse_loss(model(torch.randn(bs, 8)), torch.randn(bs, 1)).backward()
            opt.step()
            opt.zero_grad()

    if instrumented:
        with otel_train.instrument(model, output_dir=tmp_path):
            loop()
    else:
        loop()
    return {key: dict(value) for key, value in counters.items()}


def test_counters_identical_for_a_graph_break_and_a_recompile(tmp_path):
    _break_and_recompile(False, tmp_path)
    bare = _break_and_recompile(False, tmp_path)
    assert sum(bare["graph_break"].values()) == 2
    assert _break_and_recompile(True, tmp_path) == bare


# --- two gloo ranks --------------------------------------------------------------------

def _rank(rank: int, port: int, out: str, batch_sizes: tuple[int, int]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.compile(MLP(), backend="eager", dynamic=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        bs = batch_sizes[rank]
        with otel_train.instrument(model, output_dir=out, run_id="compile-consistency",
                                   exporter="file"):
            for _ in range(3):
                torch.nn.functional.mse_loss(model(torch.randn(bs, 8)),
                                             torch.randn(bs, 1)).backward()
                opt.step()
                opt.zero_grad()
        dist.barrier()  # keep rank 0's store up until every rank has compared
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path: Path, batch_sizes: tuple[int, int]) -> Path:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path), batch_sizes), nprocs=2, join=True)
    return tmp_path / "compile-consistency"


def _inconsistency(run_dir: Path) -> tuple[list[dict], dict[int, int]]:
    warnings = [r for r in otlp_files.logs(run_dir)
                if r["body"].get("stringValue") == semconv.LOG_COMPILE_INCONSISTENT]
    gauge: dict[int, int] = {}
    for point in otlp_files.metric_points(run_dir, semconv.METRIC_COMPILE_INCONSISTENT):
        rank = point["attrs"][semconv.ATTR_RANK]
        gauge[rank] = max(gauge.get(rank, 0), int(point.get("asInt", point.get("asDouble", 0))))
    return warnings, gauge


@pytest.mark.slow
def test_two_ranks_with_different_shapes_are_reported_inconsistent(tmp_path):
    warnings, gauge = _inconsistency(_two_ranks(tmp_path, (4, 6)))
    [warning] = warnings
    assert warning["attrs"][semconv.LOG_RANK] == 1
    assert warning["attrs"][semconv.ATTR_COMPILE_INCONSISTENCY] == "graph"
    assert warning["attrs"]["graph_index"] == 0
    assert warning["severityText"] == "WARNING"
    assert gauge == {0: 0, 1: 1}


@pytest.mark.slow
def test_two_ranks_with_equal_shapes_are_consistent(tmp_path):
    warnings, gauge = _inconsistency(_two_ranks(tmp_path, (4, 4)))
    assert warnings == []
    assert gauge == {0: 0, 1: 0}
