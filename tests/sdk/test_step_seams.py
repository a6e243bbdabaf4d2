"""The seams a finished step crosses, held in one place each (issue "The house, kept").

- Training thread -> emitter: the tracker's records are plain tuples laid out as
  ``wire/hot_path.py`` names them; the emitter reads them by those names
  (``steps.step_fields``, ``EMIT_STEP_FIELDS``, ``phase_interval``/``phase_span_id``,
  ``core.captured_fields``), never by positions written out.
- Emitter -> where spans are built: a ``StepRecord`` holds only what crosses
  (``WIRE_FIELDS``); the listeners' scratch is the ``StepWork`` beside it, never sent.
- Listener -> listener: a pre-step listener declares what it reads and writes
  (``step_uses``); the emitter runs each after every listener that writes what it reads,
  and refuses a cycle.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import pickle
from typing import Any

import pytest
from opentelemetry.sdk.trace import sampling

from otel_train import identity, semconv
from otel_train.emitter import core, steps
from otel_train.emitter.logs import LogRecords
from otel_train.emitter.work import (
    MADE_AFTER_PRE_STEP,
    STEP_FIELDS,
    StepWork,
    order_listeners,
    step_uses,
)
from otel_train.sources.gaps import GapSource
from otel_train.sources.gpu.cuda_timing import CudaTimingSource
from otel_train.wire import hot_path
from otel_train.wire.step import WIRE_FIELDS, PhaseRow, StepRecord

OFFSET = 1_000_000


def _by_name(layout: tuple[str, ...], /, **values: Any) -> tuple[Any, ...]:
    """A hot-path record laid out as ``layout`` says, from its fields by name."""
    assert set(values) == set(layout), sorted(set(values) ^ set(layout))
    return tuple(values[name] for name in layout)


class _Sink:
    """The pipeline's side the step assembly uses: the records it is handed."""

    kind = "none"

    def __init__(self) -> None:
        self.dropped: collections.Counter[str] = collections.Counter()
        self.records: list[Any] = []

    def step(self, record: Any) -> None:
        self.records.append(record)


def _assembly(sink: _Sink) -> steps.StepAssembly:
    ident = identity.Identity("seams", 0, 0, 1, "host", 1)
    errors: list[Exception] = []

    def swallowed(err: Exception, kind: Any) -> None:
        errors.append(err)
        raise AssertionError(f"the emitter swallowed {err!r}") from err

    return steps.StepAssembly(sink, ident, sampling.ALWAYS_ON, OFFSET, [], None, None,
                              swallowed)


# --- training thread -> emitter ---------------------------------------------------------
def test_the_emitter_reads_a_step_record_by_the_names_hot_path_gives_its_fields() -> None:
    values = dict(kind=hot_path.STEP, step=7, start_ns=11, end_ns=13, micro_batches=17,
                  samples=19, tokens=23)
    record = _by_name(hot_path.STEP_FIELDS, **values)
    taken = dict(zip(steps.EMIT_STEP_FIELDS, steps.step_fields(record), strict=True))
    assert taken == {name: values[name] for name in steps.EMIT_STEP_FIELDS}
    # what step_fields gives is what emit_step takes, parameter by parameter
    params = tuple(inspect.signature(steps.StepAssembly.emit_step).parameters)
    assert params[1:] == steps.EMIT_STEP_FIELDS


def test_the_emitter_reads_phase_and_log_records_by_their_fields_names() -> None:
    values = dict(kind=hot_path.PHASE, step=7, phase="forward", micro=2, start_ns=11,
                  end_ns=13, span_id=29)
    record = _by_name(hot_path.PHASE_FIELDS, **values)
    assert steps.phase_interval(record) == ("forward", 2, 11, 13)
    assert steps.phase_span_id(record) == 29
    log = dict(kind=hot_path.LOG, time_ns=5, level="info", event="hello", fields={"a": 1},
               scope="user")
    taken = core.captured_fields(_by_name(hot_path.LOG_FIELDS, **log))
    params = tuple(inspect.signature(LogRecords.captured).parameters)[1:]
    assert dict(zip(params, taken, strict=True)) == {
        "time_ns": 5, "level": "info", "message": "hello", "fields": {"a": 1},
        "scope": "user"}


