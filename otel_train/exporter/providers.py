"""Private OpenTelemetry providers of one instrumented run, and their exporters: where
spans, metric points and log records are built (in the exporter process, ``process.py``, or
on the emitter thread when export runs in process).

The providers are otel-train's own: the global ones (which the training code may use for
its own telemetry) are never touched. Every exporter is wrapped so that what it fails to
deliver, and what the batch processors must drop when full, is counted by signal.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import (
    DefaultAggregation,
    ExplicitBucketHistogramAggregation,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from otel_train import config as config_mod
from otel_train import redact, semconv
from otel_train._version import __version__
from otel_train.config import Config, ConfigWarning
from otel_train.exporter.collective_histogram import CollectiveDurations
from otel_train.identity import Identity
from otel_train.wire import step as wire_step
from otel_train.wire.messages import SIGNALS, expand_collectives, series_key

Dropped = collections.Counter  # signal -> count
_SAMPLED_FLAGS = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED_FLAGS = TraceFlags(TraceFlags.DEFAULT)
_UNSET_STATUS = trace.Status(trace.StatusCode.UNSET)
#: distinct user logger names given scopes of their own; later ones share SCOPE_USER_LOGS
_MAX_USER_SCOPES = 256


# --- counting wrappers -------------------------------------------------------------------


class Accounts:
    """Per signal: what reached the SDK (``produced``: spans and log records handed to the
    batch processors, metric points collected for export), what an exporter confirmed
    (``exported``) and what was lost (``dropped``: refused or failed exports, full queues).
    :meth:`close` settles the rest at shutdown: whatever is neither exported nor dropped by
    then (still queued, or in an export the shutdown bound cut short) is dropped, and later
    results are ignored, so produced = exported + dropped holds exactly for every signal."""

    def __init__(self, dropped: Dropped) -> None:
        self.produced: Dropped = collections.Counter()
        self.exported: Dropped = collections.Counter()
        self.lost: Dropped = collections.Counter()  # of what was produced
        #: every loss of the pipeline (Pipeline.dropped): these, and what never reached
        #: the SDK (an operation the exporter process could not apply, say)
        self.dropped = dropped
        self.closed = False
        self._lock = threading.Lock()

    def _lose(self, signal: str, n: int) -> None:
        self.lost[signal] += n
        self.dropped[signal] += n

    def produce(self, signal: str, n: int = 1, dropped: bool = False) -> None:
        with self._lock:
            self.produced[signal] += n
            if self.closed or dropped:  # a full queue, or made after shutdown
                self._lose(signal, n)

    def result(self, signal: str, n: int, ok: bool) -> None:
        with self._lock:
            if self.closed:
                return
            if ok:
                self.exported[signal] += n
            else:
                self._lose(signal, n)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for signal, n in self.produced.items():
                missing = n - self.exported[signal] - self.lost[signal]
                if missing > 0:
                    self._lose(signal, missing)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{"produced"|"exported"|"dropped": {signal: n}} of what reached the SDK, for spans,
        metrics and logs (after :meth:`close`, produced = exported + dropped)."""
        with self._lock:
            return {name: {s: int(counter[s]) for s in SIGNALS}
                    for name, counter in (("produced", self.produced),
                                          ("exported", self.exported),
                                          ("dropped", self.lost))}


