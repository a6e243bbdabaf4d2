"""GPU overhead and tuning benchmark: a GPT-style decoder, torch.compile'd, FSDP2, one GPU.

Part 1, overhead: blocks of steps of the same compiled model, timed bare, instrumented at
default settings (every step sampled, CUDA timing, memory, throughput), instrumented with a
1% trace-id ratio sampler (metrics only for most steps), and under an always-on
torch.profiler, interleaved round by round in one process (so drift hits every arm alike).
A block is bounded by ``torch.cuda.synchronize()`` on both ends and times ``--steps`` steps
that contain no synchronisation of their own; overheads are medians of per-round ratios.

Part 2, tuning table: eager FSDP2, compiled FSDP2, max-autotune, CUDA graphs (where they
apply) — throughput, peak memory and communication overlap, each read from otel-train's
own telemetry and checked against wall clock, ``torch.cuda.max_memory_allocated`` and
HolisticTraceAnalysis on the same profiler trace.

Also: per-call costs of the hot-path pieces (event record, allocator statistics) and of a
profiler window. Writes ``gpu-h200.json`` and ``gpu-h200.md`` into ``--out-dir``.

Usage: ``NCCL_NVLS_ENABLE=0 python bench/bench_gpu.py --out-dir DIR [--quick]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import timeit
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import otel_train  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.analysis import otlp  # noqa: E402
from otel_train.sources.gpu import kineto as gpu_trace  # noqa: E402
from otel_train.sources.gpu import (
    memory,  # noqa: E402
    mfu,  # noqa: E402
)

ALL_SOURCES = importlib.import_module("otel_train.instrument").SOURCES


# --- the model ---------------------------------------------------------------------------
@dataclass
class GPTConfig:
    vocab: int = 32768
    dim: int = 1024
    layers: int = 24
    heads: int = 16
    seq: int = 2048
    batch: int = 8


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.RMSNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.norm2 = nn.RMSNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, 4 * cfg.dim, bias=False)
        self.down = nn.Linear(4 * cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def flops_per_step(cfg: GPTConfig) -> int:
    """Model FLOPs of one step, counted by FlopCounterMode on a meta-device copy."""
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq))
    return mfu.count_flops(lambda: model(tokens, tokens).backward())


def build(cfg: GPTConfig, mode: str | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """FSDP2 (bf16 compute, fp32 reduce) over a world-size-1 NCCL group; blocks compiled
    one by one (torchtitan's way) unless ``mode`` is None."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = GPT(cfg).cuda()
    if mode is not None:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, mode=None if mode == "default" else mode,
                                            fullgraph=True)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, opt


