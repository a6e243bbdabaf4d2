"""Hard rule: instrumentation adds no graph break and no recompile.

Dynamo's counters (frames, graphs, graph breaks with their reasons, resumes, recompiles)
must be identical for the same compiled training run with and without ``instrument()``.
The counters do see a hook that reads the clock inside a compiled region: see
``test_the_check_sees_a_clock_read_inside_the_graph``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from support import training
from torch._dynamo.utils import counters

import otel_train

BACKEND = "aot_eager"  # dynamo + AOT autograd, as inductor sees them, without C++ builds


def _torch_compile(model):
    return torch.compile(model, backend=BACKEND)


def _module_compile(model):
    model.compile(backend=BACKEND)
    return model


def _fsdp2_compile(model):
    # torchtitan's pattern: compile each block, shard each block, then shard the root
    from torch.distributed.fsdp import fully_shard

    model.net = torch.compile(model.net, backend=BACKEND)
    fully_shard(model.net)
    fully_shard(model)
    return model


def _ddp_compile(model):
    return torch.compile(torch.nn.parallel.DistributedDataParallel(model), backend=BACKEND)


def _dynamo_counters(wrap: Callable, instrumented: bool, tmp_path) -> dict:
    torch._dynamo.reset()
    counters.clear()
    model, opt, loader = training.setup(batches=6)
    model = wrap(model)
    if instrumented:
        with otel_train.instrument(model, output_dir=tmp_path):
            training.train(model, opt, loader, epochs=2)
    else:
        training.train(model, opt, loader, epochs=2)
    return {key: dict(value) for key, value in counters.items()}


@pytest.mark.parametrize("wrap", [_torch_compile, _module_compile],
                         ids=["torch.compile(model)", "model.compile()"])
def test_no_added_graph_break_or_recompile(wrap, tmp_path):
    _dynamo_counters(wrap, False, tmp_path)  # warm-up: dynamo traces one-time internals once
    bare = _dynamo_counters(wrap, False, tmp_path)
    assert bare["stats"]["unique_graphs"] >= 1
    assert _dynamo_counters(wrap, True, tmp_path) == bare


@pytest.mark.parametrize("wrap", [_fsdp2_compile, _ddp_compile], ids=["fsdp2+compile",
                                                                     "ddp+compile"])
def test_no_added_graph_break_or_recompile_distributed(wrap, tmp_path, single_rank_group):
    _dynamo_counters(wrap, False, tmp_path)  # warm-up: dynamo traces one-time internals once
    bare = _dynamo_counters(wrap, False, tmp_path)
    assert bare["stats"]["unique_graphs"] >= 1
    assert _dynamo_counters(wrap, True, tmp_path) == bare


def test_the_check_sees_a_clock_read_inside_the_graph(tmp_path):
    """The naive way (forward hooks on a ``model.compile()``'d module) does break graphs."""

    def naive(model):
        model = _module_compile(model)
        model.register_forward_pre_hook(lambda m, a: None if time.perf_counter_ns() else None)
        return model

    bare = _dynamo_counters(_module_compile, False, tmp_path)
    hooked = _dynamo_counters(naive, False, tmp_path)
    assert "graph_break" not in bare and sum(hooked["graph_break"].values()) > 0