class _CountingSpanExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, accounts: Accounts) -> None:
        self._inner, self._accounts = inner, accounts

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter must never take the emitter down
            result = SpanExportResult.FAILURE
        self._accounts.result(semconv.SIGNAL_SPANS, len(spans),
                              result == SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountingLogExporter(LogRecordExporter):
    def __init__(self, inner: LogRecordExporter, accounts: Accounts) -> None:
        self._inner, self._accounts = inner, accounts

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        try:
            result = self._inner.export(batch)
        except Exception:
            result = LogRecordExportResult.FAILURE
        self._accounts.result(semconv.SIGNAL_LOGS, len(batch),
                              result == LogRecordExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _count_points(data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    )


def _with_metric(data: MetricsData, metric: Any, resource: Resource,
                 scope: InstrumentationScope) -> MetricsData:
    """``data`` with ``metric`` added under otel-train's scope (made if the reader collected
    nothing of it)."""
    resource_metrics = list(data.resource_metrics) or [
        ResourceMetrics(resource=resource, scope_metrics=[], schema_url="")]
    first = resource_metrics[0]
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope.name == scope.name:
            scopes[i] = ScopeMetrics(scope=sm.scope, metrics=[*sm.metrics, metric],
                                     schema_url=sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope=scope, metrics=[metric],
                                   schema_url=scope.schema_url or ""))
    resource_metrics[0] = ResourceMetrics(resource=first.resource, scope_metrics=scopes,
                                          schema_url=first.schema_url)
    return MetricsData(resource_metrics=resource_metrics)


def _advised_buckets(aggregation: Any) -> bool:
    """Whether an exporter's preferred histogram aggregation makes semconv's advised explicit
    buckets with min and max (the SDK's default, and the OTLP exporters' own preference
    unless told otherwise), as otel-train's own collective histogram does."""
    if aggregation is None or isinstance(aggregation, DefaultAggregation):
        return True
    return (isinstance(aggregation, ExplicitBucketHistogramAggregation)
            and getattr(aggregation, "_boundaries", ()) is None
            and getattr(aggregation, "_record_min_max", False) is True)


class _CountingMetricExporter(MetricExporter):
    """Counts what the exporter confirmed or lost of each collection (the reader counts what
    was collected: :class:`_CountingMetricReader`)."""

    def __init__(self, inner: MetricExporter, accounts: Accounts) -> None:
        # the wrapped exporter's preferences are private attributes of the SDK's base class:
        # read them guarded, as a later 1.x release may keep them elsewhere
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self._inner, self._accounts = inner, accounts

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
               ) -> MetricExportResult:
        points = _count_points(metrics_data)
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            result = MetricExportResult.FAILURE
        self._accounts.result(semconv.SIGNAL_METRICS, points,
                              result == MetricExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


class PendingPoints:
    """The series the next metric collection will carry, one data point each: what a
    collection that never happens (its exporter process killed) loses, counted in the same
    unit as the collections that do happen. A cumulative series stays from its first
    measurement on; a delta one until the next collection; none after the final one.

    ``lock`` is held by every tracked measurement and by each collection, so the series here
    are exactly those the SDK's aggregations hold; otel-train's own collective histogram
    keeps its series itself (:meth:`CollectiveDurations.series_keys`)."""

    def __init__(self, delta_metrics: frozenset[str],
                 collective: CollectiveDurations | None) -> None:
        self.lock = threading.Lock()
        self._keys: set[tuple[str, frozenset[Any]]] = set()
        self._delta = delta_metrics
        self._collective = collective
        self._version = 0
        self._final = False

    def track(self, name: str, measure: Any) -> Any:
        """``measure`` (an SDK instrument's ``record``/``add``/``set``) noting its series."""
        keys, lock = self._keys, self.lock

        def tracked(value: float, attributes: Any = None, **kwargs: Any) -> None:
            key = series_key(name, attributes)
            with lock:
                if key not in keys:
                    keys.add(key)
                    self._version += 1
                measure(value, attributes, **kwargs)

        return tracked

    def collected(self, final: bool) -> None:
        """A collection was made (``lock`` held): its delta series start again; after the
        final one no collection follows, so none is pending (what is measured after it is
        lost with or without a killed exporter: nothing makes measurements then)."""
        if final:
            self._final = True
            self._keys.clear()
            self._version += 1
            return
        gone = [k for k in self._keys if k[0] in self._delta]
        if gone:
            self._keys.difference_update(gone)
            self._version += 1

    def version(self) -> tuple[int, int]:
        """Changes whenever the series do (``lock`` held)."""
        return self._version, self._collective.version if self._collective else 0

    def keys(self) -> frozenset[tuple[str, frozenset[Any]]]:
        """The series now (``lock`` held)."""
        if self._final or self._collective is None:
            return frozenset(self._keys)
        return frozenset(self._keys) | self._collective.series_keys()


#: the SDK instrument class of each kind of metric; the synchronous gauge is not here: the
#: exporters' temporality preferences never name it, and the SDK reads it cumulative
_SDK_CLASS = {semconv.HISTOGRAM: SdkHistogram, semconv.COUNTER: SdkCounter}


def _delta_metrics(exporter: MetricExporter) -> frozenset[str]:
    """The metrics ``exporter`` collects as deltas (its temporality preference, as
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE sets it)."""
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return frozenset(name for name, spec in semconv.METRICS.items()
                     if preferred.get(_SDK_CLASS.get(spec.kind)) == AggregationTemporality.DELTA)


class _CountingMetricReader(PeriodicExportingMetricReader):
    """The SDK's periodic reader, counting each collection's points as produced the moment
    they are collected (an export that waits for the one in flight before it, or outlasts
    the shutdown bound, is counted all the same), adding otel-train's own collective
    histogram to each, and making the run's last collection at once when told
    (:meth:`final_collection`), rather than after an export in flight has ended."""

    def __init__(self, exporter: _CountingMetricExporter, accounts: Accounts,
                 pending: PendingPoints, extra: Any = None, **settings: Any) -> None:
        self._accounts, self._pending = accounts, pending
        #: (CollectiveDurations, resource, scope): a histogram aggregated by otel-train,
        #: added to every collection (exporter/collective_histogram.py)
        self.extra = extra
        self._taken: tuple[MetricsData, float] | None = None
        self._final = False
        super().__init__(exporter, **settings)

    def collect(self, timeout_millis: float = 10_000) -> None:
        """A collection (the SDK's ticker, a flush); none after the final one."""
        self._collect_and_export(timeout_millis, final=False)

    def final_collection(self, timeout_millis: float) -> None:
        """The run's last collection, on the caller's thread, and its export."""
        self._collect_and_export(timeout_millis, final=True)

    def _collect_and_export(self, timeout_millis: float, final: bool) -> None:
        # the collection under the pending series' lock (no measurement between the two),
        # the export outside it: an export to a stalled collector never holds measurements
        with self._pending.lock:
            if self._final:
                return
            self._final = final
            super().collect(timeout_millis=timeout_millis)  # ends in _receive_metrics
            taken, self._taken = self._taken, None
            self._pending.collected(final)
        if taken is not None:
            super()._receive_metrics(*taken)

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs: Any) -> None:
        if self.extra is not None:
            histogram, resource, scope = self.extra
            metric = histogram.metric()
            if metric is not None:
                metrics_data = _with_metric(metrics_data, metric, resource, scope)
        self._accounts.produce(semconv.SIGNAL_METRICS, _count_points(metrics_data))
        self._taken = (metrics_data, timeout_millis)


