"""The exporter process's throughput and the training process's cost per operation.

Sends ``--records`` collective-shaped spans (with the two metric points each collective
makes) through :class:`otel_train.export.remote.RemotePipeline` in batches the size of
``--batch`` (an emitter drain), and reports:

- the training process's CPU per operation (building the tuple, pickling, sending), from
  the sending thread's CPU clock: what the emitter pays per span or point;
- the exporter process's throughput: operations per second from the first send until it
  has exported everything (files), and what it dropped;
- the same operations through the in-process ``Pipeline`` (the old design), for the ratio.

Targets (issue 15): the exporter keeps up with >= 50,000 records per second per rank
without drops; the training process pays a few microseconds per record. Exits non-zero
when a target is missed (``--no-verdict`` to only report).

    python bench/bench_exporter.py [--records 60000] [--batch 2000] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from otel_train import config as config_mod  # noqa: E402
from otel_train import semconv  # noqa: E402
from otel_train.export.providers import Pipeline  # noqa: E402
from otel_train.export.remote import RemotePipeline  # noqa: E402
from otel_train.identity import Identity  # noqa: E402

TARGET_RECORDS_PER_S = 50_000
TARGET_US_PER_RECORD = 5.0


def _attrs(i: int) -> dict[str, Any]:
    return {semconv.ATTR_RANK: 0, semconv.ATTR_RUN_ID: "bench", semconv.ATTR_STEP: i // 75,
            semconv.ATTR_COLLECTIVE_OP: "all_gather", semconv.ATTR_COLLECTIVE_BACKEND: "nccl",
            semconv.ATTR_COLLECTIVE_BYTES: 25_169_920, semconv.ATTR_COLLECTIVE_GROUP_SIZE: 2,
            semconv.ATTR_COLLECTIVE_SEQ: i, semconv.ATTR_COLLECTIVE_DTYPE: "BFloat16",
            semconv.ATTR_COLLECTIVE_GROUP: "0", semconv.ATTR_COLLECTIVE_API: "nccl:all_gather",
            semconv.ATTR_COLLECTIVE_ASYNC: True, semconv.ATTR_COLLECTIVE_SHAPE: [12584960],
            semconv.ATTR_COLLECTIVE_SOURCE: "nccl_flight_recorder",
            semconv.ATTR_COLLECTIVE_GPU_DURATION: 0.000136}


def run(pipeline: Any, records: int, batch: int) -> dict[str, Any]:
    """Send ``records`` spans (+2 points each); CPU of this thread and wall until flushed."""
    from opentelemetry.trace import SpanContext, TraceFlags

    hist = semconv.create(pipeline.meter, semconv.METRIC_COLLECTIVE_DURATION)
    size = semconv.create(pipeline.meter, semconv.METRIC_COLLECTIVE_SIZE)
    parent = SpanContext(0x1234, 0x5678, False, TraceFlags(1))
    point_attrs = {semconv.ATTR_RANK: 0, semconv.ATTR_COLLECTIVE_OP: "all_gather"}
    t0, c0 = time.perf_counter(), time.thread_time()
    now = time.time_ns()
    for i in range(records):
        pipeline.span(semconv.SPAN_COLLECTIVE, parent, now + i * 1000, now + i * 1000 + 500,
                      _attrs(i))
        hist.record(0.000136, point_attrs)
        size.add(25_169_920, point_attrs)
        if i % batch == batch - 1:
            pipeline.commit()
    pipeline.commit()
    cpu_s = time.thread_time() - c0
    flushed = pipeline.shutdown(120.0)
    wall_s = time.perf_counter() - t0
    ops = records * 3
    return {"records": records, "operations": ops, "sender_cpu_s": cpu_s,
            "sender_us_per_record": cpu_s / records * 1e6,
            "sender_us_per_operation": cpu_s / ops * 1e6,
            "wall_s": wall_s, "records_per_s": records / wall_s, "flushed": flushed,
            "dropped": dict(pipeline.dropped)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-verdict", action="store_true")
    args = parser.parse_args()
    if args.records <= 0 or args.batch <= 0:
        parser.error("--records and --batch must be positive")
    ident = Identity("bench", 0, 0, 1, platform.node(), os.getpid())
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("exporter_process", RemotePipeline), ("in_process", Pipeline)):
            cfg = config_mod.load(output_dir=Path(tmp) / name, exporter="file")
            print(f"[bench_exporter] {name}: {args.records} spans", file=sys.stderr)
            results[name] = run(make(cfg, ident, Path(tmp) / name / "run"), args.records,
                                args.batch)
    remote = results["exporter_process"]
    missed = []
    if remote["records_per_s"] < TARGET_RECORDS_PER_S:
        missed.append(f"exporter throughput {remote['records_per_s']:.0f} spans/s < "
                      f"{TARGET_RECORDS_PER_S}")
    if remote["sender_us_per_record"] > TARGET_US_PER_RECORD:
        missed.append(f"training-process CPU {remote['sender_us_per_record']:.1f} us per "
                      f"span (+2 points) > {TARGET_US_PER_RECORD}")
    if any(remote["dropped"].values()):
        missed.append(f"dropped {remote['dropped']}")
    doc = {"date": datetime.datetime.now(datetime.UTC).isoformat(),
           "machine": f"{platform.machine()} {os.cpu_count()} cpus",
           "python": platform.python_version(), "results": results, "missed": missed}
    lines = ["| path | spans | training-process CPU per span (+2 points) | spans/s until flushed "
             "| dropped |", "| --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['records']} | {r['sender_us_per_record']:.1f} us | "
                     f"{r['records_per_s']:.0f} | {r['dropped'] or 0} |")
    table = "\n".join(lines)
    print(table)
    print("verdict:", "; ".join(missed) if missed else "all targets met")
    if args.out:
        args.out.write_text(f"# Exporter process throughput\n\n{doc['date']}, {doc['machine']},"
                            f" Python {doc['python']}\n\n{table}\n\nverdict: "
                            f"{'; '.join(missed) or 'all targets met'}\n")
        args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    return 1 if missed and not args.no_verdict else 0


if __name__ == "__main__":
    sys.exit(main())
