"""One naming scheme across spans, metrics and logs (issue 35, item 7; docs/telemetry.md).

A real run (the training helper, the exporter process, files) logs through stdlib logging
and structlog, named and unnamed; its exported records are read back:

- every log record carries the run id, rank and step under the attribute names spans and
  metrics use (``training.run.id``, ``training.rank``, ``training.step``), never the bare
  ones, and no record names its logger in an attribute;
- a user's record is under its logger's instrumentation scope (the OpenTelemetry
  convention), otel-train's own under ``otel_train`` with its version;
- every metric point carries ``training.run.id`` and ``training.rank``.

And over ``semconv`` itself: no attribute name is also the namespace of another, and no 0/1
flag is named a ratio in Prometheus.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import structlog
from support import otlp_files, training

import otel_train
from otel_train import semconv

BARE = ("run_id", "rank", "step", "logger", "logger_name", "phase", "duration_ms")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("names")
    model, opt, loader = training.setup(batches=4)
    with otel_train.instrument(model, output_dir=out):
        training.train(model, opt, loader)
        logging.getLogger("myapp.data").warning("stdlib, named")
        logging.getLogger().warning("stdlib, root")
        structlog.get_logger().warning("structlog, unnamed")
        structlog.get_logger().bind(logger="myapp.eval").warning("structlog, named", loss=1.5)
    return otlp_files.only_run_dir(out)


def _by_body(run_dir: Path) -> dict[str, dict]:
    return {r["body"]["stringValue"]: r for r in otlp_files.logs(run_dir)}


def test_every_log_record_carries_run_rank_and_step_under_the_span_attribute_names(run_dir):
    records = otlp_files.logs(run_dir)
    assert len(records) >= 8  # 4 step ends, start, stop, the 4 user lines
    for record in records:
        attrs = record["attrs"]
        assert attrs[semconv.ATTR_RUN_ID] == record["resource"][semconv.RES_RUN_ID], record
        assert attrs[semconv.ATTR_RANK] == 0, record
        assert isinstance(attrs[semconv.ATTR_STEP], int), record
        assert not set(BARE) & set(attrs), (record["body"], sorted(attrs))
    steps = [r for r in records if r["body"]["stringValue"] == "training.step.end"]
    assert sorted(r["attrs"][semconv.ATTR_STEP] for r in steps) == [0, 1, 2, 3]
    for record in steps:  # a timed event: phase, duration and phase totals in seconds
        attrs = record["attrs"]
        assert attrs[semconv.LOG_PHASE] == "step" and 0 < attrs[semconv.LOG_DURATION] < 60
        totals = {k for k in attrs if k.startswith(semconv.ATTR_PHASE_TOTAL_PREFIX)}
        assert semconv.ATTR_PHASE_TOTAL_PREFIX + semconv.PHASE_FORWARD in totals


def test_a_user_record_is_under_its_logger_s_scope(run_dir):
    scopes = {body: (r["scope"].get("name"), r["scope"].get("version"))
              for body, r in _by_body(run_dir).items()}
    assert scopes["stdlib, named"] == ("myapp.data", None)
    assert scopes["stdlib, root"] == ("root", None)
    assert scopes["structlog, named"] == ("myapp.eval", None)
    assert scopes["structlog, unnamed"] == (semconv.SCOPE_USER_LOGS, None)
    # otel-train's own records: its scope, its version
    for body in ("otel_train.start", "otel_train.stop", "training.step.end"):
        assert scopes[body] == (semconv.SCOPE_NAME, otel_train.__version__), body


def test_otel_train_s_own_fields_use_the_span_attribute_names(run_dir):
    records = _by_body(run_dir)
    start, stop = records["otel_train.start"]["attrs"], records["otel_train.stop"]["attrs"]
    assert start[semconv.ATTR_WORLD_SIZE] == 1 and "world_size" not in start
    assert stop[semconv.ATTR_STATUS] == "ok" and stop[semconv.ATTR_STEPS] == 4
    assert records["structlog, named"]["attrs"]["loss"] == 1.5  # users' own fields kept


def test_every_metric_point_carries_the_run_id_and_the_rank(run_dir):
    seen = 0
    for name in semconv.METRICS:
        for point in otlp_files.metric_points(run_dir, name):
            seen += 1
            assert point["attrs"].get(semconv.ATTR_RANK) == 0, (name, point["attrs"])
            assert point["attrs"].get(semconv.ATTR_RUN_ID), (name, point["attrs"])
    assert seen >= 8


def _attribute_names() -> set[str]:
    names = {v for k, v in vars(semconv).items()
             if k.startswith(("ATTR_", "RES_")) and isinstance(v, str)}
    names |= {semconv.LOG_RUN_ID, semconv.LOG_RANK, semconv.LOG_STEP, semconv.LOG_PHASE,
              semconv.LOG_DURATION}
    return names


def test_no_attribute_name_is_the_namespace_of_another():
    names = _attribute_names()
    prefixes = {n for n in names if n.endswith(".")}  # families: training.phase_total.<p>
    full = names - prefixes
    assert semconv.ATTR_STEP in full and len(full) > 80
    clashes = sorted((a, b) for a in full for b in full | prefixes
                     if b != a and b.startswith(a + "."))
    assert clashes == []


def test_a_namespace_clash_would_be_found():
    """The check above, shown to fail on the names this change replaced."""
    full = _attribute_names() | {"training.step.duration_s"}
    assert [b for b in full if b.startswith(semconv.ATTR_STEP + ".")] == \
        ["training.step.duration_s"]


def test_only_fractions_are_named_ratios_in_prometheus():
    ratios = sorted(m.name for m in semconv.METRICS.values() if m.prometheus.endswith("_ratio"))
    assert ratios == sorted([semconv.METRIC_COMM_OVERLAP, semconv.METRIC_GPU_IDLE,
                             semconv.METRIC_MFU])
    assert semconv.prom(semconv.METRIC_COMPILE_INCONSISTENT) == "training_compile_inconsistent"


@pytest.mark.parametrize("names", ["contract", "loki", "before 0.2.0"])
def test_check_reads_the_log_fields_under_each_of_their_names(names):
    """``check``'s log evidence: run directories of this version, Loki's copy (dots as
    underscores), and run directories written before the rename."""
    from otel_train.check.evidence import LogEvidence

    fields = {semconv.LOG_RUN_ID: "r", semconv.LOG_RANK: 0, semconv.LOG_STEP: 3,
              semconv.LOG_PHASE: "step", semconv.LOG_DURATION: 0.1}
    if names == "loki":
        fields = {k.replace(".", "_"): v for k, v in fields.items()}
    elif names == "before 0.2.0":
        fields = {semconv.LOG_LEGACY_NAMES[k]: v for k, v in fields.items()}
    logs = LogEvidence()
    logs.add("ab" * 16, "cd" * 8, fields, "training.step.end")
    logs.add("ab" * 16, "cd" * 8, {}, "a record with none")
    assert dict(logs.missing) == {semconv.LOG_RUN_ID: 1, semconv.LOG_RANK: 1,
                                  semconv.LOG_STEP: 1}
    assert (logs.timed, logs.timed_without_duration) == (1, 0)


# --- one scheme: training., otel_train., or OpenTelemetry's own (issue 54, item 1) ----------
#: OpenTelemetry's semantic-convention namespaces otel-train uses
OTEL_NAMESPACES = ("service.", "host.", "process.", "k8s.", "code.", "exception.")
#: the kinds of name semconv defines, by constant prefix
NAME_KINDS = ("SPAN_", "ATTR_", "RES_", "EVENT_", "LOG_", "METRIC_")


def _names() -> dict[str, str]:
    """Every dotted name of the contract that semconv defines: constant -> name."""
    return {k: v for k, v in vars(semconv).items()
            if k.startswith(NAME_KINDS) and isinstance(v, str) and "." in v
            and not v.endswith(".jsonl")}


def _off_scheme(names: dict[str, str]) -> list[str]:
    return sorted(f"{k}={v}" for k, v in names.items()
                  if not v.startswith(("training.", "otel_train.", *OTEL_NAMESPACES)))


def test_every_name_is_under_training_otel_train_or_an_opentelemetry_convention():
    names = _names()
    assert len(names) > 150
    assert _off_scheme(names) == []
    # the tool's own health under otel_train., everything else about the training
    health = {v for v in names.values() if v.startswith("otel_train.")}
    assert health == {semconv.METRIC_TELEMETRY_DROPPED, semconv.METRIC_INTERNAL_ERRORS,
                      semconv.ATTR_SIGNAL, semconv.ATTR_COMPONENT, semconv.LOG_START,
                      semconv.LOG_STOP}, sorted(health)


def test_the_old_names_would_be_found_off_the_scheme():
    """The check above, shown to fail on the names before 0.3.0."""
    old = {f"OLD_{i}": name for i, name in enumerate(semconv.LEGACY_NAMES)}
    off = _off_scheme(old)
    assert "OLD_0=train.run" in off and any(o.endswith("=collective.op") for o in off)
    assert any(o.endswith("=signal") for o in off)


def test_no_bare_names():
    """Attributes without a namespace (``signal``, ``component`` before 0.3.0)."""
    bare = sorted(k for k, v in vars(semconv).items()
                  if k.startswith(("ATTR_", "RES_", "EVENT_", "METRIC_", "SPAN_"))
                  and isinstance(v, str) and v and "." not in v)
    assert bare == []


def test_no_metric_name_is_the_namespace_of_another():
    names = set(semconv.METRICS)
    clashes = sorted((a, b) for a in names for b in names if b.startswith(a + "."))
    assert clashes == []
    # shown to fail on the gauge this change renamed
    old = names | {"training.memory.allocated.peak"}
    assert [b for b in old if b.startswith(semconv.METRIC_MEMORY_ALLOCATED + ".")] == \
        ["training.memory.allocated.peak"]


def test_every_legacy_name_maps_to_a_name_of_the_contract():
    contract = set(_names().values()) | {semconv.ATTR_SIGNAL, semconv.ATTR_COMPONENT}
    assert {new for new in semconv.LEGACY_NAMES.values()} <= contract
    assert not set(semconv.LEGACY_NAMES) & contract  # no old name is still in use


def test_otel_train_s_own_records_name_their_event(run_dir):
    records = otlp_files.logs(run_dir)
    own = [r for r in records if r["scope"].get("name") == semconv.SCOPE_NAME]
    assert {r["body"]["stringValue"] for r in own} >= {
        semconv.LOG_START, semconv.LOG_STOP, semconv.LOG_STEP_END}
    for record in own:
        assert record.get("eventName") == record["body"]["stringValue"], record
    users = [r for r in records if r["scope"].get("name") != semconv.SCOPE_NAME]
    assert users and all(not r.get("eventName") for r in users)
