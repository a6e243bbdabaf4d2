"""NCCL's collectives from otel-train's profiler plugin, when ``NCCL_PROFILER_PLUGIN`` names
it (the launcher's choice, or instrument()'s with ``nccl_plugin``): records made in C, copied
in batches on the emitter's ticks and kept as the plugin wrote them, given to the step that
issued them, and expanded where spans are built (wire/nccl.py). A held step is released once
every operation issued before its end has finished and been read. A stall is noticed from
the oldest operation in flight. If NCCL runs collectives without calling the plugin, the
flight recorder takes over (the route kept for that until the plugin sees an operation): this
route gives up, and the flight recorder's, which it superseded, reads from then on
(routes.py)."""

from __future__ import annotations

import time
from typing import Any

from otel_train import nccl
from otel_train.sources.collectives.assembly import Assembly
from otel_train.sources.collectives.book import Collective
from otel_train.sources.collectives.fr_route import FlightRecorderRoute
from otel_train.sources.collectives.plugin_choice import _nccl_groups_bound
from otel_train.sources.collectives.reads import ReadAccount
from otel_train.sources.collectives.route import Parts, Route
from otel_train.sources.collectives.stall import StallWatch
from otel_train.wire.nccl import op_name

#: 8-byte words a plugin record (the communicator hash is its first)
_RECORD_WORDS = nccl.RECORD.size // 8
#: a held step's gate reads again when asked, at most this often (perf ns)
_REREAD_NS = 5e6


