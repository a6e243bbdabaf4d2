"""The emitter thread's CPU by part, for the overhead benchmarks (bench/multigpu/run.py
``--modes emitter_parts``, bench/bench_overhead_cpu.py ``--parts``).

While the context is open, every listener a source registers with the emitter (before and
after a step, on each drain tick, per record, the step gates), the emitter's own steps (pump,
release of held steps, emit_step, drop reports) and the send to the exporter process are
wrapped to add their thread CPU time (``time.thread_time_ns``: exact, per thread) to a
table. Nested parts: ``emit_step`` includes the step listeners, ``pump`` everything.
Listeners are wrapped when registered: open the context before ``instrument()``. The gap
sampler's look and schedule are timed as well (on its own thread: parts named ``gap sampler``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def timing_parts() -> Iterator[dict[str, list[int]]]:
    """Yields {part: [ns, calls]}, filled while the context is open."""
    from otel_train.export import remote

    parts: dict[str, list[int]] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = parts.setdefault(name, [0, 0])
                entry[0] += time.thread_time_ns() - t0
                entry[1] += 1
        return wrapper

    def label(kind: str, fn: Any) -> str:
        return f"{kind} {getattr(fn, '__qualname__', repr(fn))}"

    from otel_train.emitter import accounts, core, logs, steps
    from otel_train.sources import gaps

    cls, assembly = core.Emitter, steps.StepAssembly
    saved = {(owner, name): getattr(owner, name) for owner, names in (
        (cls, ("before_step", "on_step", "on_tick", "on_event", "pump")),
        (assembly, ("hold_steps", "release_steps", "emit_step", "sampled", "_after_step",
                    "exemplar_context")),
        (logs.LogRecords, ("captured",)),
        (accounts.Losses, ("report_drops", "report_internal_errors")),
        (remote.RemotePipeline, ("commit", "step")),
        (gaps.GapSource, ("_look", "_sample_once", "_next_look"))) for name in names}

    def original(owner: Any, name: str) -> Any:
        return saved[(owner, name)]

    cls.before_step = lambda em, fn: original(cls, "before_step")(
        em, timed(label("before", fn), fn))
    cls.on_step = lambda em, fn: original(cls, "on_step")(em, timed(label("after", fn), fn))
    cls.on_tick = lambda em, fn: original(cls, "on_tick")(em, timed(label("tick", fn), fn))
    cls.on_event = lambda em, src, fn: original(cls, "on_event")(
        em, src, timed(label(f"event {src}", fn), fn))
    assembly.hold_steps = lambda st, fn, *a, **k: original(assembly, "hold_steps")(
        st, timed(label("gate", fn), fn), *a, **k)
    cls.pump = timed("pump (all)", original(cls, "pump"))
    assembly.release_steps = timed("release held steps (gates, emit_step)",
                                   original(assembly, "release_steps"))
    accounts.Losses.report_drops = timed("report drops",
                                         original(accounts.Losses, "report_drops"))
    accounts.Losses.report_internal_errors = timed(
        "report internal errors", original(accounts.Losses, "report_internal_errors"))
    assembly.emit_step = timed("emit_step (with listeners)", original(assembly, "emit_step"))
    logs.LogRecords.captured = timed("user log", original(logs.LogRecords, "captured"))
    assembly.sampled = timed("emit_step: sampler decision", original(assembly, "sampled"))
    assembly._after_step = timed("emit_step: after the record (prometheus, step listeners)",
                                 original(assembly, "_after_step"))
    assembly.exemplar_context = timed("exemplar context",
                                      original(assembly, "exemplar_context"))
    remote.RemotePipeline.commit = timed("commit (pickle, send)",
                                         original(remote.RemotePipeline, "commit"))
    remote.RemotePipeline.step = timed("emit_step: pipeline.step (the step record queued)",
                                       original(remote.RemotePipeline, "step"))
    # the gap sampler's thread (not the emitter's): a look's work, of it the stack read, and
    # the next look's schedule; its thread CPU less these is the price of waking at all
    source = gaps.GapSource
    source._look = timed("gap sampler: look (its stack read in)", original(source, "_look"))
    source._sample_once = timed("gap sampler: look: the stretch check and stack read",
                                original(source, "_sample_once"))
    source._next_look = timed("gap sampler: schedule", original(source, "_next_look"))
    try:
        yield parts
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


def table(parts: dict[str, list[int]], steps: int) -> dict[str, dict[str, float]]:
    """us and calls per step, dearest first."""
    return {name: {"us_per_step": ns / 1e3 / steps, "calls_per_step": n / steps}
            for name, (ns, n) in sorted(parts.items(), key=lambda kv: -kv[1][0])}


def lines(rows: dict[str, dict[str, float]]) -> list[str]:
    return [f"{v['us_per_step']:9.1f} us/step {v['calls_per_step']:7.2f} calls/step  {k}"
            for k, v in rows.items()]
