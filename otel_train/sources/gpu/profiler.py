"""Profiler windows: every ``profile_every`` steps, ``profile_steps`` steps under torch.profiler.

Off by default, because a window is not free (``docs/gpu.md`` has the measured cost): starting
CUPTI and, above all, stopping the trace (which synchronises the device and collects every
event) happen on the training thread at the window's step boundaries, and writing the trace
holds the GIL for a while. Everything else is off the training thread: the trace is written
by a background thread, analysed by a separate process (``python -m
otel_train.sources.gpu.kineto``: parsing a large JSON trace would hold the GIL for seconds) and
the emitter, polling that process without waiting, turns the result into a ``training.profile``
span under the window's first ``training.rank_step`` (with the trace file's path), the
``training.comm.overlap`` gauge and the exposed-communication and GPU-idle gauges.

One window at a time: a window that falls due while the last one is still being analysed is
skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from otel_train import semconv
from otel_train.recorder import EVENT
from otel_train.sources import RunContext
from otel_train.sources.gpu.device import training_device

RECORD = "otel_train.profile_window"
ANALYSIS_TIMEOUT_S = 600.0
#: how often the emitter looks at a window being written or analysed
POLL_S = 1.0


class ProfilerSource:
    def __init__(self) -> None:
        self.tracker: Any = None
        self._prof: Any = None
        self._window: tuple[int, int, int] | None = None  # (first step, last step, start ns)
        self._busy = threading.Event()  # a window is being written or analysed
        self._jobs: list[dict[str, Any]] = []
        self.skipped = 0

    def start(self, ctx: RunContext) -> None:
        cfg = ctx.config
        if cfg.profile_every <= 0:
            return
        self.steps = cfg.profile_steps
        self.every = max(cfg.profile_every, self.steps + 1)
        ident = ctx.identity
        self.dir = Path(cfg.profile_dir or cfg.output_dir / ident.run_id / "profiles")
        self.cuda = training_device(ctx.model) is not None
        self.shutdown_s = cfg.shutdown_timeout_s
        self.emitter, self.ident = ctx.emitter, ident
        self._put = ctx.recorder.put
        self.tracker = ctx.tracker
        meter = ctx.meter
        # the collectives source's gauge (same definition, so the same instrument), its
        # points here marked training.overlap.method="profiler"
        self.overlap = semconv.create(meter, semconv.METRIC_COMM_OVERLAP)
        self.exposed = semconv.create(meter, semconv.METRIC_COMM_EXPOSED)
        self.idle = semconv.create(meter, semconv.METRIC_GPU_IDLE)
        ctx.emitter.on_event(RECORD, self._on_window)
        ctx.emitter.on_tick(self._poll)
        self._unhook = ctx.tracker.add_step_hook(self._step_hook)

    def stop(self) -> None:
        if self.tracker is None:
            return
        self._unhook()
        if self._prof is not None:
            self._stop_window(self.tracker.step)
        # give the window in flight a bounded chance to be analysed before the last pump
        deadline = time.monotonic() + self.shutdown_s / 2
        while self._busy.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)

    # --- training thread -------------------------------------------------------------
    def _step_hook(self, step: int) -> None:
        try:
            if self._prof is not None:
                if step >= self._window[1]:
                    self._stop_window(step)
            elif (step + 1) % self.every == 0:
                if self._busy.is_set():
                    self.skipped += 1
                else:
                    self._start_window(step + 1)
        except Exception:
            self._prof = None

    def _start_window(self, first: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        prof.start()
        self._prof = prof
        self._window = (first, first + self.steps - 1, time.perf_counter_ns())

    def _stop_window(self, last: int) -> None:
        prof, self._prof = self._prof, None
        first, _, start_ns = self._window
        t0 = time.perf_counter_ns()
        prof.stop()
        stop_ns = time.perf_counter_ns()
        self._busy.set()
        path = self.dir / f"rank{self.ident.rank}_steps{first}-{last}.json"
        job = {"first": first, "last": last, "start_ns": start_ns, "end_ns": t0,
               "stop_s": (stop_ns - t0) / 1e9, "path": str(path), "written": False}

        def write() -> None:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                w0 = time.perf_counter_ns()
                prof.export_chrome_trace(str(path))
                job["write_s"] = (time.perf_counter_ns() - w0) / 1e9
                job["written"] = True
            except Exception as err:
                job["error"] = repr(err)
                job["written"] = True

        threading.Thread(target=write, name="otel-train-profile-writer", daemon=True).start()
        self._put((EVENT, RECORD, job))

    # --- emitter thread --------------------------------------------------------------
    def _on_window(self, job: dict[str, Any]) -> None:
        self._jobs.append(job)

    def _poll(self) -> None:
        self._poll_jobs()
        if self._jobs:  # a window being written or analysed: look again soon (the emitter
            self.emitter.wake_within(POLL_S)  # sleeps while nothing is recorded)

    def _poll_jobs(self) -> None:
        for job in list(self._jobs):
            if not job["written"]:
                continue
            if "error" in job:
                self._finish(job, None)
            elif "proc" not in job:
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
                job["proc"] = subprocess.Popen(
                    [sys.executable, "-m", "otel_train.sources.gpu.kineto", job["path"],
                     "--steps", str(job["last"] - job["first"] + 1)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
                job["launched"] = time.monotonic()
            elif job["proc"].poll() is not None:
                out, err = job["proc"].communicate()
                try:
                    self._finish(job, json.loads(out) if job["proc"].returncode == 0 else None,
                                 err[-500:])
                except ValueError:
                    self._finish(job, None, err[-500:])
            elif time.monotonic() - job["launched"] > ANALYSIS_TIMEOUT_S:
                job["proc"].kill()
                job["proc"].communicate()
                self._finish(job, None, "analysis timed out")

    def _finish(self, job: dict[str, Any], result: dict[str, Any] | None,
                error: str = "") -> None:
        self._jobs.remove(job)
        self._busy.clear()
        self.last_result = result
        ident, emitter = self.ident, self.emitter
        first = job["first"]
        parent = emitter.step_context(first)
        sampled = parent.trace_flags.sampled
        attrs: dict[str, Any] = {
            semconv.ATTR_RUN_ID: ident.run_id, semconv.ATTR_RANK: ident.rank,
            semconv.ATTR_STEP: first, semconv.ATTR_PROFILE_FIRST_STEP: first,
            semconv.ATTR_PROFILE_STEPS: job["last"] - first + 1,
            semconv.ATTR_PROFILE_TRACE: job["path"], semconv.ATTR_PROFILE_STOP_S: job["stop_s"],
        }
        if "write_s" in job:
            attrs[semconv.ATTR_PROFILE_WRITE_S] = job["write_s"]
        metric_attrs = ident.metric_attributes()
        if result is not None:
            if result["overlap"] is not None:
                attrs[semconv.ATTR_COMM_OVERLAP] = result["overlap"]
                self.overlap.set(result["overlap"], {
                    **metric_attrs, semconv.ATTR_OVERLAP_METHOD: "profiler"})
            attrs[semconv.ATTR_COMM_EXPOSED] = result["exposed_comm_per_step_s"]
            self.exposed.set(result["exposed_comm_per_step_s"], metric_attrs)
            if result["gpu_idle"] is not None:
                attrs[semconv.ATTR_GPU_IDLE] = result["gpu_idle"]
                self.idle.set(result["gpu_idle"], metric_attrs)
            attrs[semconv.ATTR_TOP_KERNELS] = [
                f"{k['name'][:120]} {k['total_s'] * 1e3:.3f} ms x{k['count']}"
                for k in result["top_kernels"]]
        if sampled:
            emitter.span(semconv.SPAN_PROFILE, parent, emitter.wall(job["start_ns"]),
                         emitter.wall(job["end_ns"]), attrs,
                         error=None if result is not None else (job.get("error") or error
                                                                or "analysis failed"))
