"""The step tracker's hot path in C (``otel_train/_fastpath.c``) against its Python reference
(``tracker._PyTrackerCore``): the same records, hook calls and state for any sequence of
calls, the same wrappers' behaviour, no leaked references, and the C one built where CI runs.
"""

from __future__ import annotations

import copy
import gc
import random
import sys
import threading
import time
import warnings
import weakref
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.binaries import binaries_required

from otel_train import semconv, tracker
from otel_train.recorder import PHASE, STEP, Recorder

PHASES = list(semconv.TIMED_PHASES)
DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER = PHASES

needs_c = pytest.mark.skipif(tracker.CStepTracker is None and not binaries_required(),
                             reason="the C tracker is not built here")


def test_the_c_tracker_is_built_and_chosen_by_default() -> None:
    """CI's machine has a compiler: the install built the C core, and instrument() uses it
    unless OTEL_TRAIN_FASTPATH=0. (Skipped only on a machine that could not build it.)"""
    if tracker.CStepTracker is None and not binaries_required():
        pytest.skip("the C tracker is not built here")
    assert tracker.CStepTracker is not None, "otel_train._fastpath was not built"
    assert tracker.tracker_class() is tracker.CStepTracker
    assert tracker.tracker_class(fastpath=False) is tracker.PyStepTracker



def test_a_c_tracker_of_another_record_layout_is_refused_and_python_runs(monkeypatch) -> None:
    """The C core builds the records wire/hot_path.py lays out; handed another layout (a
    build older than the Python beside it) it refuses, and the Python tracker runs."""
    if tracker.CStepTracker is None and not binaries_required():
        pytest.skip("the C tracker is not built here")
    from otel_train import _fastpath
    from otel_train.wire import hot_path

    moved = (*hot_path.STEP_FIELDS[:-2], "tokens", "samples")  # two fields swapped
    with pytest.raises(ValueError, match="step records"):
        _fastpath.configure(phase_record=PHASE, step_record=STEP, data_wait="d", forward="f",
                            optimizer="o", phase_fields=hot_path.PHASE_FIELDS,
                            step_fields=moved)
    monkeypatch.setattr(tracker, "STEP_FIELDS", moved)
    with pytest.warns(RuntimeWarning, match="the Python tracker runs instead"):
        assert tracker._configure_fastpath() is None
    monkeypatch.undo()
    assert tracker._configure_fastpath() is _fastpath  # the real layout: accepted again

def _pair(capacity: int = 1 << 20, **kw: Any) -> list[tracker.StepTracker]:
    out = []
    for cls in (tracker.PyStepTracker, tracker.CStepTracker):
        t = cls(Recorder(capacity), "run", 0, **kw)
        t._getrandbits = random.Random(7).getrandbits  # the same span ids in both
        out.append(t)
    return out


def _normal(record: tuple[Any, ...]) -> tuple[Any, ...]:
    """A record with its timestamps replaced (the two trackers read the clock apart)."""
    if record[0] == PHASE:
        return (*record[:4], "t", "t", record[6])
    if record[0] == STEP:
        return (*record[:2], "t" if record[2] is not None else None,
                "t" if record[3] is not None else None, *record[4:])
    return record


def _state(t: tracker.StepTracker) -> dict[str, Any]:
    return {name: getattr(t, name) for name in
            ("enabled", "step", "forwards", "samples", "tokens", "phase", "phase_micro",
             "_depth", "_count_batches", "fixed_samples", "fixed_tokens")} | {
        "step_start_set": t.step_start_ns is not None,
        "pending_end_set": t.pending_end_ns is not None,
        "span_id": t._span_id}


