"""Compile telemetry: every torch.compile compilation as a span in its step's trace, metrics
for compile time, graph breaks, recompiles and the recompile limit, and a cross-rank check
that every rank compiled the same graphs. See docs/compile.md.

Three torch sources, each read where it is safe to:

- ``torch._dynamo.callback`` start/end callbacks, on the compiling thread under dynamo's
  callback lock (callbacks.py): they only append one tuple to the recorder;
- ``torch._dynamo.utils.get_compilation_metrics()``: read incrementally on the emitter
  thread (records.py) and joined to the callbacks by (compile id, kind);
- ``torch._dynamo.utils.counters``: graph breaks and graphs, on the emitter thread.

Spans are emitted when the step they belong to is emitted (a ``before_step`` listener, which
also adds their time to the step's ``compile`` phase total) or, for compilations outside
any step, under ``training.run`` when the run ends.

Its modules: ``source.py`` (:class:`CompileSource`, the source itself), ``callbacks.py``
(dynamo's callbacks), ``records.py`` (torch's compilation metrics), ``fingerprint.py`` (the
ranks' graph fingerprints compared), ``reasons.py`` (graph-break and recompile reasons).
"""

from otel_train.sources.compile.source import Compilation, CompileSource

__all__ = ["Compilation", "CompileSource"]
