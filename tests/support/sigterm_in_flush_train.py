"""A rank whose training raised (a peer's socket closed under its collective), and that its
launcher stops with SIGTERM while it is flushing: torchrun signals every rank's process group
once one rank has failed, and the others are then ending on their own error.

The launcher's signal is sent here by a thread of the rank itself, as soon as the rank's
``stop()`` has begun (the only way to land it inside the flush every time); the process must
flush, then die of the signal."""

import os
import signal
import sys
import threading

import otel_train
from support import training

if __name__ == "__main__":
    model, opt, loader = training.setup(batches=6)
    inst = otel_train.instrument(model, optimizer=opt, output_dir=sys.argv[1])

    def launcher() -> None:
        while inst._started:  # the rank's stop() has not begun
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    with inst:
        training.train(model, opt, loader)
        threading.Thread(target=launcher, daemon=True).start()
        raise RuntimeError("Connection closed by peer")
