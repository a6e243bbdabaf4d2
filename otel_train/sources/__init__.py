"""What is observed beside steps: one module per thing (collectives, compile, memory, ...).

A source is a class with a constructor taking no arguments and two methods:

- ``start(ctx: RunContext) -> None``: on the training thread, while ``instrument()`` starts.
  Install hooks (hot path: only ``ctx.recorder.put((EVENT, name, payload))``), register
  ``ctx.emitter.on_event(name, handler)`` for those records, ``ctx.emitter.before_step`` /
  ``on_step`` listeners, and create instruments on ``ctx.meter``.
- ``stop() -> None``: on the training thread, when leaving ``instrument()``, before the
  emitter drains its last records. Remove every hook ``start`` installed.

Everything a source does on the emitter thread (handlers, listeners) may create spans with
``ctx.emitter.span(...)``. A source that fails to start is reported and skipped: it never
stops training.

A step listener is given the step's working state (``otel_train.emitter.work.StepWork``:
its record's fields and the listeners' scratch, by name). A pre-step listener that reads
what another one writes, or writes what another one reads, says so with :func:`step_uses`
on the listener: the emitter runs each after every listener that writes a field it reads,
whatever the order the sources start in.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentelemetry.trace import SpanContext

from otel_train.config import Config, ConfigWarning
from otel_train.emitter.work import step_uses
from otel_train.identity import Identity
from otel_train.recorder import Recorder
from otel_train.tracker import StepTracker

__all__ = ["Remover", "RunContext", "Source", "SourceHost", "start_all", "step_uses",
           "stop_all"]

#: undoes a registration (like torch's hook handles' ``remove``)
Remover = Callable[[], None]


class SourceHost(Protocol):
    """What a source may ask of the emitter (``otel_train.emitter.Emitter`` is the one
    implementation): its only door into it. Registrations return a :data:`Remover`."""

    ident: Identity
    offset: int  #: perf_counter ns + offset = epoch ns
    run_context: SpanContext  #: this rank's ``training.run`` span
    steps_emitted: int  #: steps handed to export so far

    # --- registration ---
    def on_event(self, source: str, handler: Callable[[Any], None]) -> Remover: ...
    def before_step(self, listener: Callable[[Any], None]) -> Remover: ...
    def on_step(self, listener: Callable[[Any], None]) -> Remover: ...
    def on_tick(self, listener: Callable[[], None]) -> Remover: ...
    def hold_steps(self, ready: Callable[..., bool], max_held: int = 64,
                   with_end: bool = False) -> None: ...
    def release_steps(self, final: bool = False) -> None: ...
    def wake_within(self, seconds: float) -> None: ...

    # --- a step's identity and time ---
    def sampled(self, trace_id: int) -> bool: ...
    def wall(self, perf_ns: int) -> int: ...
    def step_at(self, perf_ns: int) -> int: ...
    def step_context(self, step: int) -> SpanContext: ...
    def exemplar_context(self, info: Any) -> Any: ...

    # --- what a source makes ---
    def span(self, name: str, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: dict[str, Any], span_id: int = 0, trace_id: int = 0,
             links: Sequence[Any] | None = None, error: str | None = None,
             events: list[tuple[str, int, dict[str, Any]]] | None = None) -> SpanContext: ...
    def collectives(self, spec: Any, rows: list[Any] | bytes) -> None: ...
    def emit_log(self, level: str, message: str, fields: dict[str, Any], trace_id: int = 0,
                 span_id: int = 0) -> None: ...
    def count_drop(self, signal: str, n: int = 1) -> None: ...
    def add_cpu_throttled(self, seconds: float) -> None: ...


@dataclasses.dataclass
class RunContext:
    config: Config
    identity: Identity
    recorder: Recorder
    tracker: StepTracker
    emitter: SourceHost
    meter: Any
    log: Any
    model: Any = None


class Source(Protocol):
    def start(self, ctx: RunContext) -> None: ...

    def stop(self) -> None: ...


def start_all(paths: tuple[str, ...], ctx: RunContext) -> list[Source]:
    started: list[Source] = []
    for path in paths:
        module_name, _, class_name = path.partition(":")
        try:
            source = getattr(importlib.import_module(module_name), class_name)()
            source.start(ctx)
        except Exception as err:
            warnings.warn(f"otel-train: source {path} could not start ({err!r}); continuing "
                          "without it", ConfigWarning, stacklevel=4)
            continue
        started.append(source)
    return started


def stop_all(started: list[Source], log: Any) -> None:
    for source in reversed(started):
        try:
            source.stop()
        except Exception as err:
            log.warning("otel_train.source_stop_failed", source=type(source).__name__,
                        error=repr(err))
