"""otel-train's threads sleep until there is work, and nothing is lost for it: a filling
buffer wakes the emitter, shutdown drains what a sleeping emitter holds, the gap sampler
still finds a slow stretch and names its line. (The stall found at its deadline while the
emitter sleeps: tests/collectives/test_collectives.py.)"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support import otlp_files

import otel_train
from otel_train import semconv
from otel_train.sources import gaps as gap_sampler


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "TRACEPARENT",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE",
                 "OTEL_TRAIN_EMIT_INTERVAL_MS", "OTEL_TRAIN_GAP_SAMPLE_MS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["alarm", "no_alarm"])
def alarm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both schedules of the gap sampler: with the overrun alarm (the C tracker) and without
    it. "no_alarm" stands in for a tracker that cannot move one (the Python tracker before
    Python 3.13, a platform without timerfd), which this machine cannot be made into."""
    if request.param == "no_alarm":
        monkeypatch.setattr(gap_sampler, "open_alarm", lambda tracker: None)
    return request.param


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


class _SlowForward(torch.nn.Linear):
    """A forward that takes ``forward_s`` (asleep inside the forward phase): steps long enough
    that a loaded machine's jitter (a few tens of ms) stays well inside OVERRUN (1.5) times
    their length, with nothing in them for the sampler."""

    def __init__(self, forward_s: float) -> None:
        super().__init__(4, 1)
        self.forward_s = forward_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.forward_s)
        return super().forward(x)


def _slow_model(forward_s: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _SlowForward(forward_s)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


#: a window of steps is steady when its longest step, as timed by the test, is under this many
#: times their median (the sampler's OVERRUN is 1.5)
STEADY = 1.35


def _steady_window(inst: Any, step: Callable[[], float | None], seconds: float,
                   idle_limit_s: float | None = None, drift: float | None = None,
                   within_s: float = 150.0) -> dict[str, Any]:
    """The gap sampler's wake-ups a second, and how its counters rose, over ``seconds`` of
    ``step`` (which returns the seconds it spent outside every phase, where it has such a
    part): from the first window whose steps kept their length, every one of them (and of
    the half second before the window) under STEADY times their median, outside every
    phase under ``idle_limit_s`` (shorter than SAMPLE_AGE_S: nothing to sample), and, with
    ``drift``, their mean within that fraction of their median (the sampler aims its looks
    whole typical lengths ahead: steps longer than typical on average move the stretch away
    from where a look a second ahead lands).

    A loaded machine stretches a step now and then, for real: the sampler rightly chases it
    (and the alarm rings for it), which says nothing of its schedule on steady steps. Such a
    window is told apart (timed here, not by the sampler) and measured again, until
    ``within_s``; ``tries`` says how many windows it took."""
    gaps = _gap_source(inst)
    give_up = time.monotonic() + within_s
    tries = 0
    while True:
        tries += 1
        lengths: list[float] = []
        idles: list[float] = []
        lead_until = time.monotonic() + 0.5  # what a step before the window set off ends
        before: tuple[int, ...] = ()
        start = first = 0
        while True:
            now = time.monotonic()
            if not before and now >= lead_until:
                before = (gaps.wakeups, gaps.alarms, gaps.stretch_looks, gaps.overrun_looks)
                start, first = now, inst.tracker.step
            if before and now - start >= seconds:
                break
            began = time.perf_counter()
            idles.append(step() or 0.0)
            lengths.append(time.perf_counter() - began)
        elapsed = time.monotonic() - start
        after = (gaps.wakeups, gaps.alarms, gaps.stretch_looks, gaps.overrun_looks)
        typical, mean = statistics.median(lengths), statistics.fmean(lengths)
        if (max(lengths) < STEADY * typical
                and (idle_limit_s is None or max(idles) < idle_limit_s)
                and (drift is None or mean < (1 + drift) * typical)):
            wakeups, alarms, stretch_looks, overrun_looks = (
                a - b for a, b in zip(after, before))
            return {"rate": wakeups / elapsed, "wakeups": wakeups, "alarms": alarms,
                    "stretch_looks": stretch_looks, "overrun_looks": overrun_looks,
                    "first": first, "last": inst.tracker.step, "tries": tries,
                    "step_ms": round(typical * 1e3, 1), "mean_ms": round(mean * 1e3, 1),
                    "max_ms": round(max(lengths) * 1e3, 1)}
        assert time.monotonic() < give_up, (
            f"no {seconds} s of steady steps in {within_s} s ({tries} windows); the last: "
            f"longest step {max(lengths) * 1e3:.0f} ms, median {typical * 1e3:.1f} ms, "
            f"mean {mean * 1e3:.1f} ms, longest idle {max(idles) * 1e3:.0f} ms")


def _rank_steps(run_dir) -> list[dict]:
    return [s for s in otlp_files.spans(run_dir) if s["name"] == semconv.SPAN_RANK_STEP]


def test_a_filling_buffer_wakes_the_sleeping_emitter_and_nothing_is_dropped(tmp_path,
                                                                            monkeypatch):
    # the burst's spans all wait in the exporter's queue at once where a loaded machine runs
    # its export thread late, and its flush at exit takes longer than the default bound
    # (seen: 410 of 2000 steps kept): neither is under test here
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "65536")
    monkeypatch.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "65536")
    monkeypatch.setenv("OTEL_TRAIN_SHUTDOWN_TIMEOUT_S", "120")  # nor is the flush's bound
    model, opt = _model()
    x = torch.randn(2, 4)
    steps = 2000  # four records a step: 8000, twice the buffer
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="burst",
                               queue_size=4000, emit_interval_s=600.0) as inst:
        for _ in range(steps):
            _step(model, opt, x)
        woke = inst.emitter.wakeups  # before the exit's final drain
        dropped = sum(inst.recorder.dropped.values())
    assert dropped == 0
    assert sum(inst.telemetry["dropped"].values()) == 0, inst.telemetry
    assert woke >= 1  # a 600 s interval: only the filling buffer woke it
    assert len(_rank_steps(tmp_path / "burst")) == steps