@pytest.mark.parametrize("held", [False, True], ids=["emitted", "held then released"])
def test_a_step_made_of_records_laid_out_by_name_becomes_the_record_they_say(held) -> None:
    sink = _Sink()
    assembly = _assembly(sink)
    if held:
        gate = {"open": False}
        assembly.hold_steps(lambda step: gate["open"])
    for micro, (start, end, span_id) in enumerate([(100, 250, 31), (300, 420, 37)]):
        assembly.on_phase(_by_name(hot_path.PHASE_FIELDS, kind=hot_path.PHASE, step=5,
                                   phase=semconv.PHASE_FORWARD, micro=micro, start_ns=start,
                                   end_ns=end, span_id=span_id))
    assembly.on_step(_by_name(hot_path.STEP_FIELDS, kind=hot_path.STEP, step=5, start_ns=50,
                              end_ns=500, micro_batches=2, samples=8, tokens=64))
    if held:
        assert sink.records == [] and assembly.step_at(499) == 5
        gate["open"] = True
        assembly.release_steps()
    (record,) = sink.records
    assert type(record) is StepRecord  # the record alone is handed on, never its work
    assert (record.step, record.start_ns, record.end_ns) == (5, 50 + OFFSET, 500 + OFFSET)
    assert (record.micro_batches, record.samples, record.tokens) == (2, 8, 64)
    assert record.phase_totals == {semconv.PHASE_FORWARD: pytest.approx(270e-9)}
    assert record.phases == [
        PhaseRow(semconv.PHASE_FORWARD, 0, 100 + OFFSET, 250 + OFFSET, 31, None, None),
        PhaseRow(semconv.PHASE_FORWARD, 1, 300 + OFFSET, 420 + OFFSET, 37, None, None)]


# --- emitter -> where spans are built -----------------------------------------------------
def test_a_step_record_is_its_wire_fields_and_the_work_beside_it_holds_the_rest() -> None:
    assert WIRE_FIELDS == tuple(f.name for f in dataclasses.fields(StepRecord))
    scratch = {f.name for f in dataclasses.fields(StepWork)} - {"record"}
    assert scratch and not scratch & set(WIRE_FIELDS)
    assert STEP_FIELDS == set(WIRE_FIELDS) | scratch
    assert MADE_AFTER_PRE_STEP <= STEP_FIELDS


def test_only_the_record_crosses_and_the_work_reads_and_writes_through_to_it() -> None:
    sink = _Sink()
    assembly = _assembly(sink)
    seen: list[StepWork] = []

    def listener(work: StepWork) -> None:
        seen.append(work)
        work.rank_step_context = object()  # would not pickle: never sent
        work.phase_overrides[1] = {"end_ns": 5}
        work.gpu_ends = [(1, 2)]
        work.extra_attributes["test.extra"] = 1.5  # the record's, through the work
        work.events.append(("test.event", 7, {"where": "x.py:3"}))
        work.tokens = 99  # set through the work: the record's field

    assembly.add_pre_step_listener(listener)
    assembly.on_step(_by_name(hot_path.STEP_FIELDS, kind=hot_path.STEP, step=1, start_ns=0,
                              end_ns=10, micro_batches=1, samples=0, tokens=0))
    (work,) = seen
    (record,) = sink.records
    assert work.record is record
    for name in WIRE_FIELDS:
        assert getattr(work, name) is getattr(record, name), name
    assert record.tokens == 99 and record.extra_attributes == {"test.extra": 1.5}
    crossed = pickle.loads(pickle.dumps(record, protocol=5))
    assert type(crossed) is StepRecord
    assert {f: getattr(crossed, f) for f in WIRE_FIELDS} == {
        f: getattr(record, f) for f in WIRE_FIELDS}
    assert not any(hasattr(crossed, name) for name in STEP_FIELDS - set(WIRE_FIELDS))


# --- listener -> listener ------------------------------------------------------------------
def _named(name: str, reads: tuple[str, ...] = (), writes: tuple[str, ...] = (),
           calls: list[str] | None = None) -> Any:
    @step_uses(reads=reads, writes=writes)
    def listener(work: Any) -> None:
        if calls is not None:
            calls.append(name)

    listener.__qualname__ = name
    return listener


