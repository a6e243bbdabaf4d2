"""Collectives of DDP, FSDP2 and FSDP1 on real gloo ranks: ops, sizes, parents, stalls.

The ranks run this file as a script (``python tests/collectives/test_collectives.py ...``): a small MLP,
wrapped as asked, trained a few steps under ``instrument()``; each step ends with an explicit
``dist.all_reduce`` of the loss (the usual "average the loss for logging"), which one rank
can be told to reach late.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from support import otlp_files
from support.pipeline_fixtures import free_port
from torch._dynamo.utils import counters

import otel_train
from otel_train import collectives_math, config, semconv
from otel_train.config import ConfigWarning

REPO = Path(__file__).resolve().parents[2]
DIM, HIDDEN = 32, 64


# --- the ranks ---------------------------------------------------------------------------
def _model(parallel: str, backend: str | None):  # noqa: ANN202
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, 1))
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    elif parallel == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, use_orig_params=True,
                                         device_id=torch.device("cpu"))
    else:
        model = nn.parallel.DistributedDataParallel(model)
    if backend:
        model = torch.compile(model, backend=backend)
    return model


def _rank(rank: int, args: dict, port: int) -> None:
    import torch
    import torch.distributed as dist

    import otel_train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args["ranks"]),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args["ranks"])
    try:
        model = _model(args["parallel"], args["backend"])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with otel_train.instrument(model, optimizer=opt, run_id=args["run_id"],
                                   output_dir=args["out"]):
            for step in range(args["steps"]):
                x = torch.randn(8, DIM)
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                if rank == args["slow_rank"] and step == args["slow_step"]:
                    time.sleep(args["delay_s"])  # this rank reaches the all-reduce late
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss)
    finally:
        dist.destroy_process_group()


def _main() -> None:
    import torch.multiprocessing as mp

    args = json.loads(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(args, port), nprocs=args["ranks"], join=True,
                       start_method="spawn")


# --- the tests ---------------------------------------------------------------------------
def _train(tmp_path: Path, parallel: str, ranks: int = 2, steps: int = 3, backend: str | None = None,
           slow_rank: int = -1, slow_step: int = -1, delay_s: float = 0.0, **env: str) -> Path:
    args = {"parallel": parallel, "ranks": ranks, "steps": steps, "backend": backend,
            "slow_rank": slow_rank, "slow_step": slow_step, "delay_s": delay_s,
            "run_id": f"{parallel}-{ranks}", "out": str(tmp_path)}
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("OTEL_", "TORCHELASTIC_")) and k != "TRACEPARENT"}
    full_env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
                    OTEL_TRAIN_EMIT_INTERVAL_MS="50")
    full_env.update(env)
    out = subprocess.run([sys.executable, __file__, json.dumps(args)], env=full_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return tmp_path / args["run_id"]


def _collectives(run_dir: Path) -> tuple[list[dict], dict[str, dict]]:
    spans = otlp_files.spans(run_dir)
    by_id = {s["spanId"]: s for s in spans}
    return [s for s in spans if s["name"] == semconv.SPAN_COLLECTIVE], by_id


def _param_bytes(world: int = 1) -> dict[str, int]:
    """Parameter bytes of each linear layer of the model (the FSDP2 units: 0, 2, root 4),
    with FSDP2's padding of dim 0 to a multiple of the world size."""
    shapes = {"0": (DIM, HIDDEN), "2": (HIDDEN, HIDDEN), "4": (HIDDEN, 1)}
    padded = {name: (i, -(-o // world) * world) for name, (i, o) in shapes.items()}
    return {name: (i * o + o) * 4 for name, (i, o) in padded.items()}


def _per_step(colls: list[dict], rank: int, op: str) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for s in colls:
        a = s["attrs"]
        if a[semconv.ATTR_RANK] == rank and a[semconv.ATTR_COLLECTIVE_OP] == op:
            out[a[semconv.ATTR_STEP]].append(a[semconv.ATTR_COLLECTIVE_BYTES])
    return out


def _parents(colls: list[dict], by_id: dict, op: str, api_prefix: str = "") -> set[str]:
    return {by_id[s["parentSpanId"]]["name"] for s in colls
            if s["attrs"][semconv.ATTR_COLLECTIVE_OP] == op
            and s["attrs"][semconv.ATTR_COLLECTIVE_API].startswith(api_prefix)}


def _assert_loss_all_reduce(colls: list[dict], by_id: dict, ranks: int, steps: int) -> None:
    """The loop's own all-reduce: 4 bytes, after the optimizer. A step ends when its optimizer
    step does, so it lies in the next step, before its forward (directly under the rank step);
    the last one is after the last step: metrics only."""
    loss = [s for s in colls if s["attrs"][semconv.ATTR_COLLECTIVE_API] == "all_reduce"
            and s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] == 4]
    assert sorted(s["attrs"][semconv.ATTR_STEP] for s in loss) == sorted(
        list(range(1, steps)) * ranks)
    assert {by_id[s["parentSpanId"]]["name"] for s in loss} == {semconv.SPAN_RANK_STEP}


def _assert_metrics(run_dir: Path, ranks: int) -> None:
    keys = {(s["traceId"], s["spanId"]) for s in otlp_files.spans(run_dir)}
    points = otlp_files.metric_points(run_dir, semconv.METRIC_COLLECTIVE_DURATION)
    assert {p["attrs"][semconv.ATTR_RANK] for p in points} == set(range(ranks))
    exemplars = [e for p in points for e in p.get("exemplars", [])]
    assert exemplars and all((e["traceId"], e["spanId"]) in keys for e in exemplars)
    phases = {p["attrs"][semconv.ATTR_PHASE] for p in
              otlp_files.metric_points(run_dir, semconv.METRIC_PHASE_DURATION)}
    assert semconv.PHASE_EXPOSED_COMM in phases
    overlap = otlp_files.metric_points(run_dir, semconv.METRIC_COMM_OVERLAP)
    assert overlap and all(0.0 <= float(p["asDouble"]) <= 1.0 for p in overlap)
    sizes = otlp_files.metric_points(run_dir, semconv.METRIC_COLLECTIVE_SIZE)
    assert sizes and all(int(p["asInt"]) > 0 for p in sizes)


@pytest.mark.slow
def test_a_stall_is_reported_at_its_deadline_while_the_emitter_sleeps(tmp_path):
    # drains 5 s apart: the emitter sleeps through the stall unless it wakes for the deadline
    run_dir = _train(tmp_path, "ddp", steps=3, slow_rank=1, slow_step=1, delay_s=3.0,
                     OTEL_TRAIN_STALL_TIMEOUT_S="0.5", OTEL_TRAIN_EMIT_INTERVAL_MS="5000")
    logs = [r for r in otlp_files.logs(run_dir)
            if r["body"]["stringValue"] == semconv.LOG_COLLECTIVE_STALLED]
    assert len(logs) == 1 and logs[0]["attrs"][semconv.ATTR_RANK] == 0, logs
    # reported at the deadline, not at a drain (late, or after the collective ended)
    assert 0.5 <= logs[0]["attrs"]["pending_s"] <= 0.8, logs[0]["attrs"]


@pytest.mark.slow
def test_ddp_eager_all_reduces_gradients_under_backward_and_a_late_rank_is_a_stall(tmp_path):
    run_dir = _train(tmp_path, "ddp", steps=3, slow_rank=1, slow_step=1, delay_s=1.5,
                     OTEL_TRAIN_STALL_TIMEOUT_S="0.4")
    colls, by_id = _collectives(run_dir)
    grads = sum(_param_bytes().values())
    for rank in (0, 1):
        per_step = _per_step([s for s in colls if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] != 4],
                             rank, "all_reduce")
        assert {step: sum(b) for step, b in per_step.items()} == {0: grads, 1: grads, 2: grads}
    assert _parents([s for s in colls if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] != 4], by_id,
                    "all_reduce") == {semconv.SPAN_BACKWARD}
    _assert_loss_all_reduce(colls, by_id, 2, 3)
    _assert_metrics(run_dir, 2)
    # rank 0 waited 1.5 s in the loss all-reduce after step 1 (in step 2) for rank 1: a stall,
    # seen on rank 0 only
    stalled = [s for s in colls if s["attrs"].get(semconv.ATTR_COLLECTIVE_STALLED)]
    assert [(s["attrs"][semconv.ATTR_RANK], s["attrs"][semconv.ATTR_STEP],
             s["attrs"][semconv.ATTR_COLLECTIVE_BYTES]) for s in stalled] == [(0, 2, 4)]
    event = next(e for e in stalled[0]["events"] if e["name"] == semconv.EVENT_COLLECTIVE_STALLED)
    assert int(stalled[0]["startTimeUnixNano"]) < int(event["timeUnixNano"]) < int(
        stalled[0]["endTimeUnixNano"])
    logs = [r for r in otlp_files.logs(run_dir)
            if r["body"]["stringValue"] == semconv.LOG_COLLECTIVE_STALLED]
    assert len(logs) == 1 and logs[0]["severityText"] == "ERROR"
    attrs = logs[0]["attrs"]
    # the span's attribute names, on the log record too
    assert attrs[semconv.ATTR_COLLECTIVE_OP] == "all_reduce" and attrs[semconv.ATTR_RANK] == 0
    assert attrs[semconv.ATTR_COLLECTIVE_BYTES] == 4
    assert attrs[semconv.ATTR_COLLECTIVE_SEQ] == stalled[0]["attrs"][semconv.ATTR_COLLECTIVE_SEQ]
    assert attrs[semconv.ATTR_COLLECTIVE_GROUP] == \
        stalled[0]["attrs"][semconv.ATTR_COLLECTIVE_GROUP]
    assert (logs[0]["traceId"], logs[0]["spanId"]) == (stalled[0]["traceId"], stalled[0]["spanId"])
    # the late rank's all-reduce of that step has the same sequence number: the rank behind
    late = next(s for s in colls if s["attrs"][semconv.ATTR_RANK] == 1
                and s["attrs"][semconv.ATTR_STEP] == 2
                and s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] == 4)
    assert late["attrs"][semconv.ATTR_COLLECTIVE_SEQ] == attrs[semconv.ATTR_COLLECTIVE_SEQ]


