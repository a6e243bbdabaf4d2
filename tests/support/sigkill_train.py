"""Two gloo ranks train with DDP; rank 1 is SIGKILLed at step 5. Prints rank 0's outcome."""

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import otel_train
from support import training


def rank_main(rank: int, out: str, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=30))
    model, opt, loader = training.setup(batches=40)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    try:
        with otel_train.instrument(ddp, output_dir=out, run_id="sigkill",
                                   stall_timeout_s=1.0) as inst:
            for step, (x, y) in enumerate(loader):
                if rank == 1 and step == 5:
                    os.kill(os.getpid(), signal.SIGKILL)
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()
    except Exception as err:  # the survivor's collective fails once its peer is gone
        print(f"rank {rank} stopped: {type(err).__name__}", flush=True)
    print(f"rank {rank} exported, dropped={inst.dropped}", flush=True)


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(rank_main, args=(sys.argv[1], port), nprocs=2, join=False,
                             start_method="spawn")
    ctx.processes[0].join(120)
    print(f"rank 0 exit code {ctx.processes[0].exitcode}", flush=True)
