"""Every span, attribute, metric and log-field name otel-train emits, in one place.

These names are the telemetry contract of ``DESIGN.md``: dashboards, alert rules, the
checklist verifier and outside acceptance checks read them. Change none without a migration.
Prometheus sees metric names translated (dots to underscores, unit and ``_total`` suffixes):
``training.step.duration`` in seconds becomes ``training_step_duration_seconds``.
"""

from __future__ import annotations

# --- spans -------------------------------------------------------------------------------
SPAN_RUN = "train.run"
SPAN_SETUP = "train.setup"
SPAN_STEP = "train.step"
SPAN_RANK_STEP = "train.rank_step"
SPAN_DATA_WAIT = "train.data_wait"
SPAN_FORWARD = "train.forward"
SPAN_BACKWARD = "train.backward"
SPAN_OPTIMIZER = "train.optimizer"
SPAN_COLLECTIVE = "train.collective"
SPAN_COMPILE = "train.compile"
SPAN_CHECKPOINT = "train.checkpoint"

# --- phases (values of training.phase) ---------------------------------------------------
PHASE_DATA_WAIT = "data_wait"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_OPTIMIZER = "optimizer"
PHASE_EXPOSED_COMM = "exposed_comm"
PHASE_COMPILE = "compile"
#: the four phases the step hooks time themselves, in loop order
TIMED_PHASES = (PHASE_DATA_WAIT, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)
PHASE_SPAN = {
    PHASE_DATA_WAIT: SPAN_DATA_WAIT,
    PHASE_FORWARD: SPAN_FORWARD,
    PHASE_BACKWARD: SPAN_BACKWARD,
    PHASE_OPTIMIZER: SPAN_OPTIMIZER,
}

# --- resource attributes -----------------------------------------------------------------
SERVICE_NAME_DEFAULT = "otel-train"
RES_RUN_ID = "training.run.id"
RES_RANK = "training.rank"
RES_LOCAL_RANK = "training.local_rank"
RES_WORLD_SIZE = "training.world_size"

# --- span and metric attributes ----------------------------------------------------------
ATTR_RUN_ID = "training.run.id"
ATTR_STEP = "training.step"
ATTR_RANK = "training.rank"
ATTR_WORLD_SIZE = "training.world_size"
ATTR_PHASE = "training.phase"
ATTR_MICRO_BATCH = "training.micro_batch"
ATTR_MICRO_BATCHES = "training.micro_batches"
ATTR_SAMPLES = "training.samples"
ATTR_TOKENS = "training.tokens"
ATTR_STATUS = "training.status"
#: on train.rank_step: the per-phase totals of that rank's step, in seconds
ATTR_PHASE_TOTAL_PREFIX = "training.phase_total."
ATTR_STEP_DURATION = "training.step.duration_s"

ATTR_COLLECTIVE_OP = "collective.op"
ATTR_COLLECTIVE_BACKEND = "collective.backend"
ATTR_COLLECTIVE_BYTES = "collective.bytes"
ATTR_COLLECTIVE_GROUP_SIZE = "collective.group_size"
ATTR_COLLECTIVE_SEQ = "collective.seq"
ATTR_COLLECTIVE_DTYPE = "collective.dtype"
ATTR_COLLECTIVE_BUS_BW = "collective.bus_bandwidth_gbps"
#: collectives (sources/collectives*.py): the process group's name, the torch.distributed
#: function or hook that issued it, async or not, and the stall flag tail sampling keys on
ATTR_COLLECTIVE_GROUP = "collective.group"
ATTR_COLLECTIVE_API = "collective.api"
ATTR_COLLECTIVE_ASYNC = "collective.async"
ATTR_COLLECTIVE_SHAPE = "collective.shape"
ATTR_COLLECTIVE_STALLED = "collective.stalled"
#: python (module wrappers), pg_hook (ProcessGroup pre/post hooks), nccl_flight_recorder
ATTR_COLLECTIVE_SOURCE = "collective.source"
#: false when the collective never completed while instrumented (a hang at exit)
ATTR_COLLECTIVE_COMPLETED = "collective.completed"
#: GPU time from the NCCL flight recorder (TORCH_NCCL_ENABLE_TIMING=1), seconds
ATTR_COLLECTIVE_GPU_DURATION = "collective.gpu_duration_s"
EVENT_COLLECTIVE_STALLED = "collective.stalled"
LOG_COLLECTIVE_STALLED = "otel_train.collective_stalled"
#: values of collective.op (bounded: metric attribute)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                  "barrier", "all_to_all", "send", "recv", "gather", "scatter", "other")

ATTR_COMPILE_REASON = "compile.reason"
ATTR_COMPILE_GRAPH_BREAKS = "compile.graph_breaks"

ATTR_SIGNAL = "signal"

# --- metrics -----------------------------------------------------------------------------
METRIC_STEP_DURATION = "training.step.duration"
METRIC_PHASE_DURATION = "training.phase.duration"
METRIC_SAMPLES = "training.samples"
METRIC_TOKENS = "training.tokens"
METRIC_COLLECTIVE_DURATION = "training.collective.duration"
METRIC_COLLECTIVE_SIZE = "training.collective.size"
METRIC_COMM_OVERLAP = "training.comm.overlap"
METRIC_MEMORY_ALLOCATED_PEAK = "training.memory.allocated.peak"
METRIC_MEMORY_RESERVED = "training.memory.reserved"
METRIC_COMPILE_DURATION = "training.compile.duration"
METRIC_COMPILE_GRAPH_BREAKS = "training.compile.graph_breaks"
METRIC_COMPILE_RECOMPILES = "training.compile.recompiles"
METRIC_CPU_THROTTLED_TIME = "training.cpu.throttled.time"
METRIC_MFU = "training.mfu"
METRIC_TELEMETRY_DROPPED = "otel_train.telemetry.dropped"

#: values of the ``signal`` attribute of the dropped counter
SIGNAL_SPANS = "spans"
SIGNAL_METRICS = "metrics"
SIGNAL_LOGS = "logs"

#: Prometheus names of the contract's metrics as prometheus-client and the collector's
#: Prometheus exporter write them (histograms add _bucket/_sum/_count, counters _total).
PROM_STEP_DURATION = "training_step_duration_seconds"
PROM_PHASE_DURATION = "training_phase_duration_seconds"
PROM_SAMPLES = "training_samples_total"
PROM_TOKENS = "training_tokens_total"
PROM_TELEMETRY_DROPPED = "otel_train_telemetry_dropped_total"
PROM_RANK_LABEL = "training_rank"
PROM_PHASE_LABEL = "training_phase"
PROM_RUN_LABEL = "training_run_id"

# --- log fields --------------------------------------------------------------------------
LOG_TRACE_ID = "trace_id"
LOG_SPAN_ID = "span_id"
LOG_RUN_ID = "run_id"
LOG_RANK = "rank"
LOG_STEP = "step"
LOG_PHASE = "phase"
LOG_DURATION_MS = "duration_ms"
#: the fields every log line carries (checked by ``otel-train check``)
LOG_REQUIRED_FIELDS = (LOG_TRACE_ID, LOG_SPAN_ID, LOG_RUN_ID, LOG_RANK, LOG_STEP)

# --- instrumentation scope ---------------------------------------------------------------
SCOPE_NAME = "otel_train"

# --- files of a run directory ------------------------------------------------------------
OUTPUT_DIR_DEFAULT = "otel-train-runs"
TRACES_GLOB = "traces*.jsonl"
METRICS_GLOB = "metrics*.jsonl"
LOGS_GLOB = "logs*.jsonl"