@pytest.mark.slow
def test_fsdp2_compiled_gathers_in_forward_and_backward_reduce_scatters_in_backward(tmp_path):
    run_dir = _train(tmp_path, "fsdp2", steps=3, backend="aot_eager")
    colls, by_id = _collectives(run_dir)
    units = _param_bytes(world=2)
    for rank in (0, 1):
        gathers = _per_step(colls, rank, "all_gather")
        scatters = _per_step(colls, rank, "reduce_scatter")
        assert set(gathers) == set(scatters) == {0, 1, 2}
        for step in range(3):
            # forward gathers every unit, backward re-gathers the two resharded after forward
            assert sorted(gathers[step]) == sorted([*units.values(), units["0"], units["2"]])
            assert sorted(scatters[step]) == sorted(units.values())
    assert _parents(colls, by_id, "all_gather") == {semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD}
    assert _parents(colls, by_id, "reduce_scatter") == {semconv.SPAN_BACKWARD}
    _assert_loss_all_reduce(colls, by_id, 2, 3)
    _assert_metrics(run_dir, 2)
    bus = [s["attrs"][semconv.ATTR_COLLECTIVE_BUS_BW] for s in colls
           if s["attrs"][semconv.ATTR_COLLECTIVE_OP] == "all_gather"]
    assert bus and all(b > 0 for b in bus)