def test_shutdown_drains_everything_a_sleeping_emitter_holds(tmp_path):
    model, opt = _model()
    x = torch.randn(2, 4)
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="asleep",
                               emit_interval_s=600.0) as inst:
        for _ in range(50):
            _step(model, opt, x)
        # the first record woke it (that pass took what had come by then, the set-up's and
        # maybe the first steps'); what came after waits for a drain 600 s away
        assert inst.emitter.wakeups <= 1 and len(inst.recorder) >= 4
    assert sorted(int(s["attrs"][semconv.ATTR_STEP]) for s in _rank_steps(
        tmp_path / "asleep")) == list(range(50))


def slow_stretch(seconds: float) -> None:
    """Untimed host work between the phases: the stretch the sampler must name."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * 0.5 for i in range(200))


def slow_stretch_split(seconds: float) -> None:
    """The same, half its time in the function's own loop and half in a generator
    expression's frame, in turns of ~1 ms: a look samples either, about as often."""
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        turn = now + 0.0005
        while time.perf_counter() < turn:
            pass
        turn += 0.0005
        any(time.perf_counter() >= turn for _ in iter(int, 1))  # iter(int, 1): endless


def _stretched_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                    idle_s: float = 0.0, stretch_s: float = 0.0,
                    stretch: Callable[[float], None] = slow_stretch) -> float:
    """A step: a forward, ``idle_s`` inside no phase, the loss's forward, ``stretch_s`` of
    host work between forward and backward, the backward and the optimizer's step; how long
    the idle part took."""
    with torch.no_grad():
        model(x)
    idle = time.perf_counter()
    if idle_s:
        time.sleep(idle_s)
    idle = time.perf_counter() - idle
    loss = model(x).sum()
    if stretch_s:
        stretch(stretch_s)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return idle


