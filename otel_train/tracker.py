"""Step boundaries and phases, found by hooks, timed on the training thread.

What is hooked (each restored exactly on exit):

- data wait: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator; the multi-process
  ones only override ``_next_data``), timed around the call;
- forward: forward pre/post hooks on the module the user calls. For a ``torch.compile(model)``
  wrapper they sit on the ``OptimizedModule`` itself, whose hooks run eagerly outside the
  compiled frame; for ``model.compile()`` (which compiles ``_call_impl`` *with* the hooks) the
  instance's ``_compiled_call_impl`` is wrapped instead, so nothing enters a compiled graph;
- backward: ``torch.autograd.backward`` (``Tensor.backward`` looks it up at call time);
- optimizer: the global optimizer step pre/post hooks, or one optimizer's own if given.

A step ends when an optimizer step ends and the next phase begins (so several optimizers
stepping back to back make one step), or at :meth:`StepTracker.mark_step`. Steps are
contiguous: step k+1 starts where step k ended, so step durations add up to wall time.
"""

from __future__ import annotations

import os
import random
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from otel_train import identity, internal_errors, semconv, torch_compat
from otel_train.recorder import PHASE, STEP, Recorder

DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER = semconv.TIMED_PHASES

_now = time.perf_counter_ns
_get_ident = threading.get_ident
_live_trackers: weakref.WeakSet[StepTracker] = weakref.WeakSet()


def _disable_in_forked_child() -> None:
    # A forked DataLoader worker inherits the hooks and the tracker but not the emitter
    # thread: recording there would only fill a buffer nobody drains.
    for tracker in list(_live_trackers):
        tracker.enabled = False


os.register_at_fork(after_in_child=_disable_in_forked_child)


