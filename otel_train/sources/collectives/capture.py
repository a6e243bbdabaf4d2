"""The hot path of collectives: who issued what, when, and when it completed.

Three ways in, all on the thread that issues the collective, all append-only:

- wrappers around the ``torch.distributed`` functions FSDP2, FSDP1, DDP's default comm hook
  and user code look up on the module at call time (restored exactly on exit). A
  synchronous call is timed around the call; an asynchronous one gets a done-callback on its
  Work's future, which runs on a backend thread and only appends a record;
- ``ProcessGroup.register_pre_hook`` / ``register_post_hook`` (torch 2.14+) on every process
  group that exists at start: they see what no Python wrapper sees (DDP's C++ reducer,
  functional collectives of compiled graphs). A collective issued through a wrapper is
  recorded once, by the wrapper (a thread-local flag tells the hooks);
- before 2.14, DDP's reducer is reached through ``register_comm_hook`` with a hook that calls
  the default all-reduce hook (which calls the wrapped ``dist.all_reduce``).

Nothing here waits on anything; every recording step is inside ``try``: if recording
raises, the collective still runs and returns what it returns.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from otel_train import internal_errors, torch_compat
from otel_train.config import ConfigWarning
from otel_train.recorder import EVENT

_Tensor = torch.Tensor

#: the record name of every collective record: (EVENT, RECORD, payload)
RECORD = "otel_train.collective"
ISSUE, DONE, WORK, FLUSH = "issue", "done", "work", "flush"
# (ISSUE, key, op, api, backend, group, group_size, nbytes, dtype, shape, async_op, t0, step,
#  seq, source)   (DONE, key, t1, error)   (WORK, key, work)   (FLUSH, t)

SOURCE_PYTHON, SOURCE_HOOK = "python", "pg_hook"

#: torch.distributed function -> (collective.op, the parameter whose bytes are the size)
#: The size is the nccl-tests "size": all-gather's output, reduce-scatter's input.
WRAPPED: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "barrier": ("barrier", None),
    "all_gather": ("all_gather", "tensor_list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_to_all_single": ("all_to_all", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "send": ("send", "tensor"),
    "recv": ("recv", "tensor"),
    "isend": ("send", "tensor"),
    "irecv": ("recv", "tensor"),
}
_ALWAYS_ASYNC = ("isend", "irecv")

#: ProcessGroup hook op names (torch 2.14+) -> collective.op, and which tensors are the size
HOOK_OPS: dict[str, tuple[str, str]] = {
    "ALLREDUCE": ("all_reduce", "in"), "ALLREDUCE_COALESCED": ("all_reduce", "in"),
    "BROADCAST": ("broadcast", "in"), "REDUCE": ("reduce", "in"),
    "ALLGATHER": ("all_gather", "out"), "ALLGATHER_BASE": ("all_gather", "out"),
    "ALLGATHER_COALESCED": ("all_gather", "out"),
    "ALLGATHER_INTO_TENSOR_COALESCED": ("all_gather", "out"),
    "REDUCE_SCATTER": ("reduce_scatter", "in"), "REDUCE_SCATTER_BASE": ("reduce_scatter", "in"),
    "REDUCE_SCATTER_TENSOR_COALESCED": ("reduce_scatter", "in"),
    "ALLTOALL": ("all_to_all", "in"), "ALLTOALL_BASE": ("all_to_all", "in"),
    "BARRIER": ("barrier", "in"), "SEND": ("send", "in"), "RECV": ("recv", "out"),
    "GATHER": ("gather", "in"), "SCATTER": ("scatter", "out"),
}
_HOOK_ID = 0x07E17A1  # ours, on every group we hook
_now = time.perf_counter_ns
_is_compiling = torch.compiler.is_compiling


def _outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A callback C++ calls while a compiled graph runs (a ProcessGroup hook, a future's
    callback) would be a new frame for dynamo to compile: keep dynamo off it."""
    return torch_compat.dynamo_disable(fn)


def pg_hooks_available() -> bool:
    return hasattr(dist.ProcessGroup, "register_pre_hook") and hasattr(
        dist.ProcessGroup, "register_post_hook")


