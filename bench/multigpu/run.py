"""Multi-GPU proof: a compiled FSDP2 GPT on every GPU of one host, instrumented by otel-train.

Launch (one process per GPU; the flight recorder's variables must exist before the process
group does, so the launcher sets them):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
    TORCH_NCCL_TRACE_BUFFER_SIZE=20000 TORCH_NCCL_ENABLE_TIMING=1 OTEL_TRAIN_STALL_TIMEOUT_S=5 \\
    torchrun --standalone --nproc-per-node 2 bench/multigpu/run.py --out DIR

Modes, run in this order in one process (the model compiles once), each into ``DIR/<mode>/``:

- ``normal``: N instrumented steps; also dumps the raw NCCL flight recorder (JSON and pickle)
  to ``DIR/fr-dump-rank<r>.json`` so the fields of the installed torch are on record.
- ``straggler``: rank ``--slow-rank`` sleeps ``--sleep-s`` before every other step.
- ``straggler_gpu``: rank ``--slow-rank`` queues ``--extra-matmuls`` extra 8192^2 bf16 matmuls
  on its GPU before every other step (extra work, not a host-side pause).
- ``profile``: an otel-train profiler window; its trace is analysed by otel-train and by
  HolisticTraceAnalysis (when installed) for the overlap comparison.
- ``overhead``: bare and instrumented blocks, interleaved round by round, synchronised
  at both ends of a block (the one-GPU benchmark's method, at world size N).
- ``cost`` (only when named): the exact figure noise cannot hide. For each arm, blocks of
  two lengths (a whole ``with instrument()`` each, flush included), interleaved and
  repeated; CPU of the training process (getrusage), of its exporter process (children's
  rusage once it is waited for) and per thread (/proc), instrumented minus bare, per step
  from the difference of the two lengths (start and stop costs cancel).
- ``emitter_profile`` (only when named): cProfile of the emitter thread over one block.
- ``pairs`` (only when named): instrumented and bare steps paired inside one instrumented
  run, ``--pairs`` pairs (bench/bench_step_pairs.py's method: the training-thread part
  switched off and on between steps, every rank switching the same steps): the pair ratio
  with its 95% CI and, as an upper bound, the ratio plus otel-train's threads' CPU per step.
- ``hang``: rank ``--slow-rank`` stops calling collectives for ``--hang-s`` (more than the
  stall timeout, less than the process group's ``--pg-timeout-s``); every rank synchronises at
  the end of each step, so the others wait inside NCCL. Stall detection must report it first.

``--dry-run``: CPU and gloo, a tiny model, no compile: checks the script end to end.
Each rank writes ``DIR/result-rank<r>.json``; ``bench/multigpu/check.py`` reads it all back.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
from bench_gpu import GPT, GPTConfig, hta_overlap_pct, run_dir_of  # noqa: E402

import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.analysis import otlp  # noqa: E402
from otel_train.sources.gpu import kineto as gpu_trace  # noqa: E402

MODES = ("normal", "straggler", "straggler_gpu", "profile", "overhead", "hang")
#: modes run only when named: the exact CPU cost by arm and thread, and a cProfile of the
#: emitter thread (docs/overhead.md)
EXTRA_MODES = ("cost", "emitter_profile", "emitter_parts", "pairs")


def build(cfg: GPTConfig, device: torch.device, compiled: bool) -> tuple[nn.Module, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    if compiled:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, fullgraph=True)
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if device.type == "cuda" else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, opt


def batches(cfg: GPTConfig, device: torch.device, rank: int, n: int = 4) -> list[Any]:
    g = torch.Generator(device=device).manual_seed(rank)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), device=device,
                               generator=g)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.cuda = not args.dry_run
        self.device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
                       if self.cuda else torch.device("cpu"))
        self.cfg = (GPTConfig(vocab=512, dim=64, layers=2, heads=4, seq=32, batch=2)
                    if args.dry_run else
                    GPTConfig(dim=args.dim, layers=args.layers, seq=args.seq, batch=args.batch))
        self.model, self.opt = build(self.cfg, self.device, compiled=self.cuda)
        self.data = batches(self.cfg, self.device, self.rank)
        self.out = Path(args.out)
        self.result: dict[str, Any] = {"rank": self.rank, "world_size": self.world,
                                       "config": vars(self.cfg), "modes": {}}

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def step(self, i: int) -> None:
        tokens, targets = self.data[i % len(self.data)]
        self.model(tokens, targets).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def instrument(self, mode: str, **settings: Any) -> Any:
        if self.args.collective_spans and not mode.startswith("overhead"):
            settings.setdefault("collective_spans", self.args.collective_spans)
        return otel_train.instrument(self.model, optimizer=self.opt,
                                     output_dir=self.out / mode, console_log_level="warning",
                                     tokens_per_step=self.cfg.batch * self.cfg.seq,
                                     shutdown_timeout_s=300, **settings)

    def block(self, first: int, steps: int, before: Any = None) -> float:
        """Seconds per step over ``steps`` steps, synchronised (and barriered) at both ends."""
        self.sync()
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(first, first + steps):
            if before is not None:
                before(i)
            self.step(i)
        self.sync()
        return (time.perf_counter() - t0) / steps

    # --- modes ------------------------------------------------------------------------
    def normal(self) -> dict[str, Any]:
        with self.instrument("normal") as inst:
            per_step = self.block(0, self.args.steps)
            diag = flight_recorder_diagnostics(inst)
        self.dump_flight_recorder()
        return {"step_s": per_step, "run_dir": str(run_dir_of(self.out / "normal")),
                "flight_recorder": diag}

    def straggler(self) -> dict[str, Any]:
        slept: list[int] = []

        def maybe_sleep(i: int) -> None:
            if self.rank == self.args.slow_rank and i % 2 == 1:
                slept.append(i)
                time.sleep(self.args.sleep_s)

        with self.instrument("straggler") as inst:
            per_step = self.block(0, self.args.straggler_steps, maybe_sleep)
            diag = flight_recorder_diagnostics(inst)
        return {"step_s": per_step, "slept_steps": slept, "slow_rank": self.args.slow_rank,
                "flight_recorder": diag,
                "sleep_s": self.args.sleep_s,
                "run_dir": str(run_dir_of(self.out / "straggler"))}

    def straggler_gpu(self) -> dict[str, Any]:
        side = 256 if self.args.dry_run else 8192
        x = torch.randn(side, side, device=self.device,
                        dtype=torch.float32 if self.args.dry_run else torch.bfloat16)
        slowed: list[int] = []

        def maybe_work(i: int) -> None:
            if self.rank == self.args.slow_rank and i % 2 == 1:
                slowed.append(i)
                for _ in range(self.args.extra_matmuls):
                    torch.mm(x, x)

        with self.instrument("straggler_gpu") as inst:
            per_step = self.block(0, self.args.straggler_steps, maybe_work)
            diag = flight_recorder_diagnostics(inst)
        return {"step_s": per_step, "slowed_steps": slowed, "slow_rank": self.args.slow_rank,
                "flight_recorder": diag,
                "extra_matmuls": self.args.extra_matmuls,
                "run_dir": str(run_dir_of(self.out / "straggler_gpu"))}

    def profile(self) -> dict[str, Any]:
        with self.instrument("profile", profile_every=4, profile_steps=2):
            self.block(0, 8)
        run_dir = run_dir_of(self.out / "profile")
        res: dict[str, Any] = {"run_dir": str(run_dir)}
        # this rank's own window: its exporter's file only (issue 16 item 7: rank 0's
        # window had been analysed for both ranks)
        mine = sorted(p for p in run_dir.glob(semconv.TRACES_GLOB)
                      if p.name.startswith(f"traces.rank-{self.rank}."))
        windows = list(otlp.iter_spans(mine, frozenset({semconv.SPAN_PROFILE})))
        if not windows:
            return res
        attrs = windows[0].attributes
        trace = Path(attrs[semconv.ATTR_PROFILE_TRACE])
        ours = gpu_trace.analyse(gpu_trace.load_events(trace), steps=2)
        res.update({"rank": self.rank, "trace": str(trace), "otel_overlap_attr": attrs.get(semconv.ATTR_COMM_OVERLAP),
                    "otel_overlap_unrounded": ours.get("overlap_unrounded"),
                    "otel_overlap": ours.get("overlap"), "comm_kernels": ours.get("comm_kernels"),
                    "exposed_comm_s_per_step": ours.get("exposed_comm_per_step_s"),
                    "top_kernels": ours.get("top_kernels", [])[:5]})
        try:
            res["hta_overlap_pct"] = hta_overlap_pct(trace)
        except Exception as err:  # HTA is a cross-check; its absence is recorded, not fatal
            res["hta_error"] = repr(err)[:500]
        return res

    #: instrumented arms of the overhead mode: instrument() settings per arm
    ARMS: dict[str, dict[str, Any]] = {
        "default": {},  # every step sampled (gateway tail sampling decides what is kept)
        "sampled10": {"sampler_name": "parentbased_traceidratio", "sampler_arg": 0.1},
        "summary": {"collective_spans": "summary"},  # every step, a span per (phase, op)
        "i200": {"emit_interval_s": 0.2},  # the emitter's wake-ups as before 2026-12-01
    }

    def overhead(self) -> dict[str, Any]:
        names = ["bare", *self.args.overhead_arms.split(",")]
        arms: dict[str, list[float]] = {a: [] for a in names}
        dynamo: dict[str, list[int]] = {a: [0, 0] for a in names}

        def ctx(arm: str) -> Any:
            if arm == "bare":
                return contextlib.nullcontext()
            return self.instrument("overhead-" + arm, **self.ARMS[arm])

        for arm in names:  # warm-up block per arm
            with ctx(arm):
                self.block(0, 2)
        for r in range(self.args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # rotate the order
            for arm in order:
                before = dynamo_state()
                with ctx(arm):
                    self.block(0, 2)
                    arms[arm].append(self.block(2, self.args.overhead_steps))
                after = dynamo_state()
                dynamo[arm][0] += after[0] - before[0]
                dynamo[arm][1] += after[1] - before[1]
        out: dict[str, Any] = {"rounds": self.args.rounds, "steps": self.args.overhead_steps,
                               "arms": arms, "dynamo_delta": dynamo,
                               "median_step_s": {a: statistics.median(v) for a, v in arms.items()}}
        for arm in names[1:]:
            ratios = [d / b for d, b in zip(arms[arm], arms["bare"], strict=True)]
            out[arm] = {"ratios": ratios, "ratio_median": statistics.median(ratios),
                        "ratio_min": min(ratios), "ratio_max": max(ratios)}
        # the first instrumented arm under the old keys (check.py, earlier results)
        first = out[names[1]]
        out.update(ratios=first["ratios"], ratio_median=first["ratio_median"],
                   ratio_min=first["ratio_min"], ratio_max=first["ratio_max"])
        return out

    def pairs(self) -> dict[str, Any]:
        import bench_step_pairs

        counter = iter(range(1 << 62))

        def step() -> None:
            self.step(next(counter))

        raw = bench_step_pairs.paired_run(
            (self.model, self.opt, step, self.sync), self.args.pairs, 3, self.out / "pairs",
            self.args.pairs_seed, instrument=lambda: self.instrument("pairs"),
            block=self.args.pairs_block)
        summary = bench_step_pairs.summarise(raw)
        missed = bench_step_pairs.stats.verdict(summary, bench_step_pairs.TARGETS)
        return {**summary, "verdict": missed or "all targets met",
                **{k: raw[k] for k in ("bare_wall_ns", "inst_wall_ns", "first")}}

    COST_ARMS: dict[str, dict[str, Any]] = {
        "default": {},  # the exporter process
        "inproc": {"export_process": False},  # the providers on a thread of this process
        "summary": {"collective_spans": "summary"},
        "none": {"exporter": "none"},
        "i200": {"emit_interval_s": 0.2},  # the emitter's wake-ups as before 2026-12-01
    }

    def _cost_block(self, arm: str, steps: int) -> dict[str, Any]:
        ctx = (contextlib.nullcontext() if arm == "bare"
               else self.instrument("cost-" + arm, **self.COST_ARMS[arm]))
        self.sync()
        dist.barrier()
        rid_before = newest_nccl_record() if arm == "bare" else None
        before = cpu_snapshot()
        with ctx:
            for i in range(steps):
                self.step(i)
            self.sync()
            inside = cpu_snapshot()
        after = cpu_snapshot()
        rid_after = newest_nccl_record() if arm == "bare" else None
        return {"nccl_entries": (None if rid_after is None or rid_before is None
                                 else rid_after - rid_before),
                "cpu_s": after["self"] - before["self"],
                "children_cpu_s": after["children"] - before["children"],
                "wall_s": after["wall"] - before["wall"],
                "threads_s": {k: v - before["threads"].get(k, 0.0)
                              for k, v in inside["threads"].items()},
                "gc_counts": [a - b for a, b in zip(inside["gc"]["counts"],
                                                    before["gc"]["counts"], strict=True)],
                "gc_s": {k: v - before["gc"]["seconds"].get(k, 0.0)
                         for k, v in inside["gc"]["seconds"].items()}}

    def cost(self) -> dict[str, Any]:
        short, long_ = self.args.cost_short, self.args.cost_long
        names = ["bare", *self.args.cost_arms.split(",")]
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {
            a: {short: [], long_: []} for a in names}
        for r in range(self.args.cost_repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for arm in order:
                for n in (short, long_):
                    runs[arm][n].append(self._cost_block(arm, n))
        per_step: dict[str, dict[str, Any]] = {}
        for arm in names:
            def slope(key: str, arm: str = arm) -> list[float]:
                return [(b[key] - a[key]) / (long_ - short)
                        for a, b in zip(runs[arm][short], runs[arm][long_], strict=True)]
            threads: dict[str, list[float]] = {}
            for a, b in zip(runs[arm][short], runs[arm][long_], strict=True):
                for name in set(a["threads_s"]) | set(b["threads_s"]):
                    threads.setdefault(name, []).append(
                        (b["threads_s"].get(name, 0.0) - a["threads_s"].get(name, 0.0))
                        / (long_ - short))
            gc_s: dict[str, list[float]] = {}
            for a, b in zip(runs[arm][short], runs[arm][long_], strict=True):
                for name in set(a["gc_s"]) | set(b["gc_s"]):
                    gc_s.setdefault(name, []).append(
                        (b["gc_s"].get(name, 0.0) - a["gc_s"].get(name, 0.0)) / (long_ - short))
            gc_counts = [statistics.median(
                (b["gc_counts"][g] - a["gc_counts"][g]) / (long_ - short)
                for a, b in zip(runs[arm][short], runs[arm][long_], strict=True))
                for g in range(3)]
            per_step[arm] = {"cpu_s": slope("cpu_s"), "children_cpu_s": slope("children_cpu_s"),
                             "wall_s": slope("wall_s"),
                             "threads_s": {k: statistics.median(v) for k, v in threads.items()},
                             "gc_s": {k: statistics.median(v) for k, v in gc_s.items()},
                             "gc_collections": gc_counts}
        counted = [r["nccl_entries"] / n for n in (short, long_) for r in runs["bare"][n]
                   if r.get("nccl_entries")]
        out: dict[str, Any] = {"lengths": [short, long_], "repeats": self.args.cost_repeats,
                               "nccl_collectives_per_step": (statistics.median(counted)
                                                             if counted else None),
                               "per_step": per_step, "runs": runs}
        bare = per_step["bare"]
        for arm in names[1:]:
            mine = per_step[arm]
            out[arm] = {
                "added_cpu_ms_per_step": [1e3 * (m - b) for m, b in
                                          zip(mine["cpu_s"], bare["cpu_s"], strict=True)],
                "exporter_cpu_ms_per_step": [1e3 * (m - b) for m, b in zip(
                    mine["children_cpu_s"], bare["children_cpu_s"], strict=True)],
                "added_wall_ms_per_step": [1e3 * (m - b) for m, b in
                                           zip(mine["wall_s"], bare["wall_s"], strict=True)],
            }
        return out

    def emitter_profile(self) -> dict[str, Any]:
        import cProfile
        import io
        import pstats

        from otel_train import emitter as emitter_mod

        profiler = cProfile.Profile()
        original = emitter_mod.Emitter._run

        def profiled(em: Any) -> None:
            profiler.enable()
            try:
                original(em)
            finally:
                profiler.disable()

        emitter_mod.Emitter._run = profiled  # type: ignore[method-assign]
        try:
            with self.instrument("emitter-profile"):
                per_step = self.block(0, self.args.cost_long)
        finally:
            emitter_mod.Emitter._run = original  # type: ignore[method-assign]
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(45)
        stats.sort_stats("cumulative").print_stats(45)
        (self.out / f"emitter-profile-rank{self.rank}.txt").write_text(text.getvalue())
        return {"step_s": per_step, "total_tt_s": stats.total_tt}

    def emitter_parts(self) -> dict[str, Any]:
        """The emitter thread's CPU by part (thread CPU clock, ns): every listener the
        sources register, the step records, the send to the exporter; one block of
        ``--cost-long`` steps. Nested parts: ``emit_step`` includes the step listeners and
        ``pump`` everything."""
        import emitter_parts

        with emitter_parts.timing_parts() as parts, self.instrument("emitter-parts"):
            per_step = self.block(0, self.args.cost_long)
        table = emitter_parts.table(parts, self.args.cost_long)
        lines = emitter_parts.lines(table)
        (self.out / f"emitter-parts-rank{self.rank}.txt").write_text("\n".join(lines) + "\n")
        return {"step_s": per_step, "parts": table}

    def hang(self) -> dict[str, Any]:
        marks: dict[str, float] = {}

        def maybe_hang(i: int) -> None:
            if i == 3 and self.rank == self.args.slow_rank:
                marks["hang_start_ns"] = time.time_ns()
                time.sleep(self.args.hang_s)  # no collective is called meanwhile
                marks["hang_end_ns"] = time.time_ns()

        with self.instrument("hang"):
            self.sync()
            for i in range(8):
                maybe_hang(i)
                self.step(i)
                self.sync()  # the loop waits for its GPU: the others wait inside NCCL
        marks["end_ns"] = time.time_ns()
        return {"hang_s": self.args.hang_s, "slow_rank": self.args.slow_rank,
                "pg_timeout_s": self.args.pg_timeout_s,
                "stall_timeout_s": float(os.environ.get("OTEL_TRAIN_STALL_TIMEOUT_S", "60")),
                **marks, "run_dir": str(run_dir_of(self.out / "hang"))}

    def dump_flight_recorder(self) -> None:
        from torch._C import _distributed_c10d as c10d

        doc: dict[str, Any] = {"torch": torch.__version__}
        for name in ("_dump_nccl_trace_json", "_dump_nccl_trace"):
            fn = getattr(c10d, name, None)
            if fn is None:
                doc[name] = "absent"
                continue
            try:
                raw = fn(includeCollectives=True, onlyActive=False)
                doc[name] = (json.loads(raw.decode() if isinstance(raw, bytes) else raw)
                             if name.endswith("json") else pickle.loads(raw))
            except Exception as err:
                doc[name] = f"error: {err!r}"
        for key in ("_dump_nccl_trace_json", "_dump_nccl_trace"):  # keep the file small
            entries = doc[key].get("entries") if isinstance(doc[key], dict) else None
            if isinstance(entries, list) and len(entries) > 60:
                doc[key]["entries"] = entries[:30] + entries[-30:]
                doc[key]["entries_total"] = len(entries)
        path = self.out / f"fr-dump-rank{self.rank}.json"
        path.write_text(json.dumps(doc, indent=1, default=repr))


def flight_recorder_diagnostics(inst: Any) -> dict[str, Any]:
    for source in getattr(inst, "_sources", []):
        if type(source).__name__ == "CollectiveSource":
            ledger = source.ledger
            fr = getattr(ledger, "flight_recorder", None) if ledger is not None else None
            return {"mechanisms": list(source.mechanisms),
                    "reads": getattr(ledger, "reads", None),
                    "read_s": getattr(ledger, "read_s", None),
                    "lost": getattr(ledger, "lost", None),
                    "shortest_interval_s": getattr(ledger, "shortest_interval_s", None),
                    "flight_recorder": None if fr is None else {
                        "errors": fr.errors, "skipped": fr.skipped,
                        "last_error": fr.last_error, "seen_keys": fr.seen_keys}}
    return {"mechanisms": None}


def newest_nccl_record() -> int | None:
    """The flight recorder's newest record id (to count NCCL collectives per step in a bare
    block, outside its timing); None without NCCL or a flight recorder."""
    try:
        from torch._C import _distributed_c10d as c10d

        entries = pickle.loads(c10d._dump_nccl_trace(
            includeCollectives=True, includeStackTraces=False, onlyActive=False)).get(
            "entries") or []
        return max(int(e["record_id"]) for e in entries) if entries else None
    except Exception:
        return None


_PLUGIN: list[Any] = []


def _plugin() -> Any:
    """otel-train's NCCL plugin as NCCL loaded it, when it times itself; else None."""
    if not _PLUGIN:
        from otel_train import nccl

        plugin = nccl.loaded() if os.environ.get("OTEL_TRAIN_NCCL_SELF_TIME") == "1" else None
        _PLUGIN.append(plugin)
    return _PLUGIN[0]


