"""A log record's exception is exported, as OpenTelemetry names it, and scrubbed
(otel_train/log_capture.py, otel_train/emitter/logs.py).

One real run writes every kind of exception log call (stdlib ``logger.exception()`` and
``exc_info=True``, structlog's ``.exception()`` and ``exc_info=<exception>``); each test reads
one behaviour off its exported log records.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import structlog
from support import otlp_files, training

import otel_train
from otel_train import redact, semconv

SECRET = "ZqExporterSecret4242"  # the value of a secret environment variable of the run
TYPE, MESSAGE, STACKTRACE = (semconv.ATTR_EXCEPTION_TYPE, semconv.ATTR_EXCEPTION_MESSAGE,
                             semconv.ATTR_EXCEPTION_STACKTRACE)


def _fail(message: str) -> None:
    raise ConnectionError(message)


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of one run that logged every kind of exception."""
    out = tmp_path_factory.mktemp("run")
    model, opt, loader = training.setup(batches=1)
    app, slog = logging.getLogger("app"), structlog.get_logger("app")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("APP_DB_PASSWORD", SECRET)
        try:
            with otel_train.instrument(model, output_dir=out):
                training.train(model, opt, loader)
                try:
                    _fail(f"refused: password {SECRET}")
                except ConnectionError:
                    app.exception("stdlib exception")
                    app.error("stdlib exc_info", exc_info=True)
                    slog.exception("structlog exception", pad_token="<pad>")
                try:
                    {}["missing"]
                except KeyError as err:
                    slog.error("structlog exc_info", exc_info=err)
                try:
                    try:
                        _fail("x" * 5000)
                    except ConnectionError as cause:
                        raise TimeoutError("gave up after the long one") from cause
                except TimeoutError:
                    app.exception("long traceback")
                app.error("exc_info outside an except block", exc_info=True)
                slog.error("structlog exc_info outside an except block", exc_info=True)
        finally:
            redact.load_env_secrets()  # this process's own environment again
    return out


@pytest.fixture(scope="module")
def records(output_dir: Path) -> dict[str, dict[str, Any]]:
    """The run's exported log records' attributes, by message."""
    logs = otlp_files.logs(otlp_files.only_run_dir(output_dir))
    return {r["body"]["stringValue"]: r["attrs"] for r in logs}


def test_stdlib_exception_exports_its_type_message_and_traceback(records) -> None:
    attrs = records["stdlib exception"]
    assert attrs[TYPE] == "ConnectionError"
    assert attrs[MESSAGE] == "refused: password [REDACTED]"
    assert attrs[STACKTRACE].startswith("Traceback (most recent call last):")
    assert "in _fail" in attrs[STACKTRACE]


def test_stdlib_exc_info_true_exports_the_exception(records) -> None:
    assert records["stdlib exc_info"][TYPE] == "ConnectionError"


def test_structlog_exception_exports_the_traceback_not_exc_info_true(records) -> None:
    attrs = records["structlog exception"]
    assert "exc_info" not in attrs
    assert attrs[TYPE] == "ConnectionError"
    assert "in _fail" in attrs[STACKTRACE]
    assert attrs["pad_token"] == "<pad>"


def test_structlog_exc_info_given_an_exception_exports_it(records) -> None:
    attrs = records["structlog exc_info"]
    assert (attrs[TYPE], attrs[MESSAGE]) == ("KeyError", "'missing'")
    assert "exc_info" not in attrs


def test_secret_values_are_scrubbed_from_exception_texts(records) -> None:
    for message in ("stdlib exception", "structlog exception"):
        assert SECRET not in records[message][MESSAGE] + records[message][STACKTRACE]
        assert "password [REDACTED]" in records[message][STACKTRACE]


def test_a_long_traceback_keeps_its_end(records) -> None:
    stacktrace = records["long traceback"][STACKTRACE]
    assert len(stacktrace) == 4096 and stacktrace.startswith("...")
    assert stacktrace.endswith("TimeoutError: gave up after the long one")


@pytest.mark.parametrize("message", ["exc_info outside an except block",
                                     "structlog exc_info outside an except block"])
def test_exc_info_without_an_exception_exports_none(records, message: str) -> None:
    assert not {TYPE, MESSAGE, STACKTRACE, "exc_info", "exception"} & set(records[message])


def test_no_exported_byte_holds_the_secret(output_dir: Path) -> None:
    exported = b"".join(p.read_bytes() for p in output_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in exported
