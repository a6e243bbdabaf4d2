"""One pass per file, the files in parallel processes.

Decoding JSON is most of what ``report`` and ``check`` cost (one core decodes some 100 MB of
OTLP JSON lines a second), and every rank's file can be read on its own. Each worker returns
its file's digest; the caller merges the digests in file order, so the result is exactly
what one process reading the files one after another would have made.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: below this many bytes of files, starting the processes costs more than they save
MIN_PARALLEL_BYTES = 32 * 2**20


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, e.g. a container's cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def worker_count(paths: Sequence[Path], workers: int | None = None) -> int:
    """``workers`` (None: one per usable CPU when the files are large enough to be worth
    it), never more than there are files; 1 where workers cannot be forked safely."""
    if not can_fork():
        return 1
    if workers is None:
        size = sum(p.stat().st_size for p in paths)
        workers = usable_cpus() if size >= MIN_PARALLEL_BYTES else 1
    return max(1, min(workers, len(paths)))


def can_fork() -> bool:
    """Workers are forked: no re-import of the caller's ``__main__`` (which ``spawn`` needs
    guarded) and no start-up cost. Forking is safe only from a single-threaded process, and
    only Linux forks reliably (macOS system libraries do not survive it): elsewhere, and in
    a process with threads, the files are read in this process, one after another."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def map_files(function: Callable[..., T], paths: Sequence[Path], *args: Any,
              workers: int | None = None) -> list[T]:
    """``[function(path, i, *args) for i, path in enumerate(paths)]``, in that order, the
    calls spread over ``worker_count(paths, workers)`` processes. ``function`` must be a
    module-level function (it is pickled by name) whose result pickles."""
    count = worker_count(paths, workers)
    if count == 1:
        return [function(path, i, *args) for i, path in enumerate(paths)]
    # largest first so that no worker is left with a big file at the end
    order = sorted(range(len(paths)), key=lambda i: -paths[i].stat().st_size)
    with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {i: pool.submit(function, paths[i], i, *args) for i in order}
        return [futures[i].result() for i in range(len(paths))]