def test_the_sleeping_gap_sampler_names_a_slow_stretch_to_its_line(tmp_path):
    model, opt = _slow_model(0.03)  # ~0.1 s steps: 60 ms in the phases, 20 ms outside them
    x = torch.randn(2, 4)

    def step() -> float:
        with torch.no_grad():
            model(x)  # a forward
        idle = time.perf_counter()
        time.sleep(0.02)  # inside no phase, but shorter than SAMPLE_AGE_S
        idle = time.perf_counter() - idle
        _step(model, opt, x)
        return idle

    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="gaps") as inst:
        gaps = next(s for s in inst._sources if type(s).__name__ == "GapSource")
        deadline = time.monotonic() + 30
        # steps until the sampler knows their typical length and has slept past its fast
        # start (nothing sampled: it lands once a gap_sample_s, 200 ms)
        while gaps.typical_ns() is None or gaps.wakeups < 6:
            step()
            assert time.monotonic() < deadline
        steady = _steady_window(inst, step, 3.0, idle_limit_s=0.045)
        model(x).sum().backward()
        slow_stretch(1.5)  # longer than gap_sample_s (200 ms): always found
        opt.step()
        opt.zero_grad()
        _step(model, opt, x)
    # on steps shorter than gap_sample_s: at most once a gap_sample_s (not once a step)
    assert steady["rate"] <= 1 / inst.config.gap_sample_s + 0.5, steady
    events = [otlp_files.attrs(e) for s in _rank_steps(tmp_path / "gaps")
              for e in s.get("events", []) if e["name"] == semconv.EVENT_GAP]
    gap = max(events, key=lambda e: e[semconv.ATTR_GAP_DURATION])
    assert gap[semconv.ATTR_GAP_DURATION] >= 1.4, gap
    assert gap[semconv.ATTR_GAP_SEGMENT] == "between backward and optimizer", gap
    assert gap[semconv.ATTR_GAP_SAMPLES] >= 2, gap
    assert gap[semconv.ATTR_CODE_FUNCTION].startswith("slow_stretch"), gap
    assert gap[semconv.ATTR_CODE_FILE] == __file__, gap


@pytest.mark.parametrize("at", [30, 61, 95])
def test_a_short_host_stretch_on_short_steps_is_named_to_its_line(tmp_path, at, alarm):
    """The CPU twin of tests/gpu/test_nccl_attribution.py's CPU straggler: 0.4 s of host work
    between forward and backward in one step of a run of ~13 ms steps. At the default
    gap_sample_s (200 ms) the sampler lands inside it wherever it falls (a 1 s default
    missed it on the H200), and names the function and the file."""
    model, opt = _model()
    x = torch.randn(2, 4)
    run_id = f"short-{at}-{alarm}"
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id=run_id):
        for step in range(at + 40):
            with torch.no_grad():
                model(x)
            time.sleep(0.012)  # inside no phase, short: the typical step
            loss = model(x).sum()
            if step == at:
                slow_stretch(0.4)
            loss.backward()
            opt.step()
            opt.zero_grad()
    events = [otlp_files.attrs(e) for s in _rank_steps(tmp_path / run_id)
              if s["attrs"][semconv.ATTR_STEP] == at
              for e in s.get("events", []) if e["name"] == semconv.EVENT_GAP]
    assert events, f"no gap event on step {at}"
    gap = max(events, key=lambda e: e[semconv.ATTR_GAP_DURATION])
    assert gap[semconv.ATTR_GAP_DURATION] >= 0.39, gap
    assert gap[semconv.ATTR_GAP_SEGMENT] == "between forward and backward", gap
    assert str(gap.get(semconv.ATTR_CODE_FUNCTION)).startswith("slow_stretch"), gap
    assert gap[semconv.ATTR_CODE_FILE].endswith("test_wakeups.py"), gap


