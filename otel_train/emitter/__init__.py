"""The background thread: records from the hot path become steps, rows and log records.

Off the training thread, the emitter puts the hot path's records (``wire/hot_path.py``)
together and hands on plain values: one ``StepRecord`` per step (``wire/step.py``), a step's
collectives as rows (``wire/collectives.py``), log records and metric points. The spans,
points and log records themselves are made where spans are built: the exporter process by
default, else the Pipeline on this thread. Its parts:

- ``core.py``: :class:`Emitter`, the thread (sleeping until there is work, draining, handing
  each record to its part) and the sources' door (``sources.SourceHost``);
- ``steps.py``: phases to steps, steps to records, the step listeners, held steps, sampling;
- ``work.py``: a step's working state beside its record (``StepWork``), and the order of the
  listeners that work on it (their declared fields);
- ``logs.py``: log records, redacted and bounded;
- ``accounts.py``: what was dropped and what went wrong, as counters;
- ``pipeline.py``: what the emitter calls on a pipeline (the ``Pipeline`` protocol: the
  exporter process's, or the in-process one).
"""

from otel_train.emitter.core import Emitter

__all__ = ["Emitter"]
