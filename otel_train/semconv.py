"""Every span, attribute, metric and log-field name otel-train emits, in one place.

These names are the telemetry contract (docs/telemetry.md, docs/design.md): dashboards, alert rules, the
checklist verifier and outside acceptance checks read them. Change none without a migration.
Every metric otel-train creates is defined once, in ``METRICS`` at the end (name, kind,
unit, description, bucket advice); sources create instruments with :func:`create`, and the
Prometheus endpoint, the live checks and the dashboards read :func:`prom`'s names, which
:func:`prometheus_name` derives as the collector's Prometheus exporter does:
``training.step.duration`` in seconds becomes ``training_step_duration_seconds``.

This module imports nothing of otel_train (dashboards/otel_dashboards/names.py loads it by
file path so that generating dashboards never imports torch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# --- spans -------------------------------------------------------------------------------
SPAN_RUN = "training.run"
SPAN_SETUP = "training.setup"
SPAN_STEP = "training.step"
SPAN_RANK_STEP = "training.rank_step"
SPAN_DATA_WAIT = "training.data_wait"
SPAN_FORWARD = "training.forward"
SPAN_BACKWARD = "training.backward"
SPAN_OPTIMIZER = "training.optimizer"
SPAN_COLLECTIVE = "training.collective"
SPAN_COMPILE = "training.compile"
SPAN_CHECKPOINT = "training.checkpoint"
#: a region of the step the user named (``otel_train.region("loss")``): a phase of its own,
#: its name in ``training.phase``
SPAN_REGION = "training.region"

# --- phases (values of training.phase) ---------------------------------------------------
PHASE_DATA_WAIT = "data_wait"
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_OPTIMIZER = "optimizer"
PHASE_EXPOSED_COMM = "exposed_comm"
PHASE_COMPILE = "compile"
#: the parts of the time outside every phase (sources/gaps.py; not phases of their own:
#: values of training.untimed.part, and ``training.phase_total.<part>`` on train.rank_step):
#: blocked on the device (a call that waited for the GPU, whose queue still held work
#: issued before the stretch) and busy on the host (user code running while the device had
#: caught up, or a CPU run); the rest of it is not explained
PHASE_DEVICE_WAIT = "device_wait"
PHASE_HOST_BUSY = "host_busy"
#: untimed time's third part (GPU runs): the host blocked on its device while the device
#: ran work queued outside the phases (loss, metrics, clipping, EMA between them)
PHASE_GPU_OUTSIDE_PHASES = "gpu_outside_phases"
#: the four phases the step hooks time themselves, in loop order
TIMED_PHASES = (PHASE_DATA_WAIT, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)
#: regions users name (``otel_train.region``): at most MAX_REGIONS names a process, each
#: ``REGION_NAME`` (lower case, digits, underscores; not a phase's or part's name); a further
#: name is recorded as REGION_OTHER. A region named REGION_CHECKPOINT is the goodput's
#: checkpoint loss
MAX_REGIONS = 8
REGION_NAME = r"[a-z][a-z0-9_]{0,31}"
REGION_OTHER = "other_regions"
REGION_CHECKPOINT = "checkpoint"
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
#: on train.run: the steps this rank ran
ATTR_STEPS = "training.steps"
#: on train.rank_step: the per-phase totals of that rank's step, in seconds
ATTR_PHASE_TOTAL_PREFIX = "training.phase_total."
#: (named under ``training.rank_step``: ``training.step`` is the step's number, an attribute,
#: so it is no namespace; before 0.2.0 these were ``training.step.duration_s`` and
#: ``training.step.gpu_duration_s``, still read by the report)
ATTR_STEP_DURATION = "training.rank_step.duration_s"
#: on train.rank_step: seconds this rank's cgroup was CPU-throttled during the step
ATTR_CPU_THROTTLED = "training.cpu.throttled_s"

#: events on train.rank_step (sources/gaps.py): a stretch of the step no phase covers, and a
#: long data wait, each with where the training thread was when sampled (OpenTelemetry's
#: code.* attributes) and, for a data wait, the DataLoader worker it waited for
EVENT_GAP = "training.gap"
EVENT_DATA_WAIT = "training.data_wait"
#: "between forward and backward", "before forward", "after optimizer"
ATTR_GAP_SEGMENT = "training.gap.segment"
ATTR_GAP_AFTER = "training.gap.after"  # the phase before it ("" if none)
ATTR_GAP_BEFORE = "training.gap.before"  # the phase after it ("" if none)
ATTR_GAP_DURATION = "training.gap.duration_s"
#: samples of the training thread's stack taken in it, and the share at the location named
ATTR_GAP_SAMPLES = "training.gap.samples"
ATTR_GAP_LOCATION_SHARE = "training.gap.location_share"
#: a stretch with no sample of its own named by the same segment's recurring stretch: the
#: step whose samples gave the code.* attributes (absent where its own samples did)
ATTR_GAP_LOCATION_STEP = "training.gap.location_step"
#: on a training.gap event of a GPU run: the seconds of it the host was blocked on the
#: device (the GPU still ran work issued before the stretch); the rest the host was busy
ATTR_GAP_DEVICE_WAIT = "training.gap.device_wait_s"
ATTR_DATA_WORKER = "training.data.worker"
ATTR_CODE_FUNCTION = "code.function.name"
ATTR_CODE_FILE = "code.file.path"
ATTR_CODE_LINE = "code.line.number"
ATTR_CODE_STACKTRACE = "code.stacktrace"

ATTR_COLLECTIVE_OP = "training.collective.op"
ATTR_COLLECTIVE_BACKEND = "training.collective.backend"
ATTR_COLLECTIVE_BYTES = "training.collective.bytes"
ATTR_COLLECTIVE_GROUP_SIZE = "training.collective.group_size"
ATTR_COLLECTIVE_SEQ = "training.collective.seq"
ATTR_COLLECTIVE_DTYPE = "training.collective.dtype"
ATTR_COLLECTIVE_BUS_BW = "training.collective.bus_bandwidth_gbps"
#: collectives (sources/collectives*.py): the process group's name, the torch.distributed
#: function or hook that issued it, async or not, and the stall flag tail sampling keys on
ATTR_COLLECTIVE_GROUP = "training.collective.group"
ATTR_COLLECTIVE_API = "training.collective.api"
ATTR_COLLECTIVE_ASYNC = "training.collective.async"
ATTR_COLLECTIVE_SHAPE = "training.collective.shape"
ATTR_COLLECTIVE_STALLED = "training.collective.stalled"
#: python (module wrappers), pg_hook (ProcessGroup pre/post hooks), nccl_flight_recorder
ATTR_COLLECTIVE_SOURCE = "training.collective.source"
#: false when the collective never completed while instrumented (a hang at exit)
ATTR_COLLECTIVE_COMPLETED = "training.collective.completed"
#: GPU time from the NCCL flight recorder (TORCH_NCCL_ENABLE_TIMING=1), seconds
ATTR_COLLECTIVE_GPU_DURATION = "training.collective.gpu_duration_s"
#: summary spans (OTEL_TRAIN_COLLECTIVE_SPANS=summary, or auto past the span budget): one span per (phase, op, group) of a
#: step standing for ``collective.count`` collectives; bytes and gpu_duration_s are sums,
#: total_s the sum of their issue-to-completion times, seq the first and seq_last the last
ATTR_COLLECTIVE_COUNT = "training.collective.count"
ATTR_COLLECTIVE_TOTAL_S = "training.collective.total_s"
ATTR_COLLECTIVE_SEQ_LAST = "training.collective.seq_last"
EVENT_COLLECTIVE_STALLED = "training.collective.stalled"
LOG_COLLECTIVE_STALLED = "training.collective.stalled"
#: bodies of otel-train's own log records that the contract names
LOG_STEP_END = "training.step.end"
LOG_START = "otel_train.start"
LOG_STOP = "otel_train.stop"
LOG_COMPILE = "training.compile"
#: warnings about the training's compilation: a frame hit dynamo's recompile limit and fell
#: back to eager; this rank compiled other graphs than the reference rank
LOG_COMPILE_RECOMPILE_LIMIT = "training.compile.recompile_limit"
LOG_COMPILE_INCONSISTENT = "training.compile.inconsistent"
#: values of collective.op (bounded: metric attribute)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                  "barrier", "all_to_all", "send", "recv", "gather", "scatter", "other")

ATTR_COMPILE_REASON = "training.compile.reason"
ATTR_COMPILE_GRAPH_BREAKS = "training.compile.graph_breaks"

ATTR_SIGNAL = "otel_train.signal"

# --- metrics -----------------------------------------------------------------------------
METRIC_STEP_DURATION = "training.step.duration"
METRIC_PHASE_DURATION = "training.phase.duration"
METRIC_SAMPLES = "training.samples"
METRIC_TOKENS = "training.tokens"
METRIC_COLLECTIVE_DURATION = "training.collective.duration"
METRIC_COLLECTIVE_SIZE = "training.collective.size"
METRIC_COMM_OVERLAP = "training.comm.overlap"
METRIC_MEMORY_ALLOCATED_PEAK = "training.memory.peak.allocated"
METRIC_MEMORY_RESERVED = "training.memory.reserved"
METRIC_COMPILE_DURATION = "training.compile.duration"
METRIC_COMPILE_GRAPH_BREAKS = "training.compile.graph_breaks"
METRIC_COMPILE_RECOMPILES = "training.compile.recompiles"
METRIC_CPU_THROTTLED_TIME = "training.cpu.throttled.time"
#: the time outside every phase by part (sources/gaps.py): ``training.untimed.part`` is
#: PHASE_DEVICE_WAIT, PHASE_GPU_OUTSIDE_PHASES or PHASE_HOST_BUSY (a counter: a series a
#: part and rank, not histograms)
METRIC_UNTIMED_TIME = "training.untimed.time"
ATTR_UNTIMED_PART = "training.untimed.part"
METRIC_MFU = "training.mfu"
#: One account of a step's time (otel_train/partition.py, docs/telemetry.md "The step's
#: parts"): each rank-step's wall time split into disjoint parts that sum to it. On
#: train.rank_step as ``training.rank_step.part.<part>`` (seconds), and as the counter
#: ``training.step.time`` by ``training.part``, whose sum over parts equals the sum of
#: ``training.step.duration``. Every surface (demo, report, HTML, dashboards) reads these.
ATTR_PART = "training.part"
ATTR_RANK_STEP_PART_PREFIX = "training.rank_step.part."
METRIC_STEP_TIME = "training.step.time"
PART_DATA_WAIT = PHASE_DATA_WAIT
#: the compute phases' own time: the phase's span less the exposed communication and the
#: compile time inside it
PART_FORWARD = PHASE_FORWARD
PART_BACKWARD = PHASE_BACKWARD
PART_OPTIMIZER = PHASE_OPTIMIZER
#: the regions users named (``otel_train.region``), all of them; each one's own time is
#: ``training.phase_total.<name>``
PART_REGIONS = "regions"
#: communication in flight while no compute phase ran, or while the host was blocked in a
#: synchronous collective (inside the phases, or between them)
PART_EXPOSED_COMM = PHASE_EXPOSED_COMM
PART_COMPILE = PHASE_COMPILE
#: outside every phase: the host blocked on the device (while it ran the phases' work or
#: waited in a collective; while it ran work queued outside the phases), the host busy, the
#: rest
PART_DEVICE_WAIT = PHASE_DEVICE_WAIT
PART_GPU_OUTSIDE_PHASES = PHASE_GPU_OUTSIDE_PHASES
PART_HOST_BUSY = PHASE_HOST_BUSY
PART_NOT_EXPLAINED = "not_explained"
#: every part, in the order every surface shows them
PARTS = (PART_DATA_WAIT, PART_FORWARD, PART_BACKWARD, PART_OPTIMIZER, PART_REGIONS,
         PART_EXPOSED_COMM, PART_COMPILE, PART_DEVICE_WAIT, PART_GPU_OUTSIDE_PHASES,
         PART_HOST_BUSY, PART_NOT_EXPLAINED)
#: Goodput (docs/telemetry.md "Goodput"): a rank's run split into productive time and
#: named losses, the counter ``training.goodput.time`` by ``training.goodput.bucket``
METRIC_GOODPUT_TIME = "training.goodput.time"
ATTR_GOODPUT_BUCKET = "training.goodput.bucket"
#: on train.run: where the rank's goodput account begins, epoch ns (its process's start for
#: the first instrumented run of a process): the run's wall clock starts at the earliest
ATTR_GOODPUT_START = "training.goodput.start_ns"
#: the compute parts of steady (not warm-up) steps
GOODPUT_PRODUCTIVE = "productive"
#: the rank's start to its first step (process group init, model build, loader start)
GOODPUT_STARTUP = "startup"
#: compile time, in any step
GOODPUT_COMPILE = "compile"
#: the warm-up steps' time other than compile (the first step, a step that compiled)
GOODPUT_WARMUP = "warmup"
GOODPUT_DATA_WAIT = "data_wait"
GOODPUT_EXPOSED_COMM = "exposed_comm"
#: the host blocked on its device (on NCCL: waiting for a late rank, found at the next sync)
GOODPUT_DEVICE_WAIT = "device_wait"
#: regions named ``checkpoint`` (otel_train.region), in any step
GOODPUT_CHECKPOINT = "checkpoint"
#: steady steps' time outside the phases: host work (loss, logging), the GPU work queued
#: there, the other regions users named, and what is not explained
GOODPUT_OUTSIDE_PHASES = "outside_phases"
#: between one step's end and the next one's start (eval, checkpoints outside the step)
GOODPUT_BETWEEN_STEPS = "between_steps"
#: the buckets, productive first
GOODPUT_BUCKETS = (GOODPUT_PRODUCTIVE, GOODPUT_STARTUP, GOODPUT_COMPILE, GOODPUT_WARMUP,
                   GOODPUT_DATA_WAIT, GOODPUT_EXPOSED_COMM, GOODPUT_DEVICE_WAIT,
                   GOODPUT_CHECKPOINT, GOODPUT_OUTSIDE_PHASES, GOODPUT_BETWEEN_STEPS)
METRIC_TELEMETRY_DROPPED = "otel_train.telemetry.dropped"
#: exceptions otel-train caught on its hook paths so that training goes on (by component)
METRIC_INTERNAL_ERRORS = "otel_train.internal.errors"
ATTR_COMPONENT = "otel_train.component"

#: values of the ``signal`` attribute of the dropped counter
SIGNAL_SPANS = "spans"
SIGNAL_METRICS = "metrics"
SIGNAL_LOGS = "logs"
#: NCCL flight-recorder entries overwritten in its ring buffer before otel-train read them
SIGNAL_NCCL_ENTRIES = "nccl_entries"

# --- log fields --------------------------------------------------------------------------
#: Exported log records carry the attribute names of spans and metrics (the record's own
#: trace and span ids are its context, not attributes). On the console (otel-train's JSON
#: lines on stderr) and on stdlib ``LogRecord`` objects, for ``%(trace_id)s``-style
#: formatters, the same fields have short names: CONSOLE_*.
CONSOLE_TRACE_ID = "trace_id"
CONSOLE_SPAN_ID = "span_id"
CONSOLE_RUN_ID = "run_id"
CONSOLE_RANK = "rank"
CONSOLE_STEP = "step"
#: the short names the exporter renames to the contract's (any other field keeps its name)
CONSOLE_TO_ATTRIBUTE = {CONSOLE_RUN_ID: ATTR_RUN_ID, CONSOLE_RANK: ATTR_RANK,
                        CONSOLE_STEP: ATTR_STEP}
LOG_TRACE_ID = "trace_id"  # where a reader sees the record's context (OTLP traceId)
LOG_SPAN_ID = "span_id"
LOG_RUN_ID = ATTR_RUN_ID
LOG_RANK = ATTR_RANK
LOG_STEP = ATTR_STEP
LOG_PHASE = ATTR_PHASE
#: a timed event's duration, seconds (the phase-total attributes' unit)
LOG_DURATION = "training.duration_s"
#: the fields every log record carries (checked by ``otel-train check``)
LOG_REQUIRED_FIELDS = (LOG_TRACE_ID, LOG_SPAN_ID, LOG_RUN_ID, LOG_RANK, LOG_STEP)
#: the log attributes' names before 0.2.0, which ``check`` still reads in older run
#: directories: new name -> old name
LOG_LEGACY_NAMES = {LOG_RUN_ID: "run_id", LOG_RANK: "rank", LOG_STEP: "step",
                    LOG_PHASE: "phase", LOG_DURATION: "duration_ms"}
#: a log record's exception (OpenTelemetry semantic conventions, exceptions in logs):
#: ``logger.exception()``, ``exc_info=True``, structlog's ``.exception()``
ATTR_EXCEPTION_TYPE = "exception.type"
ATTR_EXCEPTION_MESSAGE = "exception.message"
ATTR_EXCEPTION_STACKTRACE = "exception.stacktrace"

# --- instrumentation scope ---------------------------------------------------------------
#: otel-train's own spans, metrics and log records; a user's log records are under their
#: logger's name (a stdlib logger's, or a structlog event's ``logger``), or SCOPE_USER_LOGS
SCOPE_NAME = "otel_train"
SCOPE_USER_LOGS = "structlog"
#: the OpenTelemetry semantic conventions our resource and attribute names follow (the
#: resource's and every scope's schema URL); a release of opentelemetry-semantic-conventions
#: pinned by pyproject.toml lists it (tests/sdk/test_otel_conventions.py)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

# --- files of a run directory ------------------------------------------------------------
OUTPUT_DIR_DEFAULT = "otel-train-runs"
TRACES_GLOB = "traces*.jsonl"
METRICS_GLOB = "metrics*.jsonl"
LOGS_GLOB = "logs*.jsonl"

# --- compile telemetry (sources/compile/__init__.py) ----------------------------------------------
ATTR_COMPILE_ID = "training.compile.id"
#: "co_name (file:line)" of the compiled frame
ATTR_COMPILE_FRAME = "training.compile.frame"
#: what started the compilation: dynamo, lazy_backward, cudagraph_recording, untracked
ATTR_COMPILE_TRIGGER = "training.compile.trigger"
#: the recompile's first guard failure, verbatim (``compile.reason`` is its category)
ATTR_COMPILE_GUARD_FAILURE = "training.compile.guard_failure"
ATTR_COMPILE_GRAPH_BREAK_REASONS = "training.compile.graph_break_reasons"
#: graphs this compilation handed to the backend
ATTR_COMPILE_GRAPHS = "training.compile.graphs"
ATTR_COMPILE_GRAPH_OPS = "training.compile.graph_ops"
ATTR_COMPILE_GUARDS = "training.compile.guards"
#: seconds, per stage: compile.time.dynamo_s (whole frame), .aot_autograd_s, .inductor_s,
#: .autotune_s, .backward_s
ATTR_COMPILE_TIME_PREFIX = "training.compile.time."
#: compile.cache.fx_graph.hits / .misses, compile.cache.aot_autograd.hits / .misses
ATTR_COMPILE_CACHE_PREFIX = "training.compile.cache."
ATTR_COMPILE_CUDAGRAPH_SKIP_REASON = "training.compile.cudagraph_skip_reason"
ATTR_COMPILE_FAIL_TYPE = "training.compile.fail_type"
ATTR_COMPILE_FAIL_REASON = "training.compile.fail_reason"
ATTR_COMPILE_RECOMPILE_LIMIT_HIT = "training.compile.recompile_limit_hit"
ATTR_COMPILE_RECOMPILE_LIMIT = "training.compile.recompile_limit"
#: running hash of what this rank compiled (frame, graph ops, guards, shapes), hex
ATTR_COMPILE_FINGERPRINT = "training.compile.fingerprint"
#: how a rank's compilations differ from the reference rank's: graph, count
ATTR_COMPILE_INCONSISTENCY = "training.compile.inconsistency"

#: values of compile.reason (bounded): a first compile, or the category of the guard failure
COMPILE_REASON_FIRST = "first_compile"
COMPILE_REASON_TENSOR_SHAPE = "tensor_shape"
COMPILE_REASON_TENSOR_STRIDE = "tensor_stride"
COMPILE_REASON_TENSOR_RANK = "tensor_rank"
COMPILE_REASON_TENSOR_DTYPE = "tensor_dtype"
COMPILE_REASON_TENSOR_DEVICE = "tensor_device"
COMPILE_REASON_REQUIRES_GRAD = "requires_grad"
COMPILE_REASON_DISPATCH_KEY = "dispatch_key"
COMPILE_REASON_GLOBAL_STATE = "global_state"
COMPILE_REASON_OBJECT_IDENTITY = "object_identity"
COMPILE_REASON_TYPE = "type"
COMPILE_REASON_LENGTH = "length"
COMPILE_REASON_DYNAMIC_SHAPE = "dynamic_shape"
COMPILE_REASON_VALUE = "value"
COMPILE_REASON_RECOMPILE_LIMIT = "recompile_limit"
COMPILE_REASON_UNKNOWN = "unknown"
COMPILE_REASON_OTHER = "other"

METRIC_COMPILE_GRAPHS = "training.compile.graphs"
METRIC_COMPILE_RECOMPILE_LIMIT_HITS = "training.compile.recompile_limit_hits"
#: gauge, 1 while this rank's compilations differ from the reference rank's (rank 0)
METRIC_COMPILE_INCONSISTENT = "training.compile.inconsistent"

# --- GPU telemetry (sources/gpu/cuda_timing.py, memory.py, mfu.py, profiler.py; docs/gpu.md) ---
#: on train.rank_step: GPU-timed per-phase totals in seconds (CUDA events, current stream)
ATTR_PHASE_GPU_TOTAL_PREFIX = "training.phase_gpu_total."
#: on train.rank_step: GPU seconds of work queued between the step's GPU-timed phases
#: (and between the step before's last one and its first), beyond the host's own time there:
#: where the device was busy, or behind the host, with work no phase holds (cuda_timing.py);
#: and the stretch that held most of it ("between forward and backward")
ATTR_GPU_OUTSIDE_PHASES = "training.rank_step.gpu_outside_phases_s"
ATTR_GPU_OUTSIDE_SEGMENT = "training.rank_step.gpu_outside_phases.segment"
#: on train.rank_step: GPU time from the step's first phase marker to its last
ATTR_STEP_GPU_DURATION = "training.rank_step.gpu_duration_s"
#: span attributes' names before 0.2.0, which the report still reads: new name -> old name
ATTR_LEGACY_NAMES = {ATTR_STEP_DURATION: "training.step.duration_s",
                     ATTR_STEP_GPU_DURATION: "training.step.gpu_duration_s"}
#: on train.rank_step: how far the GPU ran behind the host at the step's first phase, s
ATTR_GPU_LAG = "training.gpu.lag_s"
#: on train.rank_step: width of the GPU-to-wall clock mapping's uncertainty interval, s
ATTR_GPU_CLOCK_UNCERTAINTY = "training.gpu.clock_uncertainty_s"
#: on phase spans: "gpu" where the span's times are the GPU's (CUDA events), else absent
ATTR_TIMING = "training.timing"
TIMING_GPU = "gpu"
#: on GPU-timed phase spans: the host's view of the same phase, seconds
ATTR_HOST_DURATION = "training.host.duration_s"
METRIC_PHASE_GPU_DURATION = "training.phase.gpu_duration"

METRIC_MEMORY_ALLOCATED = "training.memory.allocated"
METRIC_MEMORY_RESERVED_PEAK = "training.memory.peak.reserved"
#: reserved minus allocated bytes: what the caching allocator holds but does not use
METRIC_MEMORY_FRAGMENTATION = "training.memory.fragmentation"
METRIC_MEMORY_ALLOC_RETRIES = "training.memory.alloc_retries"
METRIC_MEMORY_OOMS = "training.memory.ooms"
ATTR_MEMORY_ALLOCATED_PEAK = "training.memory.allocated.peak_bytes"
ATTR_MEMORY_RESERVED = "training.memory.reserved_bytes"
ATTR_MEMORY_FRAGMENTATION = "training.memory.fragmentation_bytes"
ATTR_MEMORY_ALLOC_RETRIES = "training.memory.alloc_retries"
ATTR_OOM_REQUESTED = "training.oom.requested_bytes"
ATTR_OOM_DEVICE_FREE = "training.oom.device_free_bytes"
ATTR_OOM_SUMMARY = "training.oom.allocator_summary"
LOG_OOM = "training.oom"

METRIC_THROUGHPUT_SAMPLES = "training.throughput.samples"
METRIC_THROUGHPUT_TOKENS = "training.throughput.tokens"
METRIC_FLOPS_ACHIEVED = "training.flops.achieved"
ATTR_TFLOPS = "training.tflops"
ATTR_MFU = "training.mfu"
ATTR_SAMPLES_PER_S = "training.samples_per_s"
ATTR_TOKENS_PER_S = "training.tokens_per_s"

SPAN_PROFILE = "training.profile"
ATTR_PROFILE_TRACE = "training.profile.trace_path"
ATTR_PROFILE_FIRST_STEP = "training.profile.first_step"
ATTR_PROFILE_STEPS = "training.profile.steps"
ATTR_PROFILE_STOP_S = "training.profile.stop_s"
#: seconds the background thread took to write the trace file
ATTR_PROFILE_WRITE_S = "training.profile.write_s"
ATTR_COMM_OVERLAP = "training.comm.overlap"
ATTR_COMM_EXPOSED = "training.comm.exposed_s"
ATTR_GPU_IDLE = "training.gpu.idle"
ATTR_TOP_KERNELS = "training.profile.top_kernels"
#: on training.comm.overlap points: what measured it ("profiler": a profiler window's trace)
ATTR_OVERLAP_METHOD = "training.overlap.method"
METRIC_COMM_EXPOSED = "training.comm.exposed"
METRIC_GPU_IDLE = "training.gpu.idle"

# --- names before 0.3.0 ------------------------------------------------------------------
#: every name that changed when the contract moved to one scheme (0.3.0): old -> new. Spans
#: were ``train.*``; the collective, compile and profile attributes had no prefix; the
#: tool's ``signal`` and ``component`` attributes none either. The readers (``report``,
#: ``check``, ``compare``) read a run recorded under the old names as if written under the
#: new ones (otel_train/analysis/legacy.py); CHANGELOG.md gives the same table.
LEGACY_NAMES: dict[str, str] = {
    # spans
    "train.run": SPAN_RUN, "train.setup": SPAN_SETUP, "train.step": SPAN_STEP,
    "train.rank_step": SPAN_RANK_STEP, "train.data_wait": SPAN_DATA_WAIT,
    "train.forward": SPAN_FORWARD, "train.backward": SPAN_BACKWARD,
    "train.optimizer": SPAN_OPTIMIZER, "train.collective": SPAN_COLLECTIVE,
    "train.compile": SPAN_COMPILE, "train.checkpoint": SPAN_CHECKPOINT,
    "train.profile": SPAN_PROFILE,
    # log event names (the records' bodies)
    "train.step.end": LOG_STEP_END, "train.oom": LOG_OOM, "otel_train.compile": LOG_COMPILE,
    "otel_train.collective_stalled": LOG_COLLECTIVE_STALLED,
    "otel_train.compile.recompile_limit": LOG_COMPILE_RECOMPILE_LIMIT,
    "otel_train.compile.inconsistent": LOG_COMPILE_INCONSISTENT,
    # attributes (and the span event collective.stalled)
    **{f"collective.{key}": f"training.collective.{key}" for key in (
        "op", "backend", "bytes", "group_size", "seq", "dtype", "bus_bandwidth_gbps", "group",
        "api", "async", "shape", "stalled", "source", "completed", "gpu_duration_s", "count",
        "total_s", "seq_last")},
    **{f"compile.{key}": f"training.compile.{key}" for key in (
        "reason", "graph_breaks", "id", "frame", "trigger", "guard_failure",
        "graph_break_reasons", "graphs", "graph_ops", "guards", "cudagraph_skip_reason",
        "fail_type", "fail_reason", "recompile_limit_hit", "recompile_limit", "fingerprint",
        "inconsistency")},
    **{f"profile.{key}": f"training.profile.{key}" for key in (
        "trace_path", "first_step", "steps", "stop_s", "write_s", "top_kernels")},
    "signal": ATTR_SIGNAL, "component": ATTR_COMPONENT,
    # metrics
    "training.memory.allocated.peak": METRIC_MEMORY_ALLOCATED_PEAK,
    "training.memory.reserved.peak": METRIC_MEMORY_RESERVED_PEAK,
}
#: attribute prefixes that changed: old -> new (the compile source's per-stage times and
#: cache counts, ``compile.time.<stage>``, ``compile.cache.<counter>``)
LEGACY_PREFIXES: dict[str, str] = {"compile.time.": ATTR_COMPILE_TIME_PREFIX,
                                   "compile.cache.": ATTR_COMPILE_CACHE_PREFIX}

# --- metric definitions ------------------------------------------------------------------
#: seconds, from a fast micro-step phase (5 ms) to a stalled collective (60 s: the
#: TrainingCollectiveStalled alert reads the le="60" bucket); above 60 s only +Inf.
#: Why ten: where histograms are exported exponential
#: (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram,
#: as the k8s jobs set it) Prometheus stores each as one native series and these are unused;
#: elsewhere (a Prometheus without native histograms, the per-rank endpoint, the files) every
#: attribute set costs len + 3 series, so 10 keep a rank's 10 histogram attribute sets at
#: 10 x 13 + 15 = 145 series, inside the 150 of docs/scaling.md (23 boundaries made 273)
SECONDS_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)

HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"


@dataclass(frozen=True)
class Metric:
    """One instrument: what the sources create and what Prometheus is told it is."""

    name: str
    kind: str  # HISTOGRAM, COUNTER (monotonic) or GAUGE
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None  # explicit bucket advice, histograms only

    @property
    def prometheus(self) -> str:
        return prometheus_name(self.name, self.unit, self.kind)


_DEFINITIONS = (
    Metric(METRIC_STEP_DURATION, HISTOGRAM, "s", "Step time per rank.", SECONDS_BUCKETS),
    Metric(METRIC_PHASE_DURATION, HISTOGRAM, "s", "Time per phase of a step, per rank.",
           SECONDS_BUCKETS),
    Metric(METRIC_SAMPLES, COUNTER, "{sample}", "Samples trained."),
    Metric(METRIC_TOKENS, COUNTER, "{token}", "Tokens trained."),
    Metric(METRIC_TELEMETRY_DROPPED, COUNTER, "{item}",
           "Telemetry otel-train had to drop, by signal."),
    Metric(METRIC_INTERNAL_ERRORS, COUNTER, "{error}",
           "Exceptions otel-train caught on its hook paths so that training went on, by "
           "component (each component's first one is logged)."),
    # every collective of every source, recorded where spans are built (wire/collectives.py)
    Metric(METRIC_COLLECTIVE_DURATION, HISTOGRAM, "s",
           "Time of each collective, issue to completion (GPU time on NCCL with the flight "
           "recorder's timing).", SECONDS_BUCKETS),
    Metric(METRIC_COLLECTIVE_SIZE, COUNTER, "By", "Bytes of collectives (nccl-tests size)."),
    # Owned by sources/collectives/assembly.py (every step with communication);
    # sources/gpu/profiler.py sets the same instrument from a profiled window, its points marked by
    # training.overlap.method="profiler". One definition, so one description: the SDK hands
    # both sources the same instrument instead of warning of a conflicting one.
    Metric(METRIC_COMM_OVERLAP, GAUGE, "1",
           "Fraction of the step's communication time hidden under computation "
           "(training.overlap.method=profiler: from a profiled window's kernels)."),
    # sources/gpu/cuda_timing.py
    Metric(METRIC_PHASE_GPU_DURATION, HISTOGRAM, "s",
           "GPU time per phase of a step, per rank (CUDA events).", SECONDS_BUCKETS),
    # sources/cgroup.py
    Metric(METRIC_CPU_THROTTLED_TIME, COUNTER, "s",
           "Time this rank's cgroup was CPU-throttled (CFS quota), from cpu.stat."),
    # sources/gaps.py
    Metric(METRIC_UNTIMED_TIME, COUNTER, "s",
           "Time outside every phase, by training.untimed.part: device_wait (the host "
           "blocked on the device, still running earlier work), gpu_outside_phases (blocked "
           "while the device ran work queued outside the phases) and host_busy (the host's "
           "own work while the device had caught up); the rest of it is not explained."),
    # emitter/steps.py (otel_train/partition.py)
    Metric(METRIC_STEP_TIME, COUNTER, "s",
           "Step time per rank, by training.part: the disjoint parts each step is split into "
           "(data_wait, forward, backward, optimizer, exposed_comm, compile, device_wait, "
           "host_busy, not_explained); summed over parts it is training.step.duration's sum."),
    Metric(METRIC_GOODPUT_TIME, COUNTER, "s",
           "A rank's run time by training.goodput.bucket: productive (steady steps' compute) "
           "and the named losses (startup, compile, warmup, data_wait, exposed_comm, "
           "device_wait, outside_phases, between_steps)."),
    # sources/gpu/mfu.py
    Metric(METRIC_THROUGHPUT_SAMPLES, GAUGE, "{sample}/s",
           "Samples per second over the last step."),
    Metric(METRIC_THROUGHPUT_TOKENS, GAUGE, "{token}/s", "Tokens per second over the last step."),
    Metric(METRIC_FLOPS_ACHIEVED, GAUGE, "{flop}/s",
           "Model FLOPs per second achieved over the last step."),
    Metric(METRIC_MFU, GAUGE, "1", "Model FLOPs utilisation: achieved over the device's peak."),
    # sources/gpu/profiler.py
    Metric(METRIC_COMM_EXPOSED, GAUGE, "s",
           "Communication kernel time per step not hidden under computation."),
    Metric(METRIC_GPU_IDLE, GAUGE, "1",
           "Share of a profiled window the GPU ran no kernel or copy."),
    # sources/gpu/memory.py
    Metric(METRIC_MEMORY_ALLOCATED_PEAK, GAUGE, "By",
           "Peak allocated bytes (CUDA caching allocator), since start or per step."),
    Metric(METRIC_MEMORY_RESERVED, GAUGE, "By", "Bytes reserved by the caching allocator."),
    Metric(METRIC_MEMORY_ALLOCATED, GAUGE, "By", "Bytes allocated at the step's end."),
    Metric(METRIC_MEMORY_RESERVED_PEAK, GAUGE, "By", "Peak reserved bytes."),
    Metric(METRIC_MEMORY_FRAGMENTATION, GAUGE, "By",
           "Reserved minus allocated bytes at the step's end: held by the allocator but "
           "unused."),
    Metric(METRIC_MEMORY_ALLOC_RETRIES, COUNTER, "{retry}",
           "cudaMalloc retries after freeing cached blocks (memory pressure)."),
    Metric(METRIC_MEMORY_OOMS, COUNTER, "{error}", "CUDA out-of-memory errors."),
    # sources/compile/__init__.py
    Metric(METRIC_COMPILE_DURATION, HISTOGRAM, "s", "Time per torch.compile compilation.",
           SECONDS_BUCKETS),
    Metric(METRIC_COMPILE_GRAPH_BREAKS, COUNTER, "{break}",
           "Graph breaks dynamo took, by bounded reason."),
    Metric(METRIC_COMPILE_RECOMPILES, COUNTER, "{recompile}",
           "Recompilations of an already compiled frame, by guard failure kind."),
    Metric(METRIC_COMPILE_GRAPHS, COUNTER, "{graph}",
           "Graphs dynamo handed to the compiler backend."),
    Metric(METRIC_COMPILE_RECOMPILE_LIMIT_HITS, COUNTER, "{frame}",
           "Frames that hit the recompile limit and fell back to eager."),
    # a flag (0 or 1) per rank, so summed over ranks: how many differ; a unit of "1" would
    # name it a ratio (training_compile_inconsistent_ratio)
    Metric(METRIC_COMPILE_INCONSISTENT, GAUGE, "{rank}",
           "1 while this rank compiled other graphs than the reference rank."),
)
#: every metric otel-train creates, by OpenTelemetry name
METRICS: dict[str, Metric] = {m.name: m for m in _DEFINITIONS}


def create(meter: Any, name: str) -> Any:
    """The instrument ``METRICS[name]`` on ``meter`` (an OTel Meter or the exporter's proxy)."""
    metric = METRICS[name]
    make = getattr(meter, f"create_{metric.kind}")
    if metric.buckets is None:
        return make(metric.name, unit=metric.unit, description=metric.description)
    return make(metric.name, unit=metric.unit, description=metric.description,
                explicit_bucket_boundaries_advisory=list(metric.buckets))


# --- Prometheus names ----------------------------------------------------------------------
# OpenTelemetry's translation as the pinned collector's Prometheus exporter applies it
# (collector-contrib v0.161.0, prometheus/otlptranslator v1.0.0 normalizeName, strategy
# UnderscoreEscapingWithSuffixes, as collector/configs/*.yaml set it); prometheus-client,
# given these names, serves the same (it adds _total to a counter's name without one).
_UNIT_WORDS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes",
    "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes", "m": "meters", "V": "volts",
    "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz",
    "1": "", "%": "percent",
}
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week",
                   "mo": "month", "y": "year"}