@pytest.mark.parametrize("early_s", [0.012, 0.3])
def test_back_to_back_host_stretches_early_in_a_run_are_each_named(tmp_path, early_s, alarm):
    """As on NCCL ranks (tests/gpu/test_nccl_attribution.py's CPU straggler): 0.4 s of host
    work in steps 5, 8 and 11 of a 14-step run, after first steps of ``early_s``. Each
    stretch is sampled: the sampler's backoff follows one stretch, not a run of them, and
    a typical length still that of the slow first steps does not put it to sleep past the
    next one."""
    model, opt = _model()
    x = torch.randn(2, 4)
    run_id = f"early-{early_s}-{alarm}"
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id=run_id):
        for step in range(14):
            with torch.no_grad():
                model(x)
            time.sleep(early_s if step < 3 else 0.012)
            loss = model(x).sum()
            if step in (5, 8, 11):
                slow_stretch(0.4)
            loss.backward()
            opt.step()
            opt.zero_grad()
    found = {}
    for s in _rank_steps(tmp_path / run_id):
        gaps = [otlp_files.attrs(e) for e in s.get("events", [])
                if e["name"] == semconv.EVENT_GAP]
        if s["attrs"][semconv.ATTR_STEP] in (5, 8, 11) and gaps:
            gap = max(gaps, key=lambda e: e[semconv.ATTR_GAP_DURATION])
            found[s["attrs"][semconv.ATTR_STEP]] = str(gap.get(semconv.ATTR_CODE_FUNCTION))
    assert sorted(found) == [5, 8, 11], found
    assert all(f.startswith("slow_stretch") for f in found.values()), found


@pytest.mark.parametrize("before_s", [0.0, 0.03])
def test_a_stretch_that_comes_back_every_step_is_aimed_at_not_chased(tmp_path, before_s, alarm):
    """A host stretch of 80 ms between forward and backward in every ~100 ms step (a
    ``.item()``, a host copy, a wait on a peer), ``before_s`` of other untimed host time
    before the forward moving where in the step it lies. The sampler aims at it: steady
    wake-ups at most about once a gap_sample_s (the old schedule, four times as often for
    10 s after each find, woke 9-12 times a second here and failed this), most of its looks
    sample the stretch, and the stretch is named to its line in many steps."""
    model, opt = _model()
    x = torch.randn(2, 4)
    run_id = f"recurring-{before_s}-{alarm}"
    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id=run_id) as inst:
        gaps = next(s for s in inst._sources if type(s).__name__ == "GapSource")

        def step() -> None:
            if before_s:
                time.sleep(before_s)
            with torch.no_grad():
                model(x)
            loss = model(x).sum()
            slow_stretch(0.08)
            loss.backward()
            opt.step()
            opt.zero_grad()

        deadline = time.monotonic() + 30
        while gaps.aim is None or gaps.typical_ns() is None:  # one drain's steps
            step()
            assert time.monotonic() < deadline
        for _ in range(5):
            step()
        steady = _steady_window(inst, step, 6.0, drift=0.02)  # ~60 steps
        first, last = steady["first"], steady["last"]
    assert steady["rate"] <= 1 / inst.config.gap_sample_s + 1.0, steady
    # aimed looks land in the stretch: at least half of them (a look at a random point of the
    # ~100 ms step lands in the 30 ms stretch about a third of the time); on an oversubscribed
    # machine a look woken late misses now and then: 3 of 6 seen beside three CPU hogs
    assert steady["stretch_looks"] >= 0.5 * steady["wakeups"], steady
    located = 0
    for s in _rank_steps(tmp_path / run_id):
        if not first <= int(s["attrs"][semconv.ATTR_STEP]) < last:
            continue
        for e in s.get("events", []):
            attrs = otlp_files.attrs(e)
            if (e["name"] == semconv.EVENT_GAP
                    and attrs[semconv.ATTR_GAP_SEGMENT] == "between forward and backward"
                    and str(attrs.get(semconv.ATTR_CODE_FUNCTION)).startswith("slow_stretch")):
                located += 1
    assert located >= 0.25 * (last - first), (located, last - first)


