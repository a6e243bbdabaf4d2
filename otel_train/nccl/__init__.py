"""otel-train's NCCL profiler plugin: build it, name it to NCCL, read its records.

NCCL (2.28 and later) loads a profiler plugin named by ``NCCL_PROFILER_PLUGIN`` when the
process creates its first communicator, once per process. ``profiler.c`` (this directory)
records one fixed-size record per collective and point-to-point operation, in C, inside
NCCL: no Python runs per collective (docs/collectives.md). This module compiles it with the
system's C compiler into a cache directory (once per source version; ``cc``, or ``$CC``),
and reads the records through ctypes, a batch at a time, on the emitter thread.

For launchers: ``export NCCL_PROFILER_PLUGIN=$(otel-train nccl-plugin)`` before the training
processes start; ``instrument()`` sets it itself when no communicator exists yet, which is
enough unless the process group is created eagerly (``init_process_group(device_id=...)``)
before ``instrument()``.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from otel_train import config
from otel_train.wire.nccl import DTYPES, FUNCS, RECORD  # noqa: F401  (re-exported: the plugin's layout)

ENV_NCCL = "NCCL_PROFILER_PLUGIN"
SOURCE = Path(__file__).with_name("profiler.c")
_BATCH = 4096


class PluginUnavailable(RuntimeError):
    """The plugin could not be built or loaded here."""


def cache_dir() -> Path:
    return config.cache_dir() / "nccl"


def plugin_path(build: bool = True) -> Path:
    """The compiled plugin for this source, built first if needed (atomically: ranks of one
    host may build at once). Raises PluginUnavailable with the reason."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    target = cache_dir() / f"libnccl-profiler-otel-train-{digest}.so"
    if target.exists() or not build:
        if not target.exists():
            raise PluginUnavailable(f"{target} is not built")
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise PluginUnavailable("no C compiler (cc, gcc or $CC) to build the NCCL plugin")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as err:
        raise PluginUnavailable(f"cannot write to {target.parent}: {err}") from err
    try:
        done = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-std=gnu11",
             "-o", tmp, str(SOURCE), "-lpthread"],
            capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise PluginUnavailable(f"building the NCCL plugin failed: "
                                    f"{(done.stderr or done.stdout).strip()[-500:]}")
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as err:
        raise PluginUnavailable(f"building the NCCL plugin failed: {err}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def ours(value: str | None) -> bool:
    """Does an ``NCCL_PROFILER_PLUGIN`` value name otel-train's plugin?"""
    return bool(value) and "libnccl-profiler-otel-train" in os.path.basename(str(value))


def name_to_nccl() -> str:
    """Set ``NCCL_PROFILER_PLUGIN`` to the plugin (built if needed) unless it names another
    plugin already; what happened, in words (for the start log)."""
    current = os.environ.get(ENV_NCCL)
    if current and not ours(current):
        return f"{ENV_NCCL}={current} names another plugin: not replaced"
    path = str(plugin_path())
    if current != path:
        os.environ[ENV_NCCL] = path
    return f"{ENV_NCCL}={path}"


class _Comm(ctypes.Structure):
    _fields_ = [("hash", ctypes.c_uint64), ("nranks", ctypes.c_int), ("rank", ctypes.c_int),
                ("nnodes", ctypes.c_int), ("name", ctypes.c_char * 64)]


class Plugin:
    """The plugin as NCCL loaded it (dlopen of the same path returns the same library, so
    these are NCCL's records)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            lib = ctypes.CDLL(str(path))
            version = lib.otel_train_nccl_version()
        except (OSError, AttributeError) as err:
            raise PluginUnavailable(f"cannot load {path}: {err}") from err
        if version != 4:
            raise PluginUnavailable(f"{path} is version {version}, this reader knows 4")
        self.path = str(path)
        self._lib = lib
        lib.otel_train_nccl_read.restype = ctypes.c_int
        lib.otel_train_nccl_read.argtypes = (ctypes.c_void_p, ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_uint64))
        lib.otel_train_nccl_in_flight.restype = ctypes.c_uint64
        lib.otel_train_nccl_in_flight.argtypes = (ctypes.c_void_p,)
        lib.otel_train_nccl_comms.restype = ctypes.c_int
        lib.otel_train_nccl_ncomms.restype = ctypes.c_int
        lib.otel_train_nccl_ncomms.argtypes = ()
        lib.otel_train_nccl_totals.restype = None
        lib.otel_train_nccl_complete.restype = ctypes.c_uint64
        lib.otel_train_nccl_complete.argtypes = ()
        self._buf = ctypes.create_string_buffer(RECORD.size * _BATCH)
        self._view = memoryview(self._buf).cast("B")
        self._one = ctypes.create_string_buffer(RECORD.size)
        self._lost = ctypes.c_uint64(0)
        self._comms = (_Comm * 256)()
        self._totals = (ctypes.c_uint64 * 8)()

    def read(self) -> tuple[list[tuple[int, ...]], int]:
        """Every record written since the last read, oldest first, and how many the ring
        overwrote before this read could copy them."""
        data, lost = self.read_raw()
        return list(RECORD.iter_unpack(data)), lost

    def read_raw(self) -> tuple[bytes, int]:
        """Like :meth:`read`, the records as the plugin wrote them (64 bytes each): no
        Python object per record (see :class:`Records`)."""
        chunks: list[bytes] = []
        lost = 0
        while True:
            n = self._lib.otel_train_nccl_read(self._buf, _BATCH, ctypes.byref(self._lost))
            lost += self._lost.value
            if n <= 0:
                break
            chunks.append(bytes(self._view[:n * RECORD.size]))
            if n < _BATCH:
                break
        return b"".join(chunks), lost

    def complete(self) -> int:
        """Complete, now and on this thread, every kernel launch that has finished on the
        GPU (the poller's pass, without waiting for its next one; never waits for the GPU);
        how many are still pending."""
        return int(self._lib.otel_train_nccl_complete())

    def in_flight(self) -> tuple[int, tuple[int, ...] | None]:
        """How many operations are started and not finished, and the oldest one's record
        (its ``t_done`` and GPU stamps are 0)."""
        n = self._lib.otel_train_nccl_in_flight(self._one)
        return n, (RECORD.unpack(self._one.raw) if n else None)

    def self_time(self) -> dict[str, int]:
        """With ``OTEL_TRAIN_NCCL_SELF_TIME=1`` (a measurement switch, read when NCCL loads
        the plugin): thread CPU ns spent in the plugin's callbacks on NCCL's enqueuing
        threads, how many callbacks, and the ns of those spent completing earlier launches.
        Zeros without the switch."""
        out = (ctypes.c_uint64 * 3)()
        self._lib.otel_train_nccl_self_time(out)
        return {"callbacks_ns": out[0], "callbacks": out[1], "harvest_ns": out[2]}

    def self_time_floor(self, n: int = 4000) -> float | None:
        """The self-timing's own part of each timed callback (``self_time``): the mean thread
        CPU ns of ``n`` empty timed regions, measured now on this thread; None where the
        loaded library predates it."""
        floor = getattr(self._lib, "otel_train_nccl_self_time_floor", None)
        if floor is None:
            return None
        floor.restype, floor.argtypes = ctypes.c_uint64, (ctypes.c_uint64,)
        return float(floor(n))

    def has_comms(self) -> bool:
        """Has NCCL made a communicator with the plugin (one C call, no copy)?"""
        return self._lib.otel_train_nccl_ncomms() > 0

    def comms(self) -> dict[int, tuple[str, int, int]]:
        """Communicators NCCL initialised with the plugin: hash -> (name, nranks, rank)."""
        n = self._lib.otel_train_nccl_comms(self._comms, 256)
        return {c.hash: (c.name.decode(errors="replace"), c.nranks, c.rank)
                for c in self._comms[:n]}

    def totals(self) -> dict[str, int]:
        self._lib.otel_train_nccl_totals(self._totals)
        (started, written, overwritten, unrecorded, untimed, polls, mode,
         by_enqueuer) = self._totals
        return {"started": started, "written": written, "overwritten": overwritten,
                "unrecorded": unrecorded, "untimed": untimed, "polls": polls,
                # how new operations are timed, and whether the plugin chose it (auto: kernel
                # channels while every communicator spans nodes, CUDA events otherwise)
                "timing": "events" if mode & 1 else "kernel",
                "timing_chosen": "auto" if mode & 2 else "set",
                "completed_by_enqueuer": by_enqueuer}


def loaded() -> Plugin | None:
    """The plugin, if ``NCCL_PROFILER_PLUGIN`` names ours and it loads; else None."""
    path = os.environ.get(ENV_NCCL)
    if not ours(path) or not os.path.exists(str(path)):
        return None
    try:
        return Plugin(str(path))
    except PluginUnavailable:
        return None


class Records:
    """Plugin records not yet given to a step, kept as the plugin wrote them and ordered by
    issue time, with their issue and done times (perf_counter ns) read out by one strided
    copy: the emitter needs only those two per record (which step, exposed communication);
    the rest is read where spans are built (wire/nccl.py).

    The records of a second of steps wait here until their steps are released one by one:
    each step takes the records issued before its end off the front (a binary search and
    one slice), never a pass over all of them.
    """

    _WORDS = RECORD.size // 8  # 8: t_issue is word 3, t_done word 4

    def __init__(self) -> None:
        self.raw = bytearray()
        self.issue: list[int] = []
        self.done: list[int] = []
        self._head = 0  # records before it are taken (compacted once they are half)

    def __len__(self) -> int:
        return len(self.issue) - self._head

    def add(self, data: bytes, since: int = 0) -> None:
        """Records from :meth:`Plugin.read_raw`; those issued before ``since`` are dropped."""
        if not data:
            return
        words = memoryview(data).cast("q")
        issue = words[3::self._WORDS].tolist()
        done = words[4::self._WORDS].tolist()
        if issue and min(issue) < since:
            keep = [i for i, t in enumerate(issue) if t >= since]
            data = _select(data, keep)
            issue = [issue[i] for i in keep]
            done = [done[i] for i in keep]
        if not issue:
            return
        self._compact()
        if (self.issue and issue[0] < self.issue[-1]) or issue != sorted(issue):
            # the plugin writes an operation when it finishes: communicators and streams
            # finish out of issue order now and then; sort what waits (stable: ties keep
            # the order read)
            raw, issue, done = self.raw + data, self.issue + issue, self.done + done
            order = sorted(range(len(issue)), key=issue.__getitem__)
            self.raw = bytearray(_select(raw, order))
            self.issue = [issue[i] for i in order]
            self.done = [done[i] for i in order]
            return
        self.raw += data
        self.issue += issue
        self.done += done

    def take_before(self, end: int) -> tuple[bytes, list[int], list[int]]:
        """Remove and return the records issued before ``end``, in issue order:
        (bytes, issue, done)."""
        head, issue = self._head, self.issue
        k = bisect.bisect_left(issue, end, head)
        if k == head:
            return b"", [], []
        size = RECORD.size
        out = (bytes(self.raw[head * size:k * size]), issue[head:k], self.done[head:k])
        self._head = k
        if k == len(issue):  # the usual case: all of them
            self.raw, self.issue, self.done, self._head = bytearray(), [], [], 0
        return out

    def take_all(self) -> bytes:
        out = bytes(self.raw[self._head * RECORD.size:])
        self.raw, self.issue, self.done, self._head = bytearray(), [], [], 0
        return out

    def _compact(self) -> None:
        head = self._head
        if head:
            del self.raw[:head * RECORD.size]
            del self.issue[:head]
            del self.done[:head]
            self._head = 0


def _select(data: bytes | bytearray, indexes: list[int]) -> bytes:
    size = RECORD.size
    return b"".join([data[i * size:(i + 1) * size] for i in indexes])


def comms_of(data: bytes) -> dict[int, int]:
    """Communicator hash -> its ranks, of the records in ``data``."""
    out: dict[int, int] = {}
    words = memoryview(data).cast("Q")
    for i, comm in enumerate(words[0::RECORD.size // 8].tolist()):
        if comm not in out:
            out[comm] = int.from_bytes(data[i * RECORD.size + 62:i * RECORD.size + 64],
                                       "little")
    return out