def _queue_full(processor: Any) -> bool:
    # The SDK's batch processor drops silently (with a log line) when its queue is full;
    # peek at its private queue to count those drops. Guarded: absent in other versions.
    inner = getattr(processor, "_batch_processor", None)
    queue = getattr(inner, "_queue", None)
    limit = getattr(inner, "_max_queue_size", None)
    return queue is not None and limit is not None and len(queue) >= limit


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    def __init__(self, exporter: SpanExporter, accounts: Accounts) -> None:
        super().__init__(exporter, **config_mod.batch_processor_settings("traces"))
        self._accounts = accounts

    def on_end(self, span: Any) -> None:
        self._accounts.produce(semconv.SIGNAL_SPANS, 1, dropped=_queue_full(self))
        super().on_end(span)


class _CountingBatchLogProcessor(BatchLogRecordProcessor):
    def __init__(self, exporter: LogRecordExporter, accounts: Accounts) -> None:
        super().__init__(exporter, **config_mod.batch_processor_settings("logs"))
        self._accounts = accounts

    def on_emit(self, log_record: Any) -> None:
        self._accounts.produce(semconv.SIGNAL_LOGS, 1, dropped=_queue_full(self))
        super().on_emit(log_record)


# --- exporters ---------------------------------------------------------------------------


#: the signals, as OTEL_<SIGNAL>_EXPORTER and the exporters' file names spell them
_SIGNAL_NAMES = ("traces", "metrics", "logs")