def test_the_stack_walk_caches_code_kinds_by_identity_and_keeps_its_stops(monkeypatch):
    """user_frames caches each code object's kind by id beside the code itself (a code
    object's hash is taken afresh over all its constants: ~0.1 ms a sample on a script's
    <module> frame on a cold core). A cached entry answers for that very code object only,
    and a cache that fills starts again from its stops: the DataLoader's ``__next__`` still
    ends the walk, so a batch's wait is never named by the loop's ``for`` line."""
    import sys

    from otel_train.sources.gaps import frames as gaps

    def inner() -> list:  # (function, file) of each user frame
        return [f[:2] for f in gaps.user_frames(sys._getframe(), kinds)]

    stop_code = inner.__code__
    kinds = {id(stop_code): (stop_code, gaps.OWN)}
    assert inner() == []  # the walk stops at once: inner is a stop here
    kinds.clear()
    first = inner()
    assert first and first[0][0].endswith("inner") and first[0][1] == __file__, first
    assert kinds[id(stop_code)] == (stop_code, gaps.USER)
    # an entry whose id is taken by another code object is not believed
    other = compile("pass", "<elsewhere>", "exec")
    kinds[id(stop_code)] = (other, gaps.OWN)
    assert inner() == first
    # a full cache keeps its stops: a leaf called by the stop, its code new to the cache
    def leaf() -> list:
        return [f[0] for f in gaps.user_frames(sys._getframe(), kinds)]

    def via_stop() -> list:
        return leaf()

    stop_code = via_stop.__code__
    monkeypatch.setattr(gaps, "MAX_KINDS", 2)
    kinds.clear()
    kinds[id(stop_code)] = (stop_code, gaps.OWN)
    kinds[id(other)] = (other, gaps.LIBRARY)
    names = via_stop()
    assert len(names) == 1 and names[0].endswith("leaf"), names
    assert kinds == {id(stop_code): (stop_code, gaps.OWN),
                     id(leaf.__code__): (leaf.__code__, gaps.USER)}


def _gap_source(inst):
    return next(s for s in inst._sources if type(s).__name__ == "GapSource")


def _alarm_expected(gaps) -> None:
    """Where the C tracker runs (CI builds it) the sampler has the overrun alarm."""
    from otel_train import tracker

    if isinstance(gaps.tracker, tracker.CStepTracker or ()):
        assert gaps._alarm is not None, "the C tracker can move the alarm: it was not opened"
    if gaps._alarm is None:
        pytest.skip("this tracker cannot move the overrun alarm (the Python one before 3.13)")


def test_steady_steps_cost_a_look_a_second_and_an_overrun_rings_the_alarm(tmp_path):
    """With the overrun alarm the tracker moves at each step's start, the sampler sleeps
    while steps keep their length: about one look a second of its own (five, at the 200 ms
    gap_sample_s, before the alarm), none rung by the alarm. A 0.4 s host stretch that
    begins just after a look, a second before the next, rings the alarm where its step
    passes 1.5x its typical length, and is named to its line."""
    model, opt = _slow_model(0.04)  # two forwards: ~0.1 s steps, 12 ms of it outside them
    x = torch.randn(2, 4)

    def step(stretch_s: float = 0.0) -> float:
        return _stretched_step(model, opt, x, idle_s=0.012, stretch_s=stretch_s)

    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="alarm") as inst:
        gaps = _gap_source(inst)
        _alarm_expected(gaps)
        deadline = time.monotonic() + 30
        while gaps._alarm_after == 0 or gaps.wakeups < 8:  # typical length known, settled
            step()
            assert time.monotonic() < deadline
        steady = _steady_window(inst, step, 4.0, idle_limit_s=0.045)
        rate, steady_alarms = steady["rate"], steady["alarms"]
        deadline = time.monotonic() + 30
        woke = gaps.wakeups
        while gaps.wakeups == woke:  # right after a look: the next of its own is 1 s away
            step()
            assert time.monotonic() < deadline + 10
        rang = gaps.alarms
        slow_step = inst.tracker.step
        step(0.4)
        step()
        alarms = gaps.alarms - rang
    assert rate <= 1.5, steady  # about one a second (ALARM_FLOOR_S)
    assert steady_alarms <= 1, steady
    assert alarms >= 1, alarms
    # the stretch's own segment: a loaded machine can stall the loop elsewhere as well (a
    # 0.41 s pause in the 12 ms sleep between the forwards was seen once in CI)
    events = [otlp_files.attrs(e) for s in _rank_steps(tmp_path / "alarm")
              if s["attrs"][semconv.ATTR_STEP] >= slow_step
              for e in s.get("events", []) if e["name"] == semconv.EVENT_GAP
              and otlp_files.attrs(e)[semconv.ATTR_GAP_SEGMENT] == "between forward and backward"]
    gap = max(events, key=lambda e: e[semconv.ATTR_GAP_DURATION])
    assert gap[semconv.ATTR_GAP_DURATION] >= 0.39, gap
    assert gap[semconv.ATTR_GAP_SAMPLES] >= 1, gap
    assert str(gap.get(semconv.ATTR_CODE_FUNCTION)).startswith("slow_stretch"), gap


