"""A new route of collectives is one file and one registration (sources/collectives/routes.py):
a toy route, defined here and registered in each rank before ``instrument()``, runs beside
the wrappers on two real gloo ranks under DDP.

The toy route holds every finished step (its ``ready`` gate) until one of its ticks has come
after the step's end, and then gives each step one collective of its own, ``toy``, whose api
says whether the step reached it held that way ("toy:held") or not ("toy:early"). So the run
directory shows that the ledger built it, called its gate, its ticks and its step hook, and
sent its rows; the wrappers' all-reduces (DDP's gradients, the loop's loss) are there as
before. Stand-in routes in this process check the precedence: a route superseding another
keeps it idle until it gives up, and then that one reads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.multiprocessing as mp
from opentelemetry.metrics import NoOpMeter
from support import otlp_files
from support.pipeline_fixtures import free_port

from otel_train import config, semconv
from otel_train.sources.collectives import routes
from otel_train.sources.collectives.book import Collective
from otel_train.sources.collectives.ledger import Ledger
from otel_train.sources.collectives.route import Parts, Route

STEPS, RANKS = 6, 2
TOY_OP, TOY_SOURCE = "toy", "toy_route"


class ToyRoute(Route):
    """Holds each step until a tick after its end; then one ``toy`` collective a step."""

    name = "toy"
    holds_steps = True

    def __init__(self, parts: Parts) -> None:
        self.assembly = parts.assembly
        self.offset = parts.ctx.emitter.offset
        self.ticked_at = 0  # perf ns of the last tick
        self.seen: list[int] = []  # the steps it was given, in order

    def ready(self, end_perf: int) -> bool:
        return end_perf <= self.ticked_at

    def tick(self, now: int) -> bool:
        self.ticked_at = now
        return True

    def on_step(self, info: Any) -> None:
        end = info.end_ns - self.offset
        api = "toy:held" if end <= self.ticked_at else "toy:early"
        coll = Collective(0, TOY_OP, api, "toy", "toy", 1, 0, "", (), False, end, info.step,
                          len(self.seen), TOY_SOURCE, done=end)
        self.seen.append(info.step)
        self.assembly.send([coll], info)

    @classmethod
    def build(cls, parts: Parts) -> ToyRoute:
        return cls(parts)


# --- the ranks ---------------------------------------------------------------------------
def _rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import otel_train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    routes.register(ToyRoute.name, ToyRoute.build)  # this process's ledgers build it
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with otel_train.instrument(model, optimizer=opt, run_id="toy-route", output_dir=out,
                                   emit_interval_s=0.05):
            for _ in range(STEPS):
                loss = model(torch.randn(8, 16)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss)  # after the step's end: in the next step
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("toy-route")
    sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import this file
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=RANKS, join=True,
                       start_method="spawn")
    return otlp_files.only_run_dir(out)


def _by_rank_step(spans: list[dict], **match: str) -> dict[int, dict[int, list[dict]]]:
    out: dict[int, dict[int, list[dict]]] = {}
    for span in spans:
        attrs = span["attrs"]
        if span["name"] == semconv.SPAN_COLLECTIVE and all(
                attrs.get(k) == v for k, v in match.items()):
            by_step = out.setdefault(int(attrs[semconv.ATTR_RANK]), {})
            by_step.setdefault(int(attrs[semconv.ATTR_STEP]), []).append(span)
    return out


@pytest.mark.slow
def test_a_registered_route_gates_every_step_and_sends_its_rows(run_dir: Path) -> None:
    spans = otlp_files.spans(run_dir)
    toy = _by_rank_step(spans, **{semconv.ATTR_COLLECTIVE_SOURCE: TOY_SOURCE})
    assert set(toy) == set(range(RANKS)), toy.keys()
    for rank, by_step in toy.items():
        # every step once, in order (its sequence number is the order it was given them)
        assert sorted(by_step) == list(range(STEPS)), (rank, sorted(by_step))
        for step, found in by_step.items():
            assert len(found) == 1, (rank, step, found)
            attrs = found[0]["attrs"]
            assert attrs[semconv.ATTR_COLLECTIVE_OP] == TOY_OP
            assert attrs[semconv.ATTR_COLLECTIVE_SEQ] == step
            # the gate held the step until a tick of the toy route came after its end
            assert attrs[semconv.ATTR_COLLECTIVE_API] == "toy:held", (rank, step, attrs)
    rank_steps = {(s["attrs"][semconv.ATTR_RANK], s["attrs"][semconv.ATTR_STEP])
                  for s in spans if s["name"] == semconv.SPAN_RANK_STEP}
    assert rank_steps == {(r, s) for r in range(RANKS) for s in range(STEPS)}


@pytest.mark.slow
def test_the_wrappers_route_still_records_beside_it(run_dir: Path) -> None:
    spans = otlp_files.spans(run_dir)
    reduces = _by_rank_step(spans, **{semconv.ATTR_COLLECTIVE_OP: "all_reduce"})
    assert set(reduces) == set(range(RANKS))
    for rank, by_step in reduces.items():
        # DDP's gradient all-reduces in every step; the loop's loss all-reduce (4 bytes) in
        # every step after the first (it comes after a step's end)
        assert sorted(by_step) == list(range(STEPS)), (rank, sorted(by_step))
        loss = sorted(step for step, found in by_step.items()
                      if any(s["attrs"][semconv.ATTR_COLLECTIVE_BYTES] == 4 for s in found))
        assert loss == list(range(1, STEPS)), (rank, loss)
        assert all(s["attrs"][semconv.ATTR_COLLECTIVE_SOURCE] != TOY_SOURCE
                   for found in by_step.values() for s in found)


# --- precedence, with stand-in routes in this process -------------------------------------
class _Standin(Route):
    def __init__(self, name: str, gives_up_at: int | None = None) -> None:
        self.name = name  # type: ignore[misc]  # an instance's own name: two of one class
        self.gives_up_at = gives_up_at
        self.ticks = 0
        self.started = False

    def start(self) -> None:
        self.started = True

    def tick(self, now: int) -> bool:
        self.ticks += 1
        return self.gives_up_at is None or self.ticks < self.gives_up_at


def _ledger() -> Ledger:
    noop = lambda *a, **k: None  # noqa: E731
    emitter = SimpleNamespace(offset=0, hold_steps=noop, on_event=noop, before_step=noop,
                              on_step=noop, on_tick=noop, wake_within=noop, count_drop=noop,
                              steps_emitted=0)
    log = SimpleNamespace(info=noop, warning=noop, error=noop)
    ctx = SimpleNamespace(emitter=emitter, recorder=None, log=log, meter=NoOpMeter("test"),
                          config=config.Config(),
                          identity=SimpleNamespace(rank=0, run_id="r", world_size=1))
    return Ledger(ctx)


def test_a_superseded_route_reads_once_the_one_above_it_gives_up(monkeypatch) -> None:
    primary, backup = _Standin("toy_primary", gives_up_at=3), _Standin("toy_backup")
    monkeypatch.setattr(routes, "ROUTES", list(routes.ROUTES))
    routes.register(backup.name, lambda parts: backup)
    routes.register(primary.name, lambda parts: primary, before=backup.name)
    monkeypatch.setitem(routes.SUPERSEDES, primary.name, frozenset({backup.name}))
    ledger = _ledger()
    assert [r.name for r in ledger.routes] == ["wrappers", "toy_primary", "toy_backup"]
    assert [r.name for r in ledger.active] == ["wrappers", "toy_primary"]
    assert primary.started and not backup.started
    for _ in range(3):
        ledger.tick()
    # the third tick gave up: the backup had none of them, and reads from the next one
    assert (primary.ticks, backup.ticks) == (3, 0)
    assert [r.name for r in ledger.active] == ["wrappers", "toy_backup"]
    ledger.tick()
    assert (primary.ticks, backup.ticks) == (3, 1)
    assert ledger.route("toy_backup") is backup and ledger.route("toy_primary") is None


def test_the_registry_orders_and_refuses_twins(monkeypatch) -> None:
    monkeypatch.setattr(routes, "ROUTES", list(routes.ROUTES))
    assert [e.name for e in routes.ROUTES] == [
        "wrappers", "nccl_flight_recorder", "nccl_profiler_plugin"]
    # the one precedence rule of the shipped routes: the plugin over the flight recorder
    assert routes.SUPERSEDES == {"nccl_profiler_plugin": frozenset({"nccl_flight_recorder"})}
    routes.register("toy", ToyRoute.build, before="nccl_flight_recorder")
    assert [e.name for e in routes.ROUTES][:2] == ["wrappers", "toy"]
    with pytest.raises(ValueError):
        routes.register("toy", ToyRoute.build)
    with pytest.raises(ValueError):
        routes.register("other", ToyRoute.build, before="absent")
    routes.unregister("toy")
    assert "toy" not in [e.name for e in routes.ROUTES]
