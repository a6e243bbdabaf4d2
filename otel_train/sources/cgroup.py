"""CPU throttling of this rank's cgroup, per step: ``training.cpu.throttled.time``.

A rank whose container hits its CPU quota is throttled by the kernel's CFS bandwidth
control: its data loading, kernel launches and collectives' host side all stall for the rest
of the period. The cgroup's ``cpu.stat`` counts it (v2: ``throttled_usec``; v1:
``throttled_time`` in ns).

Per step: the training thread samples ``cpu.stat`` where the step ends (at the end of each
optimizer step, the last one winning when several step back to back, or at ``mark_step``),
at most once every :data:`MIN_READ_INTERVAL_NS` (10 ms): one ``pread`` of a file descriptor
opened at start, and the raw bytes go to the emitter with the step, which parses them and
reports the increase since the previous sample: a counter, and ``training.cpu.throttled_s``
on the step's ``training.rank_step`` span. (Read when the emitter drained instead, a step was
charged with throttling that happened in later steps.) The kernel adds throttled time when a
CFS period (100 ms by default) refills the quota, so reading more often than that says
nothing more; but a read is a system call, ~8 us of the training thread a step on a 2-vCPU
VM once the cold caches are counted (docs/overhead.md), a quarter of a 0.4 ms step's budget.
Steps that end within 10 ms of the last read carry 0 and their throttling goes to the next
sampled step; steps of 10 ms or more (every GPU job) are all sampled. At the end of the run
a last read puts what no step was charged with into the counter. The kernel sums throttled
time over every CPU runqueue the cgroup's threads were queued on, so with several threads it
can exceed wall time; a step's value is capped at the step's duration (the time during which
some of its threads could not run, at most all of it), the counter keeps the kernel's sum.
Where no ``cpu.stat`` is readable the source says so once and stays off.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from otel_train import internal_errors, semconv
from otel_train.recorder import EVENT
from otel_train.sources import step_uses

RECORD = "otel_train.cgroup"
FINAL_RECORD = "otel_train.cgroup.final"
#: the shortest time between two reads on the training thread
MIN_READ_INTERVAL_NS = 10_000_000

_ROOT = Path("/sys/fs/cgroup")


def cpu_stat_path(root: Path = _ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
                  ) -> Path | None:
    """This process's cgroup ``cpu.stat``: v2 unified, or v1's cpu controller."""
    candidates = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # v2: 0::/path
            candidates.append(root / relative / "cpu.stat")
        elif "cpu" in controllers.split(","):
            candidates.append(root / controllers / relative / "cpu.stat")
    candidates += [root / "cpu.stat", root / "cpu" / "cpu.stat", root / "cpu,cpuacct" / "cpu.stat"]
    return next((c for c in candidates if c.is_file()), None)


def throttled_seconds(path: Path) -> float:
    """Total time the cgroup has been throttled, in seconds."""
    return parse_throttled(path.read_text())


_THROTTLED = re.compile(r"^throttled_(usec|time) (\d+)", re.MULTILINE)


def _throttled_of_raw(raw: bytes) -> float:
    """:func:`parse_throttled` of the file's bytes, without decoding them where cgroup v2's
    ``throttled_usec`` line is found (read at every step on the emitter thread)."""
    at = raw.find(b"\nthrottled_usec ")
    if at >= 0:
        end = raw.find(b"\n", at + 16)
        try:
            return int(raw[at + 16:end if end >= 0 else len(raw)]) / 1e6
        except ValueError:
            pass
    return parse_throttled(raw.decode())


def parse_throttled(text: str) -> float:
    """``cpu.stat``'s throttled time in seconds (v2 ``throttled_usec``, v1 ``throttled_time``)."""
    found = dict(_THROTTLED.findall(text))
    if "usec" in found:
        return int(found["usec"]) / 1e6
    return int(found.get("time", 0)) / 1e9