@pytest.mark.slow
def test_summary_spans_stand_for_every_collective_of_the_step(tmp_path):
    """OTEL_TRAIN_COLLECTIVE_SPANS=summary: one span per (phase, op, group) of a step whose
    count and bytes add up to exactly the collectives the default mode shows one by one."""
    run_dir = _train(tmp_path, "fsdp2", steps=3, backend="aot_eager",
                     OTEL_TRAIN_COLLECTIVE_SPANS="summary")
    colls, by_id = _collectives(run_dir)
    units = _param_bytes(world=2)
    count_of = semconv.ATTR_COLLECTIVE_COUNT
    for rank in (0, 1):
        for op, expected in (("all_gather", [*units.values(), units["0"], units["2"]]),
                             ("reduce_scatter", list(units.values()))):
            for step in range(3):
                mine = [s["attrs"] for s in colls if s["attrs"][semconv.ATTR_RANK] == rank
                        and s["attrs"][semconv.ATTR_STEP] == step
                        and s["attrs"][semconv.ATTR_COLLECTIVE_OP] == op]
                assert sum(a.get(count_of, 1) for a in mine) == len(expected), mine
                assert sum(a[semconv.ATTR_COLLECTIVE_BYTES] for a in mine) == sum(expected)
                assert len(mine) < len(expected), mine  # fewer spans than collectives
    summaries = [s for s in colls if s["attrs"].get(count_of, 1) > 1]
    assert summaries
    for span in summaries:
        a = span["attrs"]
        assert a[semconv.ATTR_COLLECTIVE_SEQ_LAST] >= a[semconv.ATTR_COLLECTIVE_SEQ]
        assert 0 < a[semconv.ATTR_COLLECTIVE_TOTAL_S] and a[semconv.ATTR_COLLECTIVE_BUS_BW] > 0
        assert int(span["startTimeUnixNano"]) < int(span["endTimeUnixNano"])
    assert _parents(colls, by_id, "all_gather") == {semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD}
    assert _parents(colls, by_id, "reduce_scatter") == {semconv.SPAN_BACKWARD}
    # the report counts collectives, not spans
    from otel_train.analysis.build import build_report

    rows = {row.op: row for row in build_report(run_dir).collectives}
    assert rows["all_gather"].count == 2 * 3 * 5 and rows["reduce_scatter"].count == 2 * 3 * 3
    _assert_metrics(run_dir, 2)