def test_the_gap_listener_runs_after_the_cuda_timing_one_whatever_their_registration() -> None:
    # the shipped declarations: the gap listener reads the GPU ends cuda_timing writes
    gaps, cuda = GapSource._on_step, CudaTimingSource._before_step
    assert "gpu_ends" in gaps.step_uses[0] and "gpu_ends" in cuda.step_uses[1]
    others = [_named("a", writes=("extra_attributes",)), _named("b")]
    assert order_listeners([gaps, *others, cuda]) == (*others, cuda, gaps)
    # as the sources register them (instrument.SOURCES), nothing moves
    assert order_listeners([others[0], cuda, others[1], gaps]) == (
        others[0], cuda, others[1], gaps)


def test_listeners_without_a_dependency_keep_their_registration_order() -> None:
    listeners = [_named(n, writes=("extra_attributes",)) for n in "abc"] + [_named("d")]
    assert order_listeners(listeners) == tuple(listeners)


def test_a_reader_registered_first_runs_after_its_writer_in_the_emitter() -> None:
    sink = _Sink()
    assembly = _assembly(sink)
    calls: list[str] = []

    @step_uses(reads=("gpu_ends",))
    def reader(work: StepWork) -> None:
        calls.append(f"reader saw {work.gpu_ends}")

    @step_uses(writes=("gpu_ends",))
    def writer(work: StepWork) -> None:
        calls.append("writer")
        work.gpu_ends = [(1, 2)]

    assembly.add_pre_step_listener(reader)
    remove = assembly.add_pre_step_listener(writer)
    assembly.on_step(_by_name(hot_path.STEP_FIELDS, kind=hot_path.STEP, step=0, start_ns=0,
                              end_ns=10, micro_batches=1, samples=0, tokens=0))
    assert calls == ["writer", "reader saw [(1, 2)]"]
    remove()
    assert assembly.pre_step_listeners == (reader,)


def test_a_cycle_is_refused_with_its_listeners_and_fields_and_nothing_is_registered() -> None:
    first = _named("first", reads=("gpu_ends",), writes=("events",))
    second = _named("second", reads=("events",), writes=("gpu_ends",))
    with pytest.raises(ValueError, match="cycle") as caught:
        order_listeners([first, second])
    text = str(caught.value)
    assert "first reads ['gpu_ends'] that second writes" in text
    assert "second reads ['events'] that first writes" in text
    assembly = _assembly(_Sink())
    assembly.add_pre_step_listener(first)
    with pytest.raises(ValueError, match="cycle"):
        assembly.add_pre_step_listener(second)
    assert assembly.pre_step_listeners == (first,)


@pytest.mark.parametrize("field,why", [("gpu_end", "not a step field"),
                                       ("phase_spans", "after the pre-step listeners"),
                                       ("phases", "after the pre-step listeners")])
def test_a_declared_field_must_be_one_a_pre_step_listener_can_use(field, why) -> None:
    for declared in ({"reads": (field,)}, {"writes": (field,)}):
        with pytest.raises(ValueError, match=why):
            order_listeners([_named("bad", **declared)])


def test_the_shipped_sources_listeners_run_each_after_what_it_reads_is_written(
        tmp_path) -> None:
    """A real run's pre-step listeners, as the shipped sources register them: every field a
    listener declares it reads is written only by listeners before it, and the order is the
    registration order (the sources' own, instrument.SOURCES: nothing moved)."""
    import torch

    import otel_train

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, exporter="none",
                               console_log_level="error") as inst:
        ordered = inst.emitter.steps.pre_step_listeners
        registered = inst.emitter.steps._pre_step_registered
    assert ordered == registered
    declared = [getattr(listener, "step_uses", None) for listener in ordered]
    names = {getattr(listener, "__qualname__", repr(listener)) for listener in ordered}
    assert {"GapListener._on_step", "CompileSource._before_step",
            "CgroupSource._on_step"} <= names, names
    for i, uses in enumerate(declared):
        for field in uses[0] if uses else ():
            later = [j for j, other in enumerate(declared)
                     if j > i and other and field in other[1]]
            assert later == [], (ordered[i], field, [ordered[j] for j in later])