@pytest.mark.parametrize("stretch", [slow_stretch, slow_stretch_split])
def test_a_recurring_stretch_once_located_costs_a_look_a_second_and_is_named_in_every_step(
        tmp_path, stretch):
    """An 80 ms host stretch in every ~100 ms step: once three aimed looks in a row sampled
    it in one function, the sampler looks about once a second (the alarm watches for overruns
    meanwhile), and every step's stretch is named to that line: by its own samples, or by
    the last sampled one of its segment, with the step that was sampled in. A stretch that
    runs half in a generator expression inside its function settles the same: a look that
    lands in either is in that function (once, a look that landed in the function's own
    frame after ones in its generator expression started the count again, at 5 looks a
    second, and CI measured 1.7 a second)."""
    model, opt = _model()
    x = torch.randn(2, 4)

    def step() -> None:
        _stretched_step(model, opt, x, stretch_s=0.08, stretch=stretch)

    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="settled") as inst:
        gaps = _gap_source(inst)
        _alarm_expected(gaps)
        deadline = time.monotonic() + 30
        while gaps._aim_same < gap_sampler.AIM_SETTLED:
            step()
            assert time.monotonic() < deadline
        steady = _steady_window(inst, step, 4.0, drift=0.02)
        first, last = steady["first"], steady["last"]
    # about one a second (ALARM_FLOOR_S)
    assert steady["rate"] <= 1.5, (steady, gaps._aim_same)
    own = carried = 0
    for s in _rank_steps(tmp_path / "settled"):
        number = int(s["attrs"][semconv.ATTR_STEP])
        if not first <= number < last:
            continue
        (gap,) = [otlp_files.attrs(e) for e in s.get("events", [])
                  if e["name"] == semconv.EVENT_GAP
                  and otlp_files.attrs(e)[semconv.ATTR_GAP_DURATION] >= 0.07]
        assert gap[semconv.ATTR_GAP_SEGMENT] == "between forward and backward", gap
        assert str(gap.get(semconv.ATTR_CODE_FUNCTION)).startswith("slow_stretch"), gap
        if gap[semconv.ATTR_GAP_SAMPLES]:
            own += 1
            assert semconv.ATTR_GAP_LOCATION_STEP not in gap, gap
        else:
            carried += 1
            assert first - 40 <= gap[semconv.ATTR_GAP_LOCATION_STEP] < number, gap
    assert own >= 2 and carried >= own, (own, carried)


def test_an_alarm_descriptor_replaced_under_the_sampler_is_dropped_not_spun_on(tmp_path):
    """The alarm's file descriptor closed and reused under the sampler (code that closes
    descriptors it does not own): a poll on it would return at once, forever. The sampler
    notices (a read that is not a timer's), counts it, and goes on without the alarm at
    the 200 ms schedule: no busy loop, training untouched."""
    import os

    from otel_train import internal_errors

    model, opt = _model()
    x = torch.randn(2, 4)

    def step() -> None:
        _stretched_step(model, opt, x, idle_s=0.012)

    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="stolen") as inst:
        gaps = _gap_source(inst)
        _alarm_expected(gaps)
        deadline = time.monotonic() + 30
        while gaps._alarm_after == 0:
            step()
            assert time.monotonic() < deadline
        errors = internal_errors.snapshot().get("gaps", 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, gaps._alarm)  # always readable, reads b"": no timer
        os.close(null)
        while gaps._alarm is not None:
            step()
            assert time.monotonic() < deadline + 10
        start, woke = time.monotonic(), gaps.wakeups
        while time.monotonic() - start < 2.0:
            step()
        rate = (gaps.wakeups - woke) / (time.monotonic() - start)
        assert inst.tracker._alarm_fd == -1
        assert internal_errors.snapshot().get("gaps", 0) == errors + 1
    assert rate <= 1 / inst.config.gap_sample_s + 1.0, rate