@pytest.mark.slow
def test_auto_mode_summarises_the_steps_past_the_span_budget(tmp_path):
    """The default span policy (auto): within the rank's budget every collective is its own
    span (the other tests here run with it); past it the whole step is summarised, and the
    summaries still stand for every collective, which the metrics count one by one. A
    budget of one span a second (a burst of one) summarises every step of this job."""
    run_dir = _train(tmp_path, "fsdp2", steps=3, backend="aot_eager",
                     OTEL_TRAIN_COLLECTIVE_SPAN_RATE="1")
    colls, _ = _collectives(run_dir)
    count_of = semconv.ATTR_COLLECTIVE_COUNT
    units = _param_bytes(world=2)
    for rank in (0, 1):
        for step in range(3):
            gathers = [s["attrs"] for s in colls if s["attrs"][semconv.ATTR_RANK] == rank
                       and s["attrs"][semconv.ATTR_STEP] == step
                       and s["attrs"][semconv.ATTR_COLLECTIVE_OP] == "all_gather"]
            assert sum(a.get(count_of, 1) for a in gathers) == len(units) + 2, gathers
            assert len(gathers) < len(units) + 2, gathers  # summarised: fewer spans
    last: dict[int, int] = {}  # cumulative points: the last export of each rank's series
    for p in otlp_files.metric_points(run_dir, semconv.METRIC_COLLECTIVE_DURATION):
        if p["attrs"][semconv.ATTR_COLLECTIVE_OP] == "all_gather":
            last[p["attrs"][semconv.ATTR_RANK]] = int(p["count"])
    # every collective measured: the three steps' gathers (and any after the last step)
    assert set(last) == {0, 1} and all(n >= 3 * (len(units) + 2) for n in last.values())


