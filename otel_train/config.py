"""Settings of one instrumented run: arguments first, then ``OTEL_TRAIN_*`` and ``OTEL_*``.

Every ``OTEL_TRAIN_*`` variable is read here, and each setting is checked by one rule
(``SETTINGS``) whether it comes as an argument or from its variable. A bad value never stops
training: it gives one :class:`ConfigWarning` naming the argument or the variable, in its
own unit, and the value used instead. What C code reads (the NCCL plugin's variables) is
handed to it checked (:func:`nccl_environment`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.sdk.trace import sampling

from otel_train import semconv

T = TypeVar("T")

EXPORTERS = ("auto", "otlp", "file", "none")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
COLLECTIVE_SPANS = ("auto", "all", "summary")
NCCL_TIMINGS = ("auto", "kernel", "events")
#: the plugin's settings (read by its C code when NCCL loads it: ``nccl_environment``)
NCCL_ENV = {"nccl_timing": "OTEL_TRAIN_NCCL_TIMING", "nccl_poll_ms": "OTEL_TRAIN_NCCL_POLL_MS",
            "nccl_self_time": "OTEL_TRAIN_NCCL_SELF_TIME",
            "nccl_complete_on_enqueue": "OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE"}
_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class ConfigWarning(UserWarning):
    """A setting had a bad value; a safe default was used instead."""


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything an instrumented run can be told. Build it with :func:`load`."""

    service_name: str = semconv.SERVICE_NAME_DEFAULT
    #: where the embedded default writes ``<run id>/`` directories
    output_dir: Path = Path(semconv.OUTPUT_DIR_DEFAULT)
    #: auto: OTLP when an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is set, else files
    exporter: str = "auto"
    #: a fixed run id (otherwise the launcher's, otherwise one broadcast by rank 0)
    run_id: str | None = None
    #: the hot-path buffer's capacity in records; beyond it records are dropped and counted
    queue_size: int = 65536
    #: the longest a record waits in the buffer while records come: the emitter drains
    #: this long after its last drain that found records, sooner when the buffer is half
    #: full or a source's deadline comes (a stall's, the flight recorder's reads), and
    #: sleeps while nothing is recorded. Each wake-up has a fixed cost (cold caches, the
    #: interpreter lock: ~0.5-0.9 ms a drain on an H200 host's busy ranks, docs/overhead.md),
    #: so fewer are cheaper; two seconds keep telemetry at most two seconds behind, well
    #: inside the span batches' 5 s and the metric exports' 60 s
    emit_interval_s: float = 2.0
    #: the gap sampler's interval (a quarter of it until the typical step length is
    #: known): it looks where a step has run past its typical length, and samples the training
    #: thread's stack while it is outside every phase (or in a data wait) there: where
    #: untimed time went (sources/gaps.py). Where the tracker moves the overrun alarm (the C
    #: tracker on Linux) every step that runs past that point wakes the sampler, which then
    #: looks on its own once a second, and this is how often it aims at a stretch that
    #: comes back every step until it knows where it is. Elsewhere a step that
    #: overruns by longer than this is always found: 200 ms, so that a host stretch a fifth
    #: of a second long on steps of any length is named down to its line
    #: (tests/gpu/test_nccl_attribution.py holds it on short NCCL steps). Each wake-up has a
    #: fixed cost (docs/overhead.md): five a second at most, none while training is
    #: paused. 0 turns sampling off; the gaps are still named
    gap_sample_s: float = 0.2
    #: upper bound on the time leaving ``instrument()`` may take to flush telemetry
    shutdown_timeout_s: float = 10.0
    #: per-rank Prometheus endpoint: port of local rank 0 (rank r serves on port + r); None: off
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"
    #: level of otel-train's own JSON log lines on stderr
    console_log_level: str = "info"
    #: bridge the standard library's logging records (and structlog's) into OTel logs
    capture_logs: bool = True
    #: OTEL_TRACES_SAMPLER name and argument (a trace-id ratio is consistent across ranks)
    sampler_name: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    samples_per_step: int | None = None
    tokens_per_step: int | None = None
    #: the step tracker's hot path in C where it was built at install (tracker.py); False:
    #: the Python one (the same records, a few microseconds a step dearer)
    fastpath: bool = True
    # --- GPU sources (docs/gpu.md) ---
    #: time phases with CUDA events on the current stream, resolved off the training thread
    cuda_timing: bool = True
    #: reset the allocator's peak statistics at every step end, so the peak gauge is per
    #: step (it also resets what ``torch.cuda.max_memory_allocated()`` reports)
    memory_peak_per_step: bool = False
    #: model FLOPs of one optimizer step (all micro-batches); None: counted once with
    #: FlopCounterMode where the model has no compiled parts
    flops_per_step: float | None = None
    #: the device's peak dense TFLOP/s for MFU; None: looked up by device name (bf16)
    peak_tflops: float | None = None
    #: every this many steps, profile ``profile_steps`` steps with torch.profiler (0: off)
    profile_every: int = 0
    profile_steps: int = 2
    #: where profiler traces go (default: ``<run dir>/profiles`` or the output directory)
    profile_dir: Path | None = None
    #: a collective pending longer than this is reported stalled (error log, span event)
    stall_timeout_s: float = 60.0
    #: how often the NCCL flight recorder is read (a whole-buffer dump: keep it rare)
    nccl_harvest_interval_s: float = 5.0
    #: "all": a span per collective of a sampled step; "summary": one per (phase, op, group)
    #: of a step, plus the stalled, failed, unfinished and slow ones on their own; "auto":
    #: "all" while the rank's collective spans stay within collective_span_rate a second,
    #: the step summarised past it (docs/collectives.md, "The span policy")
    collective_spans: str = "auto"
    #: own collective spans a second per rank that "auto" allows (a second's worth at once)
    collective_span_rate: float = 2000.0
    #: build, encode and export spans, metric points and logs in a separate exporter process
    #: (spawned, never forked) so that none of that work holds the training process's
    #: interpreter; False: on a thread of the training process (docs/overhead.md)
    export_process: bool = True
    #: NCCL: have instrument() name otel-train's NCCL profiler plugin in NCCL_PROFILER_PLUGIN
    #: (built with the system's C compiler) while NCCL can still load it. "auto" (default):
    #: when NCCL is 2.28 or later, no NCCL operation has run yet and a C compiler is found,
    #: else the flight recorder, quietly; True: also when that cannot be told, saying why not
    #: where it fails; False: never (the flight recorder). A launcher that names the plugin
    #: itself gets it either way (docs/collectives.md).
    nccl_plugin: bool | str = "auto"
    #: how otel-train's NCCL plugin times kernels: "kernel" (NCCL's kernel-channel events),
    #: "events" (CUDA events), "auto" (kernel while every communicator spans several nodes;
    #: docs/collectives.md). Handed to the plugin by its variable (``nccl_environment``)
    nccl_timing: str = "auto"
    #: with events timing: how often the plugin's poller looks for finished kernels, ms
    nccl_poll_ms: int = 25
    #: measurement switches of the plugin (docs/overhead.md)
    nccl_self_time: bool = False
    nccl_complete_on_enqueue: bool = False
    #: troubleshooting switch: False leaves ProcessGroup hooks out even where torch has them
    collective_pg_hooks: bool = True

    def sampler(self) -> sampling.Sampler:
        """The OpenTelemetry sampler these settings name."""
        if self.sampler_name.endswith("traceidratio"):
            ratio = sampling.TraceIdRatioBased(self.sampler_arg)
            if self.sampler_name.startswith("parentbased"):
                return sampling.ParentBased(ratio)
            return ratio
        return {
            "always_on": sampling.ALWAYS_ON,
            "always_off": sampling.ALWAYS_OFF,
            "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
            "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        }[self.sampler_name]


_DEFAULTS = Config()


def nccl_environment(cfg: Config) -> dict[str, str]:
    """The plugin's variables as its C code reads them (``otel_train/nccl/profiler.c``,
    when NCCL loads it): the checked settings, spelled as it expects."""
    return {NCCL_ENV["nccl_timing"]: cfg.nccl_timing,
            NCCL_ENV["nccl_poll_ms"]: str(cfg.nccl_poll_ms),
            NCCL_ENV["nccl_self_time"]: "1" if cfg.nccl_self_time else "0",
            NCCL_ENV["nccl_complete_on_enqueue"]: "1" if cfg.nccl_complete_on_enqueue else "0"}


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where otel-train keeps what it builds (the NCCL plugin): ``OTEL_TRAIN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/otel-train``, else ``~/.cache/otel-train``."""
    env = os.environ if env is None else env
    return Path(env.get("OTEL_TRAIN_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "otel-train"))


def launcher_run_id(env: Mapping[str, str] | None = None) -> str | None:
    """The raw id a launcher gave this job: torchrun's rendezvous id
    (``TORCHELASTIC_RUN_ID``) or ``OTEL_TRAIN_LAUNCHER_RUN_ID`` (the k8s/ jobs set it)."""
    env = os.environ if env is None else env
    for name in ("TORCHELASTIC_RUN_ID", "OTEL_TRAIN_LAUNCHER_RUN_ID"):
        value = env.get(name, "").strip()
        if value and value.lower() != "none":
            return value
    return None


def _warn(name: str, value: object, why: str, default: object) -> None:
    warnings.warn(
        f"otel-train: {name}={value!r} is invalid ({why}); using {default!r}",
        ConfigWarning,
        stacklevel=4,
    )


def _parse(
    env: Mapping[str, str], name: str, convert: Callable[[str], T], default: T, why: str
) -> T:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return convert(raw.strip())
    except (ValueError, TypeError):
        _warn(name, raw, why, default)
        return default


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(raw)
    return value


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        if raw.lower() not in options:
            raise ValueError(raw)
        return raw.lower()

    return convert


def _bool_or_auto(raw: str) -> bool | str:
    return "auto" if raw.lower() == "auto" else _bool(raw)


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _run_id(raw: str) -> str:
    # The run id names a directory and goes into every span: keep it a plain token.
    if len(raw) > 128 or not all(c.isalnum() or c in "-_." for c in raw) or raw in (".", ".."):
        raise ValueError(raw)
    return raw


# --- one validation for arguments and the environment ----------------------------------
#
# Each setting is checked by one rule, whether it comes as an argument (load(**overrides),
# instrument(**settings)) or from its variable: a bad value gives one ConfigWarning naming
# the argument or the variable, in its own unit, and the default is used. A rule checks a
# value in the field's unit; a variable's text is first read as the rule's type and scaled
# from the variable's unit (OTEL_TRAIN_EMIT_INTERVAL_MS is milliseconds, emit_interval_s
# seconds).


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How a value of one field is read from text and checked."""

    read: Callable[[str], Any]  # text -> value (raises ValueError)
    check: Callable[[Any], Any]  # value -> value (raises ValueError or TypeError)
    what: str  # what a good value is, with "{unit}" where the unit goes


def _number(kind: type, minimum: float, strict: bool) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(value)
        if kind is int and value != int(value):
            raise ValueError(value)
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise ValueError(value)
        return kind(value)

    return check


def _is(kind: type) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(value)
        return value

    return check


def _one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in options:
            raise ValueError(value)
        return value.lower()

    return check


def _boolean_or_auto(value: Any) -> bool | str:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(value)


def _tcp_port(value: Any) -> int:
    value = _number(int, 1, False)(value)
    if value > 65535:
        raise ValueError(value)
    return value


def _path(value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise TypeError(value)
    return Path(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(value)
    return value


_POSITIVE_INT = _Rule(int, _number(int, 0, True), "a positive integer{unit}")
_NON_NEGATIVE_INT = _Rule(int, _number(int, 0, False), "a non-negative integer{unit}")
_POSITIVE = _Rule(float, _number(float, 0, True), "a positive number{unit}")
_NON_NEGATIVE = _Rule(float, _number(float, 0, False), "a non-negative number{unit}")
_BOOL = _Rule(_bool, _is(bool), "true or false")
_PORT = _Rule(int, _tcp_port, "a TCP port, 1-65535")
_PATH = _Rule(Path, _path, "a path")
_TEXT = _Rule(str, _text, "a non-empty string")


def _options(options: tuple[str, ...]) -> _Rule:
    return _Rule(str, _one_of(options), f"one of {', '.join(options)}")


@dataclasses.dataclass(frozen=True)
class _Setting:
    field: str
    rule: _Rule
    #: the environment variable, if there is one, and how many of its units make one of the
    #: field's (1000: milliseconds for seconds)
    variable: str | None = None
    scale: float = 1.0
    #: the units of the field's and of the variable's values, for the messages
    unit: str = ""
    variable_unit: str = ""
    #: None is a value the field takes (off, unset, look it up)
    optional: bool = False

    def what(self, of_variable: bool) -> str:
        unit = self.variable_unit if of_variable and self.variable_unit else self.unit
        return self.rule.what.format(unit=f" of {unit}" if unit else "")

    def from_text(self, raw: str) -> Any:
        value = self.rule.read(raw)
        if self.scale != 1.0:
            value = value / self.scale
        return self.rule.check(value)

    def shown(self, value: Any, of_variable: bool) -> Any:
        """``value`` as the argument or the variable would spell it (a default in a message)."""
        if of_variable and self.scale != 1.0 and isinstance(value, (int, float)):
            scaled = value * self.scale
            return int(scaled) if scaled == int(scaled) else scaled
        return value


_ms = {"scale": 1000.0, "unit": "seconds", "variable_unit": "milliseconds"}
_SETTINGS = (
    _Setting("service_name", _TEXT, "OTEL_SERVICE_NAME"),
    _Setting("output_dir", _PATH, "OTEL_TRAIN_OUTPUT_DIR"),
    _Setting("exporter", _options(EXPORTERS), "OTEL_TRAIN_EXPORTER"),
    # a variable's run id must be a plain token already; an argument's is made one
    # (identity.sanitize_run_id), as the launcher's is
    _Setting("run_id", _Rule(_run_id, _text, "letters, digits, '-', '_', '.', at most 128"),
             "OTEL_TRAIN_RUN_ID", optional=True),
    _Setting("queue_size", _POSITIVE_INT, "OTEL_TRAIN_QUEUE_SIZE", unit="records"),
    _Setting("emit_interval_s", _POSITIVE, "OTEL_TRAIN_EMIT_INTERVAL_MS", **_ms),
    _Setting("gap_sample_s", _NON_NEGATIVE, "OTEL_TRAIN_GAP_SAMPLE_MS", **_ms),
    _Setting("shutdown_timeout_s", _POSITIVE, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", unit="seconds"),
    _Setting("prometheus_port", _PORT, "OTEL_TRAIN_PROMETHEUS_PORT", optional=True),
    _Setting("prometheus_addr", _TEXT, "OTEL_TRAIN_PROMETHEUS_ADDR"),
    _Setting("console_log_level", _options(LOG_LEVELS), "OTEL_TRAIN_LOG_LEVEL"),
    _Setting("capture_logs", _BOOL, "OTEL_TRAIN_CAPTURE_LOGS"),
    _Setting("sampler_name", _options(_SAMPLERS), "OTEL_TRACES_SAMPLER"),
    _Setting("sampler_arg", _Rule(float, lambda v: _bounded(_number(float, 0, False)(v), 1.0),
                                  "a ratio between 0 and 1"), "OTEL_TRACES_SAMPLER_ARG"),
    _Setting("samples_per_step", _POSITIVE_INT, optional=True),
    _Setting("tokens_per_step", _POSITIVE_INT, optional=True),
    _Setting("fastpath", _BOOL, "OTEL_TRAIN_FASTPATH"),
    _Setting("cuda_timing", _BOOL, "OTEL_TRAIN_CUDA_TIMING"),
    _Setting("memory_peak_per_step", _BOOL, "OTEL_TRAIN_MEMORY_PEAK_PER_STEP"),
    _Setting("flops_per_step", _POSITIVE, "OTEL_TRAIN_FLOPS_PER_STEP", unit="FLOPs",
             optional=True),
    _Setting("peak_tflops", _POSITIVE, "OTEL_TRAIN_PEAK_TFLOPS", unit="TFLOP/s",
             optional=True),
    _Setting("profile_every", _NON_NEGATIVE_INT, "OTEL_TRAIN_PROFILE_EVERY",
             unit="steps, 0 for off"),
    _Setting("profile_steps", _POSITIVE_INT, "OTEL_TRAIN_PROFILE_STEPS", unit="steps"),
    _Setting("profile_dir", _PATH, "OTEL_TRAIN_PROFILE_DIR", optional=True),
    _Setting("stall_timeout_s", _POSITIVE, "OTEL_TRAIN_STALL_TIMEOUT_S", unit="seconds"),
    _Setting("nccl_harvest_interval_s", _POSITIVE, "OTEL_TRAIN_NCCL_HARVEST_INTERVAL_S",
             unit="seconds"),
    _Setting("collective_spans", _options(COLLECTIVE_SPANS), "OTEL_TRAIN_COLLECTIVE_SPANS"),
    _Setting("collective_span_rate", _POSITIVE, "OTEL_TRAIN_COLLECTIVE_SPAN_RATE",
             unit="spans a second"),
    _Setting("collective_pg_hooks", _BOOL, "OTEL_TRAIN_COLLECTIVE_PG_HOOKS"),
    _Setting("export_process", _BOOL, "OTEL_TRAIN_EXPORT_PROCESS"),
    _Setting("nccl_plugin", _Rule(_bool_or_auto, _boolean_or_auto, "auto, true or false"),
             "OTEL_TRAIN_NCCL_PLUGIN"),
    _Setting("nccl_timing", _options(NCCL_TIMINGS), NCCL_ENV["nccl_timing"]),
    _Setting("nccl_poll_ms", _Rule(int, lambda v: _bounded_int(v, 1, 1000),
                                   "an integer of milliseconds, 1-1000"),
             NCCL_ENV["nccl_poll_ms"]),
    _Setting("nccl_self_time", _BOOL, NCCL_ENV["nccl_self_time"]),
    _Setting("nccl_complete_on_enqueue", _BOOL, NCCL_ENV["nccl_complete_on_enqueue"]),
)
SETTINGS: dict[str, _Setting] = {s.field: s for s in _SETTINGS}


def _bounded(value: Any, high: float) -> Any:
    if value > high:
        raise ValueError(value)
    return value


def _bounded_int(value: Any, low: int, high: int) -> int:
    return _bounded(_number(int, low, False)(value), high)


def from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings the environment gives, as keyword arguments of :class:`Config` (only
    those whose variable is set and valid; a bad one is warned about and left out)."""
    env = os.environ if env is None else env
    found: dict[str, Any] = {}
    for setting in _SETTINGS:
        if setting.variable is None:
            continue
        raw = env.get(setting.variable)
        if raw is None or raw.strip() == "":
            continue
        if setting.field == "sampler_arg" and not found.get(
                "sampler_name", _DEFAULTS.sampler_name).endswith("traceidratio"):
            continue  # the argument of a sampler that takes none
        try:
            found[setting.field] = setting.from_text(raw.strip())
        except (ValueError, TypeError, ArithmeticError):
            _warn(setting.variable, raw, setting.what(True),
                  setting.shown(getattr(_DEFAULTS, setting.field), True))
    return found


def _checked_arguments(overrides: Mapping[str, Any], fallback: Mapping[str, Any]
                       ) -> dict[str, Any]:
    """The arguments that pass their setting's rule; each that does not is warned about by
    name, in the field's unit, and left out: ``fallback``'s value (the environment's) or the
    default is used."""
    good: dict[str, Any] = {}
    for name, value in overrides.items():
        setting = SETTINGS[name]
        try:
            good[name] = setting.rule.check(value)
        except (ValueError, TypeError, ArithmeticError):
            _warn(f"argument {name}", value, setting.what(False),
                  fallback.get(name, getattr(_DEFAULTS, name)))
    return good


# --- the OpenTelemetry SDK's own variables ------------------------------------------------
#
# The SDK reads these itself wherever it is not given an argument, and rejects some values
# (OTEL_BSP_SCHEDULE_DELAY=-1, OTEL_METRIC_EXPORT_INTERVAL=0, OTEL_BLRP_MAX_EXPORT_BATCH_SIZE
# larger than the queue, an unknown OTEL_METRICS_EXEMPLAR_FILTER...) by raising while the
# providers are built: one bad value would leave the rank without any telemetry. So they are
# read here, where the SDK objects are built, as otel-train's own are (one ConfigWarning
# naming the variable, in its own unit, and the default), and the SDK is handed every value
# as an argument, so it does not read them itself (where it does anyway, providers.py hides a
# bad one from it). The defaults are the specification's, which are the SDK's.

#: OTEL_BSP_* (spans) and OTEL_BLRP_* (logs): queue size, schedule delay (ms), batch size,
#: export timeout (ms)
_BATCH_DEFAULTS = {"traces": ("OTEL_BSP", 2048, 5000, 512, 30000),
                   "logs": ("OTEL_BLRP", 2048, 1000, 512, 30000)}
EXEMPLAR_FILTERS = ("trace_based", "always_on", "always_off")
#: every count limit's default (attribute, event and link counts); lengths have none
_COUNT_LIMIT = 128
#: what the Python OTLP exporters can send, by protocol (http/json is not one of theirs)
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
_OTLP_COMPRESSIONS = {"http/protobuf": ("none", "gzip", "deflate"), "grpc": ("none", "gzip")}
#: the Python OTLP exporters read OTEL_EXPORTER_OTLP_*TIMEOUT in seconds, not milliseconds
_OTLP_TIMEOUT_S = 10.0


def _at_most(limit: int) -> Callable[[str], int]:
    def convert(raw: str) -> int:
        value = _positive_int(raw)
        if value > limit:
            raise ValueError(raw)
        return value

    return convert


def batch_processor_settings(signal: str, env: Mapping[str, str] | None = None
                             ) -> dict[str, int]:
    """Keyword arguments of the SDK's batch processor of ``signal`` ("traces": OTEL_BSP_*,
    "logs": OTEL_BLRP_*)."""
    env = os.environ if env is None else env
    prefix, queue_d, delay_d, batch_d, timeout_d = _BATCH_DEFAULTS[signal]
    queue = _parse(env, f"{prefix}_MAX_QUEUE_SIZE", _positive_int, queue_d,
                   "a positive integer")
    # the SDK refuses a batch larger than the queue: the default batch shrinks to a small queue
    batch = _parse(env, f"{prefix}_MAX_EXPORT_BATCH_SIZE", _at_most(queue), min(batch_d, queue),
                   f"a positive integer, at most {prefix}_MAX_QUEUE_SIZE ({queue})")
    return {
        "max_queue_size": queue,
        "max_export_batch_size": batch,
        "schedule_delay_millis": _parse(env, f"{prefix}_SCHEDULE_DELAY", _positive_int, delay_d,
                                        "a positive integer of milliseconds"),
        # unused by the SDK so far, but parsed by it (and a traceback where it is no integer)
        "export_timeout_millis": _parse(env, f"{prefix}_EXPORT_TIMEOUT", _non_negative_int,
                                        timeout_d, "a non-negative integer of milliseconds"),
    }


def metric_reader_settings(env: Mapping[str, str] | None = None) -> dict[str, float]:
    """Keyword arguments of the SDK's periodic metric reader (OTEL_METRIC_EXPORT_*)."""
    env = os.environ if env is None else env
    # infinite or NaN are refused too: the reader would never export (it has no final one)
    return {
        "export_interval_millis": _parse(env, "OTEL_METRIC_EXPORT_INTERVAL", _positive_float,
                                         60000.0, "a positive number of milliseconds"),
        "export_timeout_millis": _parse(env, "OTEL_METRIC_EXPORT_TIMEOUT", _positive_float,
                                        30000.0, "a positive number of milliseconds"),
    }


def exemplar_filter(env: Mapping[str, str] | None = None) -> str:
    """OTEL_METRICS_EXEMPLAR_FILTER: trace_based (the default), always_on or always_off."""
    env = os.environ if env is None else env
    return _parse(env, "OTEL_METRICS_EXEMPLAR_FILTER", _choice(EXEMPLAR_FILTERS), "trace_based",
                  f"one of {', '.join(EXEMPLAR_FILTERS)}")


def attribute_limits(env: Mapping[str, str] | None = None
                     ) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """Keyword arguments of the SDK's SpanLimits and LogRecordLimits (None: no limit): each
    model's own variable, else the global OTEL_ATTRIBUTE_*_LIMIT, else the default."""
    env = os.environ if env is None else env

    def limit(name: str, default: int | None) -> int | None:
        return _parse(env, name, _non_negative_int, default, "a non-negative integer")

    count = limit("OTEL_ATTRIBUTE_COUNT_LIMIT", _COUNT_LIMIT)
    length = limit("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", None)
    spans = {
        "max_attributes": count,
        "max_attribute_length": length,
        "max_span_attributes": limit("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", count),
        "max_span_attribute_length": limit("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", length),
        "max_events": limit("OTEL_SPAN_EVENT_COUNT_LIMIT", _COUNT_LIMIT),
        "max_links": limit("OTEL_SPAN_LINK_COUNT_LIMIT", _COUNT_LIMIT),
        "max_event_attributes": limit("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", count),
        "max_link_attributes": limit("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", count),
    }
    logs = {
        "max_attributes": count,
        "max_attribute_length": length,
        "max_log_record_attributes": limit("OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT", count),
        "max_log_record_attribute_length": limit("OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                                                 length),
    }
    return spans, logs


def otlp_settings(signals: Sequence[str], env: Mapping[str, str] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """By signal ("traces", "metrics", "logs"): the OTLP exporter's protocol, timeout (s) and
    compression, from OTEL_EXPORTER_OTLP_<SIGNAL>_* else OTEL_EXPORTER_OTLP_*."""
    env = os.environ if env is None else env
    general = "OTEL_EXPORTER_OTLP"
    protocols = f"one of {', '.join(OTLP_PROTOCOLS)} (the Python exporters have no http/json)"
    protocol = _parse(env, f"{general}_PROTOCOL", _choice(OTLP_PROTOCOLS), OTLP_PROTOCOLS[0],
                      protocols)
    seconds = "a positive number of seconds (the Python exporters' unit)"
    timeout = _parse(env, f"{general}_TIMEOUT", _positive_float, _OTLP_TIMEOUT_S, seconds)

    def compression(name: str, protocol: str, default: str) -> str:
        options = _OTLP_COMPRESSIONS[protocol]
        return _parse(env, name, _choice(options), default,
                      f"one of {', '.join(options)} for {protocol}")

    general_compression: dict[str, str] = {}  # by protocol: read once, so warned once
    found: dict[str, dict[str, Any]] = {}
    for signal in signals:
        own = f"{general}_{signal.upper()}"
        chosen = _parse(env, f"{own}_PROTOCOL", _choice(OTLP_PROTOCOLS), protocol, protocols)
        if chosen not in general_compression:
            general_compression[chosen] = compression(f"{general}_COMPRESSION", chosen, "none")
        found[signal] = {
            "protocol": chosen,
            "timeout": _parse(env, f"{own}_TIMEOUT", _positive_float, timeout, seconds),
            "compression": compression(f"{own}_COMPRESSION", chosen,
                                       general_compression[chosen]),
        }
    return found


def load(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Settings from the environment with ``overrides`` (arguments; ``None`` = unset) on top,
    each checked by the same rule (``SETTINGS``): a bad value is warned about by name and
    replaced by the environment's value or the default."""
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise TypeError(f"unknown otel-train setting(s): {', '.join(sorted(unknown))}")
    values = from_env(env)
    values.update(_checked_arguments({k: v for k, v in overrides.items() if v is not None},
                                     values))
    return Config(**values)


def sdk_disabled(env: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED=true`` (the specification's switch, case-insensitive): no
    telemetry at all; any other value, or none, changes nothing."""
    env = os.environ if env is None else env
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def choose_exporter(cfg: Config) -> str:
    """The run's exporter kind: the configured one, or for ``auto`` OTLP where an endpoint is
    configured and files otherwise."""
    if cfg.exporter != "auto":
        return cfg.exporter
    return "otlp" if otlp_endpoint_configured() else "file"


def otlp_endpoint_configured(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return any(
        env.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        )
    )
