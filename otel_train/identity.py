"""Who this process is in the job, and the ids every rank derives without talking.

Ranks agree on a run id once (an explicit one, the launcher's, or one broadcast by rank 0).
From then on a step's trace id and its root span id are pure functions of (run id, step), so
every rank puts its spans into the same trace and every trace-id sampler decides the same
way on every rank, with no further communication.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import socket
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_train import config, semconv
from otel_train.config import ConfigWarning

_BAD_RUN_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


@dataclasses.dataclass(frozen=True)
class Identity:
    run_id: str
    rank: int
    local_rank: int
    world_size: int
    host_name: str
    pid: int

    def metric_attributes(self) -> dict[str, Any]:
        """What every metric point of this rank carries: its rank and run id (a new dict)."""
        return {semconv.ATTR_RANK: self.rank, semconv.ATTR_RUN_ID: self.run_id}


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        warnings.warn(f"otel-train: {name}={env[name]!r} is not an integer; using {default}",
                      ConfigWarning, stacklevel=3)
        return default


def _dist_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank_and_world(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, local rank, world size): from the process group if there is one, else env."""
    env = os.environ if env is None else env
    if _dist_initialized():
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _int_env(env, "RANK", 0), _int_env(env, "WORLD_SIZE", 1)
    return rank, _int_env(env, "LOCAL_RANK", rank), world


def sanitize_run_id(raw: str) -> str:
    cleaned = _BAD_RUN_ID_CHARS.sub("-", raw.strip())[:128].strip(".")
    return cleaned or uuid.uuid4().hex


def launcher_run_id(env: Mapping[str, str]) -> str | None:
    """The id a launcher gave this job: torchrun's rendezvous id, a Kubernetes job's name."""
    value = config.launcher_run_id(env)
    return None if value is None else sanitize_run_id(value)


def agree_run_id(explicit: str | None, env: Mapping[str, str] | None = None) -> str:
    """One run id for all ranks: explicit, else the launcher's, else rank 0's broadcast."""
    env = os.environ if env is None else env
    if explicit:
        return sanitize_run_id(explicit)
    from_launcher = launcher_run_id(env)
    if from_launcher:
        return from_launcher
    fresh = f"{uuid.uuid4().hex[:16]}"
    if _dist_initialized():
        import torch.distributed as dist

        if dist.get_world_size() > 1:
            return broadcast_run_id(fresh)
    elif _int_env(env, "WORLD_SIZE", 1) > 1:
        warnings.warn(
            "otel-train: several ranks but no process group yet and no launcher run id; "
            "each rank gets its own run id. Call instrument() after init_process_group, "
            "or set OTEL_TRAIN_RUN_ID.",
            ConfigWarning,
            stacklevel=3,
        )
    return fresh


#: bytes of the run id broadcast: rank 0's fresh id is 16 hex digits, so this has room to spare
_BROADCAST_BYTES = 64