def _otlp_exporters(signals: Sequence[str]) -> dict[str, Any]:
    """OTLP exporters of ``signals``, configured by the standard ``OTEL_EXPORTER_OTLP_*``
    variables. Protocol, timeout and compression are read (and checked) by otel-train and
    handed over as arguments: the gRPC exporters raise on a bad timeout or compression, even
    on "none" (config.otlp_settings)."""
    return {signal: (_grpc_exporter if settings["protocol"] == "grpc" else _http_exporter)(
                signal, settings)
            for signal, settings in config_mod.otlp_settings(signals).items()}


def _grpc_exporter(signal: str, settings: dict[str, Any]) -> Any:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc import (
        _log_exporter,
        metric_exporter,
        trace_exporter,
    )

    exporter = {"traces": trace_exporter.OTLPSpanExporter,
                "metrics": metric_exporter.OTLPMetricExporter,
                "logs": _log_exporter.OTLPLogExporter}[signal]
    compression = {"none": grpc.Compression.NoCompression,
                   "gzip": grpc.Compression.Gzip}[settings["compression"]]
    with _unparsable_hidden(f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT"):
        return exporter(timeout=settings["timeout"], compression=compression)


@contextlib.contextmanager
def _unparsable_hidden(name: str) -> Iterator[None]:
    """``name`` out of the environment while the block runs where it is no number (empty, or
    already warned about by config.otlp_settings): the gRPC exporters parse their signal's
    timeout variable even when given a timeout, and raise on it. Put back at once: it is the
    application's environment."""
    raw = os.environ.get(name)
    try:
        float(raw if raw is not None else 0)
        hidden = False
    except ValueError:
        hidden = True
        del os.environ[name]
    try:
        yield
    finally:
        if hidden:
            os.environ[name] = raw


def _http_exporter(signal: str, settings: dict[str, Any]) -> Any:
    from opentelemetry.exporter.otlp.proto.http import (
        Compression,
        _log_exporter,
        metric_exporter,
        trace_exporter,
    )

    exporter = {"traces": trace_exporter.OTLPSpanExporter,
                "metrics": metric_exporter.OTLPMetricExporter,
                "logs": _log_exporter.OTLPLogExporter}[signal]
    kwargs: dict[str, Any] = {"timeout": settings["timeout"],
                              "compression": Compression(settings["compression"])}
    session = _session_keeping_certificate(signal)
    if session is not None:
        kwargs["session"] = session
    return exporter(**kwargs)


def _session_keeping_certificate(signal: str) -> Any:
    """A requests Session for the OTLP/HTTP exporter of ``signal`` that keeps the configured
    ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]CERTIFICATE``: the exporter sets it as the session's
    ``verify``, and requests lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` override a
    session's ``verify`` (psf/requests#3829), so TLS to the collector failed wherever those
    are set (tests/first_hour/test_readme_claims.py). None (the exporter's own session) without a
    certificate, or where a credential provider supplies the session."""
    certificate = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_CERTIFICATE")
                   or os.environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE"))
    provider = (os.environ.get(f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal.upper()}_CREDENTIAL_PROVIDER")
                or os.environ.get("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER"))
    if not certificate or provider:
        return None
    import requests

    class _Session(requests.Session):
        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any,
                                       verify: Any, cert: Any) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if verify is None and isinstance(self.verify, str):
                settings["verify"] = self.verify  # the configured CA, not the environment's
            return settings

    return _Session()


def _file_exporters(signals: Sequence[str], run_dir: Path | None, rank: int
                    ) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter, FileSpanExporter
    from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter

    if run_dir is None:
        raise ValueError("no run directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    exporter = {"traces": FileSpanExporter, "metrics": FileMetricExporter,
                "logs": FileLogExporter}
    # each opens its file as it is made: only those of exported signals are made
    return {signal: exporter[signal](run_dir / f"{signal}.rank-{rank}.jsonl")
            for signal in signals}


def _console_exporters(signals: Sequence[str]) -> dict[str, Any]:
    from opentelemetry.sdk._logs.export import ConsoleLogExporter
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    exporter = {"traces": ConsoleSpanExporter, "metrics": ConsoleMetricExporter,
                "logs": ConsoleLogExporter}
    return {signal: exporter[signal]() for signal in signals}


#: OTEL_{TRACES,METRICS,LOGS}_EXPORTER values honoured per signal (the specification's
#: others, zipkin or prometheus, name exporters otel-train does not build: warned, ignored)
SIGNAL_EXPORTERS = ("otlp", "console", "none")