class _Hooks:
    """Hooks that log their calls (timestamps replaced) and can fail on request."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_next = False

    def _maybe_fail(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ValueError("a source's hook failed")

    def phase(self, begin: bool, now: int) -> None:
        assert isinstance(now, int)
        self.calls.append(("phase", begin))
        self._maybe_fail()

    def end(self, now: int) -> None:
        assert isinstance(now, int)
        self.calls.append(("end",))

    def step(self, step: int) -> None:
        self.calls.append(("step", step))


OPS = st.one_of(
    st.tuples(st.just("begin"), st.sampled_from(PHASES)),
    st.tuples(st.just("end"), st.sampled_from(PHASES)),
    st.tuples(st.just("end_open")),
    st.tuples(st.just("mark_step")),
    st.tuples(st.just("span_id")),
    st.tuples(st.just("count"), st.integers(0, 64)),
    st.tuples(st.just("other_thread"), st.sampled_from(PHASES)),
    st.tuples(st.just("toggle")),
    st.tuples(st.just("fail_next")),
)


def _begin_into(t: tracker.StepTracker, phase: str, result: list[bool]) -> None:
    result.append(t.begin(phase))


def _play(t: tracker.StepTracker, ops: list[tuple[Any, ...]], hooks: _Hooks | None
          ) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        kind = op[0]
        if kind == "begin":
            out.append(t.begin(op[1]))
        elif kind == "end":
            out.append(t.end(op[1]))
        elif kind == "end_open" and t.phase is not None:
            t.end(t.phase)
        elif kind == "mark_step":
            t.mark_step()
        elif kind == "span_id":
            out.append(t.phase_span_id)
        elif kind == "count":
            t.samples += op[1]
            t.tokens += 2 * op[1]
        elif kind == "other_thread":
            result: list[bool] = []
            worker = threading.Thread(target=_begin_into, args=(t, op[1], result))
            worker.start()
            worker.join()
            out.append(result)
        elif kind == "toggle":
            t.enabled = not t.enabled
        elif kind == "fail_next" and hooks is not None:
            hooks.fail_next = True
        out.append(_state(t))
    t.close()
    out.append(_state(t))
    return out


@needs_c
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=40), with_hooks=st.booleans(), fixed=st.booleans(),
       capacity=st.sampled_from([3, 1 << 20]))
def test_the_c_core_makes_the_records_and_state_of_the_python_core(ops, with_hooks, fixed,
                                                                   capacity) -> None:
    kw = {"samples_per_step": 4, "tokens_per_step": 16} if fixed else {}
    results, records, calls, dropped = [], [], [], []
    for t in _pair(capacity, **kw):
        hooks = _Hooks() if with_hooks else None
        if hooks is not None:
            t.add_phase_hook(hooks.phase)
            t.add_end_hook(OPTIMIZER, hooks.end)
            t.add_step_hook(hooks.step)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results.append(_play(t, ops, hooks))
        records.append([_normal(r) for r in t._recorder.queue])
        calls.append((hooks.calls if hooks else None,
                      [str(w.message) for w in caught]))
        dropped.append(dict(t._recorder.dropped))
    assert results[0] == results[1]
    assert records[0] == records[1]
    assert calls[0] == calls[1]
    assert dropped[0] == dropped[1]


@needs_c
def test_the_c_core_reads_perf_counter_ns_clock() -> None:
    """Every timestamp of the C core is on time.perf_counter_ns()'s clock (the emitter and
    the other sources read that one)."""
    t = tracker.CStepTracker(Recorder(1 << 20), "run", 0)
    before = time.perf_counter_ns()
    for phase in PHASES:
        assert t.begin(phase)
        t.end(phase)
    t.begin(DATA_WAIT)  # finishes the step
    after = time.perf_counter_ns()
    stamps = []
    for r in t._recorder.queue:
        stamps += [r[4], r[5]] if r[0] == PHASE else [r[2], r[3]]
    assert len(stamps) == 2 * 4 + 2
    assert all(before <= s <= after for s in stamps), (before, stamps, after)
    phases = [r for r in t._recorder.queue if r[0] == PHASE]
    assert all(a[5] <= b[4] for a, b in zip(phases, phases[1:]))


@pytest.mark.parametrize("fastpath", [False, True])
def test_a_timed_call_passes_arguments_result_and_exception_through(fastpath) -> None:
    if fastpath and tracker.CStepTracker is None:
        pytest.skip("the C tracker is not built here")
    t = tracker.tracker_class(fastpath)(Recorder(1 << 20), "run", 0)

    def fn(a, b=0, *, c=0):
        if c < 0:
            raise KeyError(c)
        return a + b + c

    timed = tracker._timed(t, FORWARD, fn)
    assert timed(1, 2, c=3) == 6 and timed(1, b=5) == 6
    with pytest.raises(KeyError):
        timed(1, c=-1)
    assert [(r[2], r[3]) for r in t._recorder.queue] == [(FORWARD, 0), (FORWARD, 1),
                                                          (FORWARD, 2)]
    assert t.phase is None  # the failed call's phase ended too
    off_thread: list[int] = []
    worker = threading.Thread(target=lambda: off_thread.append(timed(2, 2)))
    worker.start()
    worker.join()
    assert off_thread == [4] and len(t._recorder.queue) == 3  # called, not recorded
    timed.__wrapped__ = fn  # StepHooks sets these
    timed.__doc__ = "doc"
    assert timed.__wrapped__ is fn and timed.__doc__ == "doc"
    assert copy.deepcopy(timed) is timed and copy.copy(timed) is timed


@needs_c
def test_the_c_optimizer_hooks_begin_and_end_the_phase_on_the_training_thread_only() -> None:
    t = tracker.CStepTracker(Recorder(1 << 20), "run", 0)
    pre, post = tracker._optimizer_hooks(t)
    assert pre(None, (), {}) is None and t.phase == OPTIMIZER
    worker = threading.Thread(target=post, args=(None, (), {}))
    worker.start()
    worker.join()
    assert t.phase == OPTIMIZER  # another thread's optimizer did not end it
    assert post(None, (), {}) is None and t.phase is None
    assert t.pending_end_ns is not None


@needs_c
def test_the_c_core_holds_no_reference_it_does_not_release() -> None:
    """Reference counts of what every record touches do not grow with the steps, and a
    wrapper in a cycle with its module (module -> wrapper -> bound method -> module) is
    collected."""
    t = tracker.CStepTracker(Recorder(1 << 30), "run", 0)
    hook_calls = []

    def phase_hook(begin: bool, now: int) -> None:
        hook_calls.append(begin)

    def step_hook(step: int) -> None:
        pass

    def fn(x: int) -> int:
        return x

    t.add_phase_hook(phase_hook)
    t.add_end_hook(OPTIMIZER, step_hook)
    t.add_step_hook(step_hook)
    timed = tracker._timed(t, BACKWARD, fn)

    def steps(n: int) -> None:
        for _ in range(n):
            for phase in (DATA_WAIT, FORWARD, OPTIMIZER):
                t.begin(phase)
                t.end(phase)
            timed(1)
        t._recorder.queue.clear()

    batch = (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4))
    it = object()

    def original(it: object) -> tuple[torch.Tensor, torch.Tensor]:
        return batch

    data_wait = tracker._fastpath.NextTimed(t, original, None, t.count_batch, torch.Tensor,
                                            tracker._TOKEN_DTYPES)
    steps_before = steps

    def steps(n: int) -> None:  # noqa: F811  (the same steps, a data wait first)
        for _ in range(n):
            assert data_wait(it) is batch
        steps_before(n)

    steps(100)
    watched = [*PHASES, PHASE, STEP, t, t._recorder.queue, t._recorder, timed, fn,
               phase_hook, step_hook, t.phase_hooks, t.step_hooks, t.end_hooks, it, batch,
               batch[0], original, data_wait]
    before = [sys.getrefcount(o) for o in watched]
    steps(2000)
    # a reference kept a record is 2000 or more; other tests' threads still ending may move
    # a count by a few
    grown = [sys.getrefcount(o) - b for o, b in zip(watched, before)]
    assert max(grown) < 100, grown
    assert len(hook_calls) == 2 * 5 * 2100  # begin and end of five phases a step

    model = torch.nn.Linear(2, 2)
    model._compiled_call_impl = tracker._timed(t, FORWARD, model._call_impl)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def _spans_of_a_run(tmp_path: Any, fastpath: bool
                    ) -> tuple[type, list[Any], list[tuple[Any, ...]]]:
    from support import otlp_files, training

    import otel_train

    model, opt, loader = training.setup(batches=6)
    out = tmp_path / str(fastpath)
    with otel_train.instrument(model, output_dir=out, fastpath=fastpath) as inst:
        training.train(model, opt, loader, accumulate=2)
    kinds = sorted((s["name"], s["attrs"].get(semconv.ATTR_STEP),
                    s["attrs"].get(semconv.ATTR_MICRO_BATCH),
                    s["attrs"].get(semconv.ATTR_MICRO_BATCHES),
                    s["attrs"].get(semconv.ATTR_SAMPLES))
                   for s in otlp_files.spans(otlp_files.only_run_dir(out))
                   if s["name"] != semconv.SPAN_RUN)
    said = [r["attrs"].get("tracker") for r in otlp_files.logs(otlp_files.only_run_dir(out))
            if r.get("body", {}).get("stringValue") == "otel_train.start"]
    return type(inst.tracker), said, kinds


@needs_c
def test_a_run_exports_the_same_spans_with_either_core(tmp_path) -> None:
    """End to end (hooks, emitter, exporter process, files), gradient accumulation included:
    the C tracker's run and the Python tracker's (OTEL_TRAIN_FASTPATH=0) export the same
    spans, steps, micro-batches and samples."""
    c_class, c_said, c_spans = _spans_of_a_run(tmp_path, True)
    py_class, py_said, py_spans = _spans_of_a_run(tmp_path, False)
    assert (c_class, py_class) == (tracker.CStepTracker, tracker.PyStepTracker)
    assert (c_said, py_said) == (["c"], ["python"])  # the start log says which runs
    assert c_spans == py_spans
    assert sum(1 for s in c_spans if s[0] == semconv.SPAN_FORWARD) == 6
    assert {s[4] for s in c_spans if s[0] == semconv.SPAN_RANK_STEP} == {2 * 4}  # two micro-batches of 4


class _Dict(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.full((5,), i, dtype=torch.long)}


def _datasets() -> dict[str, Any]:
    from torch.utils.data import TensorDataset

    return {"floats": TensorDataset(torch.randn(10, 3), torch.randn(10, 1)),
            "token_ids": TensorDataset(torch.randint(0, 9, (10, 7)), torch.randn(10)),
            "one_dim_ids": TensorDataset(torch.arange(10)),
            "dicts": _Dict()}


def _data_waits(fastpath: bool, name: str, restrict: bool) -> tuple[Any, ...]:
    from torch.utils.data import DataLoader

    data = _datasets()
    t = tracker.tracker_class(fastpath)(Recorder(1 << 20), "run", 0)
    hooks = tracker.StepHooks(t)
    hooks.hook_dataloader(data[name] if restrict else None)
    try:
        it = iter(DataLoader(data[name], batch_size=4))
        got = [next(it), it.__next__()]  # the slot and the bound method alike
        with pytest.raises(StopIteration):
            while True:
                got.append(next(it))
        other = torch.utils.data.TensorDataset(torch.randn(6, 2))
        for _ in DataLoader(other, batch_size=5):  # another loader's batches
            pass
    finally:
        hooks.remove()
    return (len(got), [_normal(r) for r in t._recorder.queue], t.samples, t.tokens,
            t.phase, t.data_iter)


@needs_c
@pytest.mark.parametrize("name", ["floats", "token_ids", "one_dim_ids", "dicts"])
@pytest.mark.parametrize("restrict", [False, True])
def test_the_c_data_wait_records_and_counts_as_the_python_one(name, restrict) -> None:
    """The DataLoader iterator's ``__next__`` in C: the same data-wait records (the one that
    ends the loader included), samples and tokens for every kind of batch, only the given
    loader's waits when restricted, and nothing left pointing at the iterator."""
    python, c = _data_waits(False, name, restrict), _data_waits(True, name, restrict)
    assert c == python
    assert c[1] and c[4] is None and c[5] is None
    own = len(_datasets()[name])
    assert c[2] == own + (0 if restrict else 6)  # samples of every batch counted
    from torch.utils.data import dataloader

    assert not isinstance(dataloader._BaseDataLoaderIter.__dict__["__next__"],
                          tracker._fastpath.NextTimed)  # removed


