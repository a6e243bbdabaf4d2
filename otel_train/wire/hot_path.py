"""The records the training thread appends to the recorder's buffer (``recorder.py``), and
what each field is. The Python tracker builds them in ``tracker.py``, the C tracker in
``_fastpath.c``; ``tracker.py`` hands these layouts to the C tracker at ``configure()``,
which refuses to run (the Python tracker then does) if its own differ.
"""

from __future__ import annotations

from otel_train import semconv

# Record kinds: the first element of every record tuple.
PHASE = "phase"
STEP = "step"
LOG = "log"
EVENT = "event"

#: (PHASE, step, phase, micro, start_ns, end_ns, span_id): perf_counter ns; span id 0 where
#: nobody asked for the phase's span id while it ran (the emitter makes one)
PHASE_FIELDS = ("kind", "step", "phase", "micro", "start_ns", "end_ns", "span_id")
#: (STEP, step, start_ns, end_ns, micro_batches, samples, tokens): perf_counter ns
STEP_FIELDS = ("kind", "step", "start_ns", "end_ns", "micro_batches", "samples", "tokens")
#: (LOG, time_ns, level, event, fields, scope): the ids ride in fields (log_capture.py)
LOG_FIELDS = ("kind", "time_ns", "level", "event", "fields", "scope")
#: (EVENT, source, payload): records of the sources/ modules, given to their handlers
EVENT_FIELDS = ("kind", "source", "payload")

#: the signal a record that could not be buffered would have become
SIGNAL_OF_KIND = {
    PHASE: semconv.SIGNAL_SPANS,
    STEP: semconv.SIGNAL_SPANS,
    LOG: semconv.SIGNAL_LOGS,
    EVENT: semconv.SIGNAL_SPANS,
}