class PluginRoute(Route):
    """Reads the plugin's records, gives each step its own, and watches the oldest in flight."""

    name = mechanism = "nccl_profiler_plugin"
    covers = frozenset({"nccl"})
    holds_steps = True

    def __init__(self, plugin: nccl.Plugin, confirmed: bool, ctx: Any, assembly: Assembly,
                 stall: StallWatch, account: ReadAccount, fallback: FlightRecorderRoute) -> None:
        self.plugin = plugin
        self.emitter = ctx.emitter
        self.log = ctx.log
        self.offset = ctx.emitter.offset
        self.assembly = assembly
        self.stall = stall
        self.account = account
        self.fallback: FlightRecorderRoute | None = fallback
        self.confirmed = confirmed  # NCCL made a communicator with the plugin
        self._ops_seen = False  # and called it for an operation
        plugin.read_raw()  # what came before instrumentation belongs to no step
        self._since = time.perf_counter_ns()
        self.rows = nccl.Records()  # the plugin's records not yet given to a step
        self._rows_for_steps: dict[int, bytes] = {}
        self._clear_before = 0  # perf ns before which every plugin operation has finished
        self._read_at = 0
        self._checked_at = 0  # perf ns of the last check for running without the plugin
        #: stalled operations not yet given to a step: (comm, seq, func) -> (stalled at, epoch
        #: ns; span id; timeout s); each leaves with the step that takes its record
        self._stalled: dict[tuple[int, int, int], tuple[int, int, float]] = {}
        self._groups: dict[int, tuple[str, int]] = {}
        #: the communicators of the last step's records and their groups (a comm's group is
        #: fixed once seen, so steps on the same communicators share one read-only dict:
        #: pickled once a batch)
        self._step_comms: set[int] = set()
        self._step_groups: dict[int, tuple[str, int]] = {}

    def read_at_next_tick(self) -> None:
        self._checked_at = 0

    def complete(self) -> None:
        """What finished on the GPU since the poller's last pass: read it now, or the last
        operations would end unmeasured (the poller passes only now and then)."""
        self.plugin.complete()

    def ready(self, end_perf: int) -> bool:
        if not self.confirmed:
            # NCCL makes its communicator (and with it the plugin's) inside the first NCCL
            # operation, before it returns: none yet, so nothing of this step to wait for
            if not self.plugin.has_comms():
                return True
            self.confirmed = True
        if end_perf > self._clear_before and time.perf_counter_ns() - self._read_at > _REREAD_NS:
            self._read()  # asked again (the last pump): look again, cheaply
        return end_perf <= self._clear_before

    def tick(self, now: int) -> bool:
        """Read the plugin's new records: False when the flight recorder takes over."""
        with self.account.timed():
            self._read()
            if not self._ops_seen and self.fallback is not None:
                return not self._maybe_fall_back(now)
        return True

    def _read(self) -> None:
        """Copy the plugin's new records. What was in flight is asked first: every operation
        issued before the oldest one still in flight has then finished and been read."""
        plugin = self.plugin
        self._read_at = now = time.perf_counter_ns()
        n, oldest = plugin.in_flight()
        data, lost = plugin.read_raw()
        if data:
            self.rows.add(data, self._since)
            self.confirmed = self._ops_seen = True
        if lost and self.account.lose(lost):
            self.log.warning(
                "otel_train.nccl_records_overwritten", lost=lost,
                hint="the NCCL plugin's ring (65536 records) filled between two reads of "
                     "the emitter thread")
        self._clear_before = oldest[3] if n else now
        if n and now - oldest[3] > self.stall.timeout_ns:
            self._stall(oldest, now)

    def _maybe_fall_back(self, now: int) -> bool:
        """NCCL has run collectives without the plugin (it was named too late, or every
        communicator has one rank: NCCL makes the plugin's context for it and then runs its
        operations without a call): read the flight recorder from now on (True). Checked
        once a second until the plugin sees an operation start."""
        if now - self._checked_at < 1e9:
            return False
        self._checked_at = now
        if self.plugin.totals()["started"] > 0:
            self._ops_seen = True
            return False
        fallback = self.fallback
        assert fallback is not None
        entries = fallback.fr.poll()
        if not entries:
            return False
        self.log.warning("otel_train.nccl_plugin", used=False,
                         reason="NCCL ran collectives without calling the plugin (its "
                                "communicator existed before instrument() named it, this "
                                "NCCL could not load it, or every communicator has one rank); "
                                f"for the first two, set {nccl.ENV_NCCL}=$(otel-train "
                                "nccl-plugin) in the launcher",
                         fallback="nccl_flight_recorder")
        self.fallback = None
        fallback.take_over(entries, now)
        return True

    def _stall(self, oldest: tuple[int, ...], now: int) -> None:
        comm, seq, nbytes, t_issue = oldest[0], oldest[1], oldest[2], oldest[3]
        key = (comm, seq, oldest[7])
        if key in self._stalled:
            return
        op = op_name(oldest[7])
        group, size = self._group(comm, oldest[13])
        coll = Collective(-1, op, "nccl:" + op, "nccl", group, size, nbytes,
                          nccl.DTYPES[oldest[8]] if oldest[8] < len(nccl.DTYPES) else "", (),
                          True, t_issue, self.emitter.step_at(t_issue), seq, "nccl_profiler")
        self.stall.check([coll], now)
        self._stalled[key] = (coll.stalled_at + self.offset, coll.span_id,
                              self.stall.timeout_ns / 1e9)

    def _group(self, comm: int, nranks: int) -> tuple[str, int]:
        group = self._groups.get(comm)
        if group is None:
            name, size, _ = self.plugin.comms().get(comm, ("", nranks, 0))
            group = self._groups[comm] = (name or f"nccl:{comm:016x}", size)
        return group

    def _groups_of(self, rows: bytes) -> dict[int, tuple[str, int]]:
        return {comm: self._group(comm, nranks) for comm, nranks in nccl.comms_of(rows).items()}

    def before_step(self, info: Any) -> None:
        """The step's NCCL operations (issued before its end): exposed communication here,
        spans and points where spans are built (:meth:`on_step`)."""
        if not self.rows:
            return
        mine, issue, done = self.rows.take_before(info.end_ns - self.offset)
        if not mine:
            return
        self.assembly.count_exposed(info, list(zip(issue, done)), [])
        self._rows_for_steps[info.step] = mine

    def on_step(self, info: Any) -> None:
        rows = self._rows_for_steps.pop(info.step, None)
        if not rows:
            return
        comms = set(memoryview(rows).cast("Q")[0::_RECORD_WORDS].tolist())
        if comms == self._step_comms:
            groups = self._step_groups
        else:
            groups = self._step_groups = self._groups_of(rows)
            self._step_comms = comms
        stalled = self._stalled_in(rows) if self._stalled else {}
        self.assembly.send_nccl(info, rows, groups, stalled)

    def _stalled_in(self, rows: bytes) -> dict[tuple[int, int, int], tuple[int, int, float]]:
        """The stalled operations among a step's records, taken out of those kept: each has
        finished (it is a record) and goes out once, with its step."""
        keys = {(r[0], r[1], r[7]) for r in nccl.RECORD.iter_unpack(rows)}
        found = {k: self._stalled.pop(k) for k in keys & self._stalled.keys()}
        return found

    def flush(self) -> None:
        """Instrumentation ends: say what NCCL still had in flight (it ends unmeasured)."""
        n, oldest = self.plugin.in_flight()
        if n and oldest is not None and oldest[3] >= self._since:
            self.log.warning("otel_train.nccl_in_flight_at_exit", operations=int(n),
                             oldest_op=op_name(oldest[7]), oldest_seq=oldest[1],
                             pending_s=round((time.perf_counter_ns() - oldest[3]) / 1e9, 3))

    def flush_rows(self) -> None:
        """NCCL operations after the last step: points, no spans."""
        if self.rows:
            rows = self.rows.take_all()
            self.assembly.send_nccl_after_steps(rows, self._groups_of(rows))


def build(parts: Parts) -> PluginRoute | None:
    """The plugin's route, where ``NCCL_PROFILER_PLUGIN`` names ours and NCCL may have loaded
    it; only beside the flight recorder's route (NCCL process groups), which it supersedes
    and falls back to (None elsewhere)."""
    fallback = parts.built.get(FlightRecorderRoute.name)
    if not isinstance(fallback, FlightRecorderRoute):
        return None
    plugin = nccl.loaded()
    confirmed = plugin is not None and plugin.has_comms()
    if plugin is not None and not confirmed and _nccl_groups_bound():
        plugin = None  # NCCL started without it: the flight recorder it is
    if plugin is None:
        return None
    # the flight recorder is then read only to notice that NCCL did not load it
    return PluginRoute(plugin, confirmed, parts.ctx, parts.assembly, parts.stall, parts.account,
                       fallback)