def test_a_sample_in_a_generator_expression_or_lambda_counts_as_its_function():
    """The function a look settles on: a generator expression, comprehension or lambda is
    part of the function around it, as Python 3.10 (bare ``<genexpr>``) and 3.11+
    (qualified) name them; a module's own code is itself; an empty stack is none."""
    named = gap_sampler.named_top
    f = ("train.py", 0)
    assert named((("step.<locals>.<genexpr>", *f), ("step", *f), ("main", *f))) == ("step", f[0])
    assert named((("<genexpr>", *f), ("<lambda>", *f), ("step", *f))) == ("step", f[0])
    assert named((("<listcomp>", *f), ("<module>", *f))) == ("<module>", f[0])
    assert named((("<lambda>", *f),)) == ("<lambda>", f[0])
    assert named(()) is None


@pytest.mark.idle_only(reason=(
    "beside two CPU hogs the sampler's aimed looks mostly miss the recurring stretch and its "
    "aim settled in 25 s to over 240 s, or not at all (CI, 2026-12-07): the chase this test "
    "proves needs a settled aim; the sampler's aim under CPU contention is an open problem"))
def test_slow_steps_after_a_settled_recurring_stretch_are_each_chased_from_the_alarm(tmp_path):
    """Issue 53, item 3: the CPU straggler losing its line on 8 NCCL ranks. Each step holds
    a recurring 0.2 s stretch (a host blocked at the batch's copy, there), so the sampler
    aims a look a second at it; then three steps in a row hold 0.6 s of host work between
    forward and backward. The overrun alarm wakes the sampler inside each: that look is not
    the aimed one it was sleeping towards, so it chases what it found (looks again after
    SAMPLE_AGE_S, then three times that): three samples a stretch. Taken for the aimed look,
    it was not followed up, and the next look came where the recurring stretch would be a
    few typical steps on: one or two samples a stretch (1, 1, 1 on rank 7 of 8 NCCL ranks
    on an H100; seen failing here 3 times in 3 with the alarm's look taken for the aimed
    one)."""
    model, opt = _model()
    x = torch.randn(2, 4)

    def step(stretch_s: float = 0.0) -> float:
        return _stretched_step(model, opt, x, idle_s=0.2, stretch_s=stretch_s)

    with otel_train.instrument(model, optimizer=opt, output_dir=tmp_path, run_id="chase") as inst:
        gaps = _gap_source(inst)
        _alarm_expected(gaps)
        # idle, the aim settles in a few seconds; beside CI's two CPU hogs it took 25 s,
        # 28 s, 62 s and over 65 s (the sampler's looks delayed, few of them aimed)
        deadline = time.monotonic() + 240
        while gaps._aim_same < gap_sampler.AIM_SETTLED or gaps._alarm_after == 0:
            step()
            assert time.monotonic() < deadline
        for _ in range(3):
            step()
        first = inst.tracker.step
        for _ in range(3):
            step(0.6)
        for _ in range(2):
            step()
    samples = {}
    for s in _rank_steps(tmp_path / "chase"):
        number = int(s["attrs"][semconv.ATTR_STEP])
        for e in s.get("events", []):
            attrs = otlp_files.attrs(e)
            if (number >= first and e["name"] == semconv.EVENT_GAP
                    and attrs[semconv.ATTR_GAP_SEGMENT] == "between forward and backward"
                    and attrs[semconv.ATTR_GAP_DURATION] >= 0.59):
                samples[number] = attrs[semconv.ATTR_GAP_SAMPLES]
    assert len(samples) == 3 and max(samples) - min(samples) == 2, samples
    assert all(n >= 3 for n in samples.values()), samples
