"""The files of one pass split over parallel processes.

Decoding JSON is most of what ``report`` and ``check`` cost (one core decodes some 100 MB of
OTLP JSON lines a second), and every rank's file can be read on its own. Each worker reads
a run of consecutive files and returns their digest; the caller merges the digests in
order, so the result is exactly what one process reading the files one after another
would have made.
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


Chunk = list[tuple[int, Path]]


def map_chunks(function: Callable[..., T], paths: Sequence[Path], *args: Any,
               workers: int | None = None) -> list[T]:
    """``function(chunk, *args)`` for each chunk of ``paths``, in order: the files split
    into ``worker_count(paths, workers)`` runs of consecutive files of about equal size,
    each chunk a list of (index in ``paths``, path) and read in its own process. One chunk
    (one worker) is all of them, read in this process. ``function`` must be a module-level
    function (it is pickled by name) whose result pickles.

    Consecutive files make each worker's result what reading them one after another gives,
    so the caller merging the results in order has what one pass over all files gives."""
    return start_chunks(function, paths, *args, workers=workers)()


def start_chunks(function: Callable[..., T], paths: Sequence[Path], *args: Any,
                 workers: int | None = None) -> Callable[[], list[T]]:
    """:func:`map_chunks` started: the workers run while the caller does other work, and
    the function returned waits for their results (with one worker it reads the files
    itself, when called)."""
    chunks = split(list(enumerate(paths)), worker_count(paths, workers))
    if len(chunks) == 1:
        return lambda: [function(chunks[0], *args)]
    pool = ProcessPoolExecutor(len(chunks), mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(function, chunk, *args) for chunk in chunks]
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise

    def results() -> list[T]:
        with pool:
            out = [future.result() for future in futures]
        futures.clear()  # a future holds its result: the caller frees each once merged
        return out

    return results


def split(files: Chunk, count: int) -> list[Chunk]:
    """``files`` in ``count`` runs of consecutive files, each about a ``count``-th of the
    bytes, none empty (``count`` at most the number of files)."""
    sizes = [path.stat().st_size for _, path in files]
    total = sum(sizes)
    chunks: list[Chunk] = [[]]
    done = 0
    for position, (item, size) in enumerate(zip(files, sizes, strict=True)):
        to_open = count - len(chunks)
        full = done >= total * len(chunks) / count
        if chunks[-1] and to_open and (full or len(files) - position == to_open):
            chunks.append([])
        chunks[-1].append(item)
        done += size
    return chunks
