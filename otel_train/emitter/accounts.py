"""What was lost, and what went wrong, exported as it happens.

``otel_train.telemetry.dropped{signal}`` is kept level with everything that lost telemetry:
the hot-path buffer (full), this side's pipeline (an exporter process lost, a source's own
losses) and the exporter process (refused exports, full queues). The hook paths' swallowed
exceptions (``internal_errors.py``) become ``otel_train.internal.errors{component}``, the
first of each component logged. Both are brought up to date after every drain.
"""

from __future__ import annotations

import collections
from typing import Any

from otel_train import internal_errors, semconv
from otel_train.emitter.pipeline import Pipeline, ReportsExporterDrops
from otel_train.identity import Identity
from otel_train.recorder import Recorder


class Losses:
    """The dropped and internal-error counters of one rank."""

    def __init__(self, recorder: Recorder, pipeline: Pipeline, ident: Identity, prometheus: Any,
                 console: Any) -> None:
        self.recorder = recorder
        self.pipeline = pipeline
        #: the exporter process's pipeline reports that process's own losses; None in process
        self._exporter: ReportsExporterDrops | None = (
            pipeline if isinstance(pipeline, ReportsExporterDrops) else None)
        self.prometheus = prometheus
        self.console = console
        self._base_attrs = {semconv.ATTR_RANK: ident.rank, semconv.ATTR_RUN_ID: ident.run_id}
        self._reported_drops: collections.Counter[str] = collections.Counter()
        self._drops_seen: tuple[Any, ...] | None = None
        meter = pipeline.meter
        self.dropped_ctr = semconv.create(meter, semconv.METRIC_TELEMETRY_DROPPED)
        for signal in (semconv.SIGNAL_SPANS, semconv.SIGNAL_METRICS, semconv.SIGNAL_LOGS):
            # a zero point for each signal, so "nothing dropped" is a fact, not a gap
            self.dropped_ctr.add(0, {**self._base_attrs, semconv.ATTR_SIGNAL: signal})
        self.internal_errors_ctr = semconv.create(meter, semconv.METRIC_INTERNAL_ERRORS)
        self._reported_internal: dict[str, int] = dict(internal_errors.snapshot())

    def count_drop(self, signal: str, n: int = 1) -> None:
        """Telemetry a source lost (flight-recorder entries overwritten, say)."""
        self.pipeline.dropped[signal] += n

    def total_dropped(self) -> collections.Counter[str]:
        total = collections.Counter(self.recorder.dropped)
        total.update(self.pipeline.dropped)
        if self._exporter is not None:  # the exporter process's own losses
            total.update(self._exporter.exporter_dropped())
        return total

    def report_internal_errors(self) -> None:
        """Export the hook paths' swallowed exceptions; log each component's first one."""
        for component, count in internal_errors.snapshot().items():
            delta = count - self._reported_internal.get(component, 0)
            if delta <= 0:
                continue
            first = component not in self._reported_internal
            self._reported_internal[component] = count
            self.internal_errors_ctr.add(delta, {**self._base_attrs,
                                                 semconv.ATTR_COMPONENT: component})
            if first and self.console is not None:
                self.console.warning("otel_train.internal_error", component=component,
                                     error=internal_errors.first_error(component),
                                     hint="training goes on; this part of the telemetry may "
                                          "be missing (counted in otel_train.internal.errors)")

    def report_drops(self) -> None:
        """Bring the dropped counter up to date with what the recorder and exporters lost."""
        # counts only grow: unchanged sums say nothing new, without building the totals
        # (and polling the exporter's socket) at every drain. The exporter's own drops as
        # read so far: its reports come after every batch (acknowledgements), most of them
        # with the same drops; the ones read by this drain's commit count at the next
        exporter = self._exporter
        seen = (sum(self.recorder.dropped.values()), sum(self.pipeline.dropped.values()),
                exporter.exporter_dropped_read() if exporter is not None else None)
        if seen == self._drops_seen:
            return
        self._drops_seen = seen
        for signal, count in self.total_dropped().items():
            delta = count - self._reported_drops[signal]
            if delta > 0:
                self._reported_drops[signal] = count
                self.dropped_ctr.add(delta, {**self._base_attrs, semconv.ATTR_SIGNAL: signal})
                if self.prometheus is not None:
                    self.prometheus.add_dropped(signal, delta)
