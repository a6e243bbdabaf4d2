"""The OpenTelemetry SDK's own variables, read as otel-train's own are: a bad value is one
warning naming the variable, in its own unit, and the default, never a run without telemetry
(issue "What users read is true", item 3). The SDK raises on some of them while the providers
are built, which used to take the exporter process down, then instrument() with it.

Real runs of the training helper, exported to files by the real exporter process (or, where
it says so, by the training process itself); nothing is mocked.
"""

from __future__ import annotations

import warnings

import pytest
from support import otlp_files, otlp_receiver, training

import otel_train
from otel_train import semconv
from otel_train.config import ConfigWarning

#: (variable, bad value, the default used instead, as the warning says it)
BAD_VALUES = [
    ("OTEL_BSP_SCHEDULE_DELAY", "-1", "5000"),
    ("OTEL_BSP_SCHEDULE_DELAY", "soon", "5000"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "2048"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0", "512"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096", "512"),  # more than the queue holds
    ("OTEL_BSP_EXPORT_TIMEOUT", "-30", "30000"),
    ("OTEL_BLRP_SCHEDULE_DELAY", "0", "1000"),
    ("OTEL_BLRP_MAX_QUEUE_SIZE", "-5", "2048"),
    ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "0", "512"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "-1", "60000.0"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "inf", "60000.0"),  # the reader would never export
    ("OTEL_METRIC_EXPORT_TIMEOUT", "0", "30000.0"),
    ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes", "'trace_based'"),
    ("OTEL_ATTRIBUTE_COUNT_LIMIT", "-1", "128"),
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", "many", "128"),
    ("OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT", "-2", "128"),
]


def _run(tmp_path, **settings):
    model, opt, loader = training.setup(batches=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with otel_train.instrument(model, output_dir=tmp_path, **settings) as inst:
            training.train(model, opt, loader, log_after_step=True)
    return inst, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def _assert_every_signal_exported(tmp_path):
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert sum(s["name"] == semconv.SPAN_RANK_STEP for s in otlp_files.spans(run_dir)) == 3
    assert otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)
    assert any(r["body"].get("stringValue") == "after step 3" for r in otlp_files.logs(run_dir))


@pytest.mark.parametrize("name,value,default", BAD_VALUES)
def test_a_bad_sdk_value_is_warned_by_name_and_telemetry_is_still_exported(
        tmp_path, monkeypatch, name, value, default):
    monkeypatch.setenv(name, value)
    inst, messages = _run(tmp_path)
    assert inst.run_id is not None, "the run was left uninstrumented"
    assert [m for m in messages if name in m] == [
        f"otel-train: {name}={value!r} is invalid ({_why(name)}); using {default}"], messages
    _assert_every_signal_exported(tmp_path)


def _why(name):
    """What the warning says a good value is: in the variable's own unit."""
    if name.endswith("MAX_EXPORT_BATCH_SIZE"):
        return f"a positive integer, at most {name.split('_MAX')[0]}_MAX_QUEUE_SIZE (2048)"
    if name.startswith("OTEL_METRIC_EXPORT"):
        return "a positive number of milliseconds"
    if name.endswith("EXPORT_TIMEOUT"):
        return "a non-negative integer of milliseconds"
    if name.endswith("SCHEDULE_DELAY"):
        return "a positive integer of milliseconds"
    if name.endswith("EXEMPLAR_FILTER"):
        return "one of trace_based, always_on, always_off"
    if name.endswith("LIMIT"):
        return "a non-negative integer"
    return "a positive integer"


def test_a_bad_sdk_value_in_the_training_process_is_warned_and_exported(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "0")
    inst, messages = _run(tmp_path, export_process=False)
    assert inst.run_id is not None
    assert any("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE='0' is invalid" in m for m in messages), messages
    _assert_every_signal_exported(tmp_path)


