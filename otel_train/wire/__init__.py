"""Everything that crosses a thread or process boundary, in one place.

Two boundaries, four kinds of value:

- training thread -> emitter thread: the hot-path records (``wire/hot_path.py``), plain
  tuples appended to the recorder's buffer; the C tracker checks its layout against these
  at ``configure()``.
- emitter thread -> where spans are built (the exporter process by default, the emitter
  thread itself when export runs in process):

  - one :class:`~otel_train.wire.step.StepRecord` per finished step (``wire/step.py``);
  - a step's collectives as rows (``wire/collectives.py``) or as the NCCL profiler plugin's
    records (``wire/nccl.py``);
  - spans, log records and metric measurements as operations (``wire/messages.py``, with
    the framing of the socket, the exporter's replies and what a lost operation costs).

Each record's module also says what it becomes (its spans and points), so both sides of the
socket agree on what a lost record costs. The training process's side of export
(``otel_train/export``) and the exporter's side (``otel_train/exporter``) import this
package, never each other. No torch here: the exporter process never imports it.
"""

from __future__ import annotations

from opentelemetry.trace import SpanContext, TraceFlags

#: a span context as a plain tuple: (trace_id, span_id, flags, is_remote)
CtxTuple = tuple[int, int, int, bool]


def ctx_tuple(ctx: SpanContext | None) -> CtxTuple | None:
    """A span context as a plain tuple (pickles small and fast); None stays None."""
    if ctx is None:
        return None
    return (ctx.trace_id, ctx.span_id, int(ctx.trace_flags), ctx.is_remote)


def context_of(t: CtxTuple) -> SpanContext:
    """A span context from its plain tuple (as :func:`ctx_tuple` makes it)."""
    return SpanContext(t[0], t[1], t[3], TraceFlags(t[2]))
