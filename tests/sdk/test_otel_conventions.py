"""OpenTelemetry's own conventions, as a user of the SDK expects them (issue 17, item 9): the
instrumentation scope carries otel-train's version and the schema URL of the semantic
conventions its names follow; ``OTEL_SDK_DISABLED=true`` turns everything off;
``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` choose or switch off each signal's exporter.

Real runs of the training helper, exported to files (or the console) by the real exporter
process; nothing is mocked.
"""

from __future__ import annotations

import re
import warnings

import pytest
from opentelemetry.semconv.schemas import Schemas
from packaging.requirements import Requirement
from support import REPO_ROOT, otlp_files, training

import otel_train
from otel_train import semconv
from otel_train.config import ConfigWarning


def _run(tmp_path, **settings):
    model, opt, loader = training.setup(batches=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with otel_train.instrument(model, output_dir=tmp_path, **settings) as inst:
            training.train(model, opt, loader)
    return inst, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def _docs(run_dir, pattern):
    return otlp_files.requests(run_dir, pattern)


def test_every_scope_carries_our_version_and_the_schema_url(tmp_path):
    assert semconv.SCHEMA_URL in {s.value for s in Schemas}  # a real conventions release
    _run(tmp_path)
    run_dir = otlp_files.only_run_dir(tmp_path)
    seen = 0
    for pattern, key in (("traces*.jsonl", "resourceSpans"), ("metrics*.jsonl",
                         "resourceMetrics"), ("logs*.jsonl", "resourceLogs")):
        docs = _docs(run_dir, pattern)
        assert docs, pattern
        for doc in docs:
            for resource in doc[key]:
                assert resource.get("schemaUrl") == semconv.SCHEMA_URL
                scopes = resource.get("scopeSpans") or resource.get("scopeMetrics") or \
                    resource.get("scopeLogs") or []
                for scope in scopes:
                    assert scope["scope"]["name"] == semconv.SCOPE_NAME
                    assert scope["scope"]["version"] == otel_train.__version__
                    assert scope.get("schemaUrl") == semconv.SCHEMA_URL
                    seen += 1
    assert seen >= 3


def test_otel_sdk_disabled_turns_everything_off(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "TRUE")  # the specification: case-insensitive
    model, opt, loader = training.setup(batches=3)
    hooks_before = len(model._forward_hooks) + len(model._forward_pre_hooks)
    with pytest.warns(ConfigWarning, match="OTEL_SDK_DISABLED"):
        with otel_train.instrument(model, output_dir=tmp_path) as inst:
            assert len(model._forward_hooks) + len(model._forward_pre_hooks) == hooks_before
            assert inst.emitter is None and inst.run_id is None
            training.train(model, opt, loader)  # trains as if never instrumented
    assert not any(tmp_path.iterdir())  # nothing written, no exporter process


def test_otel_sdk_disabled_other_values_change_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    inst, _ = _run(tmp_path)
    assert inst.run_id is not None
    assert otlp_files.spans(otlp_files.only_run_dir(tmp_path))


def test_a_signal_exporter_set_to_none_switches_that_signal_off_only(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    inst, _ = _run(tmp_path)
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert not otlp_files.spans(run_dir)
    assert otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)
    assert otlp_files.logs(run_dir)
    assert not inst.dropped.get(semconv.SIGNAL_SPANS)  # off is not lost


def test_console_and_unknown_signal_exporters(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "zipkin")  # names no metric exporter we build
    _, messages = _run(tmp_path)
    out = capfd.readouterr().out
    assert '"training.step.end"' in out or "training.step.end" in out  # log records on stdout
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert not otlp_files.logs(run_dir)  # replaced, not added to
    assert otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)  # default kept
    assert any("OTEL_METRICS_EXPORTER" in m and "zipkin" in m for m in messages), messages


@pytest.mark.filterwarnings("error")  # a leaked file's ResourceWarning fails the test
@pytest.mark.parametrize("export_process", [True, False])
def test_a_signal_switched_off_opens_no_file_and_warns_nothing(tmp_path, monkeypatch,
                                                              export_process):
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    model, opt, loader = training.setup(batches=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning, relayed from the exporter or not
        with otel_train.instrument(model, output_dir=tmp_path,
                                   export_process=export_process):
            training.train(model, opt, loader)
    run_dir = otlp_files.only_run_dir(tmp_path)
    assert not list(run_dir.glob("logs*"))
    assert otlp_files.spans(run_dir)
    assert otlp_files.metric_points(run_dir, semconv.METRIC_STEP_DURATION)


@pytest.mark.parametrize("package", ["opentelemetry-api", "opentelemetry-sdk",
                                     "opentelemetry-exporter-otlp"])
def test_the_opentelemetry_requirements_admit_every_later_1x_release(package):
    # a library pinned to one minor release cannot be installed beside an application
    # already on a later one
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    (spec,) = [Requirement(r).specifier for r in re.findall(r'"(opentelemetry-[^"]+)"', pyproject)
               if Requirement(r).name == package]
    assert spec.contains("1.45.0") and spec.contains("1.46.0") and spec.contains("1.99.0")
    assert not spec.contains("2.0.0")  # a major release may break what otel-train uses