class CgroupSource:
    def start(self, ctx: Any) -> None:
        self.path = cpu_stat_path()
        if self.path is None:
            ctx.log.info("otel_train.cgroup_unavailable",
                         reason="no readable cgroup cpu.stat; CPU throttling is not measured")
            return
        self.emitter = ctx.emitter
        self.attrs = {semconv.ATTR_RANK: ctx.identity.rank,
                      semconv.ATTR_RUN_ID: ctx.identity.run_id}
        self.counter = semconv.create(ctx.meter, semconv.METRIC_CPU_THROTTLED_TIME)
        self.counter.add(0.0, self.attrs)  # measured, and zero so far: a fact, not a gap
        ctx.emitter.add_cpu_throttled(0.0)
        self.last = throttled_seconds(self.path)
        self.samples: dict[int, bytes] = {}
        self.tracker = ctx.tracker
        self._sample: tuple[int, bytes] | None = None
        self._last_read_ns = -MIN_READ_INTERVAL_NS  # the first step is sampled
        self._optimizer_step = -1  # the last step in which an optimizer step ended
        try:
            self.fd: int | None = os.open(self.path, os.O_RDONLY)
        except OSError:
            self.fd = None  # read at drain time, as a fallback
        if self.fd is not None:
            self._put = ctx.recorder.put
            ctx.emitter.on_event(RECORD, self._on_record)
            ctx.emitter.on_event(FINAL_RECORD, self._on_final)
            self._unhooks = [self.tracker.add_end_hook(semconv.PHASE_OPTIMIZER,
                                                       self._optimizer_end),
                             self.tracker.add_step_hook(self._step_hook)]
        ctx.emitter.before_step(self._on_step)

    # --- training thread -------------------------------------------------------------
    def _read(self) -> bytes:
        assert self.fd is not None
        return os.pread(self.fd, 4096, 0)

    def _optimizer_end(self, now: int) -> None:
        # an optimizer step just ended: the step may end here (unless another one follows)
        self._optimizer_step = self.tracker.step
        if now - self._last_read_ns >= MIN_READ_INTERVAL_NS:  # else a call for nothing
            self._sample_at(now)

    def _sample_at(self, now: int) -> None:
        if now - self._last_read_ns < MIN_READ_INTERVAL_NS:
            return
        try:
            self._sample = (self.tracker.step, self._read())
            self._last_read_ns = now
        except Exception as err:
            internal_errors.count("cgroup", err)

    def _step_hook(self, step: int) -> None:
        sample = self._sample
        if (sample is None or sample[0] != step) and self._optimizer_step != step:
            # no optimizer step ended in this step (a mark_step loop): read here, rate-limited
            # alike (where one ended, its end hook already decided)
            self._sample_at(time.perf_counter_ns())
            sample = self._sample
        self._sample = None
        if sample is not None and sample[0] == step:
            self._put((EVENT, RECORD, sample))

    # --- emitter thread --------------------------------------------------------------
    def _on_record(self, payload: tuple[int, bytes]) -> None:
        step, raw = payload
        self.samples[step] = raw
        if len(self.samples) > 4096:  # steps whose record was dropped: never waited for
            for old in sorted(self.samples)[:2048]:
                del self.samples[old]

    @step_uses(writes=("extra_attributes",))
    def _on_step(self, info: Any) -> None:
        record = info.record
        raw = self.samples.pop(record.step, None)
        if raw is not None:
            delta = self._advance(_throttled_of_raw(raw))
        elif self.fd is None:  # no descriptor: read at drain time
            delta = self._advance(throttled_seconds(self.path))
        else:  # not sampled (within the read interval): the next sample carries it
            delta = 0.0
        duration_s = max(0.0, (record.end_ns - record.start_ns) / 1e9)
        record.extra_attributes[semconv.ATTR_CPU_THROTTLED] = min(delta, duration_s)

    def _on_final(self, raw: bytes) -> None:
        """The run's last read: what no sampled step was charged with, into the counter."""
        self._advance(_throttled_of_raw(raw))

    def _advance(self, now: float) -> float:
        delta, self.last = max(0.0, now - self.last), max(now, self.last)
        if delta:
            self.counter.add(delta, self.attrs)
            self.emitter.add_cpu_throttled(delta)
        return delta

    def stop(self) -> None:
        for unhook in getattr(self, "_unhooks", ()):
            unhook()
        fd = getattr(self, "fd", None)
        if fd is not None:  # after the last step's record: the emitter sees it after them
            try:
                self._put((EVENT, FINAL_RECORD, self._read()))
            except Exception as err:
                internal_errors.count("cgroup", err)
        self.fd = None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
