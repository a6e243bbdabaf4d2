"""What the ``torch.distributed`` wrappers cost the training thread per collective that NCCL's
profiler plugin (or flight recorder) records instead (``Capture.skip_backends``).

Under the plugin every NCCL collective of FSDP2, FSDP1 and user code still passes through
otel-train's wrapper of ``dist.all_gather_into_tensor`` & co. (gloo's share of a
``cpu:gloo,cuda:nccl`` group needs them), which must only see that the collective is
recorded elsewhere and call the original: tens of times a step, on the training thread.
Here a one-rank gloo group stands in for the covered group (its backend put in
``skip_backends``, as the plugin route puts NCCL's), and the wrapped function is a no-op with
``all_reduce``'s signature, so what is timed is the wrapper alone; ``--real``: torch's own
``all_reduce`` on that group instead, a collective between two wrapper calls (colder caches,
as in training; the gloo call's own time is in both cases and cancels); ``--device cuda``
(with ``--real``): a one-rank NCCL group and a CUDA tensor, NCCL in ``skip_backends`` as the
plugin route has it, the GPU synchronised every ``SYNC_EVERY`` calls outside the timed stretches
(the host's own Python and caches, where the training thread's extra per collective was seen).

Cases, interleaved every repeat in one process: the bare function; the wrapper of a covered
collective (default group, and a group passed by keyword); with ``--before FILE`` the same
through an earlier ``capture.py`` (``git show REV:otel_train/sources/collectives/capture.py
> FILE``); the wrapper of a recorded (not covered) collective, for scale. Each: ``--calls``
calls timed by the thread's CPU clock, per call, ``--repeats`` times; added = the case less
the bare function in the same repeat, median and bootstrap 95% CI over repeats; "pass-through"
is the least any Python wrapper costs (``*args, **kwargs`` handed on), the floor for
comparison. Warm caches:
in a training loop each costs several times this. Verdict: a covered collective's wrapper adds
<= 1 us a call (``TARGET_US``); exits 1 on a miss.

    python bench/bench_collective_wrapper.py --before /tmp/capture-before.py \\
        --out bench/results/collective-wrapper-cpu.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import overhead_stats as stats  # noqa: E402

from otel_train.sources.collectives import capture as capture_now  # noqa: E402

TARGET_US = 1.0
SYNC_EVERY = 256  # CUDA: calls between synchronisations (the launch queue never fills)


class _Tracker:
    step, pending_end_ns = 0, None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("capture_before", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None,
               async_op: bool = False) -> None:
    """The stand-in collective: all_reduce's signature, no work."""
    return None


def wrapped(module: Any, covered: bool, original: Callable[..., Any] = all_reduce,
            backend: str = "gloo") -> Callable[..., Any]:
    records: list[tuple[Any, ...]] = []
    cap = module.Capture(records.append, _Tracker())
    if covered:
        cap.skip_backends.add(backend)
    return cap._wrapper("all_reduce", "all_reduce", "tensor", original)


def pass_through(original: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)
    return wrapper


def per_call_us(fn: Callable[[], Any], calls: int,
                sync: Callable[[], Any] | None = None) -> float:
    """Thread CPU per call; ``sync`` (CUDA) runs every SYNC_EVERY calls, outside the timing."""
    fn()
    if sync is None:
        t0 = time.thread_time_ns()
        for _ in range(calls):
            fn()
        return (time.thread_time_ns() - t0) / calls / 1e3
    total, done = 0, 0
    while done < calls:
        sync()
        n = min(SYNC_EVERY, calls - done)
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        total += time.thread_time_ns() - t0
        done += n
    sync()
    return total / calls / 1e3


def measure(calls: int, repeats: int, before: Any | None, real: bool = False,
            device: str = "cpu") -> dict[str, list[float]]:
    """``real``: the wrapped function is torch's own ``all_reduce`` on the one-rank gloo group,
    so that each call runs a collective between two passes through the wrapper (its code and
    data leave the caches as in a training loop) rather than a no-op."""
    x = torch.ones(256 if real else 4, device=device)
    group = dist.group.WORLD
    backend = "nccl" if device == "cuda" else "gloo"
    sync = torch.cuda.synchronize if device == "cuda" else None
    original = dist.distributed_c10d.all_reduce if real else all_reduce
    now_covered = wrapped(capture_now, True, original, backend)
    now_recorded = wrapped(capture_now, False, original, backend)
    floor = pass_through(original)
    cases: dict[str, Callable[[], Any]] = {
        "bare function": lambda: original(x),
        "pass-through (the floor)": lambda: floor(x),
        "covered, default group": lambda: now_covered(x),
        "covered, group=": lambda: now_covered(x, group=group),
        "recorded (not covered), for scale": lambda: now_recorded(x),
    }
    if before is not None:
        then = wrapped(before, True, original, backend)
        cases["before: covered, default group"] = lambda: then(x)
        cases["before: covered, group="] = lambda: then(x, group=group)
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            out[name].append(per_call_us(fn, calls, sync))
    return out


def render(raw: dict[str, list[float]], args: argparse.Namespace) -> tuple[str, dict]:
    bare = raw["bare function"]
    rows, figures = [], {}
    for name, values in raw.items():
        med = stats.summarize(values).median
        if name == "bare function":
            rows.append((name, f"{med:.3f}", "-", "-"))
            continue
        added = [v - b for v, b in zip(values, bare, strict=True)]
        low, high = stats.bootstrap_median_ci(added)
        figures[name] = stats.summarize(added).median
        rows.append((name, f"{med:.3f}", f"{figures[name]:.3f}", f"[{low:.3f}, {high:.3f}]"))
    worst = max(figures["covered, default group"], figures["covered, group="])
    targets = [stats.Target("covered", "<=", TARGET_US, "a covered collective's wrapper", "us")]
    missed = stats.verdict({"covered": worst}, targets)
    text = "\n".join([
        "# The collective wrappers' cost for collectives recorded elsewhere",
        "",
        f"`python bench/bench_collective_wrapper.py {' '.join(sys.argv[1:])}`: "
        f"{args.repeats} repeats of {args.calls} calls per case, interleaved; thread CPU per "
        "call; added = the case less the bare function in the same repeat, median and "
        "bootstrap 95% CI over repeats.",
        "",
        stats.environment_markdown(),
        "",
        stats.markdown_table(["case", "us a call (median)", "added, us", "95% CI"], rows),
        "",
        f"Target: {targets[0].describe()} (the larger of the two covered cases: "
        f"{worst:.3f} us).",
        "",
        "Verdict: " + ("PASS" if not missed else "FAIL: " + "; ".join(missed)),
        "",
    ])
    return text, {"raw_us": raw, "added_us": figures, "missed": missed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--before", type=Path, default=None,
                        help="an earlier otel_train/sources/collectives/capture.py")
    parser.add_argument("--real", action="store_true",
                        help="wrap torch's all_reduce on the one-rank gloo group, not a no-op")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: a one-rank NCCL group and a CUDA tensor (with --real)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeats < 3:
        parser.error("--calls >= 1 and --repeats >= 3")
    if args.device == "cuda" and not (args.real and torch.cuda.is_available()):
        parser.error("--device cuda needs --real and a CUDA device")
    before = _load(args.before) if args.before else None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if args.device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        raw = measure(args.calls, args.repeats, before, args.real, args.device)
    finally:
        dist.destroy_process_group()
    text, summary = render(raw, args)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 1 if summary["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
