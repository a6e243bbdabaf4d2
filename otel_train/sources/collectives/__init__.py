"""Collectives: every all-gather, reduce-scatter, all-reduce, ... as a span, with bandwidth,
exposed communication, overlap and stall detection.

The hot path is in ``capture`` (wrappers, ProcessGroup hooks, DDP comm hook) and puts
records; everything else happens on the emitter thread (``ledger`` and the parts it names):
pending collectives are kept by key until their completion record arrives, each finished step
takes the collectives issued before its end (phase by time on the perf_counter clock: the
phase whose interval holds the issue time; async ones may complete later and are emitted
then), and every tick polls Works without a future, reads NCCL's records (the profiler
plugin's or the flight recorder's) and checks for stalls. Each way collectives arrive is a
route (``route.py``), listed with its precedence in ``routes.py``.
Definitions of the numbers: docs/collectives.md.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from otel_train import torch_compat
from otel_train.config import ConfigWarning
from otel_train.recorder import EVENT
from otel_train.sources.collectives import capture as capture_mod
from otel_train.sources.collectives.capture import FLUSH, RECORD, Capture
from otel_train.sources.collectives.ledger import Collective, Ledger
from otel_train.sources.collectives.plugin_choice import _name_the_plugin, auto_declines

__all__ = ["Collective", "CollectiveSource", "Ledger", "auto_declines"]


class CollectiveSource:
    """The source registered in ``instrument.SOURCES``."""

    def __init__(self) -> None:
        self.capture: Capture | None = None
        self.ledger: Ledger | None = None
        self.mechanisms: list[str] = []

    def start(self, ctx: Any) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return
        if torch_compat.torch_version() < torch_compat.MIN_TORCH:
            least = ".".join(map(str, torch_compat.MIN_TORCH))
            warnings.warn(f"otel-train: collectives need torch >= {least} (found "
                          f"{torch.__version__}); not observed", ConfigWarning, stacklevel=4)
            return
        if ctx.config.nccl_plugin:
            _name_the_plugin(ctx.log, ctx.config)
        ledger = self.ledger = Ledger(ctx)
        cap = self.capture = Capture(ctx.recorder.put, ctx.tracker)
        for route in ledger.active:  # NCCL's route, where one reads: the wrappers skip it
            cap.skip_backends.update(route.covers)
            if route.mechanism is not None:
                self.mechanisms.append(route.mechanism)
        wrapped = cap.wrap_functions()
        if wrapped:
            self.mechanisms.append("torch.distributed")
        use_hooks = capture_mod.pg_hooks_available() and ctx.config.collective_pg_hooks
        if use_hooks and cap.hook_groups():
            self.mechanisms.append("process_group_hooks")
        elif ctx.model is not None and cap.hook_ddp(ctx.model, ctx.log):
            self.mechanisms.append("ddp_comm_hook")
        ctx.log.info("otel_train.collectives", mechanisms=self.mechanisms,
                     stall_timeout_s=ctx.config.stall_timeout_s)

    def stop(self) -> None:
        if self.capture is not None:
            self.capture.remove()
            self.ledger.recorder.put_always((EVENT, RECORD, (FLUSH, time.perf_counter_ns())))