@pytest.mark.slow
def test_fsdp1_four_ranks_gathers_and_reduce_scatters_the_flat_parameter(tmp_path):
    run_dir = _train(tmp_path, "fsdp1", ranks=4, steps=2)
    colls, by_id = _collectives(run_dir)
    flat = sum(_param_bytes().values())
    padded = -(-flat // 16) * 16  # the flat parameter is padded to a multiple of 4 ranks
    for rank in range(4):
        for step in (0, 1):
            assert set(_per_step(colls, rank, "all_gather")[step]) == {padded}
            assert _per_step(colls, rank, "reduce_scatter")[step] == [padded]
    assert semconv.SPAN_FORWARD in _parents(colls, by_id, "all_gather")
    assert _parents(colls, by_id, "reduce_scatter") == {semconv.SPAN_BACKWARD}
    assert {s["attrs"][semconv.ATTR_COLLECTIVE_GROUP_SIZE] for s in colls} == {4}
    _assert_loss_all_reduce(colls, by_id, 4, 2)


@pytest.mark.slow
def test_ddp_compiled_four_ranks_through_the_comm_hook_without_process_group_hooks(tmp_path):
    run_dir = _train(tmp_path, "ddp", ranks=4, steps=2, backend="aot_eager",
                     OTEL_TRAIN_COLLECTIVE_PG_HOOKS="0")
    colls, by_id = _collectives(run_dir)
    grads = sum(_param_bytes().values())
    assert {s["attrs"][semconv.ATTR_COLLECTIVE_SOURCE] for s in colls} == {"python"}
    for rank in range(4):
        per_step = _per_step([s for s in colls if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] != 4],
                             rank, "all_reduce")
        assert {step: sum(b) for step, b in per_step.items()} == {0: grads, 1: grads}
    assert _parents([s for s in colls if s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] != 4], by_id,
                    "all_reduce") == {semconv.SPAN_BACKWARD}
    _assert_metrics(run_dir, 4)


# --- in-process ------------------------------------------------------------------------
def _compiled_all_reduce_counters(instrumented: bool, tmp_path: Path) -> dict:
    torch._dynamo.reset()
    counters.clear()

    @torch.compile(backend="aot_eager")
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    model = torch.nn.Linear(4, 4)
    if instrumented:
        with otel_train.instrument(model, output_dir=tmp_path):
            for _ in range(3):
                step(model(torch.ones(2, 4)))
    else:
        for _ in range(3):
            step(model(torch.ones(2, 4)))
    return {key: dict(value) for key, value in counters.items()}


def test_a_collective_inside_a_compiled_region_adds_no_graph_break_or_recompile(
        tmp_path, single_rank_group):
    _compiled_all_reduce_counters(False, tmp_path)
    bare = _compiled_all_reduce_counters(False, tmp_path)
    assert bare["stats"]["unique_graphs"] >= 1
    assert _compiled_all_reduce_counters(True, tmp_path) == bare


def test_wrappers_are_restored_and_a_failing_recorder_never_fails_the_collective(
        tmp_path, single_rank_group):
    names = ("all_reduce", "all_gather_single", "reduce_scatter_single", "broadcast", "barrier")
    before = {n: getattr(dist, n) for n in names}
    model = torch.nn.Linear(4, 4)
    with otel_train.instrument(model, output_dir=tmp_path) as inst:
        assert all(getattr(dist, n) is not before[n] for n in names)
        source = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource")

        def broken(*args: object) -> None:
            raise RuntimeError("recorder broke")

        source.capture._put = broken  # the hot path's only side effect now raises
        t = torch.ones(3)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert torch.equal(t, torch.ones(3))
    assert {n: getattr(dist, n) for n in names} == before
    assert source.capture.errors > 0