def signal_exporter(signal: str) -> str | None:
    """``OTEL_<SIGNAL>_EXPORTER`` for "traces", "metrics" or "logs": "otlp", "console",
    "none", or None when unset (or unusable: warned)."""
    name = f"OTEL_{signal.upper()}_EXPORTER"
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    first = raw.split(",")[0].strip()  # a list is allowed; otel-train builds one exporter
    if first in SIGNAL_EXPORTERS:
        return first
    warnings.warn(f"otel-train: {name}={raw!r} is not one of {', '.join(SIGNAL_EXPORTERS)}; "
                  "ignored", ConfigWarning, stacklevel=4)
    return None


# --- the pipeline ------------------------------------------------------------------------


_EXEMPLAR_FILTERS = {"trace_based": TraceBasedExemplarFilter, "always_on": AlwaysOnExemplarFilter,
                     "always_off": AlwaysOffExemplarFilter}


def _sdk_limits(cls: Any, limits: dict[str, int | None]) -> Any:
    """SpanLimits or LogRecordLimits of config.attribute_limits: every one given (for one not
    given the SDK would read, and raise on, the variable itself), "no limit" as UNSET."""
    return cls(**{name: cls.UNSET if value is None else value for name, value in limits.items()})


def build_resource(cfg: Config, ident: Identity) -> Resource:
    attributes: dict[str, Any] = {
        "service.instance.id": f"{ident.run_id}-rank-{ident.rank}",
        semconv.RES_RUN_ID: ident.run_id,
        semconv.RES_RANK: ident.rank,
        semconv.RES_LOCAL_RANK: ident.local_rank,
        semconv.RES_WORLD_SIZE: ident.world_size,
        "host.name": ident.host_name,
        "process.pid": ident.pid,
    }
    # service.name: an argument or OTEL_SERVICE_NAME wins; then OTEL_RESOURCE_ATTRIBUTES;
    # our default last (explicit attributes override the environment in Resource.create).
    env_attrs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if cfg.service_name != semconv.SERVICE_NAME_DEFAULT or "service.name=" not in env_attrs:
        attributes["service.name"] = cfg.service_name
    for key, names in {
        "k8s.pod.name": ("K8S_POD_NAME", "POD_NAME"),
        "k8s.namespace.name": ("K8S_NAMESPACE_NAME", "POD_NAMESPACE"),
        "k8s.node.name": ("K8S_NODE_NAME", "NODE_NAME"),
    }.items():
        value = next((os.environ[n] for n in names if os.environ.get(n)), None)
        if value:
            attributes[key] = value
    return Resource.create(attributes, schema_url=semconv.SCHEMA_URL)


_live_pipelines: weakref.WeakSet[Pipeline] = weakref.WeakSet()


def _quiet_in_forked_child() -> None:
    for pipeline in list(_live_pipelines):
        pipeline.quiet_in_child()


# A DataLoader worker forked while instrumented inherits the providers, and the SDK restarts
# their export threads in the child (its own at-fork hooks). Left alone, a worker would
# export again what its parent exports. Stop them: a worker exports nothing.
os.register_at_fork(after_in_child=_quiet_in_forked_child)


#: the method that records a measurement, by instrument kind
_MEASURE = {semconv.HISTOGRAM: "record", semconv.COUNTER: "add", semconv.GAUGE: "set"}


