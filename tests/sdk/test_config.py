"""Settings: arguments over OTEL_TRAIN_* over OTEL_*; a bad value is one warning and a default."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import sampling

from otel_train import config
from otel_train.config import ConfigWarning


def test_defaults_without_environment():
    cfg = config.load({})
    assert cfg.service_name == "otel-train"
    assert cfg.output_dir == Path("otel-train-runs")
    assert cfg.exporter == "auto" and cfg.prometheus_port is None
    assert isinstance(cfg.sampler(), sampling.ParentBased)


def test_environment_is_read():
    cfg = config.load({
        "OTEL_SERVICE_NAME": "llm-pretrain", "OTEL_TRAIN_OUTPUT_DIR": "/data/runs",
        "OTEL_TRAIN_EXPORTER": "FILE", "OTEL_TRAIN_QUEUE_SIZE": "1024",
        "OTEL_TRAIN_EMIT_INTERVAL_MS": "50", "OTEL_TRAIN_PROMETHEUS_PORT": "9464",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_TRAIN_RUN_ID": "job-42", "OTEL_TRAIN_CAPTURE_LOGS": "false",
    })
    assert cfg.service_name == "llm-pretrain" and cfg.output_dir == Path("/data/runs")
    assert cfg.exporter == "file" and cfg.queue_size == 1024 and cfg.emit_interval_s == 0.05
    assert cfg.prometheus_port == 9464 and cfg.run_id == "job-42" and not cfg.capture_logs
    sampler = cfg.sampler()
    assert isinstance(sampler, sampling.ParentBased) and "0.25" in sampler.get_description()


def test_arguments_override_the_environment():
    cfg = config.load({"OTEL_TRAIN_QUEUE_SIZE": "10", "OTEL_SERVICE_NAME": "env"},
                      queue_size=99, service_name="arg", run_id=None)
    assert cfg.queue_size == 99 and cfg.service_name == "arg"


@pytest.mark.parametrize("name,value,field,default", [
    ("OTEL_TRAIN_QUEUE_SIZE", "-3", "queue_size", 65536),
    ("OTEL_TRAIN_QUEUE_SIZE", "lots", "queue_size", 65536),
    ("OTEL_TRAIN_EMIT_INTERVAL_MS", "nan", "emit_interval_s", 2.0),
    ("OTEL_TRAIN_PROMETHEUS_PORT", "70000", "prometheus_port", None),
    ("OTEL_TRAIN_EXPORTER", "kafka", "exporter", "auto"),
    ("OTEL_TRAIN_RUN_ID", "../../etc", "run_id", None),
    ("OTEL_TRAIN_LOG_LEVEL", "loud", "console_log_level", "info"),
    ("OTEL_TRAIN_CAPTURE_LOGS", "maybe", "capture_logs", True),
    ("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "0", "shutdown_timeout_s", 10.0),
    ("OTEL_TRACES_SAMPLER", "sometimes", "sampler_name", "parentbased_always_on"),
    ("OTEL_TRAIN_COLLECTIVE_SPANS", "some", "collective_spans", "auto"),
    ("OTEL_TRAIN_COLLECTIVE_SPAN_RATE", "0", "collective_span_rate", 2000.0),
    ("OTEL_TRAIN_COLLECTIVE_SPAN_RATE", "many", "collective_span_rate", 2000.0),
    ("OTEL_TRAIN_NCCL_PLUGIN", "sometimes", "nccl_plugin", "auto"),
    ("OTEL_TRAIN_NCCL_TIMING", "fast", "nccl_timing", "auto"),
    ("OTEL_TRAIN_COLLECTIVE_PG_HOOKS", "perhaps", "collective_pg_hooks", True),
])
def test_a_bad_value_gives_one_warning_and_the_default(name, value, field, default):
    with pytest.warns(ConfigWarning) as caught:
        cfg = config.load({name: value})
    assert len(caught) == 1 and name in str(caught[0].message)
    assert getattr(cfg, field) == default


def test_a_bad_sampler_ratio_falls_back_to_one():
    with pytest.warns(ConfigWarning, match="OTEL_TRACES_SAMPLER_ARG"):
        cfg = config.load({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"})
    assert cfg.sampler_arg == 1.0


def test_good_values_give_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.load({"OTEL_TRAIN_QUEUE_SIZE": " 512 ", "OTEL_TRACES_SAMPLER": "always_off"})


def test_an_unknown_argument_is_a_programming_error():
    with pytest.raises(TypeError, match="queue_sise"):
        config.load({}, queue_sise=3)


def test_collective_span_mode_from_environment_and_argument():
    assert config.load({"OTEL_TRAIN_COLLECTIVE_SPANS": "Summary"}).collective_spans == "summary"
    assert config.load({}, collective_spans="summary").collective_spans == "summary"
    with pytest.warns(ConfigWarning, match=r"argument collective_spans='few' is invalid "
                      r"\(one of auto, all, summary\); using 'auto'"):
        assert config.load({}, collective_spans="few").collective_spans == "auto"
    assert config.load({}).collective_spans == "auto"
    assert config.load({"OTEL_TRAIN_COLLECTIVE_SPAN_RATE": "500"}).collective_span_rate == 500.0
    with pytest.warns(ConfigWarning, match="argument collective_span_rate=0 is invalid"):
        assert config.load({}, collective_span_rate=0).collective_span_rate == 2000.0


@pytest.mark.parametrize("name,value,why,used", [
    ("emit_interval_s", -5, "a positive number of seconds", 2.0),
    ("queue_size", 0, "a positive integer of records", 65536),
    ("queue_size", 2.5, "a positive integer of records", 65536),
    ("prometheus_port", 99999, "a TCP port, 1-65535", None),
    ("exporter", "bogus", "one of auto, otlp, file, none", "auto"),
    ("capture_logs", "yes", "true or false", True),
    ("gap_sample_s", float("inf"), "a non-negative number of seconds", 0.2),
    ("nccl_timing", "fast", "one of auto, kernel, events", "auto"),
    ("nccl_poll_ms", 0, "an integer of milliseconds, 1-1000", 25),
    ("output_dir", 3, "a path", Path("otel-train-runs")),
])
def test_a_bad_argument_is_checked_as_its_variable_is(name, value, why, used):
    """Issue 34, item 2: ``load(emit_interval_s=-5, queue_size=0, prometheus_port=99999,
    exporter="bogus")`` was accepted silently; each is now one warning naming the argument,
    in the field's unit, and the default."""
    with pytest.warns(ConfigWarning) as caught:
        cfg = config.load({}, **{name: value})
    assert [str(w.message) for w in caught] == [
        f"otel-train: argument {name}={value!r} is invalid ({why}); using {used!r}"]
    assert getattr(cfg, name) == used