class StepTracker:
    """The training thread's view of the current step; hooks call :meth:`begin`/:meth:`end`."""

    def __init__(
        self,
        recorder: Recorder,
        run_id: str,
        rank: int,
        samples_per_step: int | None = None,
        tokens_per_step: int | None = None,
    ) -> None:
        self._put = recorder.put
        self.run_id = run_id
        self.rank = rank
        self.thread_id = _get_ident()
        self.enabled = True
        self.fixed_samples = samples_per_step
        self.fixed_tokens = tokens_per_step
        self.step = 0
        self.step_start_ns: int | None = None
        self.pending_end_ns: int | None = None
        self.forwards = 0
        self.samples = 0
        self.tokens = 0
        self.phase: str | None = None
        self.phase_start_ns = 0
        self.phase_micro = 0
        self.phase_span_id = 0
        #: when the last phase ended (perf ns; 0 before the first): the gap sampler reads it
        self.idle_since_ns = 0
        #: the DataLoader iterator of the data wait in progress (the gap sampler reads which
        #: worker it waits for)
        self.data_iter: Any = None
        self._depth = 0  # phases begun inside an open phase (an LBFGS closure, say)
        self._rand = random.Random()  # never touch the user's global RNG state
        self._ids_cache: tuple[int, int, int] = (-1, 0, 0)
        #: optional hooks of sources (cuda_timing, memory, profiler), on the training thread:
        #: ``hook(begin, now_ns)`` after a phase begins and before it ends (read the phase
        #: fields here), ``hook(step)`` when a step ends, before its record is put. Empty on
        #: CPU and by default: one truth test each.
        self.phase_hooks: tuple[Callable[[bool, int], None], ...] = ()
        self.step_hooks: tuple[Callable[[int], None], ...] = ()
        #: ``hook(now_ns)`` when a phase of a given name ends, before its record is put: for
        #: a source that needs one moment of the step (the cgroup's at the optimizer's end)
        #: without a call at every phase boundary
        self.end_hooks: dict[str, tuple[Callable[[int], None], ...]] = {}
        _live_trackers.add(self)

    def active(self) -> bool:
        return self.enabled and _get_ident() == self.thread_id

    def add_phase_hook(self, hook: Callable[[bool, int], None]) -> Callable[[], None]:
        """Run ``hook(begin, now_ns)`` on the training thread after each phase begins and
        before it ends; returns what removes it."""
        self.phase_hooks = (*self.phase_hooks, hook)

        def remove() -> None:
            self.phase_hooks = tuple(h for h in self.phase_hooks if h is not hook)

        return remove

    def add_end_hook(self, phase: str, hook: Callable[[int], None]) -> Callable[[], None]:
        """Run ``hook(now_ns)`` on the training thread when ``phase`` ends, before its record
        is put; returns what removes it."""
        self.end_hooks = {**self.end_hooks, phase: (*self.end_hooks.get(phase, ()), hook)}

        def remove() -> None:
            left = tuple(h for h in self.end_hooks.get(phase, ()) if h is not hook)
            self.end_hooks = ({**self.end_hooks, phase: left} if left else
                              {k: v for k, v in self.end_hooks.items() if k != phase})

        return remove

    def add_step_hook(self, hook: Callable[[int], None]) -> Callable[[], None]:
        """Run ``hook(step)`` on the training thread when a step ends, before its record is
        put; returns what removes it."""
        self.step_hooks = (*self.step_hooks, hook)

        def remove() -> None:
            self.step_hooks = tuple(h for h in self.step_hooks if h is not hook)

        return remove

    # --- phases ----------------------------------------------------------------------
    def begin(self, phase: str) -> None:
        try:
            self._begin(phase)
        except Exception as err:
            self._fail(err)

    def end(self, phase: str) -> None:
        try:
            self._end(phase)
        except Exception as err:
            self._fail(err)

    def _fail(self, err: Exception) -> None:
        # A bug in otel-train's own bookkeeping must never reach the training loop: stop
        # recording for the rest of the run and say so once.
        self.enabled = False
        warnings.warn(f"otel-train: step tracking failed ({err!r}); recording stops for this "
                      "run, training continues", RuntimeWarning, stacklevel=3)

    def _begin(self, phase: str) -> None:
        if self.phase is not None:
            if phase != DATA_WAIT:
                self._depth += 1  # nested: an optimizer's closure running forward/backward
                return
            # Fetching the next batch means the open phase ended without its end hook
            # (an optimizer step that raised, say): close it here rather than lose the rest.
            self._depth = 0
            self._end(self.phase)
        now = _now()
        if self.pending_end_ns is not None and phase != OPTIMIZER:
            self._finish_step()
        if self.step_start_ns is None:
            self.step_start_ns = now
        if phase == FORWARD:
            self.phase_micro = self.forwards
            self.forwards += 1
        elif phase == DATA_WAIT:
            self.phase_micro = self.forwards
        else:
            self.phase_micro = max(self.forwards - 1, 0)
        self.phase = phase
        self.phase_start_ns = now
        self.phase_span_id = self._rand.getrandbits(64) or 1
        if self.phase_hooks:
            for hook in self.phase_hooks:
                hook(True, now)

    def _end(self, phase: str) -> None:
        if self._depth:
            self._depth -= 1
            return
        if self.phase != phase:
            return
        now = _now()
        if self.phase_hooks:
            for hook in self.phase_hooks:
                hook(False, now)
        if self.end_hooks:
            for hook in self.end_hooks.get(phase, ()):
                hook(now)
        self._put((PHASE, self.step, phase, self.phase_micro, self.phase_start_ns, now,
                   self.phase_span_id))
        self.phase = None
        self.idle_since_ns = now
        if phase == OPTIMIZER:
            self.pending_end_ns = now

    def count_batch(self, batch: Any) -> None:
        if self.fixed_samples is None or self.fixed_tokens is None:
            try:
                samples, tokens = batch_size(batch)
            except Exception as err:  # an exotic batch type: count nothing rather than fail
                internal_errors.count("batch_size", err)
                return
            self.samples += samples
            self.tokens += tokens

    # --- steps -----------------------------------------------------------------------
    def _finish_step(self) -> None:
        end = self.pending_end_ns
        start = self.step_start_ns if self.step_start_ns is not None else end
        micro_batches = max(self.forwards, 1)
        samples = self.fixed_samples if self.fixed_samples is not None else self.samples
        tokens = self.fixed_tokens if self.fixed_tokens is not None else self.tokens
        if self.step_hooks:
            for hook in self.step_hooks:
                hook(self.step)
        self._put((STEP, self.step, start, end, micro_batches, samples, tokens))
        self.step += 1
        self.step_start_ns = end
        self.pending_end_ns = None
        self.forwards = self.samples = self.tokens = 0

    def mark_step(self) -> None:
        """End the current step now (for loops without an optimizer step)."""
        if self.phase is not None:
            self._depth = 0
            self.end(self.phase)
        if self.pending_end_ns is None:
            self.pending_end_ns = _now()
        self._finish_step()

    def close(self) -> None:
        """End of instrumentation: finish the step in flight if any work was done in it."""
        if self.phase is not None:
            self._depth = 0
            self.end(self.phase)
        if self.pending_end_ns is not None or self.forwards > 0:
            if self.pending_end_ns is None:
                self.pending_end_ns = _now()
            self._finish_step()
        self.enabled = False

    # --- ids for log lines -----------------------------------------------------------
    def current_ids(self) -> tuple[int, int, int]:
        """(step, trace id, span id) of what the training thread is doing now.

        Steps are contiguous: once an optimizer step has ended, the time that follows (the
        top of the next loop iteration, a checkpoint, an evaluation) is counted in the next
        step, so a line logged then carries the next step's ids (its trace id is derived from
        the run id and the step, known in advance). Inside a phase: that phase's span."""
        step = self.step
        if self.pending_end_ns is not None and self.phase is None:
            step += 1
        cached_step, trace_id, rank_span = self._ids_cache
        if cached_step != step:
            trace_id = identity.step_trace_id(self.run_id, step)
            rank_span = identity.rank_step_span_id(self.run_id, step, self.rank)
            self._ids_cache = (step, trace_id, rank_span)
        span_id = self.phase_span_id if self.phase is not None else rank_span
        return step, trace_id, span_id


