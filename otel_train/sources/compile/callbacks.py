"""The compiling thread's side of compile telemetry: dynamo's start/end callbacks.

They run on the thread that compiles (the training thread, or autograd's for a lazily
compiled backward), under dynamo's callback lock, inside the compilation: each only puts
one tuple on the recorder (the step the training thread is in, a perf-counter timestamp,
copies of dynamo's graph-break and graph counters) and never raises, since a callback that
raises fails the compilation. ``torch._dynamo.reset()`` clears every callback: they are
registered again at once (``reset`` is wrapped) and at every emitter drain (resets that
bypass the module attribute, such as ``explain()``'s). Everything else about a compilation
happens on the emitter thread (``sources/compile/__init__.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from otel_train import internal_errors, torch_compat
from otel_train.recorder import EVENT

#: the record name of every compile record: (EVENT, SOURCE, payload)
SOURCE = "training.compile"
START, END, FINAL = "start", "end", "final"
# (START, compile id, trigger, t, step, phase, graph breaks, stats)
# (END, compile id, trigger, t, graph breaks, stats)   (FINAL,)
_now = time.perf_counter_ns


def counter_copy(counters: Any, name: str) -> dict[str, int] | None:
    value = counters.get(name)  # .get: indexing the defaultdict would create the key
    return dict(value) if value else None


def callback_args(args: tuple[Any, ...]) -> tuple[str | None, str]:
    """(compile id, trigger) from the callback's CallbackArgs; older torch passes none."""
    if not args:
        return None, "DYNAMO"
    arg = args[0]
    trigger = getattr(getattr(arg, "callback_trigger", None), "name", "DYNAMO")
    compile_id = getattr(arg, "compile_id", None)
    return (str(compile_id) if compile_id is not None else None), trigger


class CompileCallbacks:
    """Dynamo's start/end callbacks, putting records; installed, kept and removed."""

    def __init__(self, put: Callable[[tuple[Any, ...]], None], tracker: Any,
                 counters: Any) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._undo: list[Callable[[], None]] = []
        self.handler: Any = None

        def where() -> tuple[int | None, str | None]:
            if not tracker.enabled or tracker.step_start_ns is None:
                return None, None
            # after an optimizer step the time until the next phase belongs to the next step
            return tracker.step + (tracker.pending_end_ns is not None), tracker.phase

        def on_start(*args: Any) -> None:
            try:
                now = _now()
                compile_id, trigger = callback_args(args)
                step, phase = where()
                put((EVENT, SOURCE, (START, compile_id, trigger, now, step, phase,
                                     counter_copy(counters, "graph_break"),
                                     counter_copy(counters, "stats"))))
            except Exception as err:  # a callback that raises would fail the compilation
                internal_errors.count("compile", err)

        def on_end(*args: Any) -> None:
            try:
                now = _now()
                compile_id, trigger = callback_args(args)
                put((EVENT, SOURCE, (END, compile_id, trigger, now,
                                     counter_copy(counters, "graph_break"),
                                     counter_copy(counters, "stats"))))
            except Exception as err:
                internal_errors.count("compile", err)

        self._on_start, self._on_end = on_start, on_end

    def install(self) -> bool:
        """Register them and keep them across resets; False where this torch has no
        callback handler (compilations are then placed in steps by time only)."""
        self.handler = torch_compat.compile_callback_handler()
        if self.handler is None:
            return False
        self.register()
        self._wrap_reset(torch_compat.dynamo_module())
        return True

    def register(self) -> None:
        """(Again) where a reset cleared them; never after :meth:`remove`."""
        with self._lock:
            handler = self.handler
            if self._stopped or handler is None:
                return
            if self._on_start not in handler.start_callbacks:
                handler.register_start_callback(self._on_start)
            if self._on_end not in handler.end_callbacks:
                handler.register_end_callback(self._on_end)

    def _wrap_reset(self, dynamo: Any) -> None:
        original = dynamo.reset

        def reset(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                self.register()

        reset.__wrapped__ = original  # type: ignore[attr-defined]
        reset.__doc__ = original.__doc__
        dynamo.reset = reset
        self._undo.append(lambda: setattr(dynamo, "reset", original))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()
        with self._lock:
            self._stopped = True
            if self.handler is not None:
                for callbacks, fn in ((self.handler.start_callbacks, self._on_start),
                                      (self.handler.end_callbacks, self._on_end)):
                    while fn in callbacks:
                        callbacks.remove(fn)
