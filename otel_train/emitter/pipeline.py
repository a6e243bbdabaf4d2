"""The seam between the emitter and where spans are built: what the emitter (and
``instrument()``) calls on a pipeline, as a :class:`typing.Protocol`.

Two classes implement it, neither of which imports this module (``tests/sdk/test_layers.py``
keeps both sides of export off the emitter):

- ``otel_train.export.remote.RemotePipeline``: operations queued and sent to the rank's
  exporter process after each drain (the default);
- ``otel_train.exporter.providers.Pipeline``: the OpenTelemetry providers on the emitter
  thread itself (export in process).

``tests/sdk/test_pipeline_protocol.py`` holds both to every member, signatures included.
The exporter process's pipeline can do one thing more, which the emitter asks of it where it
is there: report what the exporter process itself dropped (:class:`ReportsExporterDrops`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from opentelemetry.trace import SpanContext

from otel_train import semconv
from otel_train.wire.step import StepRecord


class Pipeline(Protocol):
    """What the emitter hands its spans, points, log records, steps and collectives to."""

    #: the exporter kind the run ended up with ("file", "otlp", "console", "none")
    kind: str
    #: telemetry lost on this side, by signal (the sources count theirs here too)
    dropped: collections.Counter[str]
    #: what ``semconv.create`` makes instruments on: an OpenTelemetry Meter, or the exporter
    #: process's stand-in for one (only the metric's name travels)
    meter: Any

    def span(self, name: str, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: dict[str, Any], span_id: int = 0, trace_id: int = 0,
             links: Sequence[SpanContext] = (), error: str | None = None,
             events: Sequence[tuple[str, int, dict[str, Any]]] = ()) -> SpanContext:
        """One finished span; its context (preset ids, or random ones)."""
        ...

    def collectives(self, spec: Any, rows: Sequence[tuple[Any, ...]] | bytes) -> None:
        """A step's collectives: rows (wire/collectives.py) or NCCL records (wire/nccl.py)."""
        ...

    def step(self, record: StepRecord) -> None:
        """A finished step (wire/step.py): its spans, log and points."""
        ...

    def emit_log(self, time_ns: int, observed_ns: int, parent: SpanContext | None,
                 severity: int, severity_text: str, body: Any,
                 attributes: dict[str, Any], scope: str = semconv.SCOPE_NAME) -> None:
        """One log record, in ``parent``'s context if given, under the scope ``scope``."""
        ...

    def commit(self) -> None:
        """Hand on what this drain made (the emitter calls it after each drain)."""
        ...

    def backlog(self) -> float:
        """How full the export queues are, 0 to 1 (the emitter waits while over half)."""
        ...

    def nudge(self) -> None:
        """Ask the exporters to export now rather than on their schedule."""
        ...

    def accounts_snapshot(self) -> dict[str, dict[str, int]]:
        """Produced, exported and dropped by signal, so far."""
        ...

    def shutdown(self, timeout_s: float) -> bool:
        """Flush and shut down within ``timeout_s``; False if it had to give up waiting."""
        ...


@runtime_checkable
class ReportsExporterDrops(Protocol):
    """A pipeline whose exporter process reports its own losses (refused exports, full
    queues): the emitter adds them to ``otel_train.telemetry.dropped`` (accounts.py)."""

    def exporter_dropped(self) -> collections.Counter[str]:
        """What the exporter processes reported dropping so far (its latest report read)."""
        ...

    def exporter_dropped_read(self) -> int:
        """The exporter processes' drops as read so far, all signals (no read: cheap)."""
        ...