def test_a_small_queue_shrinks_the_default_batch_without_a_warning(tmp_path, monkeypatch):
    # a valid queue smaller than the default batch (512): the SDK would refuse the pair
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    _, messages = _run(tmp_path)
    assert messages == []
    _assert_every_signal_exported(tmp_path)


def test_good_sdk_values_give_no_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1024")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "250")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4096")
    _, messages = _run(tmp_path)
    assert messages == []
    _assert_every_signal_exported(tmp_path)


@pytest.mark.parametrize("value,exemplars", [("", True), ("ALWAYS_OFF", False)])
def test_the_exemplar_filter_is_honoured_in_any_case(tmp_path, monkeypatch, value, exemplars):
    monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", value)  # enum values: any case
    _, messages = _run(tmp_path)
    assert messages == []
    points = otlp_files.metric_points(otlp_files.only_run_dir(tmp_path),
                                      semconv.METRIC_STEP_DURATION)
    assert points and any(p.get("exemplars") for p in points) == exemplars


# --- the OTLP exporters' variables, against an OTLP receiver ------------------------------

#: (protocol, variable, value, what the warning says of it or None for no warning); the
#: gRPC exporters raised on any of these but a bad HTTP timeout, which failed every export
OTLP_VALUES = [
    ("grpc", "OTEL_EXPORTER_OTLP_COMPRESSION", "none", None),  # a valid value, refused
    ("grpc", "OTEL_EXPORTER_OTLP_COMPRESSION", "deflate",
     "(one of none, gzip for grpc); using 'none'"),
    ("grpc", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon",
     "(a positive number of seconds (the Python exporters' unit)); using 10.0"),
    ("grpc", "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "", None),  # empty: as if unset
    ("http/protobuf", "OTEL_EXPORTER_OTLP_TIMEOUT", "-1",
     "(a positive number of seconds (the Python exporters' unit)); using 10.0"),
    ("http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "zstd",
     "(one of none, gzip, deflate for http/protobuf); using 'none'"),
]


@pytest.fixture
def receiver():
    with otlp_receiver.running_receiver() as running:
        yield running


def _run_exporting_to(receiver, protocol, tmp_path, monkeypatch):
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    return _run(tmp_path)


def _assert_every_signal_received(receiver):
    assert receiver.span_names().count(semconv.SPAN_RANK_STEP) == 3
    assert semconv.METRIC_STEP_DURATION in receiver.metric_names()
    assert "after step 3" in receiver.log_bodies()


@pytest.mark.parametrize("protocol,name,value,why", OTLP_VALUES)
def test_an_otlp_value_is_warned_by_name_and_every_signal_still_arrives(
        receiver, tmp_path, monkeypatch, protocol, name, value, why):
    monkeypatch.setenv(name, value)
    inst, messages = _run_exporting_to(receiver, protocol, tmp_path, monkeypatch)
    assert not any(inst.dropped.values()), inst.dropped
    expected = [] if why is None else [f"otel-train: {name}={value!r} is invalid {why}"]
    assert [m for m in messages if name in m] == expected, messages
    _assert_every_signal_received(receiver)
    assert {p for _, p, _ in receiver.protocols()} == {protocol}


def test_an_unsupported_otlp_protocol_is_warned_and_http_protobuf_used(
        receiver, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")  # not the Python SDK's
    _, messages = _run(tmp_path)
    assert any(m.startswith("otel-train: OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is invalid")
               for m in messages), messages
    _assert_every_signal_received(receiver)
    assert {p for _, p, _ in receiver.protocols()} == {"http/protobuf"}


def test_the_otlp_compression_is_the_one_configured(receiver, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", "deflate")  # the signal's wins
    _, messages = _run_exporting_to(receiver, "http/protobuf", tmp_path, monkeypatch)
    assert messages == []
    _assert_every_signal_received(receiver)
    assert {(s, e) for s, _, e in receiver.protocols()} == {
        ("traces", "gzip"), ("metrics", "gzip"), ("logs", "deflate")}
