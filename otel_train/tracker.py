"""Step boundaries and phases, found by hooks, timed on the training thread.

What is hooked (each restored exactly on exit):

- data wait: ``_BaseDataLoaderIter.__next__`` (every DataLoader iterator; the multi-process
  ones only override ``_next_data``), timed around the call;
- forward: the call of the module the user calls, timed around the whole of it (its own
  hooks, FSDP's among them, included) by the instance's ``_compiled_call_impl``, the slot
  ``nn.Module.__call__`` looks at first: one Python frame a forward, where module hooks would
  send every call through ``_call_impl``'s slow path. For a ``torch.compile(model)`` wrapper
  it is the ``OptimizedModule``'s slot, which runs eagerly outside the compiled frame; for
  ``model.compile()`` (which compiles ``_call_impl``) the compiled call is wrapped, so nothing
  enters a compiled graph. A module whose class replaces ``__call__`` gets forward hooks;
- backward: ``torch.autograd.backward`` (``Tensor.backward`` looks it up at call time);
- optimizer: the global optimizer step pre/post hooks, or one optimizer's own if given.

A step ends when an optimizer step ends and the next phase begins (so several optimizers
stepping back to back make one step), or at :meth:`StepTracker.mark_step`. Steps are
contiguous: step k+1 starts where step k ended, so step durations add up to wall time.

The hooks run a few times a step between torch's own work, with the caches cold, where every
bytecode costs several times what a microbenchmark shows (docs/overhead.md, "The training
thread's hooks"): ``begin``/``end`` check the thread themselves, append to the recorder's
queue without a call, and the batch is measured from its first tensor's shape alone.

The hot path (``begin``, ``end``, ``_finish_step``, the data wait's, forward's and backward's
wrappers, the optimizer's hooks) runs in C where ``otel_train/_fastpath.c`` was built at install: no Python
frame at all, about half of what the Python tracker costs a step (docs/overhead.md, "The
training thread in C"). :class:`_PyTrackerCore` is the same in Python: the reference, and
what runs where the C one was not built or ``OTEL_TRAIN_FASTPATH=0``; a property test
(tests/sdk/test_tracker_core.py) holds the two to the same records, hook calls and state.
A change to one is a change to both.
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
from otel_train.recorder import Recorder
from otel_train.wire.hot_path import PHASE, PHASE_FIELDS, STEP, STEP_FIELDS

try:  # the hot path in C, built at install time where a C compiler was found
    from otel_train import _fastpath
except ImportError:  # no compiler, another platform: the Python reference below
    _fastpath = None  # type: ignore[assignment]

DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER = semconv.TIMED_PHASES
_PHASES = frozenset(semconv.TIMED_PHASES)  # any other phase is a region the user named
_Tensor = torch.Tensor
_SEQUENCES = (tuple, list)
#: dtypes whose 2-D tensors count as token ids (integers and bools: not float, not complex)
_TOKEN_DTYPES = frozenset(d for d in vars(torch).values() if isinstance(d, torch.dtype)
                          and not d.is_floating_point and not d.is_complex)

_now = time.perf_counter_ns
_get_ident = threading.get_ident
#: Python 3.13's timerfd calls: the Python core's alarm (the C core has its own on Linux)
_timerfd_settime = getattr(os, "timerfd_settime_ns", None)
_live_trackers: weakref.WeakSet[StepTracker] = weakref.WeakSet()


def _disable_in_forked_child() -> None:
    # A forked DataLoader worker inherits the hooks and the tracker but not the emitter
    # thread: recording there would only fill a buffer nobody drains.
    for tracker in list(_live_trackers):
        tracker.enabled = False


os.register_at_fork(after_in_child=_disable_in_forked_child)


class _PyTrackerCore:
    """The hot path in Python: the step's state and ``begin``/``end``/``_finish_step``.

    The reference implementation: ``_fastpath.TrackerCore`` is the same in C (every member
    has the name of a slot here), used wherever it was built; tests/sdk/test_tracker_core.py
    holds the two to the same records and state for any sequence of calls.
    """

    __slots__ = ("enabled", "_count_batches", "thread_id", "step", "forwards", "samples",
                 "tokens", "phase_micro", "_depth", "phase_start_ns", "idle_since_ns",
                 "_span_id", "_capacity", "step_start_ns", "pending_end_ns", "phase",
                 "data_iter", "phase_hooks", "step_hooks", "end_hooks", "_queue", "_recorder",
                 "fixed_samples", "fixed_tokens", "_alarm_fd", "_alarm_after_ns")

    # --- phases ----------------------------------------------------------------------
    def begin(self, phase: str) -> bool:
        """A phase begins now. False, recording nothing, off the training thread or once
        recording stopped: the caller then skips :meth:`end` too."""
        if not self.enabled or _get_ident() != self.thread_id:
            return False
        try:
            if self.phase is not None and self._begin_inside(phase):
                return True
            now = _now()
            if self.pending_end_ns is not None and phase != OPTIMIZER:
                self._finish_step()
            if self.step_start_ns is None:
                self.step_start_ns = now
            forwards = self.forwards
            if phase == FORWARD:
                self.phase_micro = forwards
                self.forwards = forwards + 1
            elif phase == DATA_WAIT:
                self.phase_micro = forwards
            else:
                self.phase_micro = forwards - 1 if forwards else 0
            self.phase = phase
            self.phase_start_ns = now
            self._span_id = 0
            if self.phase_hooks:
                for hook in self.phase_hooks:
                    hook(True, now)
        except Exception as err:
            self._fail(err)
        return True

    def end(self, phase: str) -> None:
        """The phase begun by the :meth:`begin` that returned True ends now."""
        try:
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
            # span id 0: nobody asked for one while the phase ran, the emitter makes it
            record = (PHASE, self.step, phase, self.phase_micro, self.phase_start_ns, now,
                      self._span_id)
            if len(self._queue) < self._capacity:
                self._queue.append(record)
            else:
                self._recorder.put(record)  # counts the drop
            self.phase = None
            self.idle_since_ns = now
            if phase == OPTIMIZER:
                self.pending_end_ns = now
        except Exception as err:
            self._fail(err)

    def _finish_step(self) -> None:
        end = self.pending_end_ns
        start = self.step_start_ns if self.step_start_ns is not None else end
        forwards = self.forwards
        if self.step_hooks:
            for hook in self.step_hooks:
                hook(self.step)
        record = (STEP, self.step, start, end, forwards if forwards > 1 else 1,
                  self.samples if self.fixed_samples is None else self.fixed_samples,
                  self.tokens if self.fixed_tokens is None else self.fixed_tokens)
        if len(self._queue) < self._capacity:
            self._queue.append(record)
        else:
            self._recorder.put(record)  # counts the drop
        self.step += 1
        self.step_start_ns = end
        self.pending_end_ns = None
        self.forwards = self.samples = self.tokens = 0
        if self._alarm_fd >= 0 and self._alarm_after_ns > 0 and end is not None:
            _arm_alarm(self._alarm_fd, end + self._alarm_after_ns)


class StepTracker:
    """The training thread's view of the current step; hooks call :meth:`begin`/:meth:`end`.

    The methods off the hot path; the state and the hot path come from a core:
    :class:`_PyTrackerCore` or ``_fastpath.TrackerCore`` (:func:`tracker_class` picks)."""

    __slots__ = ()

    def __init__(
        self,
        recorder: Recorder,
        run_id: str,
        rank: int,
        samples_per_step: int | None = None,
        tokens_per_step: int | None = None,
    ) -> None:
        self._recorder = recorder
        # appended to directly (one length check, one append): Recorder.put is the same,
        # and takes the records it must drop and count
        self._queue, self._capacity = recorder.queue, recorder.capacity
        recorder.add_appender(self)  # _capacity is lowered while the emitter sleeps armed
        self.run_id = run_id
        self.rank = rank
        self.thread_id = _get_ident()
        self.enabled = True
        self.fixed_samples = samples_per_step
        self.fixed_tokens = tokens_per_step
        self._count_batches = samples_per_step is None or tokens_per_step is None
        self.step = 0
        self.step_start_ns: int | None = None
        self.pending_end_ns: int | None = None
        self.forwards = 0
        self.samples = 0
        self.tokens = 0
        self.phase: str | None = None
        self.phase_start_ns = 0
        self.phase_micro = 0
        self._span_id = 0  # the open phase's span id once asked for (phase_span_id)
        #: when the last phase ended (perf ns; 0 before the first): the gap sampler reads it
        self.idle_since_ns = 0
        #: the DataLoader iterator of the data wait in progress (the gap sampler reads which
        #: worker it waits for)
        self.data_iter: Any = None
        self._depth = 0  # phases begun inside an open phase (an LBFGS closure, say)
        #: the gap sampler's overrun alarm (open_alarm): a timer moved at each step's start
        #: to ``_alarm_after_ns`` later; -1 / 0 where there is none
        self._alarm_fd = -1
        self._alarm_after_ns = 0
        # a generator of our own: never touch the user's global RNG state
        self._getrandbits = random.Random().getrandbits
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

    @property
    def phase_span_id(self) -> int:
        """The span id of the open phase, made when first asked for on the training thread
        (a log line, CUDA timing, an OOM there): a phase nobody asks about gets its id on the
        emitter thread, a random call less at every phase. 0 where none is made: asked on
        another thread before the training thread asked (made there, it could miss the
        phase's record, read meanwhile by ``end``), or once the phase ended unasked."""
        span_id = self._span_id
        if not span_id and self.phase is not None and _get_ident() == self.thread_id:
            span_id = self._span_id = self._getrandbits(64) or 1
        return span_id

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

    def _begin_inside(self, phase: str) -> bool:
        """A phase begins while another is open: True if it is nested (counted, not
        recorded); else the open one is closed first. The optimizer's step inside a region
        the user named (``otel_train.region``) ends the region: the step must end there."""
        if phase != DATA_WAIT and not (phase == OPTIMIZER and self.phase not in _PHASES):
            self._depth += 1  # nested: an optimizer's closure running forward/backward
            return True
        # Fetching the next batch means the open phase ended without its end hook (an
        # optimizer step that raised, say): close it here rather than lose the rest. The
        # optimizer's step closes an open region the same way (its end then does nothing).
        self._depth = 0
        self.end(self.phase)  # type: ignore[arg-type]
        return False

    def _fail(self, err: Exception) -> None:
        # A bug in otel-train's own bookkeeping must never reach the training loop: stop
        # recording for the rest of the run and say so once.
        self.enabled = False
        warnings.warn(f"otel-train: step tracking failed ({err!r}); recording stops for this "
                      "run, training continues", RuntimeWarning, stacklevel=3)

    def count_batch(self, batch: Any) -> None:
        """Add a batch's samples and tokens to the step's (unless both are fixed)."""
        if not self._count_batches:
            return
        try:
            samples, tokens = batch_size(batch)
        except Exception as err:  # an exotic batch type: count nothing rather than fail
            internal_errors.count("batch_size", err)
            return
        self.samples += samples
        self.tokens += tokens

    # --- steps -----------------------------------------------------------------------
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
        # another thread's line inside a phase whose id is not made yet: the rank step's
        span_id = (self.phase_span_id or rank_span) if self.phase is not None else rank_span
        return step, trace_id, span_id


_OWN_SLOTS = ("__weakref__", "run_id", "rank", "_getrandbits", "_ids_cache")


class PyStepTracker(StepTracker, _PyTrackerCore):
    """A step tracker whose hot path runs in Python."""

    __slots__ = _OWN_SLOTS


def _configure_fastpath() -> Any:
    """The C tracker, told the record kinds and phase names; None (with a warning) where
    the built extension builds records of another layout than wire/hot_path.py's (a build
    older than this source)."""
    if _fastpath is None:
        return None
    try:
        _fastpath.configure(phase_record=PHASE, step_record=STEP, data_wait=DATA_WAIT,
                            forward=FORWARD, optimizer=OPTIMIZER, phase_fields=PHASE_FIELDS,
                            step_fields=STEP_FIELDS)
    except (TypeError, ValueError) as err:
        warnings.warn(f"otel-train: the C step tracker does not match this version ({err}); "
                      "the Python tracker runs instead (rebuild the package to get it back)",
                      RuntimeWarning, stacklevel=2)
        return None
    return _fastpath


_fastpath = _configure_fastpath()

if _fastpath is not None:

    class CStepTracker(StepTracker, _fastpath.TrackerCore):
        """A step tracker whose hot path runs in C (otel_train/_fastpath.c)."""

        __slots__ = _OWN_SLOTS
else:
    CStepTracker = None  # type: ignore[assignment,misc]


def _arm_alarm(fd: int, at_ns: int) -> None:
    """The Python core's alarm: fire once at perf_counter ns ``at_ns`` (errors ignored: a
    missed alarm costs a sample, never the step)."""
    try:
        _timerfd_settime(fd, flags=os.TFD_TIMER_ABSTIME, initial=max(at_ns, 1))  # type: ignore[misc]
    except (OSError, TypeError):
        pass


def open_alarm(tracker: StepTracker) -> int | None:
    """A one-shot timer (a file descriptor that turns readable when it fires, on
    perf_counter's clock) that ``tracker`` moves at each step's start once its
    ``_alarm_fd``/``_alarm_after_ns`` are set: the gap sampler's wake-up for a step that runs
    past its typical length. None where this tracker cannot move one (not Linux; the Python
    core before Python 3.13). The caller closes it."""
    try:
        if isinstance(tracker, _PyTrackerCore):
            if _timerfd_settime is None:
                return None
            return os.timerfd_create(time.CLOCK_MONOTONIC,  # type: ignore[attr-defined]
                                     flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)  # type: ignore[attr-defined]
        opener = getattr(_fastpath, "alarm_open", None)
        return opener() if opener is not None else None
    except OSError:
        return None


def set_alarm(fd: int, at_ns: int) -> None:
    """Make an :func:`open_alarm` timer fire once at perf_counter ns ``at_ns`` (OSError on
    a closed one)."""
    setter = getattr(_fastpath, "alarm_set", None)
    if setter is not None:
        setter(fd, at_ns)
    else:
        _timerfd_settime(fd, flags=os.TFD_TIMER_ABSTIME, initial=max(at_ns, 1))  # type: ignore[misc]


def tracker_class(fastpath: bool = True) -> type[StepTracker]:
    """The C tracker where it was built and ``fastpath`` is on, else the Python one."""
    return CStepTracker if fastpath and CStepTracker is not None else PyStepTracker


def batch_size(batch: Any) -> tuple[int, int]:
    """(samples, tokens) of a batch from tensor shapes alone (host metadata: no sync).

    Tokens are counted for integer tensors of two or more dimensions (token ids).
    """
    # the common batches (a tensor, a tuple or list starting with one) without a call: each
    # attribute of a tensor is a trip into torch's bindings, dear with the caches cold
    kind = type(batch)
    if kind is _Tensor:
        tensor = batch
    elif kind in _SEQUENCES and batch and type(batch[0]) is _Tensor:
        tensor = batch[0]
    else:
        return _batch_size_of(_first_tensor(batch))
    shape = tensor.shape
    if not shape:
        return 0, 0
    samples = shape[0]
    if len(shape) >= 2 and tensor.dtype in _TOKEN_DTYPES:
        return samples, samples * shape[1]
    return samples, 0


def _batch_size_of(tensor: torch.Tensor | None) -> tuple[int, int]:
    """:func:`batch_size` of any tensor, a subclass too (through its own methods)."""
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


def _timed(tracker: StepTracker, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` timed as ``phase`` on the training thread (called straight through elsewhere)."""
    if _fastpath is not None and isinstance(tracker, _fastpath.TrackerCore):
        timed_c = _fastpath.Timed(tracker, phase, fn)  # no Python frame a call
        timed_c.__name__ = timed_c.__qualname__ = getattr(fn, "__name__", phase)
        return timed_c
    begin, end = tracker.begin, tracker.end

    def timed(*args: Any, **kwargs: Any) -> Any:
        if not begin(phase):
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            end(phase)

    return timed


def _timed_next(tracker: StepTracker, original: Callable[[Any], Any], dataset: Any
                ) -> Callable[[Any], Any]:
    """The DataLoader iterator's ``__next__`` (``original``) timed as the data wait, its batch
    counted; only ``dataset``'s iterators where one is given. A method of the iterator class."""
    if _fastpath is not None and isinstance(tracker, _fastpath.TrackerCore):
        # the same in C, a method as the function below is (no Python frame a batch)
        next_c = _fastpath.NextTimed(tracker, original, dataset, tracker.count_batch, _Tensor,
                                     _TOKEN_DTYPES)
        next_c.__name__ = next_c.__qualname__ = "__next__"
        return next_c
    begin, end, count_batch = tracker.begin, tracker.end, tracker.count_batch

    def __next__(it: Any) -> Any:
        if (dataset is not None and it._dataset is not dataset) or not begin(DATA_WAIT):
            return original(it)
        tracker.data_iter = it  # only while waiting: never keeps workers alive
        try:
            batch = original(it)
        finally:
            tracker.data_iter = None
            end(DATA_WAIT)
        # count_batch's common case inline (a tuple or list of plain tensors: a call
        # less, and two, at every batch)
        if type(batch) in _SEQUENCES and batch and type(batch[0]) is _Tensor \
                and tracker._count_batches:
            shape = batch[0].shape
            if shape:
                tracker.samples += shape[0]
                if len(shape) >= 2 and batch[0].dtype in _TOKEN_DTYPES:
                    tracker.tokens += shape[0] * shape[1]
        else:
            count_batch(batch)
        return batch

    return __next__


def _optimizer_hooks(tracker: StepTracker) -> tuple[Callable[..., None], Callable[..., None]]:
    """The optimizer step's (pre, post) hooks: the optimizer phase begins and ends."""
    if _fastpath is not None and isinstance(tracker, _fastpath.TrackerCore):
        return (_fastpath.Timed(tracker, OPTIMIZER, kind=_fastpath.HOOK_BEGIN),
                _fastpath.Timed(tracker, OPTIMIZER, kind=_fastpath.HOOK_END))
    begin, end = tracker.begin, tracker.end

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        begin(OPTIMIZER)

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        # another thread's optimizer must not end the training thread's phase
        if tracker.enabled and _get_ident() == tracker.thread_id:
            end(OPTIMIZER)

    return pre, post


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
        __next__ = _timed_next(self.tracker, original, dataset)
        __next__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__next__ = __next__
        self._undo.append(lambda: setattr(cls, "__next__", original))

    # --- forward ---------------------------------------------------------------------
    def hook_model(self, model: torch.nn.Module) -> None:
        if not torch_compat.calls_through_call_impl_slot(model):
            self._hook_model_by_hooks(model)
            return
        compiled_call = torch_compat.compiled_call_impl(model)
        # model.compile(): the compiled call (hooks would run inside the graph); else the
        # module's own _call_impl, its hooks and all
        call = (compiled_call if compiled_call is not None
                else torch_compat.call_impl(model))
        timed_call = _timed(self.tracker, FORWARD, call)
        setattr(timed_call, torch_compat.WRAPPED_COMPILED_CALL, compiled_call)
        torch_compat.set_compiled_call_impl(model, timed_call)

        def undo() -> None:
            # a model.compile() called meanwhile replaced the wrapper: leave it in place
            if torch_compat.installed_call_impl(model) is timed_call:
                torch_compat.set_compiled_call_impl(model, compiled_call)

        self._undo.append(undo)

    def _hook_model_by_hooks(self, model: torch.nn.Module) -> None:
        """Forward pre/post hooks, for a module whose class has its own ``__call__``."""
        tracker = self.tracker

        def pre_hook(module: Any, args: Any) -> None:
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
        backward = _timed(self.tracker, BACKWARD, original)
        backward.__wrapped__ = original  # type: ignore[attr-defined]
        backward.__doc__ = original.__doc__
        torch.autograd.backward = backward
        self._undo.append(lambda: setattr(torch.autograd, "backward", original))

    # --- optimizer -------------------------------------------------------------------
    def hook_optimizer(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        pre, post = _optimizer_hooks(self.tracker)
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
