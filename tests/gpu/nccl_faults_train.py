"""A user's DDP training script on NCCL with one fault injected, for the multi-rank NCCL tests
(tests/gpu/test_nccl_attribution.py) and the 8-rank proof (bench/multigpu/nccl_faults.py).

Written as users write theirs: a DataLoader with workers, the batch copied to the GPU at the
top of the loop (a pageable copy: where a host waiting for its GPU blocks), the model under
DDP, ``otel_train.instrument`` around the loop with default settings. Several ranks share GPU
0 (docs/multigpu.md): each rank gets its own ``NCCL_HOSTID`` before its process group exists.

    NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_PROFILER_PLUGIN=$(otel-train nccl-plugin) \\
    FAULT=hang FAULT_RANK=1 FAULT_STEPS=6 OTEL_TRAIN_OUTPUT_DIR=runs \\
    torchrun --standalone --nproc-per-node 2 tests/gpu/nccl_faults_train.py

FAULT: ``none``; ``hang`` (the rank sleeps ``HANG_S`` before its backward); ``cpu`` (0.4 s of
host work between forward and backward); ``gpu`` (extra matmuls inside the model's forward on
that rank's GPU); ``gpu_between`` (extra matmuls queued between forward and backward, outside
every phase: loss or metric code that launches kernels, the host not delayed); ``region``
(0.4 s of host work inside a region the user named ``metrics``, between forward and
backward: ``otel_train.region``); ``data`` (its
dataset stalls ``DATA_STALL_S`` on the step's batch, longer than the loader's prefetch
covers). Each fault's line carries a ``# FAULT:`` comment, which
the tests look up to check the line the report names.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
import time
from pathlib import Path

os.environ.setdefault("NCCL_HOSTID", f"otel-train-rank-{os.environ.get('RANK', '0')}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import otel_train  # noqa: E402
from otel_train.sources import gaps as _gaps  # noqa: E402

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEPS = {int(s) for s in os.environ.get("FAULT_STEPS", "6").split(",") if s}
STEPS = int(os.environ.get("STEPS", "14"))
HANG_S = float(os.environ.get("HANG_S", "4"))
HEAVY_S = float(os.environ.get("HEAVY_S", "0.4"))
DATA_STALL_S = float(os.environ.get("DATA_STALL_S", "2.5"))
GPU_BETWEEN_MATMULS = int(os.environ.get("GPU_BETWEEN_MATMULS", "200"))
WIDTH, BATCH = 1024, 64
#: where each rank writes otel-train's threads' CPU over the run's steady steps (for the
#: scaling figures, bench/multigpu/nccl_faults.py); unset: nothing measured
COST_OUT = os.environ.get("COST_OUT")
#: for the cost per collective (bench/multigpu/route_cost.py): this many more small
#: all-reduces each step, and BARE=1 runs the loop without otel-train
EXTRA_COLLECTIVES = int(os.environ.get("EXTRA_COLLECTIVES", "0"))
BARE = os.environ.get("BARE") == "1"
#: a measurement switch (route_cost.py's ``no_wrappers`` arm): otel-train without its
#: ``torch.distributed`` wrappers, to tell their share of the training thread's cost
NO_WRAPPERS = os.environ.get("COST_NO_WRAPPERS") == "1"
#: the cost benchmark's blocks (bench/multigpu/route_cost.py): after WARMUP steps, blocks of
#: COST_BLOCK steps cycle through three kinds until COST_DURATION_S seconds are measured:
#: ``base`` (no extra all-reduce), ``coll`` (EXTRA_COLLECTIVES a step) and ``pad`` (none, but
#: each step sleeps what the last ``coll`` block's collectives added to a step: as long as
#: ``coll``, without its collectives). Each block is measured after
#: it has settled (COST_SETTLE_S seconds and SETTLE_STEPS steps of its kind, unmeasured: the
#: gap sampler's typical step length follows the new steps' first); its per-thread CPU is
#: written; with
#: COST_PARTS=1 also the emitter's CPU by part (bench/emitter_parts.py)
COST_BLOCK = int(os.environ.get("COST_BLOCK", "0"))
COST_PARTS = os.environ.get("COST_PARTS") == "1"
KINDS = ("base", "coll", "pad")
COST_DURATION_S = float(os.environ.get("COST_DURATION_S", "30"))
COST_SETTLE_S = float(os.environ.get("COST_SETTLE_S", "1.5"))
WARMUP, SETTLE_STEPS = 3, 3
#: a block whose steps are LENGTH_CHANGE times longer or shorter than the block before it
#: settles FOLLOW_STEPS at least: the gap sampler's typical step length, the median of its
#: RECENT_STEPS last steps, is the new steps' after that many
LENGTH_CHANGE = 1.5
FOLLOW_STEPS = _gaps.RECENT_STEPS // 2 + 1
if COST_BLOCK:
    STEPS = 1_000_000  # the blocks end the loop


def gpu_metric(device: torch.device) -> torch.Tensor:
    """GPU work a user left between forward and backward: a metric that launches kernels
    (``GPU_BETWEEN_MATMULS`` matmuls of 4096 x 4096: about 0.5 s on an H100)."""
    a = torch.randn(4096, 4096, device=device)
    for _ in range(GPU_BETWEEN_MATMULS):
        a = torch.tanh(a @ a)
    return a.sum()


def heavy(seconds: float) -> float:
    """Host work a user left in the loop: a metric computed in Python."""
    total, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += sum(i * 0.5 for i in range(200))
    return total


class Samples(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if (FAULT == "data" and self.rank == FAULT_RANK and index % BATCH == 0
                and index // BATCH in FAULT_STEPS):
            time.sleep(DATA_STALL_S)  # FAULT: data
        g = torch.Generator().manual_seed(index)
        return torch.randn(WIDTH, generator=g), torch.randn(1, generator=g)


class Model(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.step = rank, 0
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH),
                                  nn.GELU(), nn.Linear(WIDTH, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if FAULT == "gpu" and self.rank == FAULT_RANK and self.step in FAULT_STEPS:
            a = torch.randn(4096, 4096, device=x.device)
            for _ in range(60):  # FAULT: gpu
                a = torch.tanh(a @ a)
            x = x + a[: x.shape[0], : x.shape[1]].sum() * 0
        return self.body(x)


def otel_threads_cpu_s() -> float:
    """CPU seconds of otel-train's threads in this process so far (schedstat: ns on CPU)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("otel-train") and thread.native_id:
            try:
                stat = Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text()
            except OSError:  # it ended meanwhile
                continue
            total += int(stat.split()[0]) / 1e9
    return total


