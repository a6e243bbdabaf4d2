"""bench/multigpu/route_cost.py's arithmetic on blocks whose figures are known: the plugin's
in-situ callback time (the ``auto_timed`` arm) comes out per extra collective, beside
otel-train's threads, and the report prints it. The blocks are made here, as the device's
runs write them (tests/gpu/nccl_faults_train.py's ``_block``); the launches need NCCL."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _route_cost():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(
        "route_cost", REPO / "bench" / "multigpu" / "route_cost.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


STEPS, EXTRA = 10, 20
COLLECTIVES = STEPS * EXTRA  # in a coll block


def _block(kind: str, wall: float, main_s: float, otel_s: float, callbacks_s: float | None,
           callbacks: int, floor_ns: float | None = None) -> dict:
    block = {"kind": kind, "steps": STEPS, "extra": EXTRA if kind == "coll" else 0,
             "wall_s": wall, "otel_threads_cpu_s": otel_s, "process_cpu_s": main_s + otel_s,
             "threads_cpu_s": {"py:main": main_s, "py:otel-train-emitter": otel_s,
                               "NCCL Progress 1": 0.5 * wall}}
    if callbacks_s is not None:
        block["plugin_callbacks_s"] = callbacks_s
        block["plugin_callbacks"] = callbacks
        if floor_ns is not None:
            block["plugin_timer_floor_ns"] = floor_ns
    return block


def _rows(main_us: float, otel_us: float, callback_us: float | None, ranks: int = 2,
          triples: int = 3, floor_ns: float | None = None) -> list[dict]:
    """Blocks of ``ranks`` ranks: coll adds ``main_us`` on the training thread (the
    callbacks inside it), ``otel_us`` on the emitter a collective; pad is coll's length."""
    rows = []
    for rank in range(ranks):
        blocks = []
        for t in range(triples):
            jitter = 1e-5 * (t + rank)  # the same in a triple's three blocks: it cancels
            timed = callback_us is not None
            blocks += [
                _block("base", 1.0, 0.1 + jitter, 0.002, 0.004 if timed else None, 40, floor_ns),
                _block("coll", 2.0, 0.1 + jitter + COLLECTIVES * main_us / 1e6,
                       0.002 + COLLECTIVES * otel_us / 1e6,
                       (0.004 + COLLECTIVES * callback_us / 1e6) if timed else None,
                       40 + 2 * COLLECTIVES, floor_ns),
                _block("pad", 2.0, 0.1 + jitter, 0.002, 0.004 if timed else None, 40, floor_ns),
            ]
        rows.append({"rank": rank, "blocks": blocks})
    return rows


def test_the_plugins_callbacks_come_out_per_collective_beside_otel_trains_threads() -> None:
    rc = _route_cost()
    per = rc.arm_figures({"bare": _rows(50.0, 0.0, None),
                          "auto_timed": _rows(53.5, 1.0, 1.5)})
    timed = per["auto_timed"]
    assert timed["plugin_callbacks_us"][0] == pytest.approx(1.5)
    assert timed["plugin_callbacks_per_collective"] == pytest.approx(2.0)
    assert timed["otel_threads_us"][0] == pytest.approx(1.0)
    assert timed["parts_us"][0] == pytest.approx(2.5)
    # the whole process's marginal: the training thread's 3.5 more and the emitter's 1.0
    assert timed["added_pairs_us"][0] == pytest.approx(4.5)
    assert "plugin_callbacks_us" not in per["bare"]
    env = {"date": "d", "gpu": "g", "torch": "t", "nccl": "n", "python": "p", "commit": "c"}
    text = rc.markdown([{"ranks": 2, "extra": EXTRA, "block": STEPS, "arms": per}], env)
    row = next(line for line in text.splitlines() if line.startswith("| 2 | auto_timed | 2.00"))
    assert ("| 0 | 1.50 [1.50, 1.50] | 1.50 [1.50, 1.50] | 1.00 [1.00, 1.00] "
            "| 2.50 [2.50, 2.50] |") in row, row
    assert not rc.verdicts([{"ranks": 2, "arms": {"auto": timed}}])


def test_the_timers_own_part_comes_off_each_callback() -> None:
    """Each timed callback's figure holds one empty timed region (two thread-CPU clock reads,
    a system call each) that the untimed plugin does not pay: with 2 callbacks a collective
    and a 250 ns floor, 1.5 us as timed is 1.0 us net; the whole process's marginal is the
    timed run's, untouched."""
    rc = _route_cost()
    per = rc.arm_figures({"bare": _rows(50.0, 0.0, None),
                          "auto_timed": _rows(53.5, 1.0, 1.5, floor_ns=250.0)})
    timed = per["auto_timed"]
    assert timed["plugin_timer_floor_ns"] == pytest.approx(250.0)
    assert timed["plugin_callbacks_gross_us"][0] == pytest.approx(1.5)
    assert timed["plugin_callbacks_us"][0] == pytest.approx(1.0)
    assert timed["parts_us"][0] == pytest.approx(2.0)
    assert timed["added_pairs_us"][0] == pytest.approx(4.5)
    env = {"date": "d", "gpu": "g", "torch": "t", "nccl": "n", "python": "p", "commit": "c"}
    text = rc.markdown([{"ranks": 2, "extra": EXTRA, "block": STEPS, "arms": per}], env)
    row = next(line for line in text.splitlines() if line.startswith("| 2 | auto_timed | 2.00"))
    assert ("| 250 | 1.50 [1.50, 1.50] | 1.00 [1.00, 1.00] | 1.00 [1.00, 1.00] "
            "| 2.00 [2.00, 2.00] |") in row, row