class Pipeline:
    """Tracer, meter and logger providers wired to one exporter kind."""

    def __init__(self, cfg: Config, ident: Identity, run_dir: Path | None) -> None:
        self.dropped: Dropped = collections.Counter()
        #: produced = exported + dropped, per signal, settled at shutdown
        self.accounts = Accounts(self.dropped)
        #: random ids where a span has no preset one (Pipeline.span takes preset ids as
        #: arguments: derived ones other ranks compute too, and those handed to log lines)
        self.ids = RandomIdGenerator()
        self.kind = config_mod.choose_exporter(cfg)
        self.resource = build_resource(cfg, ident)
        exporters = self._exporters(run_dir, ident.rank)
        span_limits, log_limits = config_mod.attribute_limits()
        # shutdown_on_exit=False: instrument() shuts them down itself, within its bound
        # The emitter makes the step sampling decision itself (the configured sampler on the
        # step's trace id) and builds spans of sampled steps only; children follow their
        # step's flag. Roots and remote-parented spans are always kept: a ratio sampler must
        # never lose a rank's training.run span.
        self.tracer_provider = TracerProvider(
            resource=self.resource, id_generator=self.ids,
            sampler=ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON),
            span_limits=_sdk_limits(SpanLimits, span_limits), shutdown_on_exit=False,
        )
        self.readers: list[_CountingMetricReader] = []
        #: the series the next collection will carry (no metric exporter: none, ever)
        self.pending = PendingPoints(frozenset(), None)
        self.processors: list[Any] = []
        self.logger_provider = LoggerProvider(
            resource=self.resource, shutdown_on_exit=False,
            log_record_limits=_sdk_limits(LogRecordLimits, log_limits))
        spans, metrics, logs = (exporters[signal] for signal in _SIGNAL_NAMES)
        if spans is not None:
            processor = _CountingBatchSpanProcessor(
                _CountingSpanExporter(spans, self.accounts), self.accounts)
            self.processors.append(processor)
            self.tracer_provider.add_span_processor(processor)
        if logs is not None:
            processor = _CountingBatchLogProcessor(
                _CountingLogExporter(logs, self.accounts), self.accounts)
            self.processors.append(processor)
            self.logger_provider.add_log_record_processor(processor)
        scope = (semconv.SCOPE_NAME, __version__, semconv.SCHEMA_URL)
        self._scope = InstrumentationScope(*scope)
        #: every collective's duration, aggregated here (exporter/collective_histogram.py)
        self.collective_durations: CollectiveDurations | None = None
        if metrics is not None:
            # only where the SDK would make explicit buckets from semconv's advice: an
            # exporter preferring exponential histograms (or buckets of its own) keeps the
            # SDK's aggregation for this one too
            if _advised_buckets(getattr(metrics, "_preferred_aggregation", {}).get(SdkHistogram)):
                delta = (getattr(metrics, "_preferred_temporality", {}).get(SdkHistogram)
                         == AggregationTemporality.DELTA)
                self.collective_durations = CollectiveDurations(delta=delta)
            extra = (None if self.collective_durations is None else
                     (self.collective_durations, self.resource, self._scope))
            self.pending = PendingPoints(_delta_metrics(metrics), self.collective_durations)
            self.readers.append(_CountingMetricReader(
                _CountingMetricExporter(metrics, self.accounts), self.accounts, self.pending,
                extra, **config_mod.metric_reader_settings()))
        self.meter_provider = MeterProvider(
            resource=self.resource, metric_readers=self.readers, shutdown_on_exit=False,
            exemplar_filter=_EXEMPLAR_FILTERS[config_mod.exemplar_filter()]())
        _live_pipelines.add(self)
        self.tracer = self.tracer_provider.get_tracer(*scope)
        self._span_processors = [p for p in self.processors if isinstance(p, BatchSpanProcessor)]
        self.meter = self.meter_provider.get_meter(*scope)
        self.otel_logger = self.logger_provider.get_logger(*scope)
        #: what a step and its collectives record into (semconv's, made here: the records
        #: name no instrument)
        self._step_instruments = tuple(self.measure_of(name) for name in wire_step.INSTRUMENTS)
        self._collective_instruments = tuple(
            self.measure_of(name)
            for name in (semconv.METRIC_COLLECTIVE_DURATION, semconv.METRIC_COLLECTIVE_SIZE))
        #: the loggers of users' scopes (their logger names), made on first use
        self._user_loggers: dict[str, Any] = {}

    def measure_of(self, name: str) -> Any:
        """The ``record``/``add``/``set`` of the instrument ``semconv.METRICS[name]`` defines,
        noting every series it measures (what a lost collection would cost)."""
        made = semconv.create(self.meter, name)
        return self.pending.track(name, getattr(made, _MEASURE[semconv.METRICS[name].kind]))

    # --- what the emitter makes: the one place OpenTelemetry objects are built ----------
    def span(self, name: str, parent: SpanContext | None, start_ns: int, end_ns: int,
             attributes: dict[str, Any], span_id: int = 0, trace_id: int = 0,
             links: Sequence[SpanContext] = (), error: str | None = None,
             events: Sequence[tuple[str, int, dict[str, Any]]] = ()) -> SpanContext:
        """One finished span with explicit times, (optionally) preset ids, links to
        ``links`` and ``events`` as (name, epoch ns, attributes).

        Every span otel-train makes is finished when it is made, with attributes it built
        itself: so it is handed to the span processors as a ``ReadableSpan`` directly, as
        the SDK's tracer would hand it over at ``end()``, without the tracer's start/end
        machinery and attribute validation (most of what a span cost that way).
        The sampling decision is the tracer's sampler's: ParentBased(ALWAYS_ON) with remote
        parents always kept; a local unsampled parent makes an unrecorded span.
        """
        if parent is not None:
            trace_id = parent.trace_id
            sampled = parent.is_remote or parent.trace_flags.sampled
            trace_state = parent.trace_state
        else:
            trace_id = trace_id or self.ids.generate_trace_id()
            sampled, trace_state = True, None
        ctx = SpanContext(trace_id, span_id or self.ids.generate_span_id(), False,
                          _SAMPLED_FLAGS if sampled else _UNSAMPLED_FLAGS, trace_state)
        if not sampled or not self._span_processors:
            return ctx
        if error:  # exception texts end up here: nothing secret leaves (redact.py)
            error = redact.scrub(str(error))
        if events:
            events = [(e[0], e[1], redact.redact_mapping(e[2])) for e in events]
        readable = ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self.resource,
            attributes=attributes,
            events=[Event(n, a, timestamp=t) for n, a, t in
                    ((e[0], e[2], e[1]) for e in events)],
            links=[Link(link) for link in links], kind=SpanKind.INTERNAL,
            status=(trace.Status(trace.StatusCode.ERROR, error) if error
                    else _UNSET_STATUS),
            start_time=start_ns, end_time=max(end_ns, start_ns),
            instrumentation_scope=self._scope)
        for processor in self._span_processors:
            processor.on_end(readable)
        return ctx

    def collectives(self, spec: Any, rows: Sequence[tuple[Any, ...]] | bytes) -> None:
        """A step's collectives as spans and points: rows of every source
        (wire/collectives.py) or the NCCL plugin's records (wire/nccl.py), by the type of
        ``spec``, into the collective duration histogram and size counter."""
        duration, size = self._collective_instruments
        if self.collective_durations is not None:  # every value, without the SDK's cost
            duration = self.collective_durations.record
        expand_collectives(spec, rows, self.span, duration, size)

    def step(self, record: wire_step.StepRecord) -> None:
        """A finished step (wire/step.py) as its spans, log and points."""
        wire_step.emit(record, self.span, self.emit_log, *self._step_instruments,
                       observed_ns=time.time_ns())

    def emit_log(self, time_ns: int, observed_ns: int, parent: SpanContext | None,
                 severity: int, severity_text: str, body: Any,
                 attributes: dict[str, Any], scope: str = semconv.SCOPE_NAME) -> None:
        """One log record, in the context of ``parent`` (its trace and span ids) if given,
        under the instrumentation scope ``scope``: otel-train's, or a user logger's name."""
        ctx = (trace.set_span_in_context(NonRecordingSpan(parent)) if parent is not None
               else None)
        # otel-train's own records are events: their body is the event's name (training.*,
        # otel_train.*), which OpenTelemetry's log data model keeps in EventName too
        event_name = body if scope == semconv.SCOPE_NAME and type(body) is str else None
        self._logger(scope).emit(
            timestamp=time_ns, observed_timestamp=observed_ns, context=ctx,
            severity_number=SeverityNumber(severity), severity_text=severity_text, body=body,
            attributes=attributes, event_name=event_name)

    def _logger(self, scope: str) -> Any:
        if scope == semconv.SCOPE_NAME:
            return self.otel_logger
        logger = self._user_loggers.get(scope)
        if logger is None:
            if len(self._user_loggers) >= _MAX_USER_SCOPES:  # logger names made per call
                scope = semconv.SCOPE_USER_LOGS
                logger = self._user_loggers.get(scope)
            if logger is None:
                # no version, no schema URL: the user's scope, not otel-train's
                logger = self._user_loggers[scope] = self.logger_provider.get_logger(scope)
        return logger

    def _exporters(self, run_dir: Path | None, rank: int) -> dict[str, Any]:
        """Each signal's exporter, None where it is not exported: of the kind its
        OTEL_<SIGNAL>_EXPORTER names ("none": off), else of the run's kind. One kind's
        exporters that cannot be made leave their signals unexported, with a warning."""
        kinds = {signal: signal_exporter(signal) or self.kind for signal in _SIGNAL_NAMES}
        exporters: dict[str, Any] = dict.fromkeys(_SIGNAL_NAMES)
        builders = {"otlp": _otlp_exporters, "console": _console_exporters,
                    "file": lambda signals: _file_exporters(signals, run_dir, rank)}
        for kind, build in builders.items():
            signals = [signal for signal in _SIGNAL_NAMES if kinds[signal] == kind]
            if not signals:
                continue
            try:
                exporters.update(build(signals))
            except Exception as err:  # unwritable directory, missing exporter package...
                warnings.warn(f"otel-train: cannot set up the {kind} exporters ({err}); "
                              f"{', '.join(signals)} of this run not exported", ConfigWarning,
                              stacklevel=4)
                if kind == self.kind:
                    self.kind = "none"
        return exporters

    def commit(self) -> None:
        """Nothing to hand on: spans and records went to the SDK as they were made."""

    def accounts_snapshot(self) -> dict[str, dict[str, int]]:
        """Produced, exported and dropped by signal (:class:`Accounts`)."""
        return self.accounts.snapshot()

    def backlog(self) -> float:
        """How full the fullest batch processor queue is, 0 to 1."""
        fill = 0.0
        for processor in self.processors:
            inner = getattr(processor, "_batch_processor", None)
            queue, limit = getattr(inner, "_queue", None), getattr(inner, "_max_queue_size", 0)
            if queue is not None and limit:
                fill = max(fill, len(queue) / limit)
        return fill

    def nudge(self) -> None:
        """Wake the batch processors' workers to export now rather than on their schedule."""
        for processor in self.processors:
            awaken = getattr(getattr(processor, "_batch_processor", None), "_worker_awaken", None)
            if awaken is not None:
                awaken.set()

    def quiet_in_child(self) -> None:
        """In a forked child: stop the export threads the SDK restarted there."""
        for reader in self.readers:
            event = getattr(reader, "_shutdown_event", None)
            if event is not None:
                event.set()
        for processor in self.processors:
            inner = getattr(processor, "_batch_processor", None)
            if inner is not None:
                inner._shutdown = True
                awaken = getattr(inner, "_worker_awaken", None)
                if awaken is not None:
                    awaken.set()

    def shutdown(self, timeout_s: float) -> bool:
        """Flush and shut down within ``timeout_s``; False if it had to give up waiting.

        Each signal flushes on a thread of its own, all at once, each with the whole bound:
        one after another, a collector that never answers kept the spans' flush busy for
        the whole bound and the final metric collection never happened, its points lost
        uncounted. The SDK's ``force_flush`` ignores its timeout, so the threads are daemons
        we stop waiting for: leaving ``instrument()`` never hangs on a dead collector.
        """
        deadline = time.monotonic() + timeout_s
        workers = [threading.Thread(target=work, args=(timeout_s,), daemon=True,
                                    name=f"otel-train-shutdown-{signal}")
                   for signal, work in ((semconv.SIGNAL_METRICS, self._shutdown_metrics),
                                        (semconv.SIGNAL_SPANS, self._shutdown_traces),
                                        (semconv.SIGNAL_LOGS, self._shutdown_logs))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.accounts.close()  # what is still queued or in flight now is dropped
        return not any(worker.is_alive() for worker in workers)

    def _shutdown_metrics(self, timeout_s: float) -> None:
        for reader in self.readers:  # collected now, whatever export is still in flight
            reader.final_collection(timeout_s * 1000)
        self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)

    def _shutdown_traces(self, timeout_s: float) -> None:
        self.tracer_provider.force_flush()
        self.tracer_provider.shutdown()

    def _shutdown_logs(self, timeout_s: float) -> None:
        self.logger_provider.force_flush()
        self.logger_provider.shutdown()
