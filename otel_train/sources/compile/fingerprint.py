"""Cross-rank compile consistency: each rank's fingerprint, compared through the c10d Store.

A rank's compile history is the sequence of graphs it compiled, each entry
``(frame, graph op count, guard count, graph input/node shapes)``; entry ``i``'s fingerprint
is a running hash over entries ``0..i``. Each rank publishes, from the emitter thread:

- ``<prefix>/<rank>/e/<i>`` = ``"<step> <hash>"``: the step graph ``i`` was compiled in;
- ``<prefix>/<rank>/p`` = ``"<steps done> <entries>"``: its progress (rate limited).

Every rank but the reference (rank 0) compares itself to the reference: a different hash
at the same index means a different graph (``graph``); the reference having finished the
step where this rank compiled entry ``i`` with fewer entries, or this rank having finished
the step of the reference's entry ``i`` without it, means one compiled what the other did
not (``count``). Only non-blocking reads are made (``check`` before ``get``), over a store
client of its own with a short timeout, so a dead rank costs a failed comparison, never a
hang; nothing runs on the training thread and no collective is issued.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from typing import Any

REFERENCE_RANK = 0
GRAPH, COUNT = "graph", "count"


def entry_hash(previous: str, frame: str, graph_ops: int | None, guards: int | None,
               shapes: str | None) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{previous}|{frame}|{graph_ops}|{guards}|{shapes}".encode())
    return h.hexdigest()


class Fingerprint:
    """This rank's compile history: (step, running hash) per compiled graph."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str]] = []

    @property
    def value(self) -> str:
        return self.entries[-1][1] if self.entries else "0" * 16

    def add(self, step: int, frame: str, graph_ops: int | None, guards: int | None,
            shapes: str | None) -> str:
        digest = entry_hash(self.value, frame, graph_ops, guards, shapes)
        self.entries.append((step, digest))
        return digest


def open_store(timeout_s: float) -> Any | None:
    """A store client for the emitter thread: a TCPStore client of its own (short timeout,
    no shared socket with the training thread) when the default store is TCP, else the
    default store itself; None without a default process group."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
    except Exception:
        return None
    from otel_train import torch_compat

    store = torch_compat.default_store()
    if store is None:
        return None
    base = store
    while hasattr(base, "underlying_store"):
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        try:
            return dist.TCPStore(base.host, base.port, is_master=False,
                                 timeout=datetime.timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
        except Exception:
            return None
    return store


class Exchange:
    """Publishes this rank's fingerprint and compares it with the reference rank's."""

    def __init__(self, store: Any, prefix: str, rank: int, world_size: int,
                 progress_interval_s: float = 5.0) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        self.progress_interval_s = progress_interval_s
        self.published = 0
        self._progress_at = -1e9
        self._progress_value = ""
        self._progress_entries = -1
        self.verified = 0
        self.mismatch: tuple[str, int] | None = None  # (kind, entry index)

    def _key(self, rank: int, *parts: object) -> str:
        return "/".join([self.prefix, str(rank), *map(str, parts)])

    def _get(self, key: str) -> str | None:
        if not self.store.check([key]):
            return None
        return self.store.get(key).decode()

    def publish(self, fp: Fingerprint, steps_done: int, force: bool = False) -> None:
        for i in range(self.published, len(fp.entries)):
            step, digest = fp.entries[i]
            self.store.set(self._key(self.rank, "e", i), f"{step} {digest}")
        self.published = len(fp.entries)
        progress = f"{steps_done} {len(fp.entries)}"
        now = time.monotonic()
        if progress != self._progress_value and (
                force or len(fp.entries) != self._progress_entries
                or now - self._progress_at >= self.progress_interval_s):
            self.store.set(self._key(self.rank, "p"), progress)
            self._progress_value, self._progress_at = progress, now
            self._progress_entries = len(fp.entries)

    def compare(self, fp: Fingerprint, steps_done: int) -> tuple[str, int] | None:
        """The first difference from the reference rank seen so far, else None."""
        if self.rank == REFERENCE_RANK or self.world_size < 2 or self.mismatch is not None:
            return self.mismatch
        ref = REFERENCE_RANK
        progress = self._get(self._key(ref, "p"))
        ref_steps, ref_entries = map(int, progress.split()) if progress else (0, 0)
        mine = fp.entries
        for i in range(self.verified, min(len(mine), ref_entries)):
            value = self._get(self._key(ref, "e", i))
            if value is None:
                return None
            if value.split()[1] != mine[i][1]:
                self.mismatch = (GRAPH, i)
                return self.mismatch
            self.verified = i + 1
        if len(mine) > ref_entries and progress and ref_steps > mine[ref_entries][0]:
            self.mismatch = (COUNT, ref_entries)
        elif ref_entries > len(mine):
            value = self._get(self._key(ref, "e", len(mine)))
            if value is not None and steps_done > int(value.split()[0]):
                self.mismatch = (COUNT, len(mine))
        return self.mismatch
