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
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from typing import Any, Protocol

from otel_train.config import Config, ConfigWarning
from otel_train.identity import Identity
from otel_train.recorder import Recorder
from otel_train.sources.steps import StepTracker


@dataclasses.dataclass
class RunContext:
    config: Config
    identity: Identity
    recorder: Recorder
    tracker: StepTracker
    emitter: Any  # otel_train.emitter.Emitter (not imported here: it imports sources)
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
