"""Prometheus names of the telemetry contract, as the dashboards query them.

Every metric name here is ``otel_train/semconv.py``'s: its table ``METRICS`` defines each
metric once and ``semconv.prom`` derives the Prometheus name by the rule the collector's
Prometheus exporter applies (OTel name, dots to underscores, then the unit, then ``_total``
for counters; gauges of unit ``1`` get ``_ratio``, prometheus/otlptranslator
``normalizeName``), so ``training.comm.overlap`` is ``training_comm_overlap_ratio``.
Recording rules and cAdvisor's series are not otel-train's metrics: they are spelled here.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the otel_train beside these dashboards (a checkout builds its own contract's names);
# importing it imports neither torch nor the OpenTelemetry SDK (otel_train/__init__.py)
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from otel_train import semconv  # noqa: E402

RUN = semconv.PROM_RUN_LABEL  # training_run_id
RANK = semconv.PROM_RANK_LABEL  # training_rank
PHASE = semconv.PROM_PHASE_LABEL  # training_phase
OP = semconv.prometheus_label(semconv.ATTR_COLLECTIVE_OP)  # training_collective_op
BACKEND = semconv.prometheus_label(semconv.ATTR_COLLECTIVE_BACKEND)  # training_collective_backend
REASON = semconv.prometheus_label(semconv.ATTR_COMPILE_REASON)  # training_compile_reason
SIGNAL = semconv.prometheus_label(semconv.ATTR_SIGNAL)  # otel_train_signal

_prom = semconv.prom
STEP = _prom(semconv.METRIC_STEP_DURATION)  # training_step_duration_seconds, histogram
PHASE_DURATION = _prom(semconv.METRIC_PHASE_DURATION)  # histogram
SAMPLES = _prom(semconv.METRIC_SAMPLES)  # training_samples_total
TOKENS = _prom(semconv.METRIC_TOKENS)
COLLECTIVE = _prom(semconv.METRIC_COLLECTIVE_DURATION)  # histogram
COLLECTIVE_BYTES = _prom(semconv.METRIC_COLLECTIVE_SIZE)  # training_collective_size_bytes_total
COMM_OVERLAP = _prom(semconv.METRIC_COMM_OVERLAP)  # training_comm_overlap_ratio
MEMORY_PEAK = _prom(semconv.METRIC_MEMORY_ALLOCATED_PEAK)  # training_memory_peak_allocated_bytes
MEMORY_RESERVED = _prom(semconv.METRIC_MEMORY_RESERVED)
COMPILE = _prom(semconv.METRIC_COMPILE_DURATION)  # histogram
GRAPH_BREAKS = _prom(semconv.METRIC_COMPILE_GRAPH_BREAKS)
RECOMPILES = _prom(semconv.METRIC_COMPILE_RECOMPILES)
UNTIMED = _prom(semconv.METRIC_UNTIMED_TIME)  # training_untimed_time_seconds_total
UNTIMED_PART = semconv.PROM_UNTIMED_PART_LABEL  # training_untimed_part
#: the step's disjoint parts (issue 51): summed over parts, a rank's step duration sum
STEP_TIME = _prom(semconv.METRIC_STEP_TIME)  # training_step_time_seconds_total
PART = semconv.PROM_PART_LABEL  # training_part
#: a rank's run, start to its last step's end, by goodput bucket (productive and the losses)
GOODPUT = _prom(semconv.METRIC_GOODPUT_TIME)  # training_goodput_time_seconds_total
BUCKET = semconv.PROM_GOODPUT_BUCKET_LABEL  # training_goodput_bucket
CPU_THROTTLED = _prom(semconv.METRIC_CPU_THROTTLED_TIME)  # ..._time_seconds_total
MFU = _prom(semconv.METRIC_MFU)  # training_mfu_ratio
DROPPED = _prom(semconv.METRIC_TELEMETRY_DROPPED)  # otel_train_telemetry_dropped_total

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
    UNTIMED: (UNTIMED_PART,),
    STEP_TIME: (PART,),
    GOODPUT: (BUCKET,),
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

#: the step's parts (training_part), in the order every surface shows them; they add up to
#: the step time (unlike PHASES, whose exposed_comm and compile lie inside forward/backward)
PARTS = semconv.PARTS
PART_DATA_WAIT = semconv.PART_DATA_WAIT
PART_DEVICE_WAIT = semconv.PART_DEVICE_WAIT
PART_GPU_OUTSIDE_PHASES = semconv.PART_GPU_OUTSIDE_PHASES
PART_HOST_BUSY = semconv.PART_HOST_BUSY
PART_NOT_EXPLAINED = semconv.PART_NOT_EXPLAINED
#: goodput buckets (training_goodput_bucket), productive first
GOODPUT_BUCKETS = semconv.GOODPUT_BUCKETS
GOODPUT_PRODUCTIVE = semconv.GOODPUT_PRODUCTIVE

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
ATTR_COMPILE_GRAPH_BREAKS = semconv.ATTR_COMPILE_GRAPH_BREAKS
#: log fields as Loki's OTLP ingestion stores them (structured metadata: the record's
#: trace and span ids, and its attributes with dots as underscores)
LOG_TRACE_ID = semconv.LOG_TRACE_ID
LOG_SPAN_ID = semconv.LOG_SPAN_ID
LOG_RUN_ID = semconv.prometheus_label(semconv.LOG_RUN_ID)  # training_run_id
LOG_RANK = semconv.prometheus_label(semconv.LOG_RANK)
LOG_STEP = semconv.prometheus_label(semconv.LOG_STEP)
SERVICE_NAME_DEFAULT = semconv.SERVICE_NAME_DEFAULT