def test_a_bad_argument_falls_back_to_the_environment_s_value():
    with pytest.warns(ConfigWarning, match="argument queue_size=-1 .* using 512"):
        assert config.load({"OTEL_TRAIN_QUEUE_SIZE": "512"}, queue_size=-1).queue_size == 512


@pytest.mark.parametrize("name,value,message", [
    ("OTEL_TRAIN_EMIT_INTERVAL_MS", "abc", "a positive number of milliseconds); using 2000"),
    ("OTEL_TRAIN_GAP_SAMPLE_MS", "-1", "a non-negative number of milliseconds); using 200"),
    ("OTEL_TRAIN_STALL_TIMEOUT_S", "soon", "a positive number of seconds); using 60.0"),
    ("OTEL_TRAIN_NCCL_POLL_MS", "5000", "an integer of milliseconds, 1-1000); using 25"),
])
def test_a_variable_s_message_is_in_the_variable_s_own_unit(name, value, message):
    with pytest.warns(ConfigWarning) as caught:
        config.load({name: value})
    assert [str(w.message) for w in caught] == [
        f"otel-train: {name}={value!r} is invalid ({message}"]


def test_every_setting_of_a_variable_is_a_config_field_and_every_field_is_checked():
    fields = {f.name for f in config.dataclasses.fields(config.Config)}
    assert set(config.SETTINGS) == fields
    assert all(s.variable.startswith("OTEL_") for s in config.SETTINGS.values() if s.variable)


