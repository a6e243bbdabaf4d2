"""CPU throttling of this rank's cgroup, per step: ``training.cpu.throttled.time``.

A rank whose container hits its CPU quota is throttled by the kernel's CFS bandwidth
control: its data loading, kernel launches and collectives' host side all stall for the rest
of the period. The cgroup's ``cpu.stat`` counts it (v2: ``throttled_usec``; v1:
``throttled_time`` in ns). The emitter reads it at each finished step, off the training
thread, and reports the increase: a counter, and ``training.cpu.throttled_s`` on the step's
``train.rank_step`` span. Where no ``cpu.stat`` is readable the source says so once and stays
off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_train import semconv

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
    fields = dict(line.split() for line in path.read_text().splitlines() if " " in line)
    if "throttled_usec" in fields:
        return int(fields["throttled_usec"]) / 1e6
    return int(fields.get("throttled_time", 0)) / 1e9


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
        self.counter = ctx.meter.create_counter(
            semconv.METRIC_CPU_THROTTLED_TIME, unit="s",
            description="Time this rank's cgroup was CPU-throttled (CFS quota), from cpu.stat.")
        self.counter.add(0.0, self.attrs)  # measured, and zero so far: a fact, not a gap
        if ctx.emitter.prometheus is not None:
            ctx.emitter.prometheus.add_cpu_throttled(0.0)
        self.last = throttled_seconds(self.path)
        ctx.emitter.before_step(self._on_step)

    def _on_step(self, info: Any) -> None:
        now = throttled_seconds(self.path)
        delta, self.last = max(0.0, now - self.last), now
        info.extra_attributes[semconv.ATTR_CPU_THROTTLED] = delta
        if delta:
            self.counter.add(delta, self.attrs)
            if self.emitter.prometheus is not None:
                self.emitter.prometheus.add_cpu_throttled(delta)

    def stop(self) -> None:
        pass