_INVALID = re.compile(r"[^a-zA-Z0-9:]")


def _unit_word(unit: str, words: dict[str, str]) -> str:
    unit = unit.strip()
    if not unit or "{" in unit or "}" in unit:  # annotations ({sample}) name no unit
        return ""
    word = re.sub("_+", "_", _INVALID.sub("_", words.get(unit, unit)))
    return word.removeprefix("_")


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """``name`` as Prometheus sees it: split at every character other than [a-zA-Z0-9:]
    (dots and underscores alike), the unit's word (``seconds``, ``bytes``, ``per_second``)
    unless a token already is it, ``_total`` for counters, ``_ratio`` for gauges of unit 1.
    """
    tokens = [t for t in _INVALID.split(name) if t]
    main, _, per = unit.partition("/")
    main_word = _unit_word(main, _UNIT_WORDS)
    per_word = _unit_word(per, _PER_UNIT_WORDS)
    per_word = f"per_{per_word}" if per_word and per_word not in tokens else ""
    if main_word and main_word not in tokens:
        tokens.append(main_word.removesuffix("_") if per_word else main_word)
    if per_word:
        tokens.append(per_word)
    if kind == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if kind == GAUGE and unit == "1":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    joined = "_".join(tokens)
    return f"_{joined}" if joined[:1].isdigit() else joined


