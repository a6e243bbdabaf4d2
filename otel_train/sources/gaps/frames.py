"""What the gap sampler's threads share: the training thread's stack as user frames, the
names of the stretches, and what a sample is.

Pure functions and constants: no state of the source, so any thread may call them. The
sampler thread (sampler.py) reads the training thread's stack with :func:`user_frames`
(its code-kind cache, ``kinds``, is the sampler thread's alone) and puts a :data:`Sample` in
the source's ``samples`` deque; the emitter thread (listener.py) takes them out and names
the stretches with :func:`segment_name`; both judge a stretch by :data:`SAMPLE_AGE_S` and
:data:`DATA_WAIT`.
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

from otel_train import semconv, torch_compat

#: a stretch (outside every phase, or a data wait) is sampled once it is this old; while it
#: lasts (or its step's overrun), the sampler looks again after this, then BACKOFF times
#: as long, and so on... (sampler.py); the listener aims the sampler at the part of a
#: recurring stretch older than this (listener.py)
SAMPLE_AGE_S = 0.05
DATA_WAIT = semconv.PHASE_DATA_WAIT
#: user frames kept per sample (innermost first)
STACK_DEPTH = 6
#: code kinds known at most (a run that makes code without end, exec'd or generated, starts
#: its cache again past it)
MAX_KINDS = 65536

#: the otel_train package's directory (this file is otel_train/sources/gaps/frames.py)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))) + os.sep
#: the demo is the user's training script when it runs: its frames are user code
_OWN_USER_CODE = (os.path.join(_OWN_DIR, "demo.py"),)
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in
                              ("stdlib", "platstdlib", "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))
USER, LIBRARY, OWN = 0, 1, 2

Frame = tuple[str, str, int]  # (function, file, line)
#: one look's sample: (perf_counter ns, the user frames innermost first, the DataLoader
#: worker waited for or None)
Sample = tuple[int, tuple[Frame, ...], int | None]


def code_kind(filename: str) -> int:
    """USER, LIBRARY (standard library, site-packages, frozen) or OWN (otel-train's hooks)."""
    if filename.startswith("<"):
        return LIBRARY
    path = os.path.abspath(filename)
    if path.startswith(_OWN_DIR) and path not in _OWN_USER_CODE:
        return OWN
    if path.startswith(_LIBRARY_DIRS):
        return LIBRARY
    return USER


_ANONYMOUS = frozenset({"<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>", "<lambda>"})


def named_top(stack: tuple[Frame, ...]) -> tuple[str, str] | None:
    """(function, file) of the innermost frame of ``stack`` that is not a generator
    expression, comprehension or lambda (``<genexpr>``, or ``f.<locals>.<genexpr>`` from
    Python 3.11): one is part of the function (or module) around it, and a loop's host
    work is sampled in either in turn. The innermost frame where every one is such; None
    for no frame."""
    for function, file, _ in stack:
        if function.rpartition(".")[2] not in _ANONYMOUS:
            return function, file
    return stack[0][:2] if stack else None


def user_frames(frame: Any, kinds: dict[int, tuple[Any, int]]) -> tuple[Frame, ...]:
    """The innermost user frames of a stack, innermost first, up to ``STACK_DEPTH``; the walk
    stops at otel-train's own hooks and the DataLoader iterator's ``__next__`` (what lies
    outside them is the loop, not the wait).

    ``kinds`` caches each code object's kind by its id, beside the code itself (held: its id
    is not reused while cached). Not by the code object: a code object's hash is taken
    afresh at every lookup over its constants, nested code included, so a script's
    ``<module>`` frame cost ~0.1 ms a sample on an H200 host's cold core."""
    out: list[Frame] = []
    while frame is not None and len(out) < STACK_DEPTH:
        code = frame.f_code
        known = kinds.get(id(code))
        if known is not None and known[0] is code:
            kind = known[1]
        else:
            if len(kinds) >= MAX_KINDS:  # again from the stops (the DataLoader's __next__)
                stops = [item for item in kinds.items() if item[1][1] == OWN]
                kinds.clear()
                kinds.update(stops)
            kind = code_kind(code.co_filename)
            kinds[id(code)] = (code, kind)
        if kind == OWN:
            break
        if kind == USER:
            out.append((getattr(code, "co_qualname", code.co_name), code.co_filename,
                        frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def dataloader_next_code() -> Any:
    """The code of the DataLoader iterator's own ``__next__`` (behind otel-train's data-wait
    wrapper, which is C where the fast path is built and then leaves no frame): a data wait's
    stack walk stops there, as at the wrapper, so a batch's wait is named by the dataset's
    line or the worker waited for, never by the training loop's ``for batch in loader``."""
    fn = torch_compat.dataloader_iter_class().__dict__["__next__"]
    return getattr(getattr(fn, "__wrapped__", fn), "__code__", None)


def segment_name(after: str | None, before: str | None) -> str:
    if after and before:
        return f"between {after} and {before}"
    if before:
        return f"before {before}"
    if after:
        return f"after {after}"
    return "outside every phase"