@pytest.mark.parametrize("covered", [False, True])
def test_a_backend_recorded_elsewhere_costs_no_record_and_no_hook(single_rank_group, covered):
    """Where NCCL's profiler plugin or flight recorder records a backend's collectives
    (``skip_backends``), the training thread pays nothing more for them: the wrappers call
    the original at once and put no record, no process-group hook is registered on a group
    that backend serves alone, and a DDP module keeps its own C++ all-reduce instead of a
    Python comm hook. (Here gloo stands in as the covered backend; uncovered, the same
    calls record and hook.)"""
    from otel_train import torch_compat
    from otel_train.sources.collectives import capture as capture_mod

    put: list[tuple] = []

    class Tracker:
        step, pending_end_ns = 0, None

    cap = capture_mod.Capture(put.append, Tracker())
    if covered:
        cap.skip_backends.add("gloo")
    try:
        cap.wrap_functions()
        t = torch.ones(3)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(3))
        dist.barrier()
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        hooked_ddp = cap.hook_ddp(ddp, structlog_stub())
        hooked_groups = cap.hook_groups() if capture_mod.pg_hooks_available() else None
    finally:
        cap.remove()
    issued = [r for r in put if r[2][0] == capture_mod.ISSUE]
    if covered:
        assert issued == [] and put == [], put
        assert hooked_ddp == 0 and not torch_compat.ddp_comm_hook_registered(ddp)
        assert hooked_groups in (None, 0)
    else:
        assert len(issued) == 4, issued
        assert hooked_ddp == 1 and torch_compat.ddp_comm_hook_registered(ddp)
        assert hooked_groups in (None, 1)


