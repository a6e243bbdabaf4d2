"""Synthetic runs of many ranks, replicated from a real run directory (a demo's, say).

Rank ``r`` of the new run is a copy of the real rank ``r % world`` with its rank, run id and
world size rewritten, and its own span ids (parents it shares with other ranks, such as the
step's root span on rank 0, are kept); only rank 0 keeps the step's root spans. Trace ids
stay: every copy of a step is in that step's trace, as ranks of a real run are.

``slow=(rank, part, factor)`` plants a slowdown: that rank's ``part`` (backward, say) takes
``factor`` times as long in every step, and the others wait for it, as in synchronous
training: their exposed communication grows by as much, inside their backward (where DDP's
and FSDP's gradient collectives block), every rank's step ends that much later, and every
later step starts that much later.

    python tests/support/replicate.py REAL_RUN_DIR OUT_ROOT --ranks 1024 [--run-id ID]
        [--slow RANK:PART:FACTOR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, as a script

from otel_train import semconv as sc  # noqa: E402

Slow = tuple[int, str, float]


def _files(run_dir: Path, glob: str) -> dict[int, Path]:
    """rank -> its file of one signal (``traces.rank-3.jsonl``)."""
    out = {}
    for path in sorted(run_dir.glob(glob)):
        rank = path.name.split(".")[-2].removeprefix("rank-")
        if rank.isdigit():
            out[int(rank)] = path
    return out


def _set(attributes: list[dict[str, Any]], values: dict[str, Any]) -> None:
    for attribute in attributes:
        if attribute["key"] in values:
            value = values[attribute["key"]]
            kind = "intValue" if isinstance(value, int) else "stringValue"
            if isinstance(value, float):
                kind = "doubleValue"
            attribute["value"] = {kind: str(value) if kind == "intValue" else value}


def _get(attributes: list[dict[str, Any]], key: str) -> Any:
    for attribute in attributes:
        if attribute["key"] == key:
            value = attribute["value"]
            if "intValue" in value:
                return int(value["intValue"])
            return next(iter(value.values()))
    return None


def _add(attributes: list[dict[str, Any]], key: str, seconds: float) -> None:
    for attribute in attributes:
        if attribute["key"] == key:
            attribute["value"] = {"doubleValue": float(next(iter(attribute["value"].values())))
                                  + seconds}
            return


def _span_id(old: str, rank: int) -> str:
    return hashlib.blake2b(f"{old}/{rank}".encode(), digest_size=8).hexdigest()


class _Plan:
    """The planted slowdown, from the real rank it copies: each step's extra seconds, where
    in the step they begin, and how much later the step starts."""

    def __init__(self, traces: Path, part: str, factor: float) -> None:
        self.extra: dict[int, float] = {}  # step -> seconds
        self.after: dict[int, int] = {}  # step -> the slowed phase's end, template ns
        phase = sc.PHASE_SPAN.get(part, part)
        ends: dict[str, int] = {}
        steps: dict[str, int] = {}
        for span in _spans(traces):
            if span["name"] == sc.SPAN_RANK_STEP:
                step = _get(span["attributes"], sc.ATTR_STEP)
                steps[span["spanId"]] = step
                key = sc.ATTR_RANK_STEP_PART_PREFIX + part
                self.extra[step] = (factor - 1.0) * float(_get(span["attributes"], key) or 0)
            elif span["name"] == phase:
                ends[span.get("parentSpanId", "")] = int(span["endTimeUnixNano"])
        for span_id, step in steps.items():
            self.after[step] = ends.get(span_id, 0)
        self.shift: dict[int, int] = {}
        total = 0.0
        for step in sorted(self.extra):
            self.shift[step] = int(total * 1e9)
            total += self.extra[step]


def _spans(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as lines:
        for line in lines:
            for rs in json.loads(line).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    yield from ss.get("spans", ())


def replicate(real: Path, out_root: Path, ranks: int, run_id: str,
              slow: Slow | None = None) -> Path:
    """A run directory of ``ranks`` ranks under ``out_root``, copied from ``real``."""
    out = out_root / run_id
    out.mkdir(parents=True, exist_ok=True)
    traces = _files(real, sc.TRACES_GLOB)
    if not traces:
        raise FileNotFoundError(f"{real}: no traces files")
    world = max(traces) + 1
    plan = _Plan(traces[slow[0] % world], slow[1], slow[2]) if slow else None
    for glob, key in ((sc.TRACES_GLOB, "resourceSpans"), (sc.METRICS_GLOB, "resourceMetrics"),
                      (sc.LOGS_GLOB, "resourceLogs")):
        for rank in range(ranks):
            source = _files(real, glob).get(rank % world)
            if source is None:
                continue
            name = source.name.replace(f"rank-{rank % world}", f"rank-{rank}")
            with open(source, "rb") as lines, open(out / name, "w") as target:
                for line in lines:
                    request = json.loads(line)
                    _copy(request, key, rank, ranks, run_id, plan, slow)
                    target.write(json.dumps(request, separators=(",", ":")) + "\n")
    info = json.loads((real / "run.json").read_text()) if (real / "run.json").exists() else {}
    info.update({"run_id": run_id, "world_size": ranks})
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def _copy(request: dict[str, Any], key: str, rank: int, ranks: int, run_id: str,
          plan: _Plan | None, slow: Slow | None) -> None:
    ids = {sc.ATTR_RANK: rank, sc.ATTR_RUN_ID: run_id, sc.ATTR_WORLD_SIZE: ranks}
    for resource in request.get(key, ()):
        attrs = resource.get("resource", {}).get("attributes", [])
        _set(attrs, {**ids, "service.instance.id": f"{run_id}-rank-{rank}"})
        for scope in resource.get("scopeSpans", resource.get("scopeMetrics",
                                                             resource.get("scopeLogs", ()))):
            if key == "resourceSpans":
                scope["spans"] = _copy_spans(scope.get("spans", []), rank, ids, plan, slow)
            elif key == "resourceMetrics":
                for metric in scope.get("metrics", ()):
                    body = next((v for v in metric.values()
                                 if isinstance(v, dict) and "dataPoints" in v), {})
                    for point in body.get("dataPoints", ()):
                        _set(point.get("attributes", []), ids)
            else:
                for record in scope.get("logRecords", ()):
                    _set(record.get("attributes", []), ids)
                    if record.get("spanId"):
                        record["spanId"] = _span_id(record["spanId"], rank)


def _copy_spans(spans: list[dict[str, Any]], rank: int, ids: dict[str, Any],
                plan: _Plan | None, slow: Slow | None) -> list[dict[str, Any]]:
    own = {s["spanId"] for s in spans if s["name"] != sc.SPAN_STEP}
    step_of = {s["spanId"]: _get(s["attributes"], sc.ATTR_STEP) for s in spans
               if s["name"] == sc.SPAN_RANK_STEP}
    parent = {s["spanId"]: s.get("parentSpanId", "") for s in spans}
    kept = []
    for span in spans:
        if span["name"] == sc.SPAN_STEP and rank != 0:
            continue  # only rank 0 has the step's root span
        if plan is not None and slow is not None:
            _plant(span, rank, plan, slow, _step_of(span, step_of, parent))
        if span["spanId"] in own:
            span["spanId"] = _span_id(span["spanId"], rank)
        if span.get("parentSpanId") in own:
            span["parentSpanId"] = _span_id(span["parentSpanId"], rank)
        _set(span["attributes"], ids)
        kept.append(span)
    return kept


def _step_of(span: dict[str, Any], step_of: dict[str, int], parent: dict[str, str]
             ) -> int | None:
    step = _get(span["attributes"], sc.ATTR_STEP)
    at = span["spanId"]
    for _ in range(4):  # a collective's phase's rank step
        if step is not None:
            return step
        at = parent.get(at, "")
        step = step_of.get(at)
    return step


def _plant(span: dict[str, Any], rank: int, plan: _Plan, slow: Slow, step: int | None
           ) -> None:
    """The slowdown in one span of ``rank``: moved by the earlier steps' extra time, and
    within its step by this step's where it lies after the slowed phase."""
    if step is None or step not in plan.extra:
        return
    extra_s, after = plan.extra[step], plan.after[step]
    extra, start, end = int(extra_s * 1e9), int(span["startTimeUnixNano"]), \
        int(span["endTimeUnixNano"])
    name, attrs = span["name"], span["attributes"]
    slowed_rank, part, _ = slow
    phase = sc.PHASE_SPAN.get(part, part)
    # the others wait inside their backward (gradient collectives), the slow rank computes
    stretched = sc.SPAN_BACKWARD if rank != slowed_rank else phase
    start += plan.shift[step] + (extra if start >= after and name != stretched else 0)
    end += plan.shift[step] + (extra if end >= after or name in (
        stretched, sc.SPAN_RANK_STEP, sc.SPAN_STEP) else 0)
    span["startTimeUnixNano"], span["endTimeUnixNano"] = str(start), str(end)
    if name == sc.SPAN_RANK_STEP:
        _add(attrs, sc.ATTR_STEP_DURATION, extra_s)
        grown = part if rank == slowed_rank else sc.PART_EXPOSED_COMM
        _add(attrs, sc.ATTR_RANK_STEP_PART_PREFIX + grown, extra_s)
        _add(attrs, sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_BACKWARD, extra_s)
        if rank != slowed_rank:
            _add(attrs, sc.ATTR_PHASE_TOTAL_PREFIX + sc.PHASE_EXPOSED_COMM, extra_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("real", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--slow", default=None, help="RANK:PART:FACTOR, e.g. 3:backward:1.1")
    args = parser.parse_args(argv)
    slow = None
    if args.slow:
        rank, part, factor = args.slow.split(":")
        slow = (int(rank), part, float(factor))
    run_id = args.run_id or f"replica-{args.ranks}"
    print(replicate(args.real, args.out, args.ranks, run_id, slow))
    return 0


if __name__ == "__main__":
    sys.exit(main())