def prometheus_label(attribute: str) -> str:
    """An attribute's Prometheus label name (otlptranslator LabelNamer: invalid characters
    to underscores; none of otel-train's attributes starts with a digit)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def prom(name: str) -> str:
    """The Prometheus name of ``METRICS[name]`` (histograms add _bucket/_sum/_count)."""
    return METRICS[name].prometheus


PROM_STEP_DURATION = prom(METRIC_STEP_DURATION)  # training_step_duration_seconds
PROM_PHASE_DURATION = prom(METRIC_PHASE_DURATION)
PROM_SAMPLES = prom(METRIC_SAMPLES)  # training_samples_total
PROM_TOKENS = prom(METRIC_TOKENS)
PROM_TELEMETRY_DROPPED = prom(METRIC_TELEMETRY_DROPPED)
PROM_UNTIMED_TIME = prom(METRIC_UNTIMED_TIME)  # training_untimed_time_seconds_total
PROM_UNTIMED_PART_LABEL = prometheus_label(ATTR_UNTIMED_PART)
PROM_STEP_TIME = prom(METRIC_STEP_TIME)  # training_step_time_seconds_total
PROM_PART_LABEL = prometheus_label(ATTR_PART)  # training_part
PROM_GOODPUT_TIME = prom(METRIC_GOODPUT_TIME)  # training_goodput_time_seconds_total
PROM_GOODPUT_BUCKET_LABEL = prometheus_label(ATTR_GOODPUT_BUCKET)
PROM_CPU_THROTTLED = prom(METRIC_CPU_THROTTLED_TIME)  # training_cpu_throttled_time_seconds_total
PROM_RANK_LABEL = prometheus_label(ATTR_RANK)  # training_rank
PROM_PHASE_LABEL = prometheus_label(ATTR_PHASE)
PROM_RUN_LABEL = prometheus_label(ATTR_RUN_ID)
PROM_SIGNAL_LABEL = prometheus_label(ATTR_SIGNAL)  # otel_train_signal