def cpu_snapshot() -> dict[str, Any]:
    """CPU seconds of this process, of its waited-for children and of each live thread
    (by Python thread name where it has one, else the kernel's), and the wall clock."""
    import resource
    import threading

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    names = {t.native_id: t.name for t in threading.enumerate()
             if not isinstance(t, threading._DummyThread)}  # foreign threads: kernel's name
    tick = os.sysconf("SC_CLK_TCK")
    threads: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:  # schedstat: on-CPU ns (exact); stat's utime+stime: 10 ms ticks (fallback)
            comm = (task / "comm").read_text().strip()
            try:
                seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                stat = (task / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
        name = names.get(int(task.name), comm)
        threads[name] = threads.get(name, 0.0) + seconds
    plugin = _plugin()
    if plugin is not None:  # in situ, with OTEL_TRAIN_NCCL_SELF_TIME=1: a part of the
        # enqueuing threads' CPU (MainThread, autograd), counted apart as otel-train's
        threads["otel-nccl-enqueue"] = plugin.self_time()["callbacks_ns"] / 1e9
    return {"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime,
            "wall": time.perf_counter(), "threads": threads, "gc": GC.snapshot()}


class _GcClock:
    """The interpreter's garbage collections: how many (by generation) and how long each
    thread spent in the ones it triggered (a thread's CPU includes the collections its
    allocations happened to trigger, over every thread's objects: per-thread CPU alone
    would charge them to whoever allocated last)."""

    def __init__(self) -> None:
        import gc
        import threading

        self._threading = threading
        self.counts = [0, 0, 0]
        self.seconds: dict[str, float] = {}
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        ident = self._threading.get_ident()
        if phase == "start":
            self._started[ident] = time.thread_time()
            return
        began = self._started.pop(ident, None)
        if began is None:
            return
        self.counts[info.get("generation", 0)] += 1
        name = self._threading.current_thread().name
        self.seconds[name] = self.seconds.get(name, 0.0) + time.thread_time() - began

    def snapshot(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "seconds": dict(self.seconds)}


GC = _GcClock()


def dynamo_state() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return (sum(counters["stats"].values()) if "stats" in counters else 0,
            sum(counters["graph_break"].values()))


def versions() -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                           "date": datetime.datetime.now(datetime.UTC).isoformat()}
    for pkg in ("opentelemetry-sdk", "holistictraceanalysis", "triton"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny model")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--straggler-steps", type=int, default=120)
    parser.add_argument("--sleep-s", type=float, default=0.3)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--extra-matmuls", type=int, default=60)
    parser.add_argument("--hang-s", type=float, default=15.0)
    parser.add_argument("--pg-timeout-s", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--overhead-steps", type=int, default=20)
    parser.add_argument("--collective-spans", choices=("all", "summary"), default=None,
                        help="OTEL_TRAIN_COLLECTIVE_SPANS for every mode but overhead")
    parser.add_argument("--overhead-arms", default="default,sampled10",
                        help="instrumented arms, from Trainer.ARMS")
    parser.add_argument("--cost-arms", default="default,inproc",
                        help="instrumented arms of the cost mode, from Trainer.COST_ARMS")
    parser.add_argument("--pairs", type=int, default=300, help="pairs mode: step pairs")
    parser.add_argument("--pairs-block", type=int, default=1,
                        help="pairs mode: steps in a row per arm (bench_step_pairs --block)")
    parser.add_argument("--pairs-seed", type=int, default=20240615,
                        help="pairs mode: the order's seed (the same on every rank)")
    parser.add_argument("--cost-short", type=int, default=10)
    parser.add_argument("--cost-long", type=int, default=40)
    parser.add_argument("--cost-repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    timeout = datetime.timedelta(seconds=args.pg_timeout_s)
    if args.dry_run:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
    args.out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(args)
    trainer.result["versions"] = versions()
    t0 = time.perf_counter()
    for i in range(3):  # compile and warm up, uninstrumented
        trainer.step(i)
    trainer.sync()
    trainer.result["warmup_s"] = time.perf_counter() - t0
    path = args.out / f"result-rank{trainer.rank}.json"
    for mode in args.modes.split(","):
        t0 = time.perf_counter()
        try:
            res = getattr(trainer, mode)()
        except Exception as err:  # record it and go on: one mode's failure is one finding
            res = {"error": repr(err)[:1000]}
        res["wall_s"] = time.perf_counter() - t0
        trainer.result["modes"][mode] = res
        path.write_text(json.dumps(trainer.result, indent=1, default=repr))
        if trainer.rank == 0:
            print(f"mode {mode}: {json.dumps(res, default=repr)[:600]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
