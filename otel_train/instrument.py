"""Wiring and teardown of one instrumented run: ``instrument()`` and what it returns."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from opentelemetry.trace import SpanContext, TraceFlags

from otel_train import config as config_mod
from otel_train import identity, redact, semconv, sources
from otel_train.config import Config, ConfigWarning
from otel_train.emitter import Emitter
from otel_train.emitter.pipeline import Pipeline
from otel_train.export.prometheus import PrometheusEndpoint
from otel_train.export.remote import ExporterUnavailable, RemotePipeline
from otel_train.exporter.providers import Pipeline as InProcessPipeline
from otel_train.identity import Identity
from otel_train.log_capture import LogCapture, LogContext, internal_logger
from otel_train.recorder import EVENT, Recorder
from otel_train.tracker import CStepTracker, StepHooks, StepTracker, tracker_class

#: what else is observed, beside steps: "module:Class" of each source (see sources/__init__.py)
SOURCES: tuple[str, ...] = ("otel_train.sources.compile:CompileSource",
                            "otel_train.sources.collectives:CollectiveSource",
                            # GPU truth (docs/gpu.md): each does nothing on a CPU run
                            "otel_train.sources.gpu.cuda_timing:CudaTimingSource",
                            "otel_train.sources.gpu.memory:MemorySource",
                            "otel_train.sources.gpu.mfu:MfuSource",
                            "otel_train.sources.gpu.profiler:ProfilerSource",
                            "otel_train.sources.cgroup:CgroupSource",
                            "otel_train.sources.gaps:GapSource")
# The sources' pre-step listeners run in this order, except where one reads a step field
# another writes: each declares what it reads and writes (``sources.step_uses``), and the
# emitter runs every listener after those that write what it reads (emitter/work.py).

_active_lock = threading.Lock()
_active: Instrumentation | None = None
_RUN_END = "otel_train.run_end"


def instrument(
    model: torch.nn.Module | None = None,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    dataloader: Any = None,
    samples_per_step: int | None = None,
    tokens_per_step: int | None = None,
    run_id: str | None = None,
    output_dir: str | Path | None = None,
    exporter: str | None = None,
    service_name: str | None = None,
    prometheus_port: int | None = None,
    **settings: Any,
) -> Instrumentation:
    """Instrument a training loop; use the result as a context manager.

    ``model`` is the module the loop calls (the ``torch.compile`` wrapper, the FSDP or DDP
    module, whatever the loop invokes). Steps end at each optimizer step (of ``optimizer``
    only, if given; else of any optimizer) or at :meth:`Instrumentation.mark_step`.
    ``dataloader`` restricts data-wait timing to that DataLoader. Samples and tokens per
    step are read off batch shapes unless given. Other keywords are :class:`Config` fields;
    everything unset comes from ``OTEL_TRAIN_*`` and ``OTEL_*`` variables.
    """
    cfg = config_mod.load(
        samples_per_step=samples_per_step, tokens_per_step=tokens_per_step, run_id=run_id,
        output_dir=output_dir, exporter=exporter, service_name=service_name,
        prometheus_port=prometheus_port, **settings,
    )
    return Instrumentation(cfg, model=model, optimizer=optimizer, dataloader=dataloader)


class Instrumentation:
    """One instrumented run. Enter to start, exit to flush and restore everything."""

    def __init__(self, cfg: Config, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, dataloader: Any = None) -> None:
        self.config = cfg
        self._model = model
        self._optimizer = optimizer
        self._dataloader = dataloader
        self._started = False
        self._inert = False
        self.identity: Identity | None = None
        self.run_dir: Path | None = None
        self.recorder: Recorder | None = None
        self.tracker: StepTracker | None = None
        self.emitter: Emitter | None = None
        #: telemetry dropped this run, by signal (set when instrumentation ends)
        self.dropped: dict[str, int] = {}
        #: what reached the OpenTelemetry SDK, by signal: {"produced", "exported", "dropped":
        #: {signal: n}}, produced = exported + dropped (set when instrumentation ends)
        self.telemetry: dict[str, dict[str, int]] = {}
        self.flushed = True
        self._signal_name: str | None = None
        self._previous_sigterm: Any = None
        self._stopping = False
        self._sigterm_pending = False

    # --- public ----------------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        return self.identity.run_id if self.identity else None

    def mark_step(self) -> None:
        """End the current step now: for loops without an optimizer step."""
        if self.tracker is not None and self.tracker.active():
            self.tracker.mark_step()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """``with inst.step(): ...``: the block is one step."""
        try:
            yield
        finally:
            self.mark_step()

    def __enter__(self) -> Instrumentation:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop(exc)

    # --- start -----------------------------------------------------------------------
    def start(self) -> None:
        global _active
        if config_mod.sdk_disabled():
            self._inert = True  # the OpenTelemetry switch for all signals: nothing installed
            warnings.warn("otel-train: OTEL_SDK_DISABLED=true: no telemetry for this run; "
                          "training runs uninstrumented", ConfigWarning, stacklevel=3)
            return
        with _active_lock:
            if _active is not None or self._started:
                warnings.warn("otel-train: instrument() is already active in this process; "
                              "this nested one does nothing", ConfigWarning, stacklevel=3)
                self._inert = True
                return
            _active = self
        self._started = True
        try:
            self._start()
        except Exception as err:  # instrumentation must never stop training from starting
            self._undo_partial_start()
            with _active_lock:
                _active = None
            self._started = False
            self._inert = True
            warnings.warn(f"otel-train: could not start ({err!r}); training continues "
                          "uninstrumented", ConfigWarning, stacklevel=3)
        except BaseException:
            self._undo_partial_start()
            with _active_lock:
                _active = None
            self._started = False
            raise

    def _undo_partial_start(self) -> None:
        """Best effort: remove whatever a failed start had installed already."""
        for undo in (lambda: self._hooks.remove(), lambda: self._logs.remove(),
                     lambda: self.emitter.stop(1.0), lambda: self._pipeline.shutdown(1.0),
                     lambda: self._prometheus.close() if self._prometheus else None):
            try:
                undo()
            except Exception:  # not installed yet, or already half gone
                pass

    def _start(self) -> None:
        cfg = self.config
        self._t0_perf = time.perf_counter_ns()
        offset = time.time_ns() - time.perf_counter_ns()
        ident = self.identity = identity.resolve(cfg.run_id)
        redact.load_env_secrets()  # the secret values to mask, read once a run
        if config_mod.choose_exporter(cfg) == "file":
            self.run_dir = cfg.output_dir / ident.run_id
        self.recorder = Recorder(cfg.queue_size)
        self.tracker = tracker_class(cfg.fastpath)(self.recorder, ident.run_id, ident.rank,
                                                   cfg.samples_per_step, cfg.tokens_per_step)
        log_ctx = LogContext(self.recorder, self.tracker, ident.run_id, ident.rank)
        console = internal_logger(log_ctx, cfg.console_log_level, bridged=False)
        pipeline = self._pipeline = self._start_pipeline(
            ident, lambda text: console.warning("otel_train.exporter_lost", detail=text))
        launcher = identity.launcher_context()
        run_trace = launcher.trace_id if launcher else identity.run_trace_id(ident.run_id)
        self._run_context = SpanContext(run_trace, identity.run_span_id(ident.run_id, ident.rank),
                                        False, TraceFlags(TraceFlags.SAMPLED))
        self._launcher = launcher
        self._logs = LogCapture(log_ctx, cfg.console_log_level)
        self._logs.install(cfg.capture_logs)
        self.log = internal_logger(log_ctx, cfg.console_log_level)
        self._prometheus = self._start_prometheus(ident)
        self.emitter = Emitter(self.recorder, pipeline, ident, cfg, offset, self._run_context,
                               launcher, self._prometheus, console)
        self.emitter.start()
        self._hooks = StepHooks(self.tracker)
        self._install_hooks()
        self._sources = sources.start_all(SOURCES, sources.RunContext(
            config=cfg, identity=ident, recorder=self.recorder, tracker=self.tracker,
            emitter=self.emitter, meter=pipeline.meter, log=self.log, model=self._model))
        self._write_run_json(ident)
        self._install_sigterm()
        self._setup_end_perf = time.perf_counter_ns()
        self._offset = offset
        in_c = CStepTracker is not None and isinstance(self.tracker, CStepTracker)
        self.log.info(semconv.LOG_START, exporter=pipeline.kind,
                      run_dir=str(self.run_dir) if self.run_dir else None,
                      sampler=cfg.sampler_name, tracker="c" if in_c else "python",
                      **{semconv.ATTR_WORLD_SIZE: ident.world_size})

    def _install_hooks(self) -> None:
        hooks = self._hooks
        dataset = None
        if self._dataloader is not None:
            dataset = getattr(self._dataloader, "dataset", None)
            if not isinstance(self._dataloader, torch.utils.data.DataLoader):
                warnings.warn("otel-train: dataloader= is not a torch DataLoader; data wait is "
                              "timed for every DataLoader", ConfigWarning, stacklevel=5)
                dataset = None
        hooks.hook_dataloader(dataset)
        if self._model is not None:
            hooks.hook_model(self._model)
        hooks.hook_backward()
        hooks.hook_optimizer(self._optimizer)

    def _start_pipeline(self, ident: Identity, on_exporter_lost: Callable[[str], None]
                        ) -> Pipeline:
        """The exporter process (the default), else the providers on a thread of ours.
        ``on_exporter_lost``: the console's warning when an exporter process is lost (the
        in-process providers have none to lose)."""
        if self.config.export_process:
            try:
                return RemotePipeline(self.config, ident, self.run_dir,
                                      on_warning=on_exporter_lost)
            except ExporterUnavailable as err:
                warnings.warn(f"otel-train: {err}; exporting from the training process "
                              "instead", ConfigWarning, stacklevel=6)
        return InProcessPipeline(self.config, ident, self.run_dir)

    def _start_prometheus(self, ident: Identity) -> PrometheusEndpoint | None:
        port = self.config.prometheus_port
        if port is None:
            return None
        try:
            return PrometheusEndpoint(self.config.prometheus_addr, port + ident.local_rank,
                                      ident.rank, ident.run_id)
        except OSError as err:
            warnings.warn(f"otel-train: cannot serve Prometheus metrics on "
                          f"{self.config.prometheus_addr}:{port + ident.local_rank} ({err}); "
                          "continuing without the endpoint", ConfigWarning, stacklevel=5)
            return None

    def _install_sigterm(self) -> None:
        """Preemption (SIGTERM): flush telemetry within the shutdown bound, then die of it.

        Installed only where SIGTERM still has its default action and only from the main
        thread (Python's rule). An application handler is left in place and chained: the run
        is marked preempted and the application's handler decides what happens next.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN or previous is None:
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._stopping:
                # a stop under way (the run ended, or its own error ended it: torchrun
                # signals the other ranks once one has failed, as they fail themselves):
                # the flush goes on, and the process dies of the signal after it
                if callable(previous):
                    previous(signum, frame)
                else:
                    self._sigterm_pending = True
                return
            self._signal_name = "SIGTERM"
            if callable(previous):
                previous(signum, frame)
                return
            self.stop(None)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        self._previous_sigterm = previous
        self._sigterm_handler = on_sigterm
        signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is None:
            return
        try:
            if signal.getsignal(signal.SIGTERM) is self._sigterm_handler:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        except ValueError:  # not the main thread: leave it, it only marks a stopped run
            pass
        self._previous_sigterm = None

    def _status(self, exc: BaseException | None) -> str:
        if self._signal_name is not None:
            return "preempted"
        return "error" if exc is not None else "ok"

    def _write_run_json(self, ident: Identity) -> None:
        if self.run_dir is None or ident.rank != 0 or self._pipeline.kind != "file":
            return
        info = {
            "run_id": ident.run_id, "world_size": ident.world_size,
            "started_unix_ns": time.time_ns(), "service_name": self.config.service_name,
            "sampler": self.config.sampler_name, "sampler_arg": self.config.sampler_arg,
            "torch_version": torch.__version__,
        }
        try:
            (self.run_dir / "run.json").write_text(json.dumps(info, indent=2) + "\n")
        except OSError as err:
            warnings.warn(f"otel-train: cannot write {self.run_dir}/run.json ({err})",
                          ConfigWarning, stacklevel=5)

    # --- stop ------------------------------------------------------------------------
    def stop(self, exc: BaseException | None = None) -> None:
        """Finish the step in flight, restore every hook, flush within the shutdown bound."""
        global _active
        if self._inert or not self._started:
            return
        self._stopping = True  # first: a SIGTERM between the two lines waits for the flush
        self._started = False
        try:
            self._stop(exc)
        finally:
            with _active_lock:
                _active = None
            # the handler stays until the flush is over: a SIGTERM meanwhile waits for it
            self._restore_sigterm()
            self._stopping = False
            if self._sigterm_pending:
                self._sigterm_pending = False
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

    def _stop(self, exc: BaseException | None) -> None:
        assert self.tracker is not None and self.emitter is not None
        assert self.identity is not None and self.recorder is not None
        cfg = self.config
        self.tracker.close()
        self._hooks.remove()
        sources.stop_all(self._sources, self.log)
        end_perf = time.perf_counter_ns()
        deadline = time.monotonic() + cfg.shutdown_timeout_s
        status = self._status(exc)
        self.log.info(semconv.LOG_STOP, signal=self._signal_name,
                      error=repr(exc) if exc is not None else None,
                      **{semconv.ATTR_STATUS: status, semconv.ATTR_STEPS: self.tracker.step})
        self._logs.remove()
        # The run spans are built by the emitter too, after every record before them.
        self.emitter.on_event(_RUN_END, lambda payload: self._run_spans(*payload))
        self.recorder.put_always((EVENT, _RUN_END, (end_perf, exc)))
        self.emitter.stop(max(0.0, deadline - time.monotonic()))
        if self.emitter.alive():
            warnings.warn("otel-train: the emitter did not finish in time; the last records "
                          "and the run span are not exported", ConfigWarning, stacklevel=4)
        self.flushed = self._pipeline.shutdown(max(0.1, deadline - time.monotonic()))
        self.dropped = dict(self.emitter.total_dropped())
        self.telemetry = self._pipeline.accounts_snapshot()
        if self._prometheus is not None:
            self._prometheus.close()
        if any(self.dropped.values()) or not self.flushed:
            warnings.warn(f"otel-train: telemetry dropped this run: {self.dropped}"
                          + ("" if self.flushed else "; the final flush timed out"),
                          ConfigWarning, stacklevel=4)

    def _run_spans(self, end_perf: int, exc: BaseException | None) -> None:
        emitter, ident = self.emitter, self.identity
        assert emitter is not None and ident is not None
        wall = emitter.wall
        run_parent = self._launcher
        attrs = {semconv.ATTR_RUN_ID: ident.run_id, semconv.ATTR_RANK: ident.rank,
                 semconv.ATTR_WORLD_SIZE: ident.world_size,
                 semconv.ATTR_STATUS: self._status(exc),
                 semconv.ATTR_STEPS: self.tracker.step if self.tracker else 0,
                 semconv.ATTR_GOODPUT_START: emitter.steps.account_start_ns}
        run_ctx = emitter.span(
            semconv.SPAN_RUN, run_parent, wall(self._t0_perf), wall(end_perf), attrs,
            span_id=self._run_context.span_id,
            trace_id=0 if run_parent else self._run_context.trace_id,
            # scrubbed before the cut: a secret across it would leave its first part
            error=(redact.scrub(f"{type(exc).__name__}: {exc}")[:1000] if exc is not None
                   else self._signal_name))
        emitter.span(semconv.SPAN_SETUP, run_ctx, wall(self._t0_perf),
                     wall(self._setup_end_perf),
                     {semconv.ATTR_RUN_ID: ident.run_id, semconv.ATTR_RANK: ident.rank})
