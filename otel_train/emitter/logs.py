"""Log records from the emitter thread: the user's captured lines and otel-train's own.

A captured line (``LOG`` records, ``log_capture.py``) carries its trace context in its
fields; otel-train's own lines (:meth:`LogRecords.emit_log`) go to the console and straight
to OpenTelemetry logs. Either way every field is redacted (``redact.py``), given the span
attributes' names and cut to a bounded length before it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import SpanContext, TraceFlags

from otel_train import redact, semconv
from otel_train.emitter.pipeline import Pipeline
from otel_train.identity import Identity

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SEVERITY = {
    "debug": SeverityNumber.DEBUG, "info": SeverityNumber.INFO,
    "warning": SeverityNumber.WARN, "warn": SeverityNumber.WARN,
    "error": SeverityNumber.ERROR, "exception": SeverityNumber.ERROR,
    "critical": SeverityNumber.FATAL,
}

#: the longest text a log attribute carries (characters)
_MAX_ATTR_CHARS = 4096


def _attr_value(value: Any, keep_end: bool = False) -> Any:
    """A log attribute from a field's redacted value (strings scrubbed already): numbers as
    they are, anything else as text, at most ``_MAX_ATTR_CHARS`` of it (its end if
    ``keep_end``: a traceback's says what was raised, and where)."""
    if isinstance(value, (bool, int, float)):
        return value
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = (value.decode("utf-8", "backslashreplace") if isinstance(value, bytes)
                    else repr(value))
        except Exception:  # an object whose repr raises
            text = f"<unrepresentable {type(value).__name__}>"
        text = redact.scrub(text)  # whole, before the cut: a secret across it would show
    if len(text) <= _MAX_ATTR_CHARS:
        return text
    return "..." + text[3 - _MAX_ATTR_CHARS:] if keep_end else text[:_MAX_ATTR_CHARS]


class LogRecords:
    """Makes log records for a pipeline, in the context of the step or span they name."""

    def __init__(self, pipeline: Pipeline, ident: Identity, sampled: Callable[[int], bool],
                 console: Any) -> None:
        self.pipeline = pipeline
        self.ident = ident
        self.sampled = sampled  # trace_id -> bool: the step sampler's decision
        self.console = console

    def emit_log(self, level: str, message: str, fields: dict[str, Any], trace_id: int = 0,
                 span_id: int = 0) -> None:
        """A log line from the emitter thread: to the console and straight to OTel logs (a
        bridged structlog line would go through the recorder, which the emitter's last pass
        no longer reads), in the context of (``trace_id``, ``span_id``) if given."""
        if self.console is not None:
            getattr(self.console, level)(message, **fields)
        ids = (semconv.CONSOLE_TRACE_ID, semconv.CONSOLE_SPAN_ID)  # the record's context
        self.otel_log(time.time_ns(), level, message,
                      {k: v for k, v in fields.items() if k not in ids}, trace_id, span_id)

    def captured(self, time_ns: int, level: str, message: str, fields: dict[str, Any],
                 scope: str = semconv.SCOPE_NAME) -> None:
        """A captured line (a ``LOG`` record's fields after its kind): its context is in its
        fields, as the console prints it."""
        trace_hex = fields.pop(semconv.CONSOLE_TRACE_ID, None)
        span_hex = fields.pop(semconv.CONSOLE_SPAN_ID, None)
        trace_id = int(trace_hex, 16) if isinstance(trace_hex, str) and trace_hex else 0
        span_id = int(span_hex, 16) if isinstance(span_hex, str) and span_hex else 0
        self.otel_log(time_ns, level, message, fields, trace_id, span_id, scope)

    def otel_log(self, time_ns: int, level: str, message: str, fields: dict[str, Any],
                 trace_id: int, span_id: int, scope: str = semconv.SCOPE_NAME) -> None:
        attributes = {}
        rename = semconv.CONSOLE_TO_ATTRIBUTE  # run_id, rank, step: the spans' names
        # denied keys redacted and strings scrubbed at any depth; other values' text scrubbed
        for k, v in redact.redact_mapping(fields).items():
            if k in ("level", "timestamp"):
                continue
            attributes[rename.get(k, k)] = _attr_value(
                v, keep_end=k == semconv.ATTR_EXCEPTION_STACKTRACE)
        attributes.setdefault(semconv.LOG_RUN_ID, self.ident.run_id)
        attributes.setdefault(semconv.LOG_RANK, self.ident.rank)
        parent = None
        if trace_id and span_id:
            flags = _SAMPLED if self.sampled(trace_id) else TraceFlags(0)
            parent = SpanContext(trace_id, span_id, False, flags)
        self.pipeline.emit_log(time_ns, time.time_ns(), parent,
                               _SEVERITY.get(level, SeverityNumber.INFO), level.upper(),
                               redact.redact_value(message), attributes, scope)
