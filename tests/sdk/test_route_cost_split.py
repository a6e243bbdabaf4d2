"""bench/multigpu/route_cost.py's split of a block's CPU into what scales with collectives,
with steps and with seconds, on blocks made from a known cost (the GPU run itself is the
device's: bench/results/nccl-timing-route-split-shared-h200.md)."""

from __future__ import annotations

import random
import re
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "multigpu"))

import route_cost  # noqa: E402

PER_COLL_S, PER_STEP_S, PER_S = 2e-6, 60e-6, 1.2e-3  # the cost the blocks are made of
PASS_S = 150e-6  # one emitter pass's fixed cost, paid at each block's edge


def _block(kind: str, steps: int, wall: float, extra: int, passes: int, rng: random.Random
           ) -> dict:
    otel = (PER_S * wall + PER_STEP_S * steps + PER_COLL_S * steps * extra + PASS_S * passes
            + rng.gauss(0, 20e-6))
    main = 50e-6 * steps * (1 + extra)  # bare torch's own work: the same in every arm
    return {"kind": kind, "steps": steps, "wall_s": wall, "extra": extra, "passes": passes,
            "drain_ns": int(PASS_S * 1e9), "otel_threads_cpu_s": otel,
            "process_cpu_s": otel + main,
            "threads_cpu_s": {"py:main": main, route_cost.EMITTER: otel, "NCCL Progress 1": wall},
            "wakeups": {"emitter": passes + round(wall), "gap_sampler": round(5 * wall),
                        "gap_stretches": 0, "gap_overruns": round((kind == "coll") * 3 * wall)}}


def _rows(seed: int = 0, ranks: int = 2, triples: int = 8) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(ranks):
        blocks = []
        for _ in range(triples):
            coll_wall = rng.uniform(0.9, 1.1)
            blocks += [_block("base", 10, 0.13, 0, rng.choice((2, 3)), rng),
                       _block("coll", 10, coll_wall, 20, rng.choice((2, 3, 5)), rng),
                       _block("pad", 10, coll_wall * rng.uniform(0.97, 1.03), 0,
                              rng.choice((2, 3)), rng)]
        rows.append({"blocks": blocks})
    return rows


def test_the_three_costs_are_told_apart() -> None:
    rows = _rows()
    per_coll = statistics.median(route_cost.marginal(rows, route_cost.otel))
    per_step = statistics.median(route_cost.per_step(rows, route_cost.otel))
    per_s = statistics.median(route_cost.per_s(b, p, route_cost.otel)
                              for b, _, p in route_cost.triples(rows))
    assert per_coll == pytest.approx(PER_COLL_S * 1e6, abs=0.3)
    assert per_step == pytest.approx(PER_STEP_S * 1e6, abs=6)
    assert per_s == pytest.approx(PER_S, rel=0.1)


def test_without_the_pad_block_per_second_cost_reads_as_per_collective() -> None:
    """What the earlier method (coll against base) reported: the longer coll block's seconds
    charged to its collectives, several times the real per-collective cost here."""
    rows = _rows()
    old = statistics.median(
        1e6 * (route_cost.otel(c) / c["steps"] - route_cost.otel(b) / b["steps"]) / c["extra"]
        for b, c, _ in route_cost.triples(rows))
    assert old > 3 * PER_COLL_S * 1e6


def test_the_edges_drains_are_taken_out() -> None:
    """Blocks with more edge passes (coll's wait for its records) cost no more per collective:
    without edge_s the extra passes would read as ~4 us a collective."""
    rows = _rows()
    raw = statistics.median(route_cost.marginal(rows, lambda b: b["otel_threads_cpu_s"]))
    taken_out = statistics.median(route_cost.marginal(rows, route_cost.otel))
    assert taken_out == pytest.approx(PER_COLL_S * 1e6, abs=0.3)
    assert abs(raw - taken_out) > 0.1


def test_figures_and_verdicts_from_launched_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    bare, auto = _rows(seed=1), _rows(seed=2)
    for row in bare:  # no otel-train threads in bare
        for b in row["blocks"]:
            b["otel_threads_cpu_s"] = 0.0
            b["threads_cpu_s"].pop(route_cost.EMITTER)
            b["process_cpu_s"] = b["threads_cpu_s"]["py:main"]
            b["passes"] = b["drain_ns"] = 0
    monkeypatch.setattr(route_cost, "launch",
                        lambda ranks, arm, args, out: bare if arm == "bare" else auto)

    class Args:
        arms, extra, block = ["bare", "auto"], 20, 10

    result = route_cost.figures(2, Args, Path("."))
    a = result["arms"]["auto"]
    assert a["added_pairs_us"][0] == pytest.approx(PER_COLL_S * 1e6, abs=0.5)
    assert a["otel_per_s"][0] == pytest.approx(PER_S * 1e3, rel=0.1)
    assert a["wakeups_per_s"]["pad"]["gap_sampler"] == pytest.approx(5, abs=1)
    assert a["wakeups_per_s"]["coll"]["gap_overruns"] == pytest.approx(3, abs=0.5)
    assert a["wakeups_per_s"]["pad"]["gap_overruns"] == 0
    # 1.2 ms/s: over the 1 ms/s target, 2 us a collective under 5
    (miss,) = route_cost.verdicts([result])
    assert miss.startswith("2 ranks: threads 1.") and miss.endswith("ms/s > 1.0")
    text = route_cost.markdown([result], dict(date="d", gpu="g", torch="t", nccl="n",
                                              python="p", commit="c"))
    assert "| 2 | auto |" in text
    assert re.search(r"^\| 2 \| auto \| coll \| 1\.0 \| [45]\.\d \| 0\.0 \| [23]\.\d \|$", text,
                     re.M)


def test_a_run_without_complete_triples_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows()
    for row in rows:
        row["blocks"] = row["blocks"][:2]  # base, coll: no pad
    monkeypatch.setattr(route_cost, "launch", lambda ranks, arm, args, out: rows)

    class Args:
        arms, extra, block = ["bare", "auto"], 20, 10

    with pytest.raises(RuntimeError, match="no complete"):
        route_cost.figures(2, Args, Path("."))