def batches(cfg: GPTConfig, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), device="cuda",
                               generator=g)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def train(model: nn.Module, opt: torch.optim.Optimizer, data: list, steps: int) -> None:
    for i in range(steps):
        tokens, targets = data[i % len(data)]
        model(tokens, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def timed(model: nn.Module, opt: torch.optim.Optimizer, data: list, steps: int) -> float:
    """Seconds per step over ``steps`` steps, synchronised only at both ends."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    train(model, opt, data, steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


# --- reading otel-train's own telemetry back -----------------------------------------------
def run_dir_of(root: Path) -> Path:
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    return dirs[-1]


def spans(run_dir: Path, *names: str) -> list[otlp.Span]:
    return list(otlp.iter_spans(sorted(run_dir.glob(semconv.TRACES_GLOB)), frozenset(names)))


def last_gauge(run_dir: Path, name: str) -> float | None:
    value = None
    for point in otlp.iter_metric_points(sorted(run_dir.glob(semconv.METRICS_GLOB))):
        if point.name == name:
            value = point.value
    return value


def hta_overlap_pct(trace: Path) -> float | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / trace.name).symlink_to(trace)
        frame = TraceAnalysis(trace_dir=tmp).get_comm_comp_overlap(visualize=False)
    return float(frame["comp_comm_overlap_pctg"].iloc[0])


# --- part 1: overhead ---------------------------------------------------------------------
ARMS = ("bare", "default", "ratio_1pct", "gpu_sources_only", "torch_profiler")
#: the gpu_sources_only arm: steps and the GPU sources, without the other sources
GPU_SOURCES = tuple(s for s in importlib.import_module("otel_train.instrument").SOURCES
                    if s.split(":")[0].rsplit(".", 1)[-1] in ("cuda_timing", "memory", "mfu",
                                                              "profiler"))


def arm_context(arm: str, model: nn.Module, opt: torch.optim.Optimizer, root: Path,
                flops: int) -> contextlib.AbstractContextManager[Any]:
    if arm == "bare":
        return contextlib.nullcontext()
    if arm == "torch_profiler":
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
    inst_module = importlib.import_module("otel_train.instrument")
    inst_module.SOURCES = GPU_SOURCES if arm == "gpu_sources_only" else ALL_SOURCES
    if arm == "ratio_1pct":
        os.environ["OTEL_TRACES_SAMPLER"] = "traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0.01"
    else:
        os.environ.pop("OTEL_TRACES_SAMPLER", None)
        os.environ.pop("OTEL_TRACES_SAMPLER_ARG", None)
    return otel_train.instrument(model, optimizer=opt, output_dir=root / arm,
                                 console_log_level="warning", flops_per_step=flops)


def dynamo_state() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return (sum(counters["stats"].values()) if "stats" in counters else 0,
            sum(counters["graph_break"].values()))


def overhead(cfg: GPTConfig, rounds: int, steps: int, root: Path, flops: int,
             gc_freeze: bool = False) -> dict[str, Any]:
    model, opt = build(cfg, "default")
    data = batches(cfg)
    t0 = time.perf_counter()
    train(model, opt, data, 3)  # compile
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for arm in ARMS:  # one warm-up block per arm
        with arm_context(arm, model, opt, root / "warmup", flops):
            timed(model, opt, data, 2)
    if gc_freeze:  # keep the long-lived objects (torch's millions) out of every collection
        gc.collect()
        gc.freeze()
    per_arm: dict[str, list[float]] = {arm: [] for arm in ARMS}
    dynamo: dict[str, list[int]] = {arm: [0, 0] for arm in ARMS}
    for r in range(rounds):
        order = ARMS if r % 2 == 0 else tuple(reversed(ARMS))
        for arm in order:
            before = dynamo_state()
            if gc_freeze:
                gc.collect()
            with arm_context(arm, model, opt, root, flops):
                train(model, opt, data, 2)  # untimed: the arm's start-up settles first
                per_arm[arm].append(timed(model, opt, data, steps))
            after = dynamo_state()
            dynamo[arm][0] += after[0] - before[0]
            dynamo[arm][1] += after[1] - before[1]
    os.environ.pop("OTEL_TRACES_SAMPLER", None)
    os.environ.pop("OTEL_TRACES_SAMPLER_ARG", None)
    importlib.import_module("otel_train.instrument").SOURCES = ALL_SOURCES
    bare = per_arm["bare"]
    result: dict[str, Any] = {"compile_s": compile_s, "rounds": rounds, "steps": steps,
                              "gc_freeze": gc_freeze, "arms": {}}
    for arm in ARMS:
        ratios = [t / b for t, b in zip(per_arm[arm], bare)]
        result["arms"][arm] = {
            "step_s": per_arm[arm], "median_step_s": statistics.median(per_arm[arm]),
            "min_step_s": min(per_arm[arm]), "max_step_s": max(per_arm[arm]),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "dynamo_frames_and_stats_delta": dynamo[arm][0],
            "graph_breaks_delta": dynamo[arm][1]}
    # what the default arm's emitter produced per step (the GIL work it competes with)
    default_dir = run_dir_of(root / "default")
    names: dict[str, int] = {}
    for span in otlp.iter_spans(sorted(default_dir.glob(semconv.TRACES_GLOB))):
        names[span.name] = names.get(span.name, 0) + 1
    n_steps = max(names.get(semconv.SPAN_RANK_STEP, 1), 1)
    result["default_spans_per_step"] = {k: v / n_steps for k, v in sorted(names.items())}
    del model, opt
    return result


# --- part 2: tuning table ------------------------------------------------------------------
def tuning_row(cfg: GPTConfig, mode: str | None, steps: int, root: Path, flops: int
               ) -> dict[str, Any]:
    label = "eager" if mode is None else mode
    row: dict[str, Any] = {"config": label}
    t0 = time.perf_counter()
    model, opt = build(cfg, mode)
    data = batches(cfg)
    train(model, opt, data, 3)
    torch.cuda.synchronize()
    row["warmup_s"] = time.perf_counter() - t0
    # throughput and memory: telemetry against wall clock and torch.cuda
    torch.cuda.reset_peak_memory_stats()
    with otel_train.instrument(model, optimizer=opt, output_dir=root / label / "timing",
                               console_log_level="warning", flops_per_step=flops):
        wall_step_s = timed(model, opt, data, steps)
        torch_peak = torch.cuda.max_memory_allocated()
    run_dir = run_dir_of(root / label / "timing")
    rank_steps = spans(run_dir, semconv.SPAN_RANK_STEP)
    durations = [s.duration_s for s in rank_steps[1:]]  # the first absorbs the block's start
    row["wall_samples_per_s"] = cfg.batch / wall_step_s
    row["otel_samples_per_s"] = cfg.batch * len(durations) / sum(durations)
    row["otel_mfu_median"] = statistics.median(
        s.attributes.get(semconv.ATTR_MFU, math.nan) for s in rank_steps[1:])
    row["otel_gpu_step_s_median"] = statistics.median(
        s.attributes.get(semconv.ATTR_STEP_GPU_DURATION, math.nan) for s in rank_steps[1:])
    row["otel_peak_gb"] = (last_gauge(run_dir, semconv.METRIC_MEMORY_ALLOCATED_PEAK) or 0) / 1e9
    row["torch_peak_gb"] = torch_peak / 1e9
    # overlap: a profiler window, analysed by otel-train, and by HTA on the same trace
    with otel_train.instrument(model, optimizer=opt, output_dir=root / label / "profile",
                               console_log_level="warning", flops_per_step=flops,
                               profile_every=3, profile_steps=2, shutdown_timeout_s=300):
        train(model, opt, data, 6)
    run_dir = run_dir_of(root / label / "profile")
    windows = spans(run_dir, semconv.SPAN_PROFILE)
    if windows:
        attrs = windows[0].attributes
        trace = Path(attrs[semconv.ATTR_PROFILE_TRACE])
        ours = gpu_trace.analyse(gpu_trace.load_events(trace), steps=2)
        row.update({
            "otel_overlap": attrs.get(semconv.ATTR_COMM_OVERLAP),
            "otel_exposed_comm_ms_per_step": 1e3 * attrs.get(semconv.ATTR_COMM_EXPOSED, math.nan),
            "otel_gpu_idle": attrs.get(semconv.ATTR_GPU_IDLE),
            "comm_kernels": ours["comm_kernels"], "top_kernels": ours["top_kernels"][:3],
            "overlap_unrounded": ours["overlap_unrounded"],
            "profile_stop_s": attrs.get(semconv.ATTR_PROFILE_STOP_S),
            "profile_write_s": attrs.get(semconv.ATTR_PROFILE_WRITE_S),
            "trace_mb": trace.stat().st_size / 1e6, "trace": str(trace)})
        row["hta_overlap_pct"] = hta_overlap_pct(trace)
        # one GPU: NCCL's one-rank kernels are no nccl*Kernel; named so, both tools see them
        doc = json.loads(trace.read_text())
        row["one_rank_kernels"] = gpu_trace.relabel_one_rank_kernels(doc)
        if row["one_rank_kernels"]:
            relabelled = trace.with_name("relabelled_" + trace.name)
            relabelled.write_text(json.dumps(doc))
            mine = gpu_trace.analyse(gpu_trace.load_events(relabelled), steps=2)
            row["relabelled_overlap_pct"] = (None if mine["overlap"] is None
                                             else 100 * mine["overlap"])
            row["relabelled_exposed_ms_per_step"] = 1e3 * mine["exposed_comm_per_step_s"]
            row["relabelled_hta_overlap_pct"] = hta_overlap_pct(relabelled)
        del doc
        window_steps = {attrs[semconv.ATTR_PROFILE_FIRST_STEP] + i for i in range(2)}
        steps_in = [s.duration_s for s in spans(run_dir, semconv.SPAN_RANK_STEP)
                    if s.attributes[semconv.ATTR_STEP] in window_steps]
        row["window_step_s"] = steps_in
    del model, opt
    torch.cuda.empty_cache()
    return row


# --- hot-path unit costs -------------------------------------------------------------------
def unit_costs() -> dict[str, float]:
    device = torch.cuda.current_device()
    ev = torch.cuda.Event(enable_timing=True)
    n = 2000
    out = {
        "event_record_us": timeit.timeit(ev.record, number=n) / n * 1e6,
        "event_query_us": timeit.timeit(ev.query, number=n) / n * 1e6,
        "memory_stats_raw_us": timeit.timeit(lambda: memory.read_stats(device), number=n)
        / n * 1e6,
        "memory_stats_dict_us": timeit.timeit(torch.cuda.memory_stats, number=200) / 200 * 1e6,
        "reset_peak_us": timeit.timeit(lambda: torch._C._cuda_resetPeakMemoryStats(device),
                                       number=n) / n * 1e6,
    }
    torch.cuda.synchronize()
    return out


# --- report ---------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": str(torch.version.cuda), "device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for package in ("opentelemetry-sdk", "holistictraceanalysis", "triton"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "absent"
    with contextlib.suppress(Exception):
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


def _f(value: Any, fmt: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def markdown(res: dict[str, Any]) -> str:
    v, cfg = res["versions"], res["model"]
    lines = [
        "# GPU benchmark: overhead and tuning table (GPT decoder, FSDP2, one GPU)", "",
        f"- date: {v['date']}; device: {v['device']}; torch {v['torch']} (CUDA {v['cuda']}, "
        f"NCCL {v.get('nccl', '?')}, triton {v['triton']}); Python {v['python']}; "
        f"opentelemetry-sdk {v['opentelemetry-sdk']}; HTA {v['holistictraceanalysis']}",
        f"- model: {res['params_m']:.0f}M parameters ({cfg['layers']} layers, dim {cfg['dim']}, "
        f"{cfg['heads']} heads, vocab {cfg['vocab']}), bf16 compute under FSDP2 "
        f"(MixedPrecisionPolicy bf16/fp32) on a world-size-1 NCCL group, batch "
        f"{cfg['batch']} x seq {cfg['seq']}; {res['flops_per_step'] / 1e12:.1f} TFLOP per step "
        "(FlopCounterMode on a meta copy)", ""]
    ov = res.get("overhead")
    if ov:
        lines += [
            f"## Overhead ({ov['rounds']} interleaved rounds x {ov['steps']} steps per arm; "
            f"compile {ov['compile_s']:.0f} s)", "",
            "| arm | median step ms | min–max ms | ratio to bare, median (min–max) | "
            "dynamo delta (stats, breaks) |", "| --- | --- | --- | --- | --- |"]
        for arm, a in ov["arms"].items():
            lines.append(
                f"| {arm} | {a['median_step_s'] * 1e3:.2f} | {a['min_step_s'] * 1e3:.2f}–"
                f"{a['max_step_s'] * 1e3:.2f} | {a['ratio_median']:.4f} ({a['ratio_min']:.4f}–"
                f"{a['ratio_max']:.4f}) | {a['dynamo_frames_and_stats_delta']}, "
                f"{a['graph_breaks_delta']} |")
        lines += ["", "Targets: default within 0.5% of bare (ratio <= 1.005); every step "
                  "sampled within 1% (the default samples every step).", "",
                  "Spans per step the default arm exported: " + ", ".join(
                      f"{k} {v:.1f}" for k, v in ov.get("default_spans_per_step", {}).items()),
                  ""]
    rows = res.get("tuning", [])
    if rows:
        lines += [
            "## Tuning table (every figure from otel-train's telemetry, checked against an "
            "independent reading)", "",
            "| config | samples/s otel (wall) | peak GB otel (torch) | MFU | overlap % otel "
            "(HTA) | exposed comm ms/step | GPU idle % | warm-up s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['config']} | failed: {r['error'][:120]} | | | | | | |")
                continue
            overlap = r.get("otel_overlap")
            lines.append(
                f"| {r['config']} | {_f(r['otel_samples_per_s'], '.2f')} "
                f"({_f(r['wall_samples_per_s'], '.2f')}) | {_f(r['otel_peak_gb'], '.2f')} "
                f"({_f(r['torch_peak_gb'], '.2f')}) | {_f(r['otel_mfu_median'], '.3f')} | "
                f"{_f(None if overlap is None else 100 * overlap, '.2f')} "
                f"({_f(r.get('hta_overlap_pct'), '.2f')}) | "
                f"{_f(r.get('otel_exposed_comm_ms_per_step'), '.3f')} | "
                f"{_f(None if r.get('otel_gpu_idle') is None else 100 * r['otel_gpu_idle'], '.2f')}"
                f" | {r['warmup_s']:.0f} |")
        lines += ["", "Communication kernels (HTA's rule: `^nccl.*Kernel`) per profiled window: "
                  + ", ".join(f"{r['config']}: {r.get('comm_kernels', 'n/a')}" for r in rows)
                  + ". On one GPU NCCL runs its one-rank kernel instead, so overlap is "
                  "undefined for both tools; the same traces with those kernels named as "
                  "NCCL's ring kernels give:", "",
                  "| config | one-rank kernels | overlap % otel-train | overlap % HTA | "
                  "exposed comm ms/step | profiler stop s | trace write s | trace MB |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            if "error" in r:
                continue
            lines.append(
                f"| {r['config']} | {r.get('one_rank_kernels', 'n/a')} | "
                f"{_f(r.get('relabelled_overlap_pct'), '.2f')} | "
                f"{_f(r.get('relabelled_hta_overlap_pct'), '.2f')} | "
                f"{_f(r.get('relabelled_exposed_ms_per_step'), '.3f')} | "
                f"{_f(r.get('profile_stop_s'), '.3f')} | {_f(r.get('profile_write_s'), '.3f')} | "
                f"{_f(r.get('trace_mb'), '.1f')} |")
        lines.append("")
    costs = res.get("unit_costs")
    if costs:
        lines += ["## Hot-path unit costs (µs per call, training thread)", "",
                  "| call | µs |", "| --- | --- |"]
        lines += [f"| {k} | {val:.2f} |" for k, val in costs.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="small model, few steps")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tuning", default="eager,default,max-autotune-no-cudagraphs,"
                        "reduce-overhead")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="skip tuning rows that would start after this many seconds")
    parser.add_argument("--tag", default="gpu-h200", help="name of the result files")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after warm-up and gc.collect() before every block")
    args = parser.parse_args()
    started = time.monotonic()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    cfg = GPTConfig(layers=4, batch=2) if args.quick else GPTConfig()
    if args.quick:
        args.rounds, args.steps = 2, 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="otel-train-bench-"))
    res: dict[str, Any] = {"versions": versions(), "model": asdict(cfg)}
    with torch.device("meta"):
        res["params_m"] = sum(p.numel() for p in GPT(cfg).parameters()) / 1e6
    flops = res["flops_per_step"] = flops_per_step(cfg)
    res["unit_costs"] = unit_costs()
    res["overhead"] = overhead(cfg, args.rounds, args.steps, root, flops, args.gc_freeze)
    print(markdown(res), flush=True)
    res["tuning"] = []
    for mode in [m for m in args.tuning.split(",") if m and m != "none"]:
        if time.monotonic() - started > args.budget_s:
            res["tuning"].append({"config": mode, "error": "skipped: time budget"})
            continue
        try:
            res["tuning"].append(tuning_row(cfg, None if mode == "eager" else mode,
                                            max(args.steps, 8), root, flops))
        except Exception as err:  # a mode that does not apply here: say so, go on
            res["tuning"].append({"config": mode, "error": f"{type(err).__name__}: {err}"})
        row = res["tuning"][-1]
        if row.get("trace") and mode == "default":  # keep one real trace to re-check anywhere
            import gzip
            import shutil

            with open(row["trace"], "rb") as src, \
                    gzip.open(args.out_dir / "trace-default.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        print(json.dumps(row, default=str)[:2000], flush=True)
    res["elapsed_s"] = time.monotonic() - started
    (args.out_dir / f"{args.tag}.json").write_text(json.dumps(res, indent=2, default=str))
    (args.out_dir / f"{args.tag}.md").write_text(markdown(res))
    print(markdown(res), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