@pytest.mark.parametrize("core", ["c", "python"])
def test_each_step_start_moves_the_overrun_alarm_on(core: str) -> None:
    """The gap sampler's alarm (tracker.open_alarm): at each step's start the core moves a
    one-shot timer to ``_alarm_after_ns`` later. While steps keep coming it never rings;
    after the last step's start it rings once that long after it, not before."""
    import os
    import select

    if core == "c" and tracker.CStepTracker is None:
        if binaries_required():
            pytest.fail("the C tracker is not built")
        pytest.skip("the C tracker is not built here")
    cls = tracker.CStepTracker if core == "c" else tracker.PyStepTracker
    t = cls(Recorder(1 << 16), "run", 0)
    fd = tracker.open_alarm(t)
    if fd is None:
        assert core == "python" and not hasattr(os, "timerfd_create"), "no alarm opened"
        pytest.skip("the Python core moves the alarm from Python 3.13 on (os.timerfd_*)")
    after = 300_000_000
    t._alarm_fd, t._alarm_after_ns = fd, after
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        for _ in range(40):  # ~10 ms steps for ~0.4 s, longer than the alarm's 0.3 s
            assert t.begin(FORWARD)
            t.end(FORWARD)
            assert t.begin(OPTIMIZER)
            time.sleep(0.01)  # the step's work
            t.end(OPTIMIZER)
            assert not poller.poll(0), "the alarm rang while steps kept coming"
        assert t.begin(FORWARD)  # finishes the step: the next one starts at its end
        start = t.step_start_ns
        assert poller.poll(5000), "the alarm did not ring after the last step's start"
        assert time.perf_counter_ns() >= start + after
        assert len(os.read(fd, 8)) == 8
    finally:
        os.close(fd)