def test_every_otel_train_variable_is_read_in_config_only():
    """No module but config.py reads an OTEL_TRAIN_* variable (C reads what Python hands it:
    the plugin's variables are the checked settings, ``config.nccl_environment``)."""
    import re

    from support import REPO_ROOT

    reads = re.compile(r"(?:environ(?:\.get)?|getenv)\(?\[?\s*[\"']OTEL_TRAIN_")
    found = [str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "otel_train").rglob("*.py")
             if p.name != "config.py" and reads.search(p.read_text(encoding="utf-8"))]
    assert found == []


def test_the_plugin_s_variables_are_the_checked_settings():
    cfg = config.load({"OTEL_TRAIN_NCCL_TIMING": "Kernel", "OTEL_TRAIN_NCCL_POLL_MS": "10"},
                      nccl_self_time=True)
    assert config.nccl_environment(cfg) == {
        "OTEL_TRAIN_NCCL_TIMING": "kernel", "OTEL_TRAIN_NCCL_POLL_MS": "10",
        "OTEL_TRAIN_NCCL_SELF_TIME": "1", "OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE": "0"}


def test_the_nccl_plugin_is_auto_by_default_and_can_be_forced_or_refused():
    assert config.load({}).nccl_plugin == "auto"
    assert config.load({"OTEL_TRAIN_NCCL_PLUGIN": "AUTO"}).nccl_plugin == "auto"
    assert config.load({"OTEL_TRAIN_NCCL_PLUGIN": "1"}).nccl_plugin is True
    assert config.load({"OTEL_TRAIN_NCCL_PLUGIN": "false"}).nccl_plugin is False
    assert config.load({"OTEL_TRAIN_NCCL_PLUGIN": "1"}, nccl_plugin=False).nccl_plugin is False



def test_a_signal_s_bad_otlp_value_falls_back_to_the_general_one():
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "3", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-1",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "ftp"}
    with pytest.warns(ConfigWarning) as caught:
        found = config.otlp_settings(("traces", "metrics", "logs"), env)
    assert sorted(str(w.message).split("=")[0] for w in caught) == [
        "otel-train: OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
        "otel-train: OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"]
    assert [found[s]["timeout"] for s in ("traces", "metrics", "logs")] == [3.0, 3.0, 3.0]
    assert [found[s]["protocol"] for s in ("traces", "metrics", "logs")] == ["grpc"] * 3


def test_a_bad_general_otlp_value_is_warned_once_for_all_signals():
    with pytest.warns(ConfigWarning) as caught:
        config.otlp_settings(("traces", "metrics", "logs"),
                             {"OTEL_EXPORTER_OTLP_COMPRESSION": "lz4"})
    assert len(caught) == 1 and "OTEL_EXPORTER_OTLP_COMPRESSION" in str(caught[0].message)


def test_a_model_s_attribute_limit_falls_back_to_the_global_one():
    spans, logs = config.attribute_limits({"OTEL_ATTRIBUTE_COUNT_LIMIT": "16",
                                           "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "64"})
    assert spans["max_span_attributes"] == 64 and spans["max_event_attributes"] == 16
    assert logs["max_log_record_attributes"] == 16 and logs["max_attribute_length"] is None


def test_the_readme_s_table_names_every_variable():
    from support import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert [s.variable for s in config.SETTINGS.values()
            if s.variable and f"`{s.variable}`" not in readme] == []