def test_a_group_covered_whole_skips_its_collectives_and_no_other_group_does() -> None:
    """The wrappers' first look (``Capture._whole``): a group whose every backend is covered
    passes its collectives straight to torch, and nothing else does: not a mixed default
    group (``cpu:<covered>,cuda:gloo``) whose other backend's collectives must be recorded,
    not another backend's group, on any call after the look-ups were cached. torch's own
    "fake" backend (from its test utilities; a real ProcessGroup whose collectives do
    nothing) stands in for NCCL, which needs a GPU: it is the covered one here, and a meta
    tensor stands in for a device the mixed group's covered backend does not serve."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    from otel_train.sources.collectives import capture as capture_mod

    put: list[tuple] = []

    class Tracker:
        step, pending_end_ns = 0, None

    dist.init_process_group("cpu:fake,cuda:gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    cap = capture_mod.Capture(put.append, Tracker())
    cap.skip_backends.add("fake")
    try:
        covered_whole = dist.new_group([0], backend="fake")
        gloo_only = dist.new_group([0], backend="gloo")
        default_name = dist.group.WORLD.group_name
        cap.wrap_functions()
        t, elsewhere = torch.ones(3), torch.ones(3, device="meta")
        for _ in range(3):  # the first calls fill the caches, the later ones read them
            dist.all_reduce(t, group=covered_whole)
            dist.all_reduce(t)  # the default group's covered backend: not recorded
            dist.all_reduce(elsewhere)  # the same group, not its covered backend: recorded
            dist.all_reduce(t, group=gloo_only)
            dist.all_reduce(t, dist.ReduceOp.SUM, gloo_only)  # the group by position
    finally:
        cap.remove()
        dist.destroy_process_group()
    issued = [r[2] for r in put if r[2][0] == capture_mod.ISSUE]
    groups = [rec[5] for rec in issued]
    assert groups.count(gloo_only.group_name) == 6, groups
    assert groups.count(default_name) == 3, groups  # the meta tensor's, every time
    assert len(issued) == 9, issued
    assert cap._whole == {id(covered_whole)}, cap._whole


def test_the_group_look_ups_start_over_when_a_group_is_destroyed() -> None:
    """The wrappers' look-ups are keyed by the group's id, the default group's by id(None):
    a default group of a covered backend ("fake", standing in for NCCL as above), destroyed
    and made again with gloo inside one capture, must have the new group's collectives
    recorded, not passed on as the old one's were."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    from otel_train.sources.collectives import capture as capture_mod

    put: list[tuple] = []

    class Tracker:
        step, pending_end_ns = 0, None

    cap = capture_mod.Capture(put.append, Tracker())
    cap.skip_backends.add("fake")
    original_destroy = dist.destroy_process_group
    cap.wrap_functions()
    assert dist.destroy_process_group is not original_destroy
    t = torch.ones(3)
    try:
        dist.init_process_group("fake", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
        for _ in range(2):
            dist.all_reduce(t)  # covered whole: passed on, the default group noted
        assert cap._whole == {id(None)}, cap._whole
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
        for _ in range(2):
            dist.all_reduce(t)  # gloo: recorded
        name = dist.group.WORLD.group_name
    finally:
        cap.remove()
        if dist.is_initialized():
            dist.destroy_process_group()
    issued = [r[2] for r in put if r[2][0] == capture_mod.ISSUE]
    assert [(rec[4], rec[5]) for rec in issued] == [("gloo", name)] * 2, issued
    assert dist.destroy_process_group is original_destroy, "removed with the other wrappers"


def structlog_stub():  # noqa: ANN201
    import structlog

    return structlog.get_logger("test")


def test_bus_bandwidth_follows_nccl_tests():
    gb, second = 10**9, 1.0
    assert collectives_math.bus_bandwidth_gbps("all_reduce", gb, second, 4) == pytest.approx(1.5)
    assert collectives_math.bus_bandwidth_gbps("all_gather", gb, second, 4) == pytest.approx(0.75)
    assert (collectives_math.bus_bandwidth_gbps("reduce_scatter", gb, second, 2)
            == pytest.approx(0.5))
    assert collectives_math.bus_bandwidth_gbps("broadcast", gb, second, 8) == pytest.approx(1.0)
    assert collectives_math.bus_bandwidth_gbps("barrier", 0, second, 8) is None


def test_exposed_communication_is_in_flight_time_without_compute():
    # step [0, 100); compute 10-40 and 60-90; a sync collective 30-50 blocks the thread,
    # an async one 65-95 runs under compute until 90
    exposed, total = collectives_math.exposed_and_total(
        comm=[(30, 50), (65, 95)], blocking=[(30, 50)], compute=[(10, 40), (60, 90)],
        lo=0, hi=100)
    assert total == 20 + 30
    assert exposed == 20 + 5


@pytest.mark.parametrize("value,expected,warns", [("2.5", 2.5, False), ("0", 60.0, True),
                                                  ("soon", 60.0, True)])
def test_stall_timeout_setting(value, expected, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = config.load({"OTEL_TRAIN_STALL_TIMEOUT_S": value})
    assert cfg.stall_timeout_s == expected
    ours = [w for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(ours) == (1 if warns else 0)
    assert not ours or "OTEL_TRAIN_STALL_TIMEOUT_S" in str(ours[0].message)


if __name__ == "__main__":
    _main()


def test_the_flight_recorder_read_interval_follows_the_rate_of_collectives():
    from otel_train.sources.collectives.flight_recorder import read_interval_s

    # 2000 entries filling at 685 a second (FSDP on 2 H200s): read before 80% of it is used,
    # a tick early (reads happen on the emitter's ticks)
    assert read_interval_s(5.0, 2000, 685.0, 0.2) == pytest.approx(0.8 * 2000 / 685 - 0.2)
    assert read_interval_s(5.0, 2000, 10.0, 0.2) == 5.0  # slow jobs keep the configured one
    assert read_interval_s(5.0, 64, 1e5, 0.2) == 0.25  # never below the floor: reads cost
    assert read_interval_s(5.0, 0, 470.0) == 5.0 and read_interval_s(5.0, 2000, 0.0) == 5.0


def test_the_flight_recorder_size_reads_its_new_name_first(monkeypatch):
    from otel_train.sources.collectives.flight_recorder import buffer_size

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert buffer_size() == 2000
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")
    assert buffer_size() == 500
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    assert buffer_size() == 64
