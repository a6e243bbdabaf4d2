"""The one-time cost of counting FLOPs for MFU (otel_train/sources/gpu/mfu.py).

On a CUDA run without compiled parts, otel-train counts one step's FLOPs (step
``MEASURE_STEP``) under ``torch.utils.flop_counter.FlopCounterMode``, a dispatch mode that
sees every aten op on the training thread. This measures what that one step costs: a small
GPT-like model (embedding, attention and MLP blocks, the ops a transformer step issues),
forward + backward + optimizer step, timed bare and under the counter, interleaved, on this
machine's CPU (the counter's cost is host work per op; on a GPU run the counted step's host
time grows by about as much, once per run). Reports the median step both ways, the extra
milliseconds, the aten ops counted, the cost per op, and a 95% bootstrap interval of the
extra time; exits 1 if the cost per op is over the target (100 us: ~1 s once per run for a
step of 10,000 ops).

    python bench/bench_mfu_count.py [--rounds 15] [--out bench/results/mfu-count.md]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

#: the counter's host cost per aten op it sees: the counted step costs this times the step's
#: op count, once per run (a 4-block model here: ~1,100 ops; large transformers: ~10^4)
TARGET_US_PER_OP = 100.0


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 4, heads: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    logits = model(idx[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 512, (8, 129))
    for _ in range(3):
        one_step(model, opt, idx)  # warm up: allocator, lazy init
    bare, counted, extra = [], [], []
    ops = flops = 0
    for r in range(args.rounds):
        times = {}
        for arm in (("bare", "counted") if r % 2 == 0 else ("counted", "bare")):
            t0 = time.perf_counter()
            if arm == "counted":
                with FlopCounterMode(display=False) as counter:
                    one_step(model, opt, idx)
                flops = counter.get_total_flops()
            else:
                one_step(model, opt, idx)
            times[arm] = time.perf_counter() - t0
        bare.append(times["bare"])
        counted.append(times["counted"])
        extra.append(times["counted"] - times["bare"])
    # how many aten ops one step dispatches (what the mode intercepts)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args_=(), kwargs=None):
            Count.n += 1
            return func(*args_, **(kwargs or {}))

    with Count():
        one_step(model, opt, idx)
    ops = Count.n
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(extra, k=len(extra))) for _ in range(2000))
    med = statistics.median(extra)
    per_op_us = 1e6 * med / max(ops, 1)
    lines = [
        "# One-time cost of counting FLOPs for MFU (bench/bench_mfu_count.py)", "",
        f"- date {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, 1 CPU thread",
        f"- model: TinyGPT (4 blocks, dim 128, batch 8 x 128 tokens), {flops / 1e9:.2f} "
        f"GFLOP per step, {ops} aten ops per step",
        f"- step bare: median {1e3 * statistics.median(bare):.1f} ms (min "
        f"{1e3 * min(bare):.1f}, max {1e3 * max(bare):.1f}); under FlopCounterMode: median "
        f"{1e3 * statistics.median(counted):.1f} ms (p99/max {1e3 * max(counted):.1f})",
        f"- extra for the counted step: median {1e3 * med:.1f} ms, 95% CI "
        f"[{1e3 * boots[50]:.1f}, {1e3 * boots[1949]:.1f}] ms over {args.rounds} paired "
        f"rounds; {1e6 * med / max(ops, 1):.1f} us per aten op",
        f"- target: <= {TARGET_US_PER_OP:.0f} us per aten op, once per run: "
        f"{'met' if per_op_us <= TARGET_US_PER_OP else 'MISSED'}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if per_op_us <= TARGET_US_PER_OP else 1


if __name__ == "__main__":
    sys.exit(main())
