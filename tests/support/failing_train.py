"""A user's torchrun script (gloo, DDP, instrumented) in which one rank fails mid-run.

FAIL=raise: rank FAIL_RANK raises at step FAIL_STEP (a message holding a token, which must
come out scrubbed); FAIL=kill: it SIGKILLs itself there (no cleanup, no run span), once its
first steps were exported: every step before it emitted, and an emitter pass after that
(which hands them to the exporter process, which outlives the rank to flush them). The other
ranks then lose it in their next collective, or are stopped by torchrun.
"""

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

import otel_train
from support import training
from support.waits import emitter_passes, wait_for

FAIL = os.environ.get("FAIL", "raise")
FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "5"))
SECRET = "hf_Zx81abcdefghijklmnopqrst"

if __name__ == "__main__":
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    model, opt, loader = training.setup(batches=12)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    with otel_train.instrument(ddp, optimizer=opt, output_dir=sys.argv[1],
                               run_id="fates") as inst:
        for step, (x, y) in enumerate(loader):
            if rank == FAIL_RANK and step == FAIL_STEP:
                if FAIL == "kill":  # after its first steps were exported, as in a long run
                    wait_for(f"steps 0-{step - 1} emitted",
                             lambda: inst.emitter.steps_emitted >= FAIL_STEP, 60, interval=0.05)
                    emitter_passes(inst)
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"loss is NaN (hub token {SECRET})")
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
