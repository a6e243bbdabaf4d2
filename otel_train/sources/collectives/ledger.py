"""The emitter thread's book of collectives: pending ones by key until their completion
record arrives, finished ones given to the step that issued them (by time on the
perf_counter clock), the NCCL plugin's records and the flight recorder's entries read on the
emitter's ticks, stalls watched. Definitions of the numbers: docs/collectives.md."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from otel_train import collectives_math, internal_errors, nccl, semconv
from otel_train.export.remote import ctx_tuple
from otel_train.sources.collectives.capture import (
    DONE,
    FLUSH,
    ISSUE,
    RECORD,
    WORK,
)
from otel_train.sources.collectives.flight_recorder import (
    FlightRecorder,
    buffer_size,
    read_interval_s,
)
from otel_train.sources.collectives.plugin_choice import _nccl_groups_bound
from otel_train.sources.collectives.stall import StallWatch
from otel_train.wire import collectives as collective_rows
from otel_train.wire import nccl as nccl_rows
from otel_train.wire.collectives import Spec as RowSpec
from otel_train.wire.nccl import StepSpec, op_name

_COMPUTE = (semconv.PHASE_FORWARD, semconv.PHASE_BACKWARD, semconv.PHASE_OPTIMIZER)
#: how often Works without a future (gloo's asynchronous reduce_scatter) are polled for
#: their completion while one is in flight: the resolution of their durations
_WORK_POLL_S = 0.05


@dataclasses.dataclass(slots=True, eq=False)
class Collective:
    key: int
    op: str
    api: str
    backend: str
    group: str
    group_size: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    async_op: bool
    issue: int  # perf_counter ns
    step: int
    seq: int
    source: str
    done: int | None = None
    error: str | None = None
    work: Any = None
    stalled_at: int = 0
    span_id: int = 0
    gpu_duration_s: float | None = None
    owner: Any = None  # the StepInfo it was counted in, when it completes after its step

    def seconds(self) -> float:
        if self.gpu_duration_s is not None:
            return self.gpu_duration_s
        return max(0, (self.done or self.issue) - self.issue) / 1e9




class Ledger:
    """The emitter thread's book of collectives: pending, finished, and whose step is whose."""

    def __init__(self, ctx: Any) -> None:
        self.emitter = emitter = ctx.emitter
        self.recorder = ctx.recorder
        self.offset = emitter.offset
        self.rank = ctx.identity.rank
        self.run_id = ctx.identity.run_id
        self.base = {semconv.ATTR_RANK: self.rank, semconv.ATTR_RUN_ID: self.run_id}
        self.pending: dict[int, Collective] = {}
        self.finished: list[Collective] = []
        self._for_spans: dict[int, list[Collective]] = {}
        self.stall = StallWatch(ctx.config.stall_timeout_s, ctx.log, self.run_id)
        recorder = FlightRecorder(ctx.identity.world_size)
        self.flight_recorder = recorder if recorder.available() else None
        # NCCL's collectives from otel-train's profiler plugin, when NCCL_PROFILER_PLUGIN
        # names it (the launcher's choice, or instrument()'s with nccl_plugin): records made
        # in C, read in batches, expanded where spans are built (nccl/rows.py); the flight
        # recorder is then read only to notice that NCCL did not load the plugin
        self.plugin = nccl.loaded() if recorder.available() else None
        self._plugin_confirmed = False  # NCCL made a communicator with the plugin
        self._plugin_ops_seen = False  # and called it for an operation
        self._fallback = None
        if self.plugin is not None:
            if self.plugin.has_comms():
                self._plugin_confirmed = True
            elif _nccl_groups_bound():
                self.plugin = None  # NCCL started without it: the flight recorder it is
            if self.plugin is not None:
                self._fallback, self.flight_recorder = self.flight_recorder, None
                self.plugin.read_raw()  # what came before instrumentation belongs to no step
        self._rows = nccl.Records()  # the plugin's records not yet given to a step
        self._rows_for_steps: dict[int, bytes] = {}
        self._clear_before = 0  # perf ns before which every plugin operation has finished
        self._plugin_read_at = 0
        self._stalled: dict[tuple[int, int, int], tuple[int, int, float]] = {}
        self._groups: dict[int, tuple[str, int]] = {}
        self._since = time.perf_counter_ns()
        self._harvested_at = 0  # perf ns of the last flight-recorder read
        #: perf ns at which the last completed read began: a step that ended before it has
        #: every collective it issued in that read (the gate of held steps)
        self._read_began = 0
        # Each read dumps and parses the whole buffer with the GIL held (torch offers no
        # incremental read): measured at 2 GPUs, reading it around every step cost 21% of
        # step time. So it is read every ``nccl_harvest_interval_s``, and finished steps wait
        # (held by the emitter, at most 512) for the first read after them, so their exposed
        # communication still counts their NCCL collectives.
        # The ring buffer overwrites its oldest entries: read before it fills (the interval
        # shortens to the rate of collectives seen), and count what was lost anyway.
        self._configured_interval_s = ctx.config.nccl_harvest_interval_s
        # the first interval is short: the rate is unknown until two reads
        self._harvest_interval_ns = int(min(1.0, self._configured_interval_s) * 1e9)
        self._buffer = buffer_size()
        self._last_read: tuple[int, int] | None = None  # (perf ns, highest record id)
        self._rate = 0.0  # entries a second, the recent peak (halving at each quiet read)
        # reads happen on the emitter's ticks, which wake for them (wake_within), up to a
        # drain's length late
        self._tick_s = min(ctx.config.emit_interval_s, 0.2)
        self.lost = 0
        self.reads = 0
        self.read_s = 0.0  # seconds spent reading the flight recorder (dump, parse, book)
        self.shortest_interval_s = self._harvest_interval_ns / 1e9
        if self.flight_recorder is not None:
            self.flight_recorder.baseline()
        if self.flight_recorder is not None or self.plugin is not None:
            # a second of steps between drains (emit_interval_s), fast ones too
            emitter.hold_steps(self._ready, max_held=512, with_end=True)
        meter = ctx.meter
        self.overlap = semconv.create(meter, semconv.METRIC_COMM_OVERLAP)  # its owner
        emitter.on_event(RECORD, self.on_record)
        emitter.before_step(self._guarded(self.before_step))
        emitter.on_step(self._guarded(self.on_step))
        emitter.on_tick(self.tick)
        self.log = ctx.log
        self._errors = internal_errors.Tally(log_first=3)
        mode = ctx.config.collective_spans
        #: "auto": own spans within the rank's budget, a step summarised past it
        self.budget = (collective_rows.SpanBudget(ctx.config.collective_span_rate)
                       if mode == "auto" else None)
        self.summary = mode == "summary"

    @property
    def errors(self) -> int:
        """Exceptions of step listeners contained (the first three are logged)."""
        return self._errors.errors

    def _guarded(self, listener: Any) -> Any:
        """A step listener that raises would cost the whole step its telemetry: contain it."""
        def guarded(info: Any) -> None:
            try:
                listener(info)
            except Exception as err:
                if self._errors.add(err, "collectives"):
                    self.log.warning("otel_train.collectives_error", error=repr(err))

        return guarded

    # --- records ---------------------------------------------------------------------
    def on_record(self, payload: tuple[Any, ...]) -> None:
        kind = payload[0]
        if kind == ISSUE:
            # (ISSUE, key, op, api, backend, group, group_size, nbytes, dtype, shape,
            #  async_op, t0, step, seq, source): Collective's first fields, in order
            self.pending[payload[1]] = Collective(*payload[1:])
        elif kind == DONE:
            coll = self.pending.pop(payload[1], None)
            if coll is not None:
                coll.done, coll.error = payload[2], payload[3]
                self._finish(coll)
        elif kind == WORK:
            coll = self.pending.get(payload[1])
            if coll is not None:
                coll.work = payload[2]
        elif kind == FLUSH:
            self._harvested_at = 0  # the last read is never skipped
            if self.plugin is not None:
                # what finished on the GPU since the poller's last pass: read it now, or the
                # last operations would end unmeasured (the poller passes every 25 ms)
                self.plugin.complete()
            self.tick()
            if self.plugin is not None:
                self._plugin_flush()
            self.emitter.release_steps(final=True)  # steps held for this read go first
            self._flush(payload[1])

    def _finish(self, coll: Collective) -> None:
        coll.work = None
        if coll.owner is None:
            self.finished.append(coll)
            return
        self._send([coll], coll.owner)  # its step is out already: on its own

    def tick(self) -> None:
        now = time.perf_counter_ns()
        polled = [c for c in self.pending.values() if c.work is not None]
        for coll in polled:
            if coll.work.is_completed():  # non-blocking; Works without a future only
                del self.pending[coll.key]
                coll.done = now
                self._finish(coll)
        if any(c.done is None for c in polled):
            # their completion is seen when polled: keep the resolution they always had
            self.emitter.wake_within(_WORK_POLL_S)
        if self.plugin is not None:
            self._plugin_tick(now)
        elif self.flight_recorder is not None:
            if now - self._harvested_at > self._harvest_interval_ns:
                self._harvest()
            # the next read before the ring can wrap, not at the next drain
            self.emitter.wake_within(
                (self._harvested_at + self._harvest_interval_ns - now) / 1e9)
        _, deadline = self.stall.check(list(self.pending.values()), now)
        if deadline is not None:  # a training thread blocked in it records nothing else
            self.emitter.wake_within((deadline - now) / 1e9)
        # the next issue is drained (its deadline known) before it can stall: binds only
        # where the stall timeout is shorter than the drain interval (or the keep-alive)
        self.emitter.wake_within(self.stall.timeout_ns / 1e9)

    def _harvest(self) -> None:
        assert self.flight_recorder is not None
        self._harvested_at = started = time.perf_counter_ns()
        try:
            self._read_flight_recorder()
        finally:
            self.reads += 1
            self._read_began = started
            self.read_s += (time.perf_counter_ns() - started) / 1e9

    def _read_flight_recorder(self, entries: list[dict[str, Any]] | None = None) -> None:
        fr = self.flight_recorder
        assert fr is not None
        if entries is None:
            entries = fr.poll()
        self._account_for_the_ring(fr)
        for entry in entries:
            key = -1 - int(entry["record_id"])
            coll = self.pending.get(key)
            if coll is None:
                created = int(entry.get("time_created_ns") or 0) - self.offset
                coll = Collective(
                    key, entry["op"], "nccl:" + str(entry.get("profiling_name", "")), "nccl",
                    entry["group"], entry["group_size"], entry["nbytes"],
                    str((entry.get("input_dtypes") or [""])[0]),
                    tuple((entry.get("input_sizes") or [[]])[0]), True, created,
                    self._step_at(created), int(entry.get("collective_seq_id") or 0),
                    "nccl_flight_recorder")
                self.pending[key] = coll
            if not entry["terminal"]:
                continue
            del self.pending[key]
            duration_ms = entry.get("duration_ms")
            if duration_ms is not None:
                coll.gpu_duration_s = float(duration_ms) / 1e3
            completed = entry.get("time_discovered_completed_ns")
            coll.done = (int(completed) - self.offset if completed
                         else coll.issue + int((coll.gpu_duration_s or 0) * 1e9))
            self._finish(coll)

    def _account_for_the_ring(self, fr: FlightRecorder) -> None:
        """Drop what the ring overwrote before it finished (never a stall: it completed, we
        cannot know when), count it with what was never seen, and adapt the read interval."""
        lost, fr.unseen = fr.unseen, 0
        if fr.lowest is not None:
            gone = [k for k, c in self.pending.items()
                    if c.source == "nccl_flight_recorder" and -1 - k < fr.lowest]
            for key in gone:
                del self.pending[key]
            lost += len(gone)
        if lost:
            self.lost += lost
            self.emitter.count_drop(semconv.SIGNAL_NCCL_ENTRIES, lost)
            if self.lost == lost:  # the first time
                self.log.warning(
                    "otel_train.nccl_flight_recorder_overflow", lost=lost, buffer=self._buffer,
                    hint="raise TORCH_FR_BUFFER_SIZE (entries overwritten before a read are "
                         "lost); the read interval now follows the rate of collectives")
        now = time.perf_counter_ns()
        if fr.highest is not None:
            if self._last_read is not None and now > self._last_read[0]:
                rate = (fr.highest - self._last_read[1]) / ((now - self._last_read[0]) / 1e9)
                self._rate = max(rate, self._rate / 2)  # bursts come back: forget slowly
                interval_s = read_interval_s(self._configured_interval_s, self._buffer,
                                             self._rate, self._tick_s)
                self._harvest_interval_ns = int(1e9 * interval_s)
                self.shortest_interval_s = min(self.shortest_interval_s, interval_s)
            self._last_read = (now, fr.highest)

    def _ready(self, step: int, end_perf: int) -> bool:
        if self.plugin is None:
            # every collective issued before the step ended is in a dump begun after it
            return self.flight_recorder is None or end_perf < self._read_began
        if not self._plugin_confirmed:
            # NCCL makes its communicator (and with it the plugin's) inside the first NCCL
            # operation, before it returns: none yet, so nothing of this step to wait for
            if not self.plugin.has_comms():
                return True
            self._plugin_confirmed = True
        if end_perf > self._clear_before and time.perf_counter_ns() - self._plugin_read_at > 5e6:
            self._plugin_read()  # asked again (the last pump): look again, cheaply
        return end_perf <= self._clear_before

    # --- the NCCL profiler plugin ------------------------------------------------------
    def _plugin_read(self) -> None:
        """Copy the plugin's new records. What was in flight is asked first: every operation
        issued before the oldest one still in flight has then finished and been read."""
        plugin = self.plugin
        assert plugin is not None
        self._plugin_read_at = now = time.perf_counter_ns()
        n, oldest = plugin.in_flight()
        data, lost = plugin.read_raw()
        if data:
            self._rows.add(data, self._since)
            self._plugin_confirmed = self._plugin_ops_seen = True
        if lost:
            self._count_lost(lost)
        self._clear_before = oldest[3] if n else now
        if n and now - oldest[3] > self.stall.timeout_ns:
            self._plugin_stall(oldest, now)

    def _plugin_tick(self, now: int) -> None:
        started = time.perf_counter_ns()
        try:
            self._plugin_read()
            if not self._plugin_ops_seen and self._fallback is not None:
                self._maybe_fall_back(now)
        finally:
            self.reads += 1
            self.read_s += (time.perf_counter_ns() - started) / 1e9

    def _maybe_fall_back(self, now: int) -> None:
        """NCCL has run collectives without the plugin (it was named too late, or every
        communicator has one rank: NCCL makes the plugin's context for it and then runs its
        operations without a call): read the flight recorder from now on. Checked once a
        second until the plugin sees an operation start."""
        if now - self._harvested_at < 1e9:
            return
        self._harvested_at = now
        if self.plugin is not None and self.plugin.totals()["started"] > 0:
            self._plugin_ops_seen = True
            return
        fr = self._fallback
        assert fr is not None
        entries = fr.poll()
        if not entries:
            return
        self.log.warning("otel_train.nccl_plugin", used=False,
                         reason="NCCL ran collectives without calling the plugin (its "
                                "communicator existed before instrument() named it, this "
                                "NCCL could not load it, or every communicator has one rank); "
                                f"for the first two, set {nccl.ENV_NCCL}=$(otel-train "
                                "nccl-plugin) in the launcher",
                         fallback="nccl_flight_recorder")
        self.plugin, self.flight_recorder, self._fallback = None, fr, None
        self._read_flight_recorder(entries)
        self._read_began = now  # entries were polled just now

    def _plugin_stall(self, oldest: tuple[int, ...], now: int) -> None:
        comm, seq, nbytes, t_issue = oldest[0], oldest[1], oldest[2], oldest[3]
        key = (comm, seq, oldest[7])
        if key in self._stalled:
            return
        op = op_name(oldest[7])
        group, size = self._group(comm, oldest[13])
        coll = Collective(-1, op, "nccl:" + op, "nccl", group, size, nbytes,
                          nccl.DTYPES[oldest[8]] if oldest[8] < len(nccl.DTYPES) else "", (),
                          True, t_issue, self._step_at(t_issue), seq, "nccl_profiler")
        self.stall.check([coll], now)
        self._stalled[key] = (coll.stalled_at + self.offset, coll.span_id,
                              self.stall.timeout_ns / 1e9)

    def _group(self, comm: int, nranks: int) -> tuple[str, int]:
        group = self._groups.get(comm)
        if group is None:
            name, size, _ = (self.plugin.comms() if self.plugin is not None else {}).get(
                comm, ("", nranks, 0))
            group = self._groups[comm] = (name or f"nccl:{comm:016x}", size)
        return group

    def _plugin_flush(self) -> None:
        """Instrumentation ends: say what NCCL still had in flight (it ends unmeasured)."""
        assert self.plugin is not None
        n, oldest = self.plugin.in_flight()
        if n and oldest is not None and oldest[3] >= self._since:
            self.log.warning("otel_train.nccl_in_flight_at_exit", operations=int(n),
                             oldest_op=op_name(oldest[7]), oldest_seq=oldest[1],
                             pending_s=round((time.perf_counter_ns() - oldest[3]) / 1e9, 3))

    def _count_lost(self, lost: int) -> None:
        self.lost += lost
        self.emitter.count_drop(semconv.SIGNAL_NCCL_ENTRIES, lost)
        if self.lost == lost:  # the first time
            self.log.warning(
                "otel_train.nccl_records_overwritten", lost=lost,
                hint="the NCCL plugin's ring (65536 records) filled between two reads of "
                     "the emitter thread")

    def _step_at(self, perf_ns: int) -> int:
        """The step that issued an NCCL operation, from its time: steps held for a read of
        the flight recorder count (stall logs and spans must carry the issuing step)."""
        return self.emitter.step_at(perf_ns)

    # --- steps -----------------------------------------------------------------------
    def before_step(self, info: Any) -> None:
        if self._rows or self.plugin is not None:
            self._plugin_before_step(info)
        lo, hi = info.start_ns - self.offset, info.end_ns - self.offset
        mine = [c for c in self.finished if c.issue < hi]
        self.finished = [c for c in self.finished if c.issue >= hi]
        late = [c for c in self.pending.values() if c.owner is None and c.issue < hi]
        for coll in late:
            coll.owner = info
        if not mine and not late:
            return
        comm = [(c.issue, c.done or c.issue) for c in mine] + [(c.issue, hi) for c in late]
        blocking = ([(c.issue, c.done or c.issue) for c in mine if not c.async_op]
                    + [(c.issue, hi) for c in late if not c.async_op])
        compute = [(s, e) for phase, _, s, e in info.phase_intervals if phase in _COMPUTE]
        exposed, total = collectives_math.exposed_and_total(comm, blocking, compute, lo, hi)
        info.phase_totals[semconv.PHASE_EXPOSED_COMM] = (
            info.phase_totals.get(semconv.PHASE_EXPOSED_COMM, 0.0) + exposed / 1e9)
        if total > 0:
            self.overlap.set(1.0 - exposed / total, self.base)
        self._for_spans[info.step] = mine

    def _plugin_before_step(self, info: Any) -> None:
        """The step's NCCL operations (issued before its end): exposed communication here,
        spans and points where spans are built (on_step)."""
        lo, hi = info.start_ns - self.offset, info.end_ns - self.offset
        if not self._rows:
            return
        mine, issue, done = self._rows.take_before(hi)
        if not mine:
            return
        compute = [(s, e) for phase, _, s, e in info.phase_intervals if phase in _COMPUTE]
        exposed, total = collectives_math.exposed_and_total(list(zip(issue, done)), [], compute,
                                                            lo, hi)
        info.phase_totals[semconv.PHASE_EXPOSED_COMM] = (
            info.phase_totals.get(semconv.PHASE_EXPOSED_COMM, 0.0) + exposed / 1e9)
        if total > 0:
            self.overlap.set(1.0 - exposed / total, self.base)
        self._rows_for_steps[info.step] = mine

    def _plugin_on_step(self, info: Any) -> None:
        rows = self._rows_for_steps.pop(info.step, None)
        if not rows:
            return
        groups = {comm: self._group(comm, nranks)
                  for comm, nranks in nccl.comms_of(rows).items()}
        stalled = {k: v for k, v in self._stalled.items() if k[0] in groups}
        spec = StepSpec(
            info.step, info.sampled, self._summarise(info, rows),
            ctx_tuple(info.rank_step_context),
            [(ctx, start, end) for _, _, ctx, start, end in info.phase_spans],
            self.offset, self.base, groups, stalled)
        self.emitter.collectives(spec, rows)

    def on_step(self, info: Any) -> None:
        if self._rows_for_steps:
            self._plugin_on_step(info)
        colls = self._for_spans.pop(info.step, [])
        if colls:
            self._send(colls, info)

    # --- output ----------------------------------------------------------------------
    def _summarise(self, info: Any, collectives: Sequence[Any] | bytes) -> bool:
        """Whether a step's collectives (Collective objects, or the plugin's records as the
        bytes it wrote, 64 a collective) become summary spans (docs/collectives.md, "The span
        policy"): always in summary mode, never in all mode; in auto mode when the sampled
        step's collectives would take the rank past its span budget."""
        if self.budget is None or not info.sampled:
            return self.summary
        return self.budget.summarise(nccl_rows.count(collectives), info.end_ns)

    def _send(self, colls: list[Collective], info: Any, end_perf: int | None = None,
              points: bool = True) -> None:
        """The collectives of a step as rows: their spans and points are made where spans
        are built (wire/collectives.py), the exporter process by default."""
        spec = RowSpec(info.step, info.sampled, self._summarise(info, colls),
                       ctx_tuple(info.rank_step_context),
                       [(ctx, start, end) for _, _, ctx, start, end in info.phase_spans],
                       self.base, points)
        self.emitter.collectives(spec, [self._row(c, end_perf) for c in colls])

    def _row(self, coll: Collective, end_perf: int | None) -> collective_rows.Row:
        off = self.offset
        done = coll.done is not None
        end = coll.done if coll.done is not None else (end_perf or coll.issue)
        stalled = ((coll.stalled_at + off, self.stall.timeout_ns / 1e9) if coll.stalled_at
                   else None)
        return (coll.op, coll.api, coll.backend, coll.group, coll.group_size, coll.nbytes,
                coll.dtype, tuple(coll.shape), coll.async_op, coll.issue + off, end + off, done,
                coll.seq, coll.source, coll.gpu_duration_s, stalled, coll.error, coll.span_id)

    def _flush(self, end_perf: int) -> None:
        """Instrumentation ends: what never completed becomes an unfinished span; what ran
        after the last step counts in the metrics only."""
        for coll in list(self.pending.values()):  # never finished: a span, no points
            if coll.owner is not None and coll.owner.sampled:
                self._send([coll], coll.owner, end_perf, points=False)
        self.pending.clear()
        if self.finished:  # after the last step: points, no spans
            spec = RowSpec(self.emitter.steps_emitted, False, self.summary, (0, 0, 0, False),
                           [], self.base)
            self.emitter.collectives(spec, [self._row(c, None) for c in self.finished])
        self.finished = []
        if self._rows:  # NCCL operations after the last step: points, no spans
            rows = self._rows.take_all()
            groups = {comm: self._group(comm, nranks)
                      for comm, nranks in nccl.comms_of(rows).items()}
            spec = StepSpec(self.emitter.steps_emitted, False, self.summary, (0, 0, 0, False),
                            [], self.offset, self.base, groups, {})
            self.emitter.collectives(spec, rows)
