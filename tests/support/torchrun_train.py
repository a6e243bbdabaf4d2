"""A training script as users write it, for torchrun: gloo, DDP, instrumented."""

import sys

import torch
import torch.distributed as dist

import otel_train
from support import training

if __name__ == "__main__":
    dist.init_process_group("gloo")
    model, opt, loader = training.setup(batches=4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    with otel_train.instrument(ddp, output_dir=sys.argv[1]):
        training.train(ddp, opt, loader)
    dist.destroy_process_group()