def broadcast_run_id(fresh: str) -> str:
    """Rank 0's ``fresh`` id on every rank, by one broadcast of a fixed-size byte tensor.

    Not ``broadcast_object_list``: it pickles through a tensor that needs numpy on the
    receiving ranks, and a plain ``pip install`` has no numpy, which left every rank but 0
    uninstrumented. A fixed size also makes it one collective instead of two (size, then
    payload). Runs once at start-up, so the copy back to the host is no concern.
    """
    import torch
    import torch.distributed as dist

    data = fresh.encode("ascii")[:_BROADCAST_BYTES]
    buf = torch.zeros(_BROADCAST_BYTES, dtype=torch.uint8, device=_collective_device())
    if dist.get_rank() == 0:
        buf[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    received = bytes(buf.cpu().tolist()).rstrip(b"\0").decode("ascii", errors="replace")
    return sanitize_run_id(received)


def _collective_device() -> str:
    """Where the default group's tensors live: CPU when a CPU backend (gloo) is there, else
    the accelerator's current device ("cuda" means the current CUDA device, as NCCL needs).
    This is the rule ``broadcast_object_list`` used, so NCCL-only jobs behave as before."""
    from otel_train import torch_compat

    device = torch_compat.object_collective_device()
    if device is not None:
        return device
    import torch.distributed as dist

    return "cuda" if str(dist.get_backend()) == "nccl" else "cpu"


def resolve(explicit_run_id: str | None, env: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if env is None else env
    rank, local_rank, world = rank_and_world(env)
    return Identity(
        run_id=agree_run_id(explicit_run_id, env),
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        host_name=socket.gethostname(),
        pid=os.getpid(),
    )


# --- derived ids -------------------------------------------------------------------------


def _digest(*parts: object) -> bytes:
    return hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=16).digest()


def _nonzero(value: int) -> int:
    return value or 1  # an all-zero id is invalid in OpenTelemetry


def _step_prefix(run_id: str) -> Any:
    """The hash of a run's step ids up to the step: ``run_id``, "step" (``_digest``'s bytes)."""
    return hashlib.blake2b(f"{run_id}\x1fstep\x1f".encode(), digest_size=16)


def _step_hash(prefix: Any, step: int) -> Any:
    h = prefix.copy()
    h.update(str(step).encode())
    return h


def _id64(h: Any, suffix: bytes) -> int:
    h.update(suffix)
    return _nonzero(int.from_bytes(h.digest()[:8], "big"))


def step_trace_id(run_id: str, step: int) -> int:
    """The trace id of step ``step``, the same on every rank."""
    return _nonzero(int.from_bytes(_step_hash(_step_prefix(run_id), step).digest(), "big"))


def step_span_id(run_id: str, step: int) -> int:
    """The span id of the step's root ``training.step`` span (emitted by rank 0)."""
    return _id64(_step_hash(_step_prefix(run_id), step), b"\x1froot")


def rank_step_span_id(run_id: str, step: int, rank: int) -> int:
    """The span id of one rank's ``training.rank_step`` span."""
    return _id64(_step_hash(_step_prefix(run_id), step), f"\x1frank\x1f{rank}".encode())


class StepIds:
    """:func:`step_trace_id` and :func:`rank_step_span_id` of one rank's steps, once a step
    on the emitter thread: the same hash, its run prefix made once."""

    __slots__ = ("_prefix", "_rank")

    def __init__(self, run_id: str, rank: int) -> None:
        self._prefix = _step_prefix(run_id)
        self._rank = f"\x1frank\x1f{rank}".encode()

    def of(self, step: int) -> tuple[int, int]:
        """(step_trace_id, rank_step_span_id) of ``step``."""
        h = _step_hash(self._prefix, step)
        trace_id = _nonzero(int.from_bytes(h.digest(), "big"))
        return trace_id, _id64(h, self._rank)


def run_trace_id(run_id: str) -> int:
    """Trace of the ``training.run`` spans when no launcher context is given."""
    return _nonzero(int.from_bytes(_digest(run_id, "run"), "big"))


def run_span_id(run_id: str, rank: int) -> int:
    return _nonzero(int.from_bytes(_digest(run_id, "run", rank)[:8], "big"))


def launcher_context(env: Mapping[str, str] | None = None) -> SpanContext | None:
    """The span context of ``TRACEPARENT`` (W3C), if the launcher set one."""
    env = os.environ if env is None else env
    traceparent = env.get("TRACEPARENT", "").strip()
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if env.get("TRACESTATE"):
        carrier["tracestate"] = env["TRACESTATE"]
    from opentelemetry import trace

    ctx = TraceContextTextMapPropagator().extract(carrier)
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        warnings.warn(
            f"otel-train: TRACEPARENT={traceparent[:80]!r} is not a valid W3C traceparent; "
            "training.run starts a new trace",
            ConfigWarning,
            stacklevel=3,
        )
        return None
    return span_context