def _nbytes(value: Any) -> tuple[int, str, tuple[int, ...]]:
    """(bytes, dtype, shape of the first tensor) of a tensor or a list of tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size(), str(value.dtype)[6:], tuple(value.shape)
    if isinstance(value, (list, tuple)) and value:
        total = 0
        for t in value:
            total += t.numel() * t.element_size()
        first = value[0]
        return total, str(first.dtype)[6:], tuple(first.shape)
    return 0, "", ()


class _Busy(threading.local):
    """Per thread: inside a wrapped call (a collective it makes inside is not recorded
    again). A class default, not ``getattr(local, "busy", False)``: a thread-local's missing
    attribute costs an AttributeError raised and caught at every collective."""

    busy = False


class Capture:
    """Puts collective records on the recorder; installs and removes the ways in."""

    def __init__(self, put: Callable[[tuple[Any, ...]], None], tracker: Any) -> None:
        self._put = put
        self._tracker = tracker
        self._keys = itertools.count(1)
        self._local = _Busy()
        self._groups: dict[tuple[int, str], tuple[str, int, str]] = {}
        self._seq: dict[str, int] = {}
        self._hook_keys: dict[tuple[int, int], int] = {}
        self._undo: list[Callable[[], None]] = []
        self.enabled = True
        self._errors = internal_errors.Tally()
        put_record = self._put

        def future_done(key: int, _future: Any) -> None:
            put_record((EVENT, RECORD, (DONE, key, _now(), None)))

        self._future_done = _outside_dynamo(future_done)
        #: group names whose records come from elsewhere (the NCCL flight recorder)
        self.skip_backends: set[str] = set()
        #: (id(group), "cuda" or "cpu") -> whether its collectives' records come from elsewhere
        self._covered: dict[tuple[int, str], bool] = {}
        #: id(group) (id(None): the default group) of the groups whose every backend is in
        #: ``skip_backends`` (a pure NCCL group under the plugin): the wrappers' first look
        self._whole: set[int] = set()

    @property
    def errors(self) -> int:
        """Exceptions swallowed while capturing (training went on)."""
        return self._errors.errors

    # --- shared recording ------------------------------------------------------------
    def _group(self, group: Any, device: str) -> tuple[str, int, str]:
        """(name, size, backend) of a process group (None: the default one), cached."""
        key = (id(group), device)  # id(None) stands for the default group of this run
        info = self._groups.get(key)
        if info is None:
            if group is None:
                group = torch_compat.default_group()
            backend = str(dist.get_backend(group))
            if ":" in backend:  # "cpu:gloo,cuda:nccl": the one for this device
                parts = dict(p.split(":", 1) for p in backend.split(",") if ":" in p)
                backend = parts.get(device, backend)
            info = (str(getattr(group, "group_name", "") or ""), group.size(), backend)
            self._groups[key] = info
        return info

    def covered(self, group: Any, sized: Any) -> bool:
        """Whether a collective's records come from elsewhere: its group's backend for its
        tensors' device is in ``skip_backends`` (NCCL, whose profiler plugin or flight
        recorder sees every NCCL collective); the wrappers then call the original at once.
        The answer is cached by group and device (CUDA or CPU, read off the tensor's flags);
        a group whose every backend is covered goes into ``_whole`` too, and the wrappers see
        it there before looking at any tensor (bench/results/collective-wrapper-cpu.md has
        the costs)."""
        first = sized if isinstance(sized, _Tensor) else (
            sized[0] if isinstance(sized, (list, tuple)) and sized else None)
        if not isinstance(first, _Tensor):
            on = "cpu"  # no tensor (a barrier): the group's CPU backend, as _issue has it
        elif first.is_cuda:
            on = "cuda"
        elif first.is_cpu:
            on = "cpu"
        else:  # another device: the full look-up, not cached
            return self._group(group, first.device.type)[2] in self.skip_backends
        key = (id(group), on)
        hit = self._covered.get(key)
        if hit is None:
            hit = self._covered[key] = self._group(group, on)[2] in self.skip_backends
            if hit:
                self._note_whole(group)
        return hit

    def _note_whole(self, group: Any) -> None:
        """Remember a group whose every backend is covered: the wrappers' first look (a set
        of ids, as the caches above; a mixed ``cpu:gloo,cuda:nccl`` group is not one)."""
        try:
            if self.covers_group(group):
                self._whole.add(id(group))
        except Exception as err:  # not known to be whole: the per-device look-up stays
            self._errors.add(err, "collectives")

    def covers_group(self, group: Any) -> bool:
        """Whether every backend of a process group is in ``skip_backends`` (a pure NCCL
        group under the plugin): its hooks would only cost."""
        if not self.skip_backends:
            return False
        if group is None:
            group = torch_compat.default_group()
        backend = str(dist.get_backend(group))
        names = [p.split(":", 1)[-1] for p in backend.split(",")]
        return all(name in self.skip_backends for name in names)

    def _issue(self, op: str, api: str, group: Any, sized: Any, async_op: bool,
               source: str) -> int:
        # The training thread pays for this at every collective: the backend first, so that
        # collectives whose records come from elsewhere (NCCL's flight recorder) cost a
        # dictionary look-up and nothing more.
        first = sized if isinstance(sized, torch.Tensor) else (
            sized[0] if isinstance(sized, (list, tuple)) and sized else None)
        device = first.device.type if isinstance(first, torch.Tensor) else "cpu"
        name, size, backend = self._group(group, device)
        if backend in self.skip_backends:
            return 0
        nbytes, dtype, shape = _nbytes(sized)
        seq = self._seq[name] = self._seq.get(name, 0) + 1
        key = next(self._keys)
        tracker = self._tracker  # a step whose optimizer step is over has ended: the next
        step = tracker.step + (tracker.pending_end_ns is not None)
        self._put((EVENT, RECORD, (ISSUE, key, op, api, backend, name, size, nbytes, dtype,
                                   shape, async_op, _now(), step, seq, source)))
        return key

    def _done(self, key: int, error: str | None = None) -> None:
        self._put((EVENT, RECORD, (DONE, key, _now(), error)))

    def _watch(self, key: int, work: Any) -> None:
        """Completion of an async collective: its future's callback, else polling."""
        try:
            future = work.get_future()
        except Exception:  # some backends' works have no future (gloo reduce_scatter)
            self._put((EVENT, RECORD, (WORK, key, work)))
            return
        # one dynamo-disabled callback made at start, bound to the key here: wrapping a new
        # lambda per collective cost ~15 us of the training thread's time
        future.add_done_callback(functools.partial(self._future_done, key))

    # --- module wrappers -------------------------------------------------------------
    def wrap_functions(self) -> list[str]:
        wrapped = []
        for api, (op, size_param) in WRAPPED.items():
            original = dist.__dict__.get(api)
            if original is None or not callable(original):
                continue
            try:
                wrapper = self._wrapper(api, op, size_param, original)
            except (TypeError, ValueError):  # no signature: leave it alone
                continue
            setattr(dist, api, wrapper)
            self._undo.append(lambda api=api, original=original: setattr(dist, api, original))
            wrapped.append(api)
        self._wrap_destroy()
        return wrapped

    def _wrap_destroy(self) -> None:
        """After ``destroy_process_group`` the look-ups keyed by a group's id start over: the
        default group may be made again with another backend under the same key (id(None)),
        and a destroyed group's id may be a new group's. Never called inside a compiled
        region (a graph holds no destroy), so no graph sees the replaced function."""
        original = dist.__dict__.get("destroy_process_group")
        if original is None or not callable(original):
            return
        caches = (self._groups, self._covered, self._whole)  # the objects the wrappers hold

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                for cache in caches:
                    cache.clear()

        dist.destroy_process_group = destroy_process_group
        self._undo.append(lambda: setattr(dist, "destroy_process_group", original))

    def _wrapper(self, api: str, op: str, size_param: str | None,
                 original: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(original).parameters)
        group_pos = params.index("group") if "group" in params else -1
        async_pos = params.index("async_op") if "async_op" in params else -1
        size_pos = params.index(size_param) if size_param in params else -1
        always_async = api in _ALWAYS_ASYNC
        local = self._local
        capture = self
        skip = self.skip_backends  # the set itself: filled before the first collective
        whole = self._whole  # the set itself, filled by covered()

        def arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str | None
                ) -> Any:
            if 0 <= pos < len(args):
                return args[pos]
            return kwargs.get(name) if name else None

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Inside a compiled region dynamo folds is_compiling() to True and traces the
            # original, which it maps to a functional collective: the graph is unchanged.
            if _is_compiling() or local.busy:
                return original(*args, **kwargs)
            # A group whose every backend NCCL's plugin (or flight recorder) records, the
            # usual case under NCCL: one set look-up and the original, nothing more. The
            # training thread pays this at every collective of FSDP and user code.
            group = args[group_pos] if 0 <= group_pos < len(args) else kwargs.get("group")
            if id(group) in whole or not capture.enabled:
                return original(*args, **kwargs)
            key = 0
            async_op = always_async
            try:
                sized = (args[size_pos] if 0 <= size_pos < len(args) else
                         kwargs.get(size_param) if size_param else None)
                if skip and capture.covered(group, sized):  # NCCL's plugin records it
                    return original(*args, **kwargs)
                if not always_async:
                    async_op = bool(arg(args, kwargs, async_pos, "async_op"))
                key = capture._issue(op, api, group, sized, async_op, SOURCE_PYTHON)
            except Exception as err:
                capture._errors.add(err, "collectives")
            local.busy = True
            try:
                result = original(*args, **kwargs)
            except BaseException as err:
                local.busy = False
                if key:
                    capture._safe(capture._done, key, f"{type(err).__name__}: {err}"[:500])
                raise
            local.busy = False
            if key:
                if async_op and result is not None:
                    capture._safe(capture._watch, key, result)
                else:
                    capture._safe(capture._done, key)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = original.__name__
        wrapper.__qualname__ = original.__qualname__
        wrapper.__doc__ = original.__doc__
        return wrapper

    def _safe(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as err:
            self._errors.add(err, "collectives")

    # --- ProcessGroup hooks (torch 2.14+) --------------------------------------------
    def hook_groups(self) -> int:
        hooked = 0
        for group in torch_compat.process_groups():
            try:
                if self.covers_group(group):  # NCCL's plugin sees them all: no Python call
                    continue
                self._hook_group(group)
            except Exception as err:
                warnings.warn(f"otel-train: cannot hook process group "
                              f"{getattr(group, 'group_name', '?')} ({err!r}); its collectives "
                              "are seen only through torch.distributed", ConfigWarning,
                              stacklevel=2)
                continue
            hooked += 1
        return hooked

    def _hook_group(self, group: Any) -> None:
        local = self._local
        hook_keys = self._hook_keys
        gid = id(group)

        def pre(a: Any) -> None:
            if not self.enabled or local.busy:
                return
            try:
                op, which = HOOK_OPS.get(a.name.name, ("other", "in"))
                tensors = a.input_tensors if which == "in" else a.output_tensors
                key = self._issue(op, "hook:" + a.name.name, group, tensors, bool(a.async_op),
                                  SOURCE_HOOK)
                if key:
                    hook_keys[(gid, a.op_id)] = key
            except Exception as err:
                self._errors.add(err, "collectives")

        def post(a: Any) -> None:
            if not hook_keys:
                return
            try:
                key = hook_keys.pop((gid, a.op_id), 0)
                if not key:
                    return
                if a.work is None:
                    self._done(key)
                else:
                    self._watch(key, a.work)
            except Exception as err:
                self._errors.add(err, "collectives")

        group.register_pre_hook(_HOOK_ID, _outside_dynamo(pre))
        try:
            group.register_post_hook(_HOOK_ID, _outside_dynamo(post))
        except Exception:
            group.unregister_pre_hook(_HOOK_ID)
            raise
        self._undo.append(lambda: (group.unregister_pre_hook(_HOOK_ID),
                                   group.unregister_post_hook(_HOOK_ID)))

    # --- DDP without ProcessGroup hooks ----------------------------------------------
    def hook_ddp(self, model: Any, log: Any) -> int:
        """Route each DDP module's all-reduce through the (wrapped) default hook."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        hooked = 0
        for module in model.modules() if isinstance(model, torch.nn.Module) else ():
            if not isinstance(module, DDP):
                continue
            if torch_compat.ddp_comm_hook_registered(module):
                log.info("otel_train.ddp_comm_hook_kept",
                         reason="a comm hook is registered already; its collectives are seen "
                                "only if it calls torch.distributed functions")
                continue
            if getattr(module, "_otel_train_hooked", False):
                hooked += 1
                continue
            try:
                device = str(getattr(module, "device_type", "cuda") or "cuda")
                if self._group(module.process_group, device)[2] in self.skip_backends:
                    continue  # NCCL's plugin sees its all-reduces: DDP keeps its C++ one
            except Exception as err:
                self._errors.add(err, "collectives")
            try:
                module.register_comm_hook(module.process_group, otel_train_allreduce_hook)
            except Exception as err:
                log.warning("otel_train.ddp_comm_hook_failed", error=repr(err))
                continue
            module._otel_train_hooked = True
            hooked += 1
        return hooked

    def remove(self) -> None:
        self.enabled = False
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as err:
                self._errors.add(err)


def otel_train_allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP comm hook registered by otel-train (before torch 2.14): DDP's default all-reduce,
    through ``dist.all_reduce`` so the wrapper sees it. It cannot be unregistered; after
    ``instrument()`` exits it stays, a plain default all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook(state, bucket)


# DDP checks the hook's annotations as objects; ``from __future__ import annotations`` made
# them strings.
otel_train_allreduce_hook.__annotations__ = {
    "state": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
