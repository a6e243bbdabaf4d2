"""What one read of the NCCL flight recorder costs, by part: torch's JSON dump, its pickle
dump, Python's parse of each, and otel-train's poll (parse + per-entry bookkeeping).

Usage (one GPU): ``TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_ENABLE_TIMING=1 python
bench/multigpu/fr_read_cost.py``. Prints JSON with medians over ``--reads`` reads of a full
ring.
"""

from __future__ import annotations

import argparse
import json
import pickle
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from otel_train.sources.collectives.flight_recorder import FlightRecorder, buffer_size  # noqa: E402


def timed(fn, reads: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(reads):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=7)
    args = parser.parse_args()
    from torch._C import _distributed_c10d as c10d

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, device_id=torch.device("cuda:0"))
    x = torch.ones(1 << 16, device="cuda")
    for _ in range(buffer_size() + 100):  # fill the ring
        dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(2.0)  # retired by the watchdog
    res: dict[str, object] = {"buffer": buffer_size(), "torch": torch.__version__}
    t, raw_json = timed(lambda: c10d._dump_nccl_trace_json(includeCollectives=True,
                                                           onlyActive=False), args.reads)
    res["json_dump_ms"] = 1e3 * t
    res["json_bytes"] = len(raw_json)
    res["json_parse_ms"] = 1e3 * timed(lambda: json.loads(raw_json), args.reads)[0]
    t, raw_pickle = timed(lambda: c10d._dump_nccl_trace(
        includeCollectives=True, includeStackTraces=False, onlyActive=False), args.reads)
    res["pickle_dump_ms"] = 1e3 * t
    res["pickle_bytes"] = len(raw_pickle)
    res["pickle_parse_ms"] = 1e3 * timed(lambda: pickle.loads(raw_pickle), args.reads)[0]
    fr = FlightRecorder(1, since_ns=0)
    t0 = time.perf_counter()
    first = fr.poll()
    res["poll_first_ms"] = 1e3 * (time.perf_counter() - t0)  # every entry new
    res["poll_first_entries"] = len(first)
    res["poll_again_ms"] = 1e3 * timed(fr.poll, args.reads)[0]  # every entry finalized
    dist.destroy_process_group()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
