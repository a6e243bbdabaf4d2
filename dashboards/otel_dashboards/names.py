"""Prometheus names of the telemetry contract, as the dashboards query them.

Where ``otel_train/semconv.py`` already spells a Prometheus name it is the source; the rest
follow the same translation (OTel name, dots to underscores, then the unit, then ``_total``
for counters), which is what both prometheus-client and the collector's Prometheus exporter
write. Gauges of unit ``1`` get ``_ratio``: that is the collector's rule (prometheus/
otlptranslator ``normalizeName``: unit "1" on a gauge appends ``ratio``; unit "1" alone maps
to no unit word), so ``training.comm.overlap`` is ``training_comm_overlap_ratio``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SEMCONV = Path(__file__).resolve().parents[2] / "otel_train" / "semconv.py"


def _load_semconv():
    # semconv.py is plain constants; load the file alone so that generating dashboards never
    # imports the otel_train package (and with it torch).
    spec = importlib.util.spec_from_file_location("_otel_train_semconv", _SEMCONV)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


semconv = _load_semconv()

RUN = semconv.PROM_RUN_LABEL  # training_run_id
RANK = semconv.PROM_RANK_LABEL  # training_rank
PHASE = semconv.PROM_PHASE_LABEL  # training_phase
OP = "collective_op"
BACKEND = "collective_backend"
REASON = "compile_reason"
SIGNAL = semconv.ATTR_SIGNAL

STEP = semconv.PROM_STEP_DURATION  # histogram
PHASE_DURATION = semconv.PROM_PHASE_DURATION  # histogram
SAMPLES = semconv.PROM_SAMPLES
TOKENS = semconv.PROM_TOKENS
COLLECTIVE = "training_collective_duration_seconds"  # histogram
COLLECTIVE_BYTES = "training_collective_size_bytes_total"
COMM_OVERLAP = "training_comm_overlap_ratio"
MEMORY_PEAK = "training_memory_allocated_peak_bytes"
MEMORY_RESERVED = "training_memory_reserved_bytes"
COMPILE = "training_compile_duration_seconds"  # histogram
GRAPH_BREAKS = "training_compile_graph_breaks_total"
RECOMPILES = "training_compile_recompiles_total"
CPU_THROTTLED = "training_cpu_throttled_time_seconds_total"
MFU = "training_mfu_ratio"
DROPPED = semconv.PROM_TELEMETRY_DROPPED

# Recording rules of prometheus/rules.yml the dashboards read (series labelled run and rank).
#: seconds a rank spends in collectives per step
COLLECTIVE_PER_STEP = "training_run_rank:collective_duration_seconds:per_step5m"
#: (median rank's collective seconds per step - this rank's) / median step time: how much of
#: a step the other ranks lose waiting for this rank (TrainingStragglerRank, collective_wait)
WAIT_CAUSED = "training_run_rank:collective_wait_caused:share_of_step5m"
#: the share above which TrainingStragglerRank fires with straggler_signal="collective_wait"
WAIT_CAUSED_LIMIT = 0.15
#: seconds per step this rank arrives at its collectives after the earliest rank (the longest
#: collective seconds per step in the run less this rank's)
ARRIVAL_LAG = "training_run_rank:collective_arrival_lag_seconds:per_step5m"

#: labels besides run and rank that identify a series of each metric
IDENTITY = {
    PHASE_DURATION: (PHASE,),
    COLLECTIVE: (OP, BACKEND),
    COLLECTIVE_BYTES: (OP,),
    GRAPH_BREAKS: (REASON,),
    RECOMPILES: (REASON,),
    DROPPED: (SIGNAL,),
}

# cAdvisor (kubelet /metrics/cadvisor); its series carry namespace/pod/container, not ranks.
CADVISOR_THROTTLED = "container_cpu_cfs_throttled_periods_total"
CADVISOR_PERIODS = "container_cpu_cfs_periods_total"

PHASES = (
    semconv.PHASE_DATA_WAIT,
    semconv.PHASE_FORWARD,
    semconv.PHASE_BACKWARD,
    semconv.PHASE_OPTIMIZER,
    semconv.PHASE_EXPOSED_COMM,
    semconv.PHASE_COMPILE,
)

# Span names and attributes as TraceQL and LogQL see them.
SPAN_STEP = semconv.SPAN_STEP
SPAN_RANK_STEP = semconv.SPAN_RANK_STEP
SPAN_RUN = semconv.SPAN_RUN
SPAN_COLLECTIVE = semconv.SPAN_COLLECTIVE
SPAN_COMPILE = semconv.SPAN_COMPILE
SPAN_DATA_WAIT = semconv.SPAN_DATA_WAIT
ATTR_RUN_ID = semconv.ATTR_RUN_ID
ATTR_RANK = semconv.ATTR_RANK
ATTR_STEP = semconv.ATTR_STEP
ATTR_COLLECTIVE_OP = semconv.ATTR_COLLECTIVE_OP
ATTR_COLLECTIVE_BYTES = semconv.ATTR_COLLECTIVE_BYTES
ATTR_COLLECTIVE_BUS_BW = semconv.ATTR_COLLECTIVE_BUS_BW
ATTR_COMPILE_REASON = semconv.ATTR_COMPILE_REASON
LOG_TRACE_ID = semconv.LOG_TRACE_ID
LOG_SPAN_ID = semconv.LOG_SPAN_ID
LOG_RUN_ID = semconv.LOG_RUN_ID
LOG_RANK = semconv.LOG_RANK
SERVICE_NAME_DEFAULT = semconv.SERVICE_NAME_DEFAULT
