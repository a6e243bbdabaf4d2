"""Logs with the ids of the span they were written in, bridged into OpenTelemetry logs.

Why not the SDK's ``LoggingHandler``: it is deprecated since OpenTelemetry Python 1.40 (its
successor in ``opentelemetry-instrumentation-logging`` is pre-release only), it builds OTel
objects on the calling thread, and it takes trace ids from the OTel context, which is empty
on the training thread because otel-train creates spans later, off-thread. Instead:

- a log-record factory stamps every stdlib ``LogRecord`` with ``trace_id``, ``span_id``,
  ``run_id``, ``rank`` and ``step`` (hex ids, usable in any formatter);
- a handler on the root logger appends each record to the hot-path buffer; the emitter
  turns it into an OTel log record in that context, under the logger's name as its
  instrumentation scope, with ``training.run.id``, ``training.rank`` and ``training.step``
  (the names spans and metrics use: ``semconv.CONSOLE_TO_ATTRIBUTE``);
- structlog gets the same two processors: ``add_ids`` and ``bridge``. When the application
  has not configured structlog, otel-train configures JSON lines on stderr; when it has, the
  two processors are put in front of its renderer. Either way the configuration is restored
  exactly on exit;
- a record's exception (``logger.exception()``, ``exc_info=True``, structlog's
  ``.exception()``) becomes the OpenTelemetry ``exception.type``, ``exception.message`` and
  ``exception.stacktrace`` attributes. The traceback is formatted on the calling thread (an
  exception is rare, and a traceback kept for later would keep its frames alive); the
  emitter scrubs it like every other field (``otel_train/redact.py``).
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

import structlog

from otel_train import semconv
from otel_train.recorder import LOG, Recorder
from otel_train.tracker import StepTracker

#: loggers whose records are never bridged (the exporters' own complaints would loop)
_NOT_BRIDGED = ("opentelemetry", "otel_train.internal", "urllib3", "grpc")
_STDLIB_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", semconv.CONSOLE_TRACE_ID, semconv.CONSOLE_SPAN_ID,
    semconv.CONSOLE_RUN_ID, semconv.CONSOLE_RANK, semconv.CONSOLE_STEP,
}


class LogContext:
    """What a log line needs to know about the run; ``tracker`` is None outside a run."""

    def __init__(self, recorder: Recorder, tracker: StepTracker, run_id: str, rank: int) -> None:
        self.recorder = recorder
        self.tracker = tracker
        self.run_id = run_id
        self.rank = rank

    def ids(self) -> tuple[int, int, int]:
        return self.tracker.current_ids()


ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def exception_fields(exc_info: ExcInfo) -> dict[str, str]:
    """The OpenTelemetry exception attributes of ``exc_info``: type, message, traceback."""
    exc_type, exc, tb = exc_info
    name = exc_type.__qualname__
    if exc_type.__module__ not in ("builtins", "__main__"):
        name = f"{exc_type.__module__}.{name}"
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ raises
        message = f"<unprintable {exc_type.__name__}>"
    return {semconv.ATTR_EXCEPTION_TYPE: name, semconv.ATTR_EXCEPTION_MESSAGE: message,
            semconv.ATTR_EXCEPTION_STACKTRACE: "".join(
                traceback.format_exception(exc_type, exc, tb)).rstrip("\n")}


def _structlog_exc_info(value: Any) -> ExcInfo | None:
    """structlog's ``exc_info``: True (the exception being handled), an exception or a
    ``sys.exc_info()`` tuple."""
    if isinstance(value, BaseException):
        return type(value), value, value.__traceback__
    if value is True:
        value = sys.exc_info()
    if isinstance(value, tuple) and len(value) == 3 and value[0] is not None:
        return value  # type: ignore[return-value]
    return None


# --- structlog processors ----------------------------------------------------------------


def make_add_ids(ctx: LogContext) -> Callable[..., dict[str, Any]]:
    """structlog processor: fill in the run's ids unless the event carries its own."""

    def add_ids(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if semconv.CONSOLE_TRACE_ID not in event:
            step, trace_id, span_id = ctx.ids()
            event[semconv.CONSOLE_TRACE_ID] = f"{trace_id:032x}"
            event[semconv.CONSOLE_SPAN_ID] = f"{span_id:016x}"
            event.setdefault(semconv.CONSOLE_STEP, step)
        event.setdefault(semconv.CONSOLE_RUN_ID, ctx.run_id)
        event.setdefault(semconv.CONSOLE_RANK, ctx.rank)
        return event

    return add_ids


#: structlog event keys that name the logger: ``add_logger_name``'s, and the one bound by
#: ``wrap_logger(logger_name=...)`` (otel-train's own)
_LOGGER_KEYS = ("logger", "logger_name")


def structlog_scope(logger: Any, event: dict[str, Any]) -> str:
    """The instrumentation scope of a structlog event: its logger's name where the event or
    the wrapped logger (a stdlib one) has one, else ``semconv.SCOPE_USER_LOGS``."""
    for key in _LOGGER_KEYS:
        name = event.get(key)
        if isinstance(name, str) and name:
            return name
    name = getattr(logger, "name", None)
    return name if isinstance(name, str) and name else semconv.SCOPE_USER_LOGS


def make_bridge(ctx: LogContext) -> Callable[..., dict[str, Any]]:
    """structlog processor: hand a copy of the event to the emitter (OTel logs)."""

    def bridge(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        fields = {k: v for k, v in event.items()
                  if k not in ("event", "exc_info") and k not in _LOGGER_KEYS}
        exc_info = _structlog_exc_info(event.get("exc_info"))
        if exc_info is not None:
            fields.update(exception_fields(exc_info))
        ctx.recorder.put((LOG, time.time_ns(), method, str(event.get("event", "")), fields,
                          structlog_scope(logger, event)))
        return event

    return bridge


def _level_number(method: str) -> int:
    return logging.getLevelName(method.upper()) if method != "exception" else logging.ERROR


# --- stdlib logging ----------------------------------------------------------------------


class BridgeHandler(logging.Handler):
    """Appends stdlib log records to the hot-path buffer for the emitter."""

    def __init__(self, ctx: LogContext) -> None:
        super().__init__(logging.NOTSET)
        self.ctx = ctx

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_NOT_BRIDGED) or getattr(record, "_otel_train_bridged", False):
            return
        try:
            fields = {k: v for k, v in vars(record).items() if k not in _STDLIB_FIELDS}
            fields.update({
                semconv.CONSOLE_TRACE_ID: getattr(record, semconv.CONSOLE_TRACE_ID, None),
                semconv.CONSOLE_SPAN_ID: getattr(record, semconv.CONSOLE_SPAN_ID, None),
                semconv.CONSOLE_STEP: getattr(record, semconv.CONSOLE_STEP, None),
                semconv.CONSOLE_RUN_ID: self.ctx.run_id,
                semconv.CONSOLE_RANK: self.ctx.rank,
            })
            if record.exc_info and record.exc_info[0] is not None:
                fields.update(exception_fields(record.exc_info))
            # the logger's name is the record's instrumentation scope (root: "root")
            self.ctx.recorder.put((LOG, int(record.created * 1e9), record.levelname.lower(),
                                   record.getMessage(), fields, record.name))
        except Exception:  # a log line must never break training
            self.handleError(record)


class LogCapture:
    """Installs the record factory, the bridge handler and structlog processors; undoes them."""

    def __init__(self, ctx: LogContext, console_level: str) -> None:
        self.ctx = ctx
        self.console_level = console_level
        self._old_factory: Callable[..., logging.LogRecord] | None = None
        self._handler: BridgeHandler | None = None
        self._structlog_config: dict[str, Any] | None = None
        self._structlog_was_configured = False

    def install(self, capture: bool) -> None:
        self._install_factory()
        if capture:
            self._handler = BridgeHandler(self.ctx)
            logging.getLogger().addHandler(self._handler)
        self._install_structlog(capture)

    def remove(self) -> None:
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler = None
        if self._old_factory is not None:
            logging.setLogRecordFactory(self._old_factory)
            self._old_factory = None
        if self._structlog_config is not None:
            if self._structlog_was_configured:
                structlog.configure(**self._structlog_config)
            else:
                structlog.reset_defaults()
            self._structlog_config = None

    def _install_factory(self) -> None:
        old = logging.getLogRecordFactory()
        ctx = self.ctx

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = old(*args, **kwargs)
            step, trace_id, span_id = ctx.ids()
            record.trace_id = f"{trace_id:032x}"
            record.span_id = f"{span_id:016x}"
            record.run_id = ctx.run_id
            record.rank = ctx.rank
            record.step = step
            return record

        self._old_factory = old
        logging.setLogRecordFactory(factory)

    def _install_structlog(self, capture: bool) -> None:
        self._structlog_was_configured = structlog.is_configured()
        self._structlog_config = structlog.get_config()
        ours = [make_add_ids(self.ctx)] + ([make_bridge(self.ctx)] if capture else [])
        if self._structlog_was_configured:
            processors = list(self._structlog_config["processors"])
            # in front of the renderer (the last processor), after the user's enrichment
            structlog.configure(processors=processors[:-1] + ours + processors[-1:])
            return
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                *ours,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(default=repr),
            ],
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            wrapper_class=structlog.make_filtering_bound_logger(_level_number(self.console_level)),
            cache_logger_on_first_use=False,
        )


def internal_logger(ctx: LogContext, console_level: str, bridged: bool = True) -> Any:
    """otel-train's own structlog logger: JSON on stderr (and bridged into OTel logs unless
    ``bridged`` is False), whatever the application configured for itself."""
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            make_add_ids(ctx),
            *([make_bridge(ctx)] if bridged else []),
            contract_names,
            structlog.processors.JSONRenderer(default=repr),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_level_number(console_level)),
        logger_name="otel_train",
    )


def contract_names(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    """otel-train's own console lines under the contract's names, as their exported
    records have them: ``training.run.id``, ``training.rank``, ``training.step`` beside
    ``training.world_size``, never ``rank`` beside it (a user's lines keep the short names
    their formatters use)."""
    for short, name in semconv.CONSOLE_TO_ATTRIBUTE.items():
        if short in event:
            event[name] = event.pop(short)
    return event