def threads_cpu_s() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, summed by thread name: a Python
    thread's own name (``py:otel-train-emitter``; Python does not name its threads for the
    kernel, so all would read "python"), else the kernel's (NCCL names its threads with
    NCCL_SET_THREAD_NAME=1)."""
    python_names = {t.native_id: f"py:{t.name}" for t in threading.enumerate() if t.native_id}
    main = threading.main_thread().native_id
    python_names[main] = "py:main"
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = python_names.get(int(task.name)) or (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:  # it ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


def block_on_syncs() -> None:
    """COST_BLOCKING_SYNC=1: the host sleeps in a synchronisation instead of spinning
    (the primary context's CU_CTX_SCHED_BLOCKING_SYNC, set before torch makes it). On the
    socket transport a collective lasts milliseconds, and a spinning host would count them
    as CPU: the run-to-run spread of that wait would bury a microsecond of work."""
    if os.environ.get("COST_BLOCKING_SYNC") != "1":
        return
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    ok = (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
          and cuda.cuDevicePrimaryCtxSetFlags(dev, 0x04) == 0)  # CU_CTX_SCHED_BLOCKING_SYNC
    if not ok:
        raise RuntimeError("could not set CU_CTX_SCHED_BLOCKING_SYNC")


def main() -> None:
    block_on_syncs()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    inner = Model(rank).to(device)
    model = DDP(inner)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(Samples(rank), batch_size=BATCH, num_workers=2, prefetch_factor=2)
    marks: list[tuple[float, float, int, float, dict[str, float], dict[str, int]]] = []
    small = torch.ones(256, device=device)
    extra = EXTRA_COLLECTIVES
    blocks = Blocks(device)
    if COST_PARTS and not BARE:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
        import emitter_parts

        parts_cm = emitter_parts.timing_parts()
    else:
        parts_cm = contextlib.nullcontext({})
    if NO_WRAPPERS:
        from otel_train.sources.collectives import capture

        capture.Capture.wrap_functions = lambda self: []  # type: ignore[method-assign]
    with parts_cm as parts, (contextlib.nullcontext() if BARE
                             else otel_train.instrument(model, optimizer=opt,
                                                        dataloader=loader)) as inst:
        blocks.inst, blocks.parts = inst, parts
        for step, (x, y) in enumerate(loader):
            inner.step = step
            if COST_BLOCK:
                # the blocks' edges, at the top of a step: the step before has ended (its
                # record is put when the loader is asked for this one)
                if blocks.edge(step):
                    break
                for _ in range(blocks.extra):  # issued inside this step: its collectives
                    dist.all_reduce(small)
                blocks.pad()  # a pad block: coll's length, not its collectives
            x, y = x.to(device), y.to(device)  # the copy: where a waiting host blocks
            loss = nn.functional.mse_loss(model(x), y)
            if FAULT == "cpu" and rank == FAULT_RANK and step in FAULT_STEPS:
                heavy(HEAVY_S)  # FAULT: cpu
            if FAULT == "gpu_between" and rank == FAULT_RANK and step in FAULT_STEPS:
                gpu_metric(device)  # FAULT: gpu_between
            if FAULT == "region" and rank == FAULT_RANK and step in FAULT_STEPS:
                with otel_train.region("metrics"):  # FAULT: region
                    heavy(HEAVY_S)
            if FAULT == "hang" and rank == FAULT_RANK and step in FAULT_STEPS:
                time.sleep(HANG_S)  # FAULT: hang
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if COST_BLOCK:
                continue
            for _ in range(extra):
                dist.all_reduce(small)
            if COST_OUT and step in (2, STEPS - 1):
                torch.cuda.synchronize()  # the measurement's edges, not the training's
                marks.append((time.perf_counter(), otel_threads_cpu_s(), step,
                              time.process_time(), threads_cpu_s(), {}))
    blocks = blocks.done  # type: ignore[assignment]
    if COST_OUT and COST_BLOCK:
        Path(COST_OUT).mkdir(parents=True, exist_ok=True)
        Path(COST_OUT, f"rank-{rank}.json").write_text(json.dumps({
            "rank": rank, "world": dist.get_world_size(), "blocks": blocks,
            "extra_collectives": EXTRA_COLLECTIVES, "block_steps": COST_BLOCK}))
    elif COST_OUT:
        (t0, c0, s0, p0, th0, _), (t1, c1, s1, p1, th1, _) = marks
        Path(COST_OUT).mkdir(parents=True, exist_ok=True)
        Path(COST_OUT, f"rank-{rank}.json").write_text(json.dumps({
            "rank": rank, "world": dist.get_world_size(), "steps": s1 - s0,
            "wall_s": t1 - t0, "otel_threads_cpu_s": c1 - c0,
            # every thread of the training process (NCCL's, the plugin's, torch's); the
            # exporter process and the DataLoader workers are other processes
            "process_cpu_s": p1 - p0, "extra_collectives": EXTRA_COLLECTIVES,
            "threads_cpu_s": {k: v - th0.get(k, 0.0) for k, v in th1.items()}}))
    dist.destroy_process_group()


class Blocks:
    """The cost benchmark's blocks (COST_BLOCK): base, coll, pad, base, ... At each edge the
    GPU is synchronised and the emitter asked to drain at once (a measurement's edge: each
    block's emitter CPU is then the work of its own steps, not of whichever drain a second's
    timer put in it), then asked once more with nothing new (``drain_ns``: a pass's fixed
    cost; route_cost.py takes the edge's ``passes`` out at that cost)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.inst: object = None
        self.parts: dict[str, list[int]] = {}
        self.kind, self.extra, self.pad_s = 0, 0, 0.0  # the block running: KINDS[kind]
        self.walls: dict[str, float] = {}
        self.cycles_per_s = _sleep_cycles_per_s() if COST_BLOCK else 0.0
        self.marks: list[tuple] = []
        self.done: list[dict] = []
        self.settle_steps, self.measure_from = 0, -1  # the block runs unmeasured until then
        self.drain = (0, 0)  # the last edge's drain: passes, a pass's thread CPU ns

    def edge(self, step: int) -> bool:
        """At the top of ``step``: start measuring a block once it has settled, close it
        when its COST_BLOCK steps are done; True to stop training. Every rank switches kind
        at the same step (their collectives must match): a settle's length in steps is
        agreed at the block's end, from the step length its kind had last."""
        if step < WARMUP:
            return False
        if step == WARMUP:
            self._settle(step, SETTLE_STEPS)
        if step == self.measure_from:
            self.marks.append(self._mark(step))
            return False
        if step != self.measure_from + COST_BLOCK:
            return False
        torch.cuda.synchronize()  # the blocks' edges, not the training's
        if self.pad_s and KINDS[self.kind] == "pad":  # the GPU's sleep, brought to length
            added = time.perf_counter() - self.marks[-1][0] - self.walls["base"]
            self.cycles_per_s *= min(2.0, max(0.5, self.pad_s * COST_BLOCK / max(1e-3, added)))
        self.marks.append(self._mark(step))
        block = _block(self.marks[-2], self.marks[-1], self.extra)
        block.update(kind=KINDS[self.kind], pad_s=self.pad_s, drain_ns=self.drain[1],
                     passes=self.drain[0], settle_steps=self.settle_steps,
                     wakeups={k: v - self.marks[-2][6].get(k, 0)
                              for k, v in self.marks[-1][6].items()})
        self.done.append(block)
        self.walls[KINDS[self.kind]] = block["wall_s"]
        self.kind = (self.kind + 1) % len(KINDS)
        name = KINDS[self.kind]
        self.extra = EXTRA_COLLECTIVES if name == "coll" else 0
        self.pad_s = (max(0.0, (self.walls["coll"] - self.walls["base"]) / COST_BLOCK)
                      if name == "pad" else 0.0)
        measured = sum(b["wall_s"] for b in self.done)
        # COST_SETTLE_S at the next kind's step length as last measured (a first pad's is
        # coll's; a first coll's is not known: twice SETTLE_STEPS)
        last = self.walls.get(name, self.walls.get("coll") if name == "pad" else None)
        settle = (2 * SETTLE_STEPS if last is None else
                  max(SETTLE_STEPS, math.ceil(COST_SETTLE_S / max(1e-3, last / COST_BLOCK))))
        before = block["wall_s"]
        if last is None or max(last, before) > LENGTH_CHANGE * min(last, before):
            # steps of another length (coll after base): until the gap sampler's typical
            # length (the median of its recent steps) is the new one's, it takes every step
            # for an overrun and chases it; a user's steady steps are not measured so
            settle = max(settle, FOLLOW_STEPS)
        flags = torch.tensor([-float(measured >= COST_DURATION_S
                                     and len(self.done) % len(KINDS) == 0), float(settle)],
                             device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # every rank: stops together, settles alike
        stop, settle = -flags[0].item() > 0, int(flags[1].item())
        self._settle(step, settle)
        return stop

    def _settle(self, step: int, steps: int) -> None:
        """The block of the current kind runs from ``step``, measured ``steps`` later."""
        self.settle_steps, self.measure_from = steps, step + steps

    def _mark(self, step: int) -> tuple:
        """A block's edge: the GPU synchronised, the emitter drained (at a block's start what
        it holds is the settle's; at its end, the block's own: ``self.drain`` says how many
        passes, and a pass's cost), then the readings."""
        torch.cuda.synchronize()
        self.drain = self._drain()
        plugin_timer_floor_ns()  # measured once, before the first edge's readings
        return (time.perf_counter(), otel_threads_cpu_s(), step, time.process_time(),
                threads_cpu_s(), {k: v[0] for k, v in self.parts.items()}, self._wakeups(),
                plugin_self_time())

    def _wakeups(self) -> dict[str, int]:
        """How often otel-train's threads woke so far (the emitter's count includes the
        edges' drains: ``passes``)."""
        emitter = getattr(self.inst, "emitter", None)
        if emitter is None:
            return {}
        out = {"emitter": emitter.wakeups}
        for source in getattr(self.inst, "_sources", ()):
            if type(source).__name__ == "GapSource":
                out["gap_sampler"] = source.wakeups
                # what its looks found: a stretch sampled, a step past its typical length
                out["gap_stretches"] = getattr(source, "stretch_looks", 0)
                out["gap_overruns"] = getattr(source, "overrun_looks", 0)
        return out

    def pad(self) -> None:
        """In a pad block, at the top of a step: a GPU kernel that sleeps what coll's
        collectives added to a step, so the host then waits in the batch's copy as it does
        behind coll's collectives (a host sleep would be another kind of stretch to the gap
        sampler)."""
        if self.pad_s:
            torch.cuda._sleep(int(self.pad_s * self.cycles_per_s))

    def _drain(self) -> tuple[int, int]:
        """Have the emitter drain now, until it holds no step back (a step waits for its
        NCCL records), then once more with nothing new: how many passes, and the last one's
        thread CPU ns (each pass's fixed cost: route_cost.py takes the passes out). (0, 0)
        without otel-train."""
        emitter = getattr(self.inst, "emitter", None)
        if emitter is None:
            return 0, 0
        tid = emitter._thread.native_id  # measurement only: otel-train's internals
        passes = 0
        for _ in range(100):
            self._pass(emitter)
            passes += 1
            if not emitter.steps.held and not len(emitter.recorder):
                break
            time.sleep(0.002)
        before = _thread_ns(tid)
        self._pass(emitter)
        return passes + 1, _thread_ns(tid) - before

    @staticmethod
    def _pass(emitter: object) -> None:
        seen = emitter.wakeups
        emitter._wake.set()
        while emitter.wakeups == seen and emitter.alive():
            time.sleep(0.0005)


def _sleep_cycles_per_s() -> float:
    """``torch.cuda._sleep``'s cycles a second here (a first guess: each pad block corrects
    it to what it took, other ranks' kernels sharing the GPU included)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / max(1e-6, start.elapsed_time(end) / 1e3)


def _thread_ns(tid: int) -> int:
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])


def _block(start: tuple, end: tuple, extra: int) -> dict:
    (t0, c0, s0, p0, th0, pa0, _, cb0), (t1, c1, s1, p1, th1, pa1, _, cb1) = start, end
    block = {"steps": s1 - s0, "extra": extra, "wall_s": t1 - t0,
             "otel_threads_cpu_s": c1 - c0, "process_cpu_s": p1 - p0,
             "threads_cpu_s": {k: v - th0.get(k, 0.0) for k, v in th1.items()},
             "emitter_parts_ns": {k: v - pa0.get(k, 0) for k, v in pa1.items()}}
    if cb0 is not None and cb1 is not None:  # in situ: inside the enqueuing threads' CPU
        block["plugin_callbacks_s"] = (cb1[0] - cb0[0]) / 1e9
        block["plugin_callbacks"] = cb1[1] - cb0[1]
        floor = plugin_timer_floor_ns()
        if floor is not None:  # the timer's own part of each callback's figure
            block["plugin_timer_floor_ns"] = floor
    return block


@functools.cache
def _timed_plugin() -> object | None:
    """otel-train's NCCL plugin as NCCL loaded it, when it times itself; else None."""
    from otel_train import nccl

    return nccl.loaded() if os.environ.get("OTEL_TRAIN_NCCL_SELF_TIME") == "1" else None


@functools.cache
def plugin_timer_floor_ns() -> float | None:
    """With OTEL_TRAIN_NCCL_SELF_TIME=1: the self-timing's own part of each timed callback
    (the mean of 4000 empty timed regions on this thread, the training thread where NCCL
    enqueues), measured once; else None."""
    plugin = _timed_plugin()
    return None if plugin is None else plugin.self_time_floor(4000)  # type: ignore[attr-defined]


def plugin_self_time() -> tuple[int, int] | None:
    """With OTEL_TRAIN_NCCL_SELF_TIME=1 (a measurement switch, read when NCCL loads the
    plugin): the thread CPU ns the plugin's callbacks have spent so far where NCCL enqueues
    (the training thread here), and how many; else None."""
    plugin = _timed_plugin()
    if plugin is None:
        return None
    counts = plugin.self_time()  # type: ignore[attr-defined]
    return counts["callbacks_ns"], counts["callbacks"]


if __name__ == "__main__":
    main()
