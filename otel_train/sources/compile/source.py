"""The compile source: ``CompileSource``, registered in ``instrument.SOURCES``, and what it
keeps of each compilation (see the package's docstring, ``__init__.py``, for what it
observes and docs/compile.md for what it makes).

Three threads run its code: ``start`` and ``stop`` run on the training thread; the dynamo
callbacks it installs (callbacks.py) run on the compiling thread and only put records;
everything else (the records' handler, the polls of torch's compilation metrics, the
pre-step listener, the cross-rank comparison) runs on the emitter thread, whose state it
is alone.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import time
import warnings
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_train import identity, internal_errors, semconv, torch_compat
from otel_train.config import ConfigWarning
from otel_train.recorder import EVENT
from otel_train.sources import RunContext, step_uses
from otel_train.sources.compile import fingerprint as fpmod
from otel_train.sources.compile import records
from otel_train.sources.compile.callbacks import (
    END,
    FINAL,
    SOURCE,
    START,
    CompileCallbacks,
    counter_copy,
)
from otel_train.sources.compile.reasons import GraphBreakReasons, recompile_category

_TRIGGER_KIND = {"LAZY_BACKWARD": records.BACKWARD, "CUDAGRAPH_RECORDING": records.RUNTIME,
                 "TRITON_AUTOTUNING": records.RUNTIME}
_MAX_TEXT = 2000
_now = time.perf_counter_ns


@dataclasses.dataclass
class Compilation:
    """One compilation: a callback pair, its torch record, or both."""

    key: tuple[str | None, str]  # (compile id, kind)
    trigger: str
    step: int | None  # None: outside any step
    phase: str | None = None
    start_perf: int | None = None
    end_perf: int | None = None
    graph_breaks: dict[str, int] = dataclasses.field(default_factory=dict)
    graphs: int | None = None
    record: records.CompileRecord | None = None


def _delta(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int]:
    before = before or {}
    return {k: v - before.get(k, 0) for k, v in (after or {}).items() if v > before.get(k, 0)}


#: how often the ranks' graph fingerprints are compared through the store (a round trip
#: each, ~0.1-0.4 ms of the emitter's time); the last comparison at the end is always made
_COMPARE_EVERY_S = 5.0

class CompileSource:
    """The source registered in ``instrument.SOURCES``."""

    def __init__(self) -> None:
        self.callbacks: CompileCallbacks | None = None
        self._warned: set[str] = set()

    # --- training thread ---------------------------------------------------------------
    def start(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.counters = torch_compat.dynamo_counters()
        self._init_emitter_state(ctx)
        self._limit_at_start = _recompile_limit()
        self.callbacks = CompileCallbacks(ctx.recorder.put, ctx.tracker, self.counters)
        if not self.callbacks.install():
            self.callbacks = None
            self._warn("callbacks", "torch._dynamo.callback.callback_handler is missing: "
                       "compilations are placed in steps by time only")
        missing = records.missing_fields()
        if missing:
            self._warn("fields", "this torch's CompilationMetrics lacks "
                       f"{', '.join(missing)}: those compile attributes are left out")
        ctx.emitter.on_event(SOURCE, self._handle)
        ctx.emitter.before_step(self._before_step)
        ctx.emitter.on_tick(self._poll)

    def stop(self) -> None:
        if self.callbacks is not None:
            self.callbacks.remove()
        self.ctx.recorder.put_always((EVENT, SOURCE, (FINAL,)))

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"otel-train: {message}", ConfigWarning, stacklevel=3)

    # --- emitter thread: state and instruments ---------------------------------------
    def _init_emitter_state(self, ctx: RunContext) -> None:
        meter, ident = ctx.meter, ctx.identity
        self.attrs = {semconv.ATTR_RANK: ident.rank, semconv.ATTR_RUN_ID: ident.run_id}
        self.duration_hist = semconv.create(meter, semconv.METRIC_COMPILE_DURATION)
        self.graph_breaks_ctr = semconv.create(meter, semconv.METRIC_COMPILE_GRAPH_BREAKS)
        self.recompiles_ctr = semconv.create(meter, semconv.METRIC_COMPILE_RECOMPILES)
        self.graphs_ctr = semconv.create(meter, semconv.METRIC_COMPILE_GRAPHS)
        self.limit_ctr = semconv.create(meter, semconv.METRIC_COMPILE_RECOMPILE_LIMIT_HITS)
        self.inconsistent_gauge = semconv.create(meter, semconv.METRIC_COMPILE_INCONSISTENT)
        self.recompiles_ctr.add(0, self.attrs)
        self.graph_breaks_ctr.add(0, self.attrs)
        self.reader = records.RecordReader()
        self.reasons = GraphBreakReasons()
        self._open: dict[tuple[str | None, str], Compilation] = {}
        self._pending: list[Compilation] = []  # waiting for their step to be emitted
        self._unpaired: list[records.CompileRecord] = []  # records without callbacks (yet)
        self._frames: dict[int, str] = {}  # frame id -> frame, for records without co_name
        self._reasons_by_id: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._emitted_without_record: collections.deque[tuple[Any, ...]] = collections.deque(
            maxlen=256)
        self._steps: collections.deque[tuple[int, int, int, SpanContext]] = collections.deque(
            maxlen=256)  # (step, start wall, end wall, rank step ctx) of emitted steps
        self._gb_seen = counter_copy(self.counters, "graph_break") or {}
        self._graphs_seen = (counter_copy(self.counters, "stats") or {}).get("unique_graphs", 0)
        self.fingerprint = fpmod.Fingerprint()
        self._exchange: fpmod.Exchange | None | bool = None  # False: unavailable
        self._steps_done = 0
        self._last_compare = -1e9
        self.mismatch_reported = False
        self.inconsistent_gauge.set(0, self.attrs)

    # --- emitter thread: events --------------------------------------------------------
    def _handle(self, payload: tuple[Any, ...]) -> None:
        kind = payload[0]
        if kind == START:
            _, compile_id, trigger, now, step, phase, gb, stats = payload
            comp = Compilation((compile_id, _TRIGGER_KIND.get(trigger, records.FORWARD)),
                               trigger, step, phase, start_perf=now)
            comp.graph_breaks, comp.graphs = gb or {}, (stats or {}).get("unique_graphs", 0)
            self._open[comp.key] = comp
        elif kind == END:
            _, compile_id, trigger, now, gb, stats = payload
            comp = self._open.pop((compile_id, _TRIGGER_KIND.get(trigger, records.FORWARD)),
                                  None)
            if comp is None:
                return
            comp.end_perf = now
            comp.graph_breaks = _delta(comp.graph_breaks, gb)
            comp.graphs = max(0, (stats or {}).get("unique_graphs", 0) - (comp.graphs or 0))
            self._pending.append(comp)
            self._poll()
        elif kind == FINAL:
            self._poll()
            self._flush(final=True)
            self._consistency(final=True)

    def _poll(self) -> None:
        """Read new torch records and counters; pair records with callbacks."""
        if self.callbacks is not None:
            try:
                self.callbacks.register()  # a reset (or explain()) since the last poll cleared them
            except Exception as err:
                internal_errors.count("compile", err)
        for rec in self.reader.read():
            self._on_record(rec)
        if self.reader.possibly_missed:
            self.reader.possibly_missed = False
            self._emit_log("warning", "otel_train.compile.records_missed", self._step_ids(),
                           detail="more than 64 compilations between two reads; "
                                  "some compile spans lack torch's details")
        self._count_from_counters()
        unpaired = []
        for rec in self._unpaired:
            comp = self._find_pending(rec)
            if comp is not None:
                comp.record = rec
            else:
                unpaired.append(rec)
        self._unpaired = unpaired

    def _find_pending(self, rec: records.CompileRecord) -> Compilation | None:
        for comp in self._pending:
            if comp.record is None and comp.key == (rec.compile_id, rec.kind):
                return comp
        return None

    def _on_record(self, rec: records.CompileRecord) -> None:
        if rec.frame_id is not None and rec.frame:
            self._frames[rec.frame_id] = rec.frame
        elif rec.frame_id is not None and rec.frame is None:
            rec.frame = self._frames.get(rec.frame_id)
        if rec.kind == records.FORWARD:
            self._count_recompile(rec)
        if (rec.compile_id, rec.kind) in self._emitted_without_record:
            return  # its span went out before the record arrived
        comp = self._find_pending(rec)
        if comp is not None:
            comp.record = rec
        else:
            self._unpaired.append(rec)

    def _count_recompile(self, rec: records.CompileRecord) -> None:
        if rec.recompile_limit_hit:
            self.limit_ctr.add(1, {**self.attrs, semconv.ATTR_COMPILE_FRAME: rec.frame or ""})
            return
        if rec.guard_failure or rec.frame_compile:
            reason = recompile_category(rec.guard_failure)
            self.recompiles_ctr.add(1, {**self.attrs, semconv.ATTR_COMPILE_REASON: reason})

    def _count_from_counters(self) -> None:
        gb = counter_copy(self.counters, "graph_break") or {}
        if any(gb.get(k, 0) < v for k, v in self._gb_seen.items()):
            self._gb_seen = {}  # someone cleared dynamo's counters: count from zero again
        for message, n in _delta(self._gb_seen, gb).items():
            self.graph_breaks_ctr.add(n, {**self.attrs,
                                          semconv.ATTR_COMPILE_REASON: self.reasons.label(message)})
        self._gb_seen = gb
        graphs = (counter_copy(self.counters, "stats") or {}).get("unique_graphs", 0)
        if graphs < self._graphs_seen:
            self._graphs_seen = 0
        if graphs > self._graphs_seen:
            self.graphs_ctr.add(graphs - self._graphs_seen, self.attrs)
        self._graphs_seen = graphs

    # --- emitter thread: steps ---------------------------------------------------------
    @step_uses(writes=("compile_intervals", "phase_totals"))
    def _before_step(self, info: Any) -> None:
        record = info.record  # the step's wire fields
        self._steps.append((record.step, record.start_ns, record.end_ns,
                            info.rank_step_context))
        self._steps_done = record.step + 1
        if self._pending or self.callbacks is None:
            # a compilation ended (its record pairs now), or no callbacks place them: read
            # torch's records for this step; otherwise once per drain (on_tick) is enough
            self._poll()
        total = 0.0
        keep = []
        for comp in self._pending:
            if comp.step is not None and comp.step <= record.step:
                interval = self._emit(comp, self._step_parent(comp.step))
                if comp.step == record.step and interval is not None:
                    total += self._add_interval(info, interval)
            else:
                keep.append(comp)
        self._pending = keep
        unpaired = []
        for rec in self._unpaired:
            if rec.start_ns is not None and rec.start_ns < record.end_ns:
                step = self._step_at(rec.start_ns)
                comp = Compilation((rec.compile_id, rec.kind), "untracked", step, record=rec)
                parent = self._step_parent(step) if step is not None else self._run_parent()
                interval = self._emit(comp, parent)
                if step == record.step and interval is not None:
                    total += self._add_interval(info, interval)
            else:
                unpaired.append(rec)
        self._unpaired = unpaired
        if total > 0:
            totals = record.phase_totals
            totals[semconv.PHASE_COMPILE] = totals.get(semconv.PHASE_COMPILE, 0.0) + total
        self._consistency()

    @staticmethod
    def _add_interval(info: Any, interval: tuple[int, int]) -> float:
        """A compilation of the step: its interval for the step's parts, its seconds."""
        info.compile_intervals.append(interval)
        return max(0, interval[1] - interval[0]) / 1e9

    def _step_at(self, wall_ns: int) -> int | None:
        for step, start, end, _ in reversed(self._steps):
            if start <= wall_ns < end:
                return step
        return None

    def _step_parent(self, step: int) -> SpanContext:
        for known, _, _, ctx in reversed(self._steps):
            if known == step:
                return ctx
        return self.ctx.emitter.step_context(step)

    def _run_parent(self) -> SpanContext:
        return self.ctx.emitter.run_context

    def _flush(self, final: bool) -> None:
        for comp in self._pending:
            known = comp.step is not None and any(s == comp.step for s, *_ in self._steps)
            self._emit(comp, self._step_parent(comp.step) if known else self._run_parent())
        self._pending = []
        for rec in self._unpaired:
            step = self._step_at(rec.start_ns) if rec.start_ns is not None else None
            comp = Compilation((rec.compile_id, rec.kind), "untracked", step, record=rec)
            self._emit(comp, self._step_parent(step) if step is not None else self._run_parent())
        self._unpaired = []

    # --- emitter thread: one span ------------------------------------------------------
    def _emit(self, comp: Compilation, parent: SpanContext) -> tuple[int, int] | None:
        """The compilation's span, point and log; its (start, end), wall-clock ns, or None
        where its times are not known."""
        emitter, rec = self.ctx.emitter, comp.record
        if comp.start_perf is not None and comp.end_perf is not None:
            start, end = emitter.wall(comp.start_perf), emitter.wall(comp.end_perf)
        elif rec is not None and rec.start_ns is not None:
            start = rec.start_ns
            end = start + (rec.duration_ns or 0)
        else:
            return None
        if rec is None:
            self._emitted_without_record.append(comp.key)
        attrs = self._span_attributes(comp, rec)
        is_step = parent is not self._run_parent()
        if is_step and comp.step is not None:
            attrs[semconv.ATTR_STEP] = comp.step
        span_ctx = emitter.span(semconv.SPAN_COMPILE, parent, start, end, attrs)
        seconds = max(0, end - start) / 1e9
        sampled = span_ctx.trace_flags.sampled
        exemplar = trace.set_span_in_context(NonRecordingSpan(span_ctx)) if sampled else None
        self.duration_hist.record(seconds, {**self.attrs, semconv.ATTR_COMPILE_TRIGGER:
                                            attrs[semconv.ATTR_COMPILE_TRIGGER]},
                                  context=exemplar)
        self._log(comp, attrs, parent, span_ctx, seconds)
        return start, end

    def _span_attributes(self, comp: Compilation, rec: records.CompileRecord | None) -> dict:
        trigger = comp.trigger.lower()
        attrs: dict[str, Any] = {
            **self.attrs, semconv.ATTR_COMPILE_ID: comp.key[0] or "",
            semconv.ATTR_COMPILE_TRIGGER: trigger,
        }
        if comp.phase:
            attrs[semconv.ATTR_PHASE] = comp.phase
        breaks = comp.graph_breaks
        if rec is not None and not breaks and comp.start_perf is None:
            breaks = {r: 1 for r in rec.restart_reasons}
        attrs[semconv.ATTR_COMPILE_GRAPH_BREAKS] = sum(breaks.values())
        if breaks:
            attrs[semconv.ATTR_COMPILE_GRAPH_BREAK_REASONS] = [r[:_MAX_TEXT] for r in breaks]
        if comp.graphs is not None:
            attrs[semconv.ATTR_COMPILE_GRAPHS] = comp.graphs
        reason = self._reason(comp, rec)
        attrs[semconv.ATTR_COMPILE_REASON] = reason
        if rec is None:
            return attrs
        if rec.frame:
            attrs[semconv.ATTR_COMPILE_FRAME] = rec.frame
        if rec.guard_failure:
            attrs[semconv.ATTR_COMPILE_GUARD_FAILURE] = rec.guard_failure[:_MAX_TEXT]
        for name, value in ((semconv.ATTR_COMPILE_GRAPH_OPS, rec.graph_ops),
                            (semconv.ATTR_COMPILE_GUARDS, rec.guards),
                            (semconv.ATTR_COMPILE_CUDAGRAPH_SKIP_REASON,
                             rec.cudagraph_skip_reason),
                            (semconv.ATTR_COMPILE_FAIL_TYPE, rec.fail_type),
                            (semconv.ATTR_COMPILE_FAIL_REASON,
                             rec.fail_reason[:_MAX_TEXT] if rec.fail_reason else None)):
            if value is not None:
                attrs[name] = value
        for key, seconds in rec.times.items():
            attrs[semconv.ATTR_COMPILE_TIME_PREFIX + key] = seconds
        for key, count in rec.cache.items():
            attrs[semconv.ATTR_COMPILE_CACHE_PREFIX + key] = count
        if rec.recompile_limit_hit:
            attrs[semconv.ATTR_COMPILE_RECOMPILE_LIMIT_HIT] = True
            limit = _recompile_limit(rec.fail_reason) or self._limit_at_start
            if limit is not None:
                attrs[semconv.ATTR_COMPILE_RECOMPILE_LIMIT] = limit
        elif rec.kind == records.FORWARD and rec.has_guarded_code and rec.graph_ops is not None:
            frame = _portable_frame(rec)
            attrs[semconv.ATTR_COMPILE_FINGERPRINT] = self.fingerprint.add(
                comp.step if comp.step is not None else -1, frame, rec.graph_ops, rec.guards,
                rec.shapes)
        return attrs

    def _reason(self, comp: Compilation, rec: records.CompileRecord | None) -> str:
        compile_id = comp.key[0]
        if rec is None or rec.kind != records.FORWARD:
            return self._reasons_by_id.get(compile_id or "", semconv.COMPILE_REASON_FIRST)
        if rec.recompile_limit_hit:
            reason = semconv.COMPILE_REASON_RECOMPILE_LIMIT
        elif rec.guard_failure:
            reason = recompile_category(rec.guard_failure)
        elif rec.frame_compile:
            reason = semconv.COMPILE_REASON_UNKNOWN
        else:
            reason = semconv.COMPILE_REASON_FIRST
        if compile_id:
            self._reasons_by_id[compile_id] = reason
            while len(self._reasons_by_id) > 256:
                self._reasons_by_id.popitem(last=False)
        return reason

    def _log(self, comp: Compilation, attrs: dict, parent: SpanContext, span_ctx: SpanContext,
             seconds: float) -> None:
        span_id = span_ctx.span_id if span_ctx.trace_flags.sampled else parent.span_id
        ids = {semconv.CONSOLE_TRACE_ID: f"{parent.trace_id:032x}",
               semconv.CONSOLE_SPAN_ID: f"{span_id:016x}",
               semconv.LOG_STEP: comp.step, semconv.LOG_PHASE: semconv.PHASE_COMPILE,
               semconv.LOG_DURATION: round(seconds, 6)}
        # the training.compile span's attribute names
        named = {semconv.ATTR_COMPILE_FRAME: attrs.get(semconv.ATTR_COMPILE_FRAME)}
        if attrs.get(semconv.ATTR_COMPILE_RECOMPILE_LIMIT_HIT):
            named.update({
                semconv.ATTR_COMPILE_RECOMPILE_LIMIT: attrs.get(semconv.ATTR_COMPILE_RECOMPILE_LIMIT),
                semconv.ATTR_COMPILE_GUARD_FAILURE: attrs.get(semconv.ATTR_COMPILE_GUARD_FAILURE)})
            self._emit_log("warning", semconv.LOG_COMPILE_RECOMPILE_LIMIT, ids, **named,
                           detail="the frame hit the recompile limit and now runs eagerly")
        else:
            named.update({
                semconv.ATTR_COMPILE_REASON: attrs[semconv.ATTR_COMPILE_REASON],
                semconv.ATTR_COMPILE_TRIGGER: attrs[semconv.ATTR_COMPILE_TRIGGER],
                semconv.ATTR_COMPILE_GRAPH_BREAKS: attrs[semconv.ATTR_COMPILE_GRAPH_BREAKS]})
            self._emit_log("info", semconv.LOG_COMPILE, ids, **named)

    def _step_ids(self) -> dict[str, Any]:
        """Log ids of the last step this rank finished (its training.rank_step span)."""
        step = max(self._steps_done - 1, 0)
        run_id, rank = self.ctx.identity.run_id, self.ctx.identity.rank
        return {semconv.CONSOLE_TRACE_ID: f"{identity.step_trace_id(run_id, step):032x}",
                semconv.CONSOLE_SPAN_ID:
                    f"{identity.rank_step_span_id(run_id, step, rank):016x}",
                semconv.LOG_STEP: step}

    def _emit_log(self, level: str, event: str, ids: dict[str, Any], **fields: Any) -> None:
        """A log line from the emitter thread: straight to OTel logs (a bridged structlog
        line would go through the recorder, which the emitter's last pass no longer reads)
        and to the console."""
        fields = {k: v for k, v in fields.items() if v is not None}
        trace_hex = ids.get(semconv.CONSOLE_TRACE_ID)
        span_hex = ids.get(semconv.CONSOLE_SPAN_ID)
        self.ctx.emitter.emit_log(level, event, {**ids, **fields},
                                  int(trace_hex, 16) if trace_hex else 0,
                                  int(span_hex, 16) if span_hex else 0)

    # --- emitter thread: cross-rank consistency ----------------------------------------
    def _consistency(self, final: bool = False) -> None:
        ident = self.ctx.identity
        if ident.world_size < 2 or self._exchange is False:
            return
        now = time.monotonic()
        if not final and now - self._last_compare < _COMPARE_EVERY_S:
            return
        self._last_compare = now
        try:
            if self._exchange is None:
                store = fpmod.open_store(timeout_s=5.0)
                if store is None:
                    self._exchange = False
                    return
                self._exchange = fpmod.Exchange(
                    store, f"otel_train/{ident.run_id}/compile", ident.rank, ident.world_size)
            exchange = self._exchange
            exchange.publish(self.fingerprint, self._steps_done, force=final)
            mismatch = exchange.compare(self.fingerprint, self._steps_done)
            deadline = now + 3.0
            while final and mismatch is None and self._pending_comparison(exchange) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)  # the reference rank's last entries may still be on the way
                mismatch = exchange.compare(self.fingerprint, self._steps_done)
        except Exception as err:
            self._exchange = False
            self._emit_log("warning", "otel_train.compile.consistency_unavailable",
                           self._step_ids(),
                           error=repr(err))
            return
        if mismatch is not None and not self.mismatch_reported:
            self._report_mismatch(*mismatch)

    def _pending_comparison(self, exchange: fpmod.Exchange) -> bool:
        return exchange.rank != fpmod.REFERENCE_RANK and exchange.verified < len(
            self.fingerprint.entries)

    def _report_mismatch(self, kind: str, index: int) -> None:
        self.mismatch_reported = True
        attrs = {**self.attrs, semconv.ATTR_COMPILE_INCONSISTENCY: kind}
        self.inconsistent_gauge.set(1, attrs)
        self._emit_log(
            "warning", semconv.LOG_COMPILE_INCONSISTENT, self._step_ids(),
            **{semconv.ATTR_COMPILE_INCONSISTENCY: kind,
               semconv.ATTR_COMPILE_FINGERPRINT: self.fingerprint.value},
            graph_index=index, reference_rank=fpmod.REFERENCE_RANK,
            detail=("this rank compiled a different graph than the reference rank"
                    if kind == fpmod.GRAPH else
                    "this rank and the reference rank compiled a different number of graphs"))


def _recompile_limit(fail_reason: str | None = None) -> int | None:
    """The limit a frame hit: from dynamo's message (it names the value), else the config.
    Dynamo's config is per thread (context variables) in recent torch: read it only on the
    training thread."""
    match = re.search(r"currently set to (\d+)", fail_reason or "")
    if match:
        return int(match.group(1))
    if fail_reason is not None:
        return None
    return torch_compat.recompile_limit()


def _portable_frame(rec: records.CompileRecord) -> str:
    # file paths may differ between ranks' images or checkouts: name, file name and line
    return f"{rec.co_name}@{os.path.basename(rec.filename or '')}:{rec.line}"
