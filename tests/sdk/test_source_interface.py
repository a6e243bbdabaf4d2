"""Sources reach the emitter only through ``sources.SourceHost`` (issue 18): every attribute
a source module reads off an emitter is a member of the Protocol, the Emitter implements
all of them, and registrations hand back removers that undo them."""

from __future__ import annotations

import ast
import inspect
import time
from pathlib import Path

from otel_train import emitter as emitter_mod
from otel_train import semconv, sources
from otel_train.sources import SourceHost

SOURCES = Path(sources.__file__).parent


def _members() -> set[str]:
    names = {n for n in vars(SourceHost) if not n.startswith("_")}
    return names | set(SourceHost.__annotations__)


def _emitter_attributes(path: Path) -> set[tuple[str, int]]:
    """(attribute, line) of every ``<...>emitter.<attribute>`` and ``getattr(<...>emitter,
    "<attribute>")`` in a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            value = node.value
            if (isinstance(value, ast.Name) and value.id == "emitter") or (
                    isinstance(value, ast.Attribute) and value.attr == "emitter"):
                found.add((node.attr, node.lineno))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "getattr" and len(node.args) >= 2):
            target, name = node.args[0], node.args[1]
            if ((isinstance(target, ast.Name) and target.id == "emitter") or (
                    isinstance(target, ast.Attribute) and target.attr == "emitter")) and (
                    isinstance(name, ast.Constant)):
                found.add((str(name.value), node.lineno))
    return found


def test_sources_use_only_the_source_host_interface() -> None:
    members = _members()
    outside = sorted(f"{path.relative_to(SOURCES)}:{line}: emitter.{name}"
                     for path in sorted(SOURCES.rglob("*.py"))
                     for name, line in _emitter_attributes(path) if name not in members)
    assert not outside, "\n".join(outside)


def test_the_emitter_implements_the_source_host_interface() -> None:
    emitter_cls = emitter_mod.Emitter
    init = inspect.getsource(emitter_cls.__init__)
    for name in sorted(_members()):
        assert hasattr(emitter_cls, name) or f"self.{name} =" in init, name


def test_registrations_hand_back_removers(tmp_path) -> None:
    """What a registration returns undoes it: listeners removed before the emitter's first
    drain are never called (the ones kept, registered the same way, are), and training-thread
    hooks removed after three steps are not called again."""
    import torch

    import otel_train

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls: dict[str, int] = {}

    def counter(name: str):
        def count(*_: object) -> None:
            calls[name] = calls.get(name, 0) + 1
        return count

    def train(steps: int) -> None:
        for _ in range(steps):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()

    # an hour between drains: nothing more is drained before leaving, when the last pump runs
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, exporter="none",
                               emit_interval_s=3600) as inst:
        host, tracker = inst.emitter, inst.tracker
        # the emitter drains once for the set-up's records (its first record wakes it; the
        # count goes up once that pass is over), then sleeps the hour: its wake on a later
        # record is taken away so that it stays asleep
        deadline = time.monotonic() + 30
        while host.wakeups < 1:
            assert time.monotonic() < deadline, "the emitter never drained the set-up"
            time.sleep(0.01)
        inst.recorder.wake = None
        for kept in (True, False):
            tag = "kept" if kept else "removed"
            removers = [host.before_step(counter(f"before {tag}")),
                        host.on_step(counter(f"after {tag}")),
                        host.on_tick(counter(f"tick {tag}")),
                        tracker.add_phase_hook(counter(f"phase {tag}")),
                        tracker.add_end_hook(semconv.PHASE_OPTIMIZER, counter(f"end {tag}")),
                        tracker.add_step_hook(counter(f"step {tag}"))]
            if not kept:
                train(3)
                hooked = (calls["phase removed"], calls["step removed"], calls["end removed"])
                for remove in removers:
                    remove()
        train(3)
    for name in ("before", "after", "tick", "phase", "step", "end"):
        assert calls.get(f"{name} kept", 0) > 0, calls
    assert "before removed" not in calls and "after removed" not in calls, calls
    assert "tick removed" not in calls, calls
    assert (calls["phase removed"], calls["step removed"], calls["end removed"]) == hooked, calls
    assert all(hooked) and calls["phase kept"] > hooked[0], calls
    assert hooked[2] == 3 and calls["end kept"] == 6, calls  # once an optimizer step
