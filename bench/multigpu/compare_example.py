"""The worked example of docs/compare.md: eager vs compiled FSDP2, as a user would compare them.

One configuration per launch, NCCL ranks sharing GPU 0 (docs/multigpu.md: each rank its own
``NCCL_HOSTID``, the socket transport) or one rank per GPU where there are as many; the
GPT of ``bench/bench_gpu.py`` sharded with FSDP2 (bf16 parameters, fp32 reductions), every
block ``torch.compile``'d with ``--compiled``; ``otel_train.instrument`` around the whole
loop with its defaults, the first steps (compile, warm-up) included, as users run it: the
comparison itself leaves them out.

    NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 torchrun --standalone --nproc-per-node 2 \\
        bench/multigpu/compare_example.py --run-id eager --out runs
    ... --compiled --run-id compiled --out runs
    otel-train compare runs/eager runs/compiled

bench/multigpu/compare_call.sh runs both and the comparison on the device.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NCCL_HOSTID", f"otel-train-rank-{os.environ.get('RANK', '0')}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
from bench_gpu import GPT, GPTConfig, flops_per_step  # noqa: E402

import otel_train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="root of the run directories")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    # one GPU each where there are enough, else all on GPU 0 (NCCL_HOSTID set above)
    enough = torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpu = local if enough else 0
    device = torch.device("cuda", gpu)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    cfg = GPTConfig(dim=args.dim, layers=args.layers, seq=args.seq, batch=args.batch)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    if args.compiled:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, fullgraph=True)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator(device=device).manual_seed(rank)
    data = []
    for _ in range(4):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), device=device,
                               generator=g)
        data.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    # the model's FLOPs a step, counted on a meta-device copy: otel-train counts them itself
    # only for a model with no compiled parts (a dispatch mode around a compiled region could
    # recompile), so both runs are given the same count and MFU is comparable
    flops = flops_per_step(cfg)
    with otel_train.instrument(model, optimizer=opt, output_dir=args.out, run_id=args.run_id,
                               samples_per_step=cfg.batch, tokens_per_step=cfg.batch * cfg.seq,
                               flops_per_step=flops,
                               console_log_level="warning", shutdown_timeout_s=300):
        for step in range(args.steps):
            tokens, targets = data[step % len(data)]
            model(tokens, targets).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    if rank == 0:
        print(f"{args.run_id}: {args.steps} steps, peak allocated "
              f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (rank 0)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