def batch_size(batch: Any) -> tuple[int, int]:
    """(samples, tokens) of a batch from tensor shapes alone (host metadata: no sync).

    Tokens are counted for integer tensors of two or more dimensions (token ids).
    """
    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        return 0, 0
    samples = int(tensor.shape[0])
    if tensor.dim() >= 2 and not tensor.is_floating_point() and not tensor.is_complex():
        return samples, samples * int(tensor.shape[1])
    return samples, 0


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        preferred = batch.get("input_ids")
        if isinstance(preferred, torch.Tensor):
            return preferred
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    return None


class StepHooks:
    """Installs the hooks that drive a :class:`StepTracker`; :meth:`remove` undoes them all."""

    def __init__(self, tracker: StepTracker) -> None:
        self.tracker = tracker
        self._undo: list[Callable[[], None]] = []

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    # --- data ------------------------------------------------------------------------
    def hook_dataloader(self, dataset: Any = None) -> None:
        cls = torch_compat.dataloader_iter_class()
        original = cls.__dict__["__next__"]
        tracker = self.tracker

        def __next__(it: Any) -> Any:
            if not tracker.active() or (dataset is not None and it._dataset is not dataset):
                return original(it)
            tracker.begin(DATA_WAIT)
            tracker.data_iter = it  # only while waiting: never keeps workers alive
            try:
                batch = original(it)
            finally:
                tracker.data_iter = None
                tracker.end(DATA_WAIT)
            tracker.count_batch(batch)
            return batch

        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__next__ = __next__
        self._undo.append(lambda: setattr(cls, "__next__", original))

    # --- forward ---------------------------------------------------------------------
    def hook_model(self, model: torch.nn.Module) -> None:
        tracker = self.tracker
        compiled_call = torch_compat.compiled_call_impl(model)
        if compiled_call is not None:  # model.compile(): hooks would run inside the graph
            def timed_call(*args: Any, **kwargs: Any) -> Any:
                if not tracker.active():
                    return compiled_call(*args, **kwargs)
                tracker.begin(FORWARD)
                try:
                    return compiled_call(*args, **kwargs)
                finally:
                    tracker.end(FORWARD)

            torch_compat.set_compiled_call_impl(model, timed_call)
            self._undo.append(lambda: torch_compat.set_compiled_call_impl(model, compiled_call))
            return

        def pre_hook(module: Any, args: Any) -> None:
            if tracker.active():
                tracker.begin(FORWARD)

        def post_hook(module: Any, args: Any, output: Any) -> None:
            if tracker.active():
                tracker.end(FORWARD)

        pre = model.register_forward_pre_hook(pre_hook, prepend=True)
        post = model.register_forward_hook(post_hook, always_call=True)
        self._undo.append(pre.remove)
        self._undo.append(post.remove)

    # --- backward --------------------------------------------------------------------
    def hook_backward(self) -> None:
        original = torch.autograd.backward
        tracker = self.tracker

        def backward(*args: Any, **kwargs: Any) -> Any:
            if not tracker.active():
                return original(*args, **kwargs)
            tracker.begin(BACKWARD)
            try:
                return original(*args, **kwargs)
            finally:
                tracker.end(BACKWARD)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        backward.__doc__ = original.__doc__
        torch.autograd.backward = backward
        self._undo.append(lambda: setattr(torch.autograd, "backward", original))

    # --- optimizer -------------------------------------------------------------------
    def hook_optimizer(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        tracker = self.tracker

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            if tracker.active():
                tracker.begin(OPTIMIZER)

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            if tracker.active():
                tracker.end(OPTIMIZER)

        if optimizer is not None:
            handles = [optimizer.register_step_pre_hook(pre),
                       optimizer.register_step_post_hook(post)]
        else:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            handles = [register_optimizer_step_pre_hook(pre),
                       register_optimizer_step_post_hook(post)]
        self._undo.extend(h.remove for h in handles)
