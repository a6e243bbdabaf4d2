"""Compile telemetry: spans, reasons and counts for a graph break, a shape-change recompile,
a recompile storm past the limit and a clean model; re-registration after reset; teardown."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from support import otlp_files
from torch import nn

import otel_train
from otel_train import identity, semconv

BACKEND = "aot_eager"  # dynamo + AOT autograd, no C++ builds: the machine is small


class MLP(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu()
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.b(h)


def _train(model: nn.Module, batch_sizes: list[int], tmp_path: Path) -> Path:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with otel_train.instrument(model, output_dir=tmp_path):
        for bs in batch_sizes:
            x, y = torch.randn(bs, 8), torch.randn(bs, 1)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return otlp_files.only_run_dir(tmp_path)


def _compiles(run_dir: Path) -> list[dict]:
    spans = otlp_files.spans(run_dir)
    return sorted((s for s in spans if s["name"] == semconv.SPAN_COMPILE),
                  key=lambda s: int(s["startTimeUnixNano"]))


def _dynamo(compiles: list[dict]) -> list[dict]:
    return [s for s in compiles if s["attrs"][semconv.ATTR_COMPILE_TRIGGER] != "lazy_backward"]


def _counter(run_dir: Path, name: str) -> dict[str | None, int]:
    last: dict[str | None, int] = {}
    for point in otlp_files.metric_points(run_dir, name):  # cumulative: the last one wins
        last[point["attrs"].get(semconv.ATTR_COMPILE_REASON)] = int(point["asInt"])
    return {k: v for k, v in last.items() if v}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def test_clean_model_compiles_once_in_step_zero(tmp_path):
    run_dir = _train(torch.compile(MLP(), backend=BACKEND), [4, 4, 4], tmp_path)
    spans = otlp_files.spans(run_dir)
    compiles = _compiles(run_dir)
    [forward] = _dynamo(compiles)
    attrs = forward["attrs"]
    assert attrs[semconv.ATTR_COMPILE_REASON] == semconv.COMPILE_REASON_FIRST
    assert attrs[semconv.ATTR_COMPILE_GRAPH_BREAKS] == 0
    assert attrs[semconv.ATTR_COMPILE_GRAPHS] == 1
    assert attrs[semconv.ATTR_COMPILE_FRAME].startswith("forward (")
    assert attrs[semconv.ATTR_COMPILE_TIME_PREFIX + "dynamo_s"] > 0
    assert attrs[semconv.ATTR_COMPILE_TIME_PREFIX + "aot_autograd_s"] > 0
    assert len(attrs[semconv.ATTR_COMPILE_FINGERPRINT]) == 16
    run_id = run_dir.name
    rank_step0 = next(s for s in spans if s["name"] == semconv.SPAN_RANK_STEP
                      and s["attrs"][semconv.ATTR_STEP] == 0)
    for span in compiles:  # the forward and its lazy backward: both in step 0's trace
        assert span["attrs"][semconv.ATTR_STEP] == 0
        assert span["traceId"] == f"{identity.step_trace_id(run_id, 0):032x}"
        assert span["parentSpanId"] == f"{identity.rank_step_span_id(run_id, 0, 0):016x}"
    total = sum(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) for s in compiles) / 1e9
    compile_total = rank_step0["attrs"][semconv.ATTR_PHASE_TOTAL_PREFIX + semconv.PHASE_COMPILE]
    assert compile_total == pytest.approx(total, rel=1e-6)
    later = [s for s in spans if s["name"] == semconv.SPAN_RANK_STEP
             and s["attrs"][semconv.ATTR_STEP] > 0]
    assert all(semconv.ATTR_PHASE_TOTAL_PREFIX + "compile" not in s["attrs"] for s in later)
    assert _counter(run_dir, semconv.METRIC_COMPILE_RECOMPILES) == {}
    assert _counter(run_dir, semconv.METRIC_COMPILE_GRAPH_BREAKS) == {}
    assert _counter(run_dir, semconv.METRIC_COMPILE_GRAPHS) == {None: 1}
    [hist] = [p for p in otlp_files.metric_points(run_dir, semconv.METRIC_COMPILE_DURATION)
              if p["attrs"][semconv.ATTR_COMPILE_TRIGGER] == "dynamo"][-1:]
    assert int(hist["count"]) == 1
    assert hist["exemplars"][0]["spanId"] == forward["spanId"]


def test_graph_break_gives_two_graphs_and_the_break_reason(tmp_path):
    run_dir = _train(torch.compile(MLP(graph_break=True), backend=BACKEND), [4, 4], tmp_path)
    broken, resumed = _dynamo(_compiles(run_dir))
    assert broken["attrs"][semconv.ATTR_COMPILE_GRAPH_BREAKS] == 1
    # an OTLP arrayValue of strings, decoded to a list
    [reason] = broken["attrs"][semconv.ATTR_COMPILE_GRAPH_BREAK_REASONS]
    assert reason.startswith("Call to `torch._dynamo.graph_break()`")
    assert resumed["attrs"][semconv.ATTR_COMPILE_FRAME].startswith("torch_dynamo_resume_in_")
    assert resumed["attrs"][semconv.ATTR_COMPILE_GRAPH_BREAKS] == 0
    for span in (broken, resumed):
        assert span["attrs"][semconv.ATTR_COMPILE_REASON] == semconv.COMPILE_REASON_FIRST
        assert span["attrs"][semconv.ATTR_STEP] == 0
    assert _counter(run_dir, semconv.METRIC_COMPILE_GRAPH_BREAKS) == {
        "Call to `torch._dynamo.graph_break()`": 1}
    assert _counter(run_dir, semconv.METRIC_COMPILE_RECOMPILES) == {}
    assert _counter(run_dir, semconv.METRIC_COMPILE_GRAPHS) == {None: 2}


def test_shape_change_recompiles_once_with_the_guard_failure(tmp_path):
    run_dir = _train(torch.compile(MLP(), backend=BACKEND), [4, 4, 6, 6, 7], tmp_path)
    first, recompile = _dynamo(_compiles(run_dir))  # then dynamic: 7 compiles nothing
    assert first["attrs"][semconv.ATTR_STEP] == 0
    attrs = recompile["attrs"]
    assert attrs[semconv.ATTR_STEP] == 2
    assert attrs[semconv.ATTR_COMPILE_REASON] == semconv.COMPILE_REASON_TENSOR_SHAPE
    assert "size mismatch at index 0. expected 4, actual 6" in attrs[
        semconv.ATTR_COMPILE_GUARD_FAILURE]
    assert recompile["traceId"] == f"{identity.step_trace_id(run_dir.name, 2):032x}"
    assert _counter(run_dir, semconv.METRIC_COMPILE_RECOMPILES) == {
        semconv.COMPILE_REASON_TENSOR_SHAPE: 1}


def test_recompile_storm_past_the_limit_is_a_warning_and_a_count(tmp_path):
    model = torch.compile(MLP(), backend=BACKEND, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2):
        run_dir = _train(model, [2, 3, 4, 5, 6], tmp_path)
    compiles = _dynamo(_compiles(run_dir))
    reasons = [(s["attrs"][semconv.ATTR_STEP], s["attrs"][semconv.ATTR_COMPILE_REASON])
               for s in compiles]
    assert reasons == [(0, semconv.COMPILE_REASON_FIRST), (1, semconv.COMPILE_REASON_TENSOR_SHAPE),
                       (2, semconv.COMPILE_REASON_RECOMPILE_LIMIT)]
    hit = compiles[-1]["attrs"]
    assert hit[semconv.ATTR_COMPILE_RECOMPILE_LIMIT_HIT] is True
    assert hit[semconv.ATTR_COMPILE_RECOMPILE_LIMIT] == 2
    assert hit[semconv.ATTR_COMPILE_FRAME].startswith("forward (")
    assert "expected 3, actual 4" in hit[semconv.ATTR_COMPILE_GUARD_FAILURE]
    assert _counter(run_dir, semconv.METRIC_COMPILE_RECOMPILES) == {
        semconv.COMPILE_REASON_TENSOR_SHAPE: 1}
    limit = otlp_files.metric_points(run_dir, semconv.METRIC_COMPILE_RECOMPILE_LIMIT_HITS)
    assert int(limit[-1]["asInt"]) == 1
    assert limit[-1]["attrs"][semconv.ATTR_COMPILE_FRAME] == hit[semconv.ATTR_COMPILE_FRAME]
    [warning] = [r for r in otlp_files.logs(run_dir)
                 if r["body"].get("stringValue") == semconv.LOG_COMPILE_RECOMPILE_LIMIT]
    assert warning["severityText"] == "WARNING"
    assert warning["traceId"] == compiles[-1]["traceId"]
    assert warning["attrs"][semconv.LOG_STEP] == 2


def test_reset_inside_the_run_keeps_callbacks_and_exit_removes_them(tmp_path):
    handler = torch._dynamo.callback.callback_handler
    before = (list(handler.start_callbacks), list(handler.end_callbacks))
    reset = torch._dynamo.reset
    model = torch.compile(MLP(), backend=BACKEND)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with otel_train.instrument(model, output_dir=tmp_path):
        for step in range(3):
            if step == 1:
                torch._dynamo.reset()  # clears every callback, and the compiled code
            nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
            opt.step()
            opt.zero_grad()
    assert (handler.start_callbacks, handler.end_callbacks) == before
    assert torch._dynamo.reset is reset
    compiles = _dynamo(_compiles(otlp_files.only_run_dir(tmp_path)))
    assert [s["attrs"][semconv.ATTR_STEP] for s in compiles] == [0, 1]
    assert all(s["attrs"][semconv.ATTR_COMPILE_TRIGGER] == "dynamo" for s in compiles)
    assert collections.Counter(s["attrs"][semconv.ATTR_COMPILE_REASON] for s in compiles) == {
        semconv.COMPILE_REASON_FIRST: 2}
