"""Diagnostic, not a benchmark: how many finished steps the emitter holds back for the NCCL
source, step by step, and how long ``instrument()`` takes to end, at world size 1 (where NCCL
runs without the profiler plugin and the flight recorder is the source).

    torchrun --standalone --nproc-per-node 1 bench/nccl/held_steps.py ddp|fsdp

Found in the tenth session: steps held for the flight recorder left one per read (held grew
to 18-28 in 30 steps, and the end waited a second); since then a read releases every step
that ended before it began.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

import otel_train


def main() -> None:
    fsdp = sys.argv[1] == "fsdp"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    with otel_train.instrument(model, optimizer=opt, output_dir="/tmp/held-steps") as inst:
        source = next(s for s in inst._sources if type(s).__name__ == "CollectiveSource")
        ledger = source.ledger
        for i in range(30):
            model(torch.randn(64, 1024, device="cuda")).square().mean().backward()
            if not fsdp:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            time.sleep(0.05)
            rows.append({"i": i, "plugin": ledger.plugin is not None,
                         "flight_recorder": ledger.flight_recorder is not None,
                         "reads": ledger.reads, "held": len(inst.emitter.steps.held)})
        t0 = time.perf_counter()
    print(json.dumps({"variant": sys.argv[1], "steps": rows[::5] + rows[-1:],
                      "exit_s": time.perf_counter() - t0}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
