/* otel-train's NCCL profiler plugin (ncclProfiler_v5, NCCL 2.28 and later).
 *
 * NCCL loads it when NCCL_PROFILER_PLUGIN names this file (set before the first communicator
 * is created). For every collective and point-to-point operation it keeps one record: the
 * communicator, NCCL's sequence number, the per-rank element count in bytes, the CPU time at
 * which NCCL started the task (CLOCK_MONOTONIC, the clock of Python's time.perf_counter_ns),
 * the CPU time at which NCCL's proxy thread saw its last kernel channel finish, and the GPU's
 * globaltimer at the first channel's start and the last channel's stop. Records go into one
 * fixed-size ring that otel-train's emitter thread copies out through ctypes, a batch per
 * tick: nothing here takes the Python interpreter's lock, allocates per record on the
 * reading side or blocks NCCL. A full ring overwrites its oldest records and counts them.
 *
 * Callbacks run on the thread that enqueues the collective (task start and stop) and on
 * NCCL's proxy progress thread (kernel channel start, stop); see NCCL's
 * src/plugin/profiler.cc. The event structures below repeat the layout of NCCL's
 * ext-profiler/example/nccl/profiler_v5.h (NCCL 2.28.9, BSD-3-Clause, Copyright (c) 2024,
 * NVIDIA CORPORATION): the ABI this plugin must match.
 *
 * Build: cc -O2 -shared -fPIC -o libnccl-profiler-otel-train.so profiler.c -lpthread
 * (otel_train/nccl/__init__.py does it, once, into a cache directory).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#define OTP_VERSION 4

/* ---- NCCL's ABI (profiler_v5.h, profiler.h of NCCL 2.28.9) ---------------------------- */
typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
enum {
  ncclProfileGroup = (1 << 0), ncclProfileColl = (1 << 1), ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3), ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5), ncclProfileKernelCh = (1 << 6),
  ncclProfileKernelLaunch = (1 << 11),
};
#define ncclProfilerKernelChStop 22

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct { int graphCaptured; int groupDepth; } groupApi;
    struct { const char* func; size_t count; const char* datatype; int root; void* stream;
             bool graphCaptured; } collApi;
    struct { const char* func; size_t count; const char* datatype; void* stream;
             bool graphCaptured; } p2pApi;
    struct { void* stream; } kernelLaunch;
    struct { uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; uint8_t nChannels; uint8_t nWarps;
             const char* algo; const char* proto; void* parentGroup; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer;
             uint8_t nChannels; void* parentGroup; } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize;
             int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void* data; } netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask,
                       const char* commName, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

/* ---- records ---------------------------------------------------------------------------- */
/* 64 bytes, little-endian on every platform NCCL runs on; Python: struct "<QQQqqQQBBBBBBH" */
typedef struct {
  uint64_t comm;      /* NCCL's communicator hash (commId of init) */
  uint64_t seq;       /* NCCL's per-communicator, per-function sequence number (0 for p2p) */
  uint64_t bytes;     /* count x element size, as NCCL counts (per rank) */
  int64_t t_issue;    /* CLOCK_MONOTONIC ns: NCCL started the task */
  int64_t t_done;     /* CLOCK_MONOTONIC ns: the proxy saw the last channel stop */
  uint64_t gpu_start; /* GPU globaltimer ns: first channel start (0: not known) */
  uint64_t gpu_stop;  /* GPU globaltimer ns: last channel stop (0: not known) */
  uint8_t func;       /* OTP_F_* */
  uint8_t dtype;      /* element type (TYPES below; 0: unknown) */
  uint8_t algo;
  uint8_t proto;
  uint8_t nchannels;
  uint8_t flags;      /* 1: GPU-timed; 2: by CUDA events (gpu_start 0, gpu_stop the ns);
                         4: its kernel ran other operations too (the kernel's duration) */
  uint16_t nranks;
} otp_record;

enum { OTP_F_OTHER = 0, OTP_F_ALL_GATHER, OTP_F_ALL_REDUCE, OTP_F_ALL_TO_ALL, OTP_F_BROADCAST,
       OTP_F_GATHER, OTP_F_RECV, OTP_F_REDUCE, OTP_F_REDUCE_SCATTER, OTP_F_SCATTER,
       OTP_F_SEND_RECV, OTP_F_SEND };

#define OTP_MAX_CHANNELS 64
#define OTP_RING (1u << 16)
#define OTP_MAX_COMMS 256

typedef struct {
  _Atomic uint64_t stamp; /* index + 1 once written; 0 while being written */
  otp_record rec;
} otp_slot;

typedef struct otp_comm {
  uint64_t hash;
  int nranks, rank, nnodes;
  char name[64];
} otp_comm;

struct otp_op;
typedef struct {
  uint64_t type; /* ncclProfileKernelCh: handles start with their type */
  struct otp_op* op;
  uint64_t start;
  uint8_t started;
} otp_channel;

typedef struct otp_op {
  uint64_t type; /* ncclProfileColl or ncclProfileP2p */
  otp_comm* comm;
  otp_record rec;
  _Atomic int refs;       /* the task's stop + one per started channel */
  _Atomic int ch_stopped; /* channels that reported their stop */
  _Atomic int ch_started;
  _Atomic int timed;      /* channels with both GPU stamps */
  _Atomic uint64_t gpu_min, gpu_max;
  struct otp_op *prev, *next; /* in flight, oldest first */
  struct otp_op* lnext;       /* the next operation of the same kernel launch */
  int attached;               /* timed by a launch's CUDA events */
  int events;                 /* timed by CUDA events (else by kernel channels): the mode
                                 when NCCL started it, which a later communicator may change */
  otp_channel ch[OTP_MAX_CHANNELS];
} otp_op;

static otp_slot g_ring[OTP_RING];
static _Atomic uint64_t g_head;     /* records written */
static uint64_t g_tail;             /* records read (reader only, under g_read_lock) */
static uint64_t g_lost;             /* overwritten before a read */
static _Atomic uint64_t g_dropped;  /* not recorded at all (allocation failed) */
static _Atomic uint64_t g_ops;      /* tasks started */
static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_flight_lock = PTHREAD_MUTEX_INITIALIZER;
static otp_op *g_oldest, *g_newest;
static uint64_t g_in_flight;
static otp_comm g_comms[OTP_MAX_COMMS];
static _Atomic int g_ncomms;
static pthread_mutex_t g_comm_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t self_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint8_t func_id(const char* f) {
  if (f == NULL) return OTP_F_OTHER;
  /* ncclFuncToString: AllGather AllReduce AlltoAll Broadcast Gather Recv Reduce
     ReduceScatter Scatter SendRecv Send */
  static const struct { const char* name; uint8_t id; } table[] = {
    {"AllGather", OTP_F_ALL_GATHER}, {"AllReduce", OTP_F_ALL_REDUCE},
    {"AlltoAll", OTP_F_ALL_TO_ALL}, {"Broadcast", OTP_F_BROADCAST}, {"Gather", OTP_F_GATHER},
    {"Recv", OTP_F_RECV}, {"Reduce", OTP_F_REDUCE}, {"ReduceScatter", OTP_F_REDUCE_SCATTER},
    {"Scatter", OTP_F_SCATTER}, {"SendRecv", OTP_F_SEND_RECV}, {"Send", OTP_F_SEND},
  };
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    if (strcmp(f, table[i].name) == 0) return table[i].id;
  return OTP_F_OTHER;
}

/* ncclDatatypeToString's names -> (our id, element size); id 0: unknown. The ids are
 * otel_train/nccl/__init__.py's DTYPES. */
static const struct { const char* name; uint8_t id, size; } TYPES[] = {
  {"ncclInt8", 1, 1}, {"ncclUint8", 2, 1}, {"ncclInt32", 3, 4}, {"ncclUint32", 4, 4},
  {"ncclInt64", 5, 8}, {"ncclUint64", 6, 8}, {"ncclFloat16", 7, 2}, {"ncclFloat32", 8, 4},
  {"ncclFloat64", 9, 8}, {"ncclBfloat16", 10, 2}, {"ncclFloat8e4m3", 11, 1},
  {"ncclFloat8e5m2", 12, 1},
};

static uint8_t type_id(const char* t, uint8_t* size) {
  *size = 0;
  if (t == NULL) return 0;
  for (size_t i = 0; i < sizeof(TYPES) / sizeof(TYPES[0]); i++)
    if (strcmp(t, TYPES[i].name) == 0) {
      *size = TYPES[i].size;
      return TYPES[i].id;
    }
  return 0;
}

static uint8_t small_id(const char* s) { /* algorithm / protocol names: first letters */
  if (s == NULL) return 0;
  return (uint8_t)s[0];
}

static void publish(const otp_record* r) {
  uint64_t i = atomic_fetch_add_explicit(&g_head, 1, memory_order_relaxed);
  otp_slot* s = &g_ring[i & (OTP_RING - 1)];
  atomic_store_explicit(&s->stamp, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  s->rec = *r;
  atomic_store_explicit(&s->stamp, i + 1, memory_order_release);
}

static void flight_add(otp_op* op) {
  pthread_mutex_lock(&g_flight_lock);
  op->prev = g_newest;
  op->next = NULL;
  if (g_newest) g_newest->next = op; else g_oldest = op;
  g_newest = op;
  g_in_flight++;
  pthread_mutex_unlock(&g_flight_lock);
}

static void flight_remove(otp_op* op) {
  pthread_mutex_lock(&g_flight_lock);
  if (op->prev) op->prev->next = op->next; else g_oldest = op->next;
  if (op->next) op->next->prev = op->prev; else g_newest = op->prev;
  op->prev = op->next = NULL;
  g_in_flight--;
  pthread_mutex_unlock(&g_flight_lock);
}

static void release(otp_op* op) {
  if (atomic_fetch_sub_explicit(&op->refs, 1, memory_order_acq_rel) == 1) free(op);
}

/* The task is done: on the last channel's stop, or at the task's stop when it has none. */
static void finish(otp_op* op) {
  int started = atomic_load(&op->ch_started);
  op->rec.t_done = now_ns();
  if (started > 0 && atomic_load(&op->timed) == started) {
    op->rec.gpu_start = atomic_load(&op->gpu_min);
    op->rec.gpu_stop = atomic_load(&op->gpu_max);
    op->rec.flags = 1;
  }
  flight_remove(op);
  publish(&op->rec);
}

/* ---- timing by CUDA events (the default) -------------------------------------------------- */
typedef int CUresult; /* CUDA_SUCCESS 0, CUDA_ERROR_NOT_READY 600 */
typedef void* CUevent;
typedef void* CUstream;
typedef void* CUcontext;
static struct {
  int ok;
  CUresult (*ctx_get)(CUcontext*);
  CUresult (*ctx_set)(CUcontext);
  CUresult (*event_create)(CUevent*, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_query)(CUevent);
  CUresult (*event_elapsed)(float*, CUevent, CUevent);
  CUresult (*is_capturing)(CUstream, int*);
} cu;
static pthread_once_t g_cu_once = PTHREAD_ONCE_INIT;
/* How kernels are timed (OTEL_TRAIN_NCCL_TIMING, read once):
 *   "events": CUDA events recorded around each kernel launch, completed by the poller;
 *   "kernel": NCCL's kernel-channel events (the GPU's globaltimer at each channel's start and
 *             stop, reported by NCCL's proxy thread, which then polls the kernel's progress);
 *   "auto" (the default): kernel while every communicator of the process spans several nodes
 *             (nNodes > 1: its peers are reached over the network transport, whose proxy
 *             thread already spins while a collective runs, so the channel events cost it
 *             nothing more), events once any communicator is within one node (there the
 *             proxy thread sleeps, and kernel timing would keep it busy: a core a process).
 * NCCL keeps one activation mask for the whole process (src/plugin/profiler.cc,
 * ncclProfilerEventMask, written by every init), so the choice is the process's; each
 * operation keeps the mode it started under. */
enum { OTP_TIMING_AUTO = 0, OTP_TIMING_EVENTS = 1, OTP_TIMING_KERNEL = 2 };
static int g_timing = OTP_TIMING_AUTO;
static _Atomic int g_mode_events = 1; /* the mode new operations start under */
static int g_any_local = 0;           /* a communicator within one node was seen (comm lock) */
static pthread_once_t g_mode_once = PTHREAD_ONCE_INIT;

/* between poller passes while a launch is pending: OTEL_TRAIN_NCCL_POLL_MS (1-1000, 25).
 * Each pass costs a wake-up and event queries; a finished kernel's end time does not depend
 * on when the pass sees it (it is chained on the GPU's clock, see poller()). */
static int64_t g_poll_ns = 25000000;

/* Measurement switches (bench/multigpu): OTEL_TRAIN_NCCL_SELF_TIME=1 adds up the thread CPU
 * spent in this plugin's callbacks on NCCL's enqueuing threads (two CPU-clock reads per
 * callback, ~0.2 us each, partly counted); OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE=1 completes
 * finished launches on the enqueuing thread too, not only on the poller. It is off: where the
 * driver's event calls cost as much on the enqueuing thread as on the poller, the training
 * threads pay more than the poller saves (docs/collectives.md). */
static int g_self_time = 0;
static int g_harvest_on_enqueue = 0;
static _Atomic uint64_t g_cb_ns, g_cb_n, g_harvest_enqueue_ns;

/* instrument() sets these variables to its checked settings (config.nccl_environment in
 * Python: one validation, warned about by name) before NCCL loads the plugin; where a
 * launcher names the plugin itself they are read as it set them, and a value not understood
 * here falls back to the default. */
static void read_mode(void) {
  const char* m = getenv("OTEL_TRAIN_NCCL_TIMING");
  g_timing = m == NULL ? OTP_TIMING_AUTO
             : strcmp(m, "kernel") == 0 ? OTP_TIMING_KERNEL
             : strcmp(m, "events") == 0 ? OTP_TIMING_EVENTS : OTP_TIMING_AUTO;
  atomic_store(&g_mode_events, g_timing != OTP_TIMING_KERNEL);
  const char* st = getenv("OTEL_TRAIN_NCCL_SELF_TIME");
  g_self_time = st != NULL && strcmp(st, "1") == 0;
  const char* hv = getenv("OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE");
  g_harvest_on_enqueue = hv != NULL && strcmp(hv, "1") == 0;
  const char* p = getenv("OTEL_TRAIN_NCCL_POLL_MS");
  if (p != NULL) {
    long ms = strtol(p, NULL, 10);
    if (ms >= 1 && ms <= 1000) g_poll_ns = (int64_t)ms * 1000000;
  }
}

static void cu_load(void) {
  /* the driver the training process already uses (torch loaded it) */
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == NULL) return;
  cu.ctx_get = (CUresult(*)(CUcontext*))dlsym(h, "cuCtxGetCurrent");
  cu.ctx_set = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
  cu.event_create = (CUresult(*)(CUevent*, unsigned))dlsym(h, "cuEventCreate");
  cu.event_record = (CUresult(*)(CUevent, CUstream))dlsym(h, "cuEventRecord");
  cu.event_query = (CUresult(*)(CUevent))dlsym(h, "cuEventQuery");
  cu.event_elapsed = (CUresult(*)(float*, CUevent, CUevent))dlsym(h, "cuEventElapsedTime");
  if (cu.event_elapsed == NULL)
    cu.event_elapsed = (CUresult(*)(float*, CUevent, CUevent))dlsym(h, "cuEventElapsedTime_v2");
  cu.is_capturing = (CUresult(*)(CUstream, int*))dlsym(h, "cuStreamIsCapturing");
  cu.ok = cu.ctx_get && cu.ctx_set && cu.event_create && cu.event_record && cu.event_query &&
          cu.event_elapsed && cu.is_capturing;
}

typedef struct otp_launch {
  uint64_t type; /* ncclProfileKernelLaunch */
  CUevent ev0, ev1;
  CUcontext ctx;
  CUstream stream;
  int64_t t_launch;
  int recorded, done, nops;
  uint64_t gpu_ns;
  int64_t t_done;
  otp_op* ops;                 /* attached before completion, published with it */
  int refs;                    /* the launching thread's, the pending list's, NCCL's handle */
  struct otp_launch* next;     /* pending, oldest first */
} otp_launch;

#define OTP_POOL 4096
static pthread_mutex_t g_launch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_launch_cond = PTHREAD_COND_INITIALIZER;
static otp_launch *g_pending_head, *g_pending_tail;
static struct { CUevent ev; CUcontext ctx; } g_pool[OTP_POOL];
static int g_pool_n;
static pthread_once_t g_poller_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t g_polls;      /* poller passes that queried at least one event */
static _Atomic uint64_t g_untimed;    /* operations without GPU timing (capture, errors) */
static __thread otp_launch* tl_launch; /* the launch of this thread's current plan */

static void launch_release_locked(otp_launch* l) {
  if (--l->refs > 0) return;
  if (g_pool_n + 2 <= OTP_POOL) { /* events go back to the pool */
    if (l->ev0) { g_pool[g_pool_n].ev = l->ev0; g_pool[g_pool_n++].ctx = l->ctx; }
    if (l->ev1) { g_pool[g_pool_n].ev = l->ev1; g_pool[g_pool_n++].ctx = l->ctx; }
  }
  free(l);
}

static CUevent event_get(CUcontext ctx) { /* called without g_launch_lock held */
  pthread_mutex_lock(&g_launch_lock);
  for (int i = g_pool_n - 1; i >= 0; i--)
    if (g_pool[i].ctx == ctx) {
      CUevent ev = g_pool[i].ev;
      g_pool[i] = g_pool[--g_pool_n];
      pthread_mutex_unlock(&g_launch_lock);
      return ev;
    }
  pthread_mutex_unlock(&g_launch_lock);
  CUevent ev = NULL;
  if (cu.event_create(&ev, 0) != 0) return NULL; /* CU_EVENT_DEFAULT: timing on */
  return ev;
}

static void op_timed_locked(otp_op* op, otp_launch* l) {
  op->rec.t_issue = l->t_launch;
  op->rec.t_done = l->t_done;
  if (l->gpu_ns) {
    op->rec.gpu_start = 0;
    op->rec.gpu_stop = l->gpu_ns;
    op->rec.flags = 1 | 2 | (l->nops > 1 ? 4 : 0);
  } else {
    atomic_fetch_add(&g_untimed, 1);
  }
  flight_remove(op);
  publish(&op->rec);
}


/* Per stream, the last launch completed there and its end on the host clock: the next one's
 * end is chained from it. A stream is completed by one thread at a time (busy). */
#define OTP_STREAMS 64
static struct { CUstream stream; int64_t done; otp_launch* last; int busy; } g_ends[OTP_STREAMS];
static int g_nends;                   /* under g_launch_lock */
static _Atomic uint64_t g_by_enqueuer; /* launches completed on the enqueuing thread */

/* Complete the finished launches of one stream, oldest first and in order, up to the first
 * that is not finished (a stream runs its kernels in order), stopping at `before` (a launch
 * just made, not finished). The calling thread has the launches' CUDA context current.
 * A stream another thread is completing is left to it (-1). Returns how many were completed.
 *
 * Who calls it: the poller, every OTEL_TRAIN_NCCL_POLL_MS; with
 * OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE=1 also the thread that enqueues a collective, for the
 * earlier launches on the same stream, right after launching its kernel (launch_stop); and
 * otel_train_nccl_complete(), when instrumentation ends. The driver's event calls are cheap
 * on the poller and can be dear on a thread that waits for the driver's lock while the
 * training thread records events (bench/nccl/driver_calls.c measures them;
 * docs/overhead.md). */
static int harvest(CUstream stream, otp_launch* before) {
  otp_launch* batch[64];
  int n = 0, k = 0;
  pthread_mutex_lock(&g_launch_lock);
  while (k < g_nends && g_ends[k].stream != stream) k++;
  if (k == g_nends) {
    if (g_nends == OTP_STREAMS) k = -1; /* more streams than slots: not chained */
    else {
      g_ends[k].stream = stream;
      g_ends[k].last = NULL;
      g_ends[k].done = 0;
      g_ends[k].busy = 0;
      g_nends++;
    }
  }
  if (k >= 0 && g_ends[k].busy) {
    pthread_mutex_unlock(&g_launch_lock);
    return -1; /* another thread is at it */
  }
  for (otp_launch* l = g_pending_head; l != NULL && l != before && n < 64; l = l->next)
    if (l->stream == stream) {
      l->refs++;
      batch[n++] = l;
    }
  if (n == 0) {
    pthread_mutex_unlock(&g_launch_lock);
    return 0;
  }
  if (k >= 0) g_ends[k].busy = 1;
  pthread_mutex_unlock(&g_launch_lock);
  /* many pending: if the newest is done, all are (one query instead of one each) */
  int all = n > 2 && cu.event_query(batch[n - 1]->ev1) != 600;
  int64_t now = 0;
  int completed = 0;
  for (int i = 0; i < n; i++) {
    otp_launch* l = batch[i];
    if (!all && cu.event_query(l->ev1) == 600) break; /* not yet, nor any later one */
    float ms = 0;
    uint64_t gpu_ns = 0;
    if (cu.event_elapsed(&ms, l->ev0, l->ev1) == 0 && ms >= 0)
      gpu_ns = (uint64_t)((double)ms * 1e6);
    if (now == 0) now = now_ns();
    /* When it ended, on the host's clock. Its GPU start is the stream's previous end plus
     * the GPU's idle gap between the two (events: exact, dependency waits included); it
     * cannot have ended before its launch plus its GPU time (which re-anchors the chain
     * whenever it launched into an idle stream), nor after this thread saw it. */
    int64_t done = l->t_launch + (int64_t)gpu_ns;
    if (k >= 0 && g_ends[k].last != NULL && gpu_ns) {
      float gap_ms = 0;
      if (cu.event_elapsed(&gap_ms, g_ends[k].last->ev1, l->ev0) == 0 && gap_ms >= 0) {
        int64_t chained = g_ends[k].done + (int64_t)((double)gap_ms * 1e6) + (int64_t)gpu_ns;
        if (chained > done) done = chained;
      }
    }
    if (done > now || gpu_ns == 0) done = now;
    pthread_mutex_lock(&g_launch_lock);
    if (k >= 0) {
      if (g_ends[k].last != NULL) launch_release_locked(g_ends[k].last);
      l->refs++; /* kept until the stream's next kernel is done: its end event anchors it */
      g_ends[k].last = l;
      g_ends[k].done = done;
    }
    l->done = 1;
    l->gpu_ns = gpu_ns;
    l->t_done = done;
    for (otp_op* op = l->ops; op != NULL;) {
      otp_op* next = op->lnext;
      op_timed_locked(op, l);
      release(op); /* the launch's reference */
      op = next;
    }
    l->ops = NULL;
    /* off the pending list */
    otp_launch** pp = &g_pending_head;
    otp_launch* prev = NULL;
    while (*pp != NULL && *pp != l) { prev = *pp; pp = &(*pp)->next; }
    if (*pp == l) {
      *pp = l->next;
      if (g_pending_tail == l) g_pending_tail = prev;
      launch_release_locked(l); /* the pending list's */
    }
    pthread_mutex_unlock(&g_launch_lock);
    completed++;
  }
  pthread_mutex_lock(&g_launch_lock);
  for (int i = 0; i < n; i++) launch_release_locked(batch[i]);
  if (k >= 0) g_ends[k].busy = 0;
  pthread_mutex_unlock(&g_launch_lock);
  return completed;
}

/* One pass over every stream with launches pending: complete what has finished. Returns how
 * many streams another thread was completing at that moment (left to it). */
static int pass_all(CUcontext* current) {
  struct { CUstream stream; CUcontext ctx; } streams[OTP_STREAMS];
  int ns = 0, busy = 0;
  pthread_mutex_lock(&g_launch_lock);
  for (otp_launch* l = g_pending_head; l != NULL && ns < OTP_STREAMS; l = l->next) {
    int j = 0;
    while (j < ns && streams[j].stream != l->stream) j++;
    if (j == ns) {
      streams[ns].stream = l->stream;
      streams[ns++].ctx = l->ctx;
    }
  }
  pthread_mutex_unlock(&g_launch_lock);
  for (int j = 0; j < ns; j++) {
    if (streams[j].ctx != *current && cu.ctx_set(streams[j].ctx) == 0)
      *current = streams[j].ctx;
    busy += harvest(streams[j].stream, NULL) < 0;
  }
  return busy;
}

static void* poller(void* arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "otel-nccl-poll");
  CUcontext current = NULL;
  for (;;) {
    pthread_mutex_lock(&g_launch_lock);
    while (g_pending_head == NULL) pthread_cond_wait(&g_launch_cond, &g_launch_lock);
    pthread_mutex_unlock(&g_launch_lock);
    pass_all(&current);
    pthread_mutex_lock(&g_launch_lock);
    int more = g_pending_head != NULL;
    pthread_mutex_unlock(&g_launch_lock);
    atomic_fetch_add_explicit(&g_polls, 1, memory_order_relaxed);
    if (more) { /* each pass takes every finished launch: the next in g_poll_ns */
      struct timespec ts = {g_poll_ns / 1000000000, g_poll_ns % 1000000000};
      nanosleep(&ts, NULL);
    }
  }
  return NULL;
}

static void start_poller(void) {
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_create(&t, &attr, poller, NULL);
  pthread_attr_destroy(&attr);
}

static void launch_start(void** handle, ncclProfilerEventDescr_v5_t* d) {
  pthread_once(&g_cu_once, cu_load);
  otp_launch* old = tl_launch;
  tl_launch = NULL;
  if (old != NULL) {
    pthread_mutex_lock(&g_launch_lock);
    launch_release_locked(old); /* the thread's reference */
    pthread_mutex_unlock(&g_launch_lock);
  }
  if (!cu.ok) return;
  CUstream stream = (CUstream)d->kernelLaunch.stream;
  int capturing = 0;
  if (cu.is_capturing(stream, &capturing) != 0 || capturing != 0) return; /* never in a graph */
  CUcontext ctx = NULL;
  if (cu.ctx_get(&ctx) != 0 || ctx == NULL) return;
  otp_launch* l = (otp_launch*)calloc(1, sizeof(otp_launch));
  if (l == NULL) return;
  l->type = ncclProfileKernelLaunch;
  l->ctx = ctx;
  l->stream = stream;
  l->ev0 = event_get(ctx);
  l->ev1 = event_get(ctx);
  if (l->ev0 == NULL || l->ev1 == NULL || cu.event_record(l->ev0, stream) != 0) {
    pthread_mutex_lock(&g_launch_lock);
    l->refs = 1;
    launch_release_locked(l);
    pthread_mutex_unlock(&g_launch_lock);
    return;
  }
  l->t_launch = now_ns();
  l->refs = 2; /* this thread's, NCCL's handle */
  tl_launch = l;
  *handle = l;
}

static void launch_stop(otp_launch* l) {
  int ok = cu.event_record(l->ev1, l->stream) == 0;
  pthread_mutex_lock(&g_launch_lock);
  if (ok) {
    l->recorded = 1;
    l->refs++; /* the pending list's */
    l->next = NULL;
    if (g_pending_tail) g_pending_tail->next = l; else g_pending_head = l;
    g_pending_tail = l;
    pthread_cond_signal(&g_launch_cond);
  }
  launch_release_locked(l); /* NCCL's handle */
  pthread_mutex_unlock(&g_launch_lock);
  if (ok) {
    pthread_once(&g_poller_once, start_poller);
    if (!g_harvest_on_enqueue) return;
    /* the earlier launches on this stream that have finished, here and now (harvest()) */
    int64_t t0 = g_self_time ? self_cpu_ns() : 0;
    int n = harvest(l->stream, l);
    if (n > 0) atomic_fetch_add_explicit(&g_by_enqueuer, (uint64_t)n, memory_order_relaxed);

    if (g_self_time)
      atomic_fetch_add_explicit(&g_harvest_enqueue_ns, (uint64_t)(self_cpu_ns() - t0),
                                memory_order_relaxed);
  }
}

/* NCCL starts a plan's tasks right after launching its kernel, on the same thread: the
 * operation takes the launch's timing (or, if the kernel already finished, has it now). */
static int attach(otp_op* op) {
  otp_launch* l = tl_launch;
  if (l == NULL) return 0;
  pthread_mutex_lock(&g_launch_lock);
  if (!l->recorded) {
    pthread_mutex_unlock(&g_launch_lock);
    return 0;
  }
  l->nops++;
  op->attached = 1;
  if (l->done) {
    op_timed_locked(op, l);
  } else {
    atomic_fetch_add(&op->refs, 1); /* the launch's */
    op->lnext = l->ops;
    l->ops = op;
  }
  pthread_mutex_unlock(&g_launch_lock);
  return 1;
}

/* ---- the plugin ------------------------------------------------------------------------ */
static ncclResult_t otp_init(void** context, uint64_t commId, int* mask, const char* name,
                             int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  pthread_once(&g_mode_once, read_mode);
  pthread_mutex_lock(&g_comm_lock);
  if (g_timing == OTP_TIMING_AUTO) {
    if (nNodes <= 1) g_any_local = 1;
    atomic_store(&g_mode_events, g_any_local);
  }
  int events = atomic_load(&g_mode_events);
  int n = atomic_load(&g_ncomms);
  otp_comm* c = NULL;
  for (int i = 0; i < n; i++)
    if (g_comms[i].hash == commId) c = &g_comms[i]; /* a communicator made again */
  if (c == NULL && n < OTP_MAX_COMMS) {
    c = &g_comms[n];
    c->hash = commId;
    c->nranks = nranks;
    c->rank = rank;
    c->nnodes = nNodes;
    if (name) strncpy(c->name, name, sizeof(c->name) - 1);
    atomic_store(&g_ncomms, n + 1);
  }
  pthread_mutex_unlock(&g_comm_lock);
  /* the process's mask (every communicator's, not only this one's: never 0 here) */
  *mask = ncclProfileColl | ncclProfileP2p |
          (events ? ncclProfileKernelLaunch : ncclProfileKernelCh);
  /* more communicators than slots: this one is not observed (its events have no context) */
  *context = c;
  return 0;
}

static ncclResult_t otp_start_(void* context, void** handle, ncclProfilerEventDescr_v5_t* d) {
  *handle = NULL;
  if (context == NULL || d == NULL) return 0;
  if (d->type == ncclProfileColl || d->type == ncclProfileP2p) {
    /* timed by events, an operation has no kernel channels: 2 KiB less to clear */
    int events = atomic_load_explicit(&g_mode_events, memory_order_relaxed);
    otp_op* op = (otp_op*)calloc(1, events ? offsetof(otp_op, ch) : sizeof(otp_op));
    atomic_fetch_add_explicit(&g_ops, 1, memory_order_relaxed);
    if (op == NULL) {
      atomic_fetch_add_explicit(&g_dropped, 1, memory_order_relaxed);
      return 0;
    }
    otp_comm* c = (otp_comm*)context;
    uint8_t size = 0;
    op->type = d->type;
    op->events = events;
    op->comm = c;
    op->rec.comm = c->hash;
    op->rec.nranks = (uint16_t)c->nranks;
    op->rec.t_issue = now_ns();
    if (d->type == ncclProfileColl) {
      op->rec.seq = d->coll.seqNumber;
      op->rec.func = func_id(d->coll.func);
      op->rec.dtype = type_id(d->coll.datatype, &size);
      op->rec.bytes = (uint64_t)d->coll.count * size;
      op->rec.nchannels = d->coll.nChannels;
      op->rec.algo = small_id(d->coll.algo);
      op->rec.proto = small_id(d->coll.proto);
    } else {
      op->rec.func = func_id(d->p2p.func);
      op->rec.dtype = type_id(d->p2p.datatype, &size);
      op->rec.bytes = (uint64_t)d->p2p.count * size;
      op->rec.nchannels = d->p2p.nChannels;
    }
    atomic_store(&op->gpu_min, UINT64_MAX);
    if (events) {
      atomic_store(&op->refs, 1); /* the task's stop; attach() adds the launch's */
      flight_add(op);
      attach(op);
      *handle = op;
      return 0;
    }
    /* references: the task's stop, and its completion while channels are to come (a
     * channel can start after NCCL stopped the task) */
    atomic_store(&op->refs, op->rec.nchannels > 0 ? 2 : 1);
    flight_add(op);
    *handle = op;
  } else if (d->type == ncclProfileKernelLaunch) {
    launch_start(handle, d);
  } else if (d->type == ncclProfileKernelCh) {
    otp_op* op = (otp_op*)d->parentObj;
    if (op == NULL || (op->type != ncclProfileColl && op->type != ncclProfileP2p) ||
        op->events) return 0; /* started under events timing: it has no channel slots */
    uint8_t id = d->kernelCh.channelId;
    if (id >= OTP_MAX_CHANNELS) return 0;
    otp_channel* ch = &op->ch[id];
    ch->type = ncclProfileKernelCh;
    ch->op = op;
    ch->start = d->kernelCh.pTimer;
    ch->started = 1;
    atomic_fetch_add(&op->refs, 1);
    atomic_fetch_add(&op->ch_started, 1);
    *handle = ch;
  }
  return 0;
}

static void fetch_min(_Atomic uint64_t* a, uint64_t v) {
  uint64_t cur = atomic_load(a);
  while (v < cur && !atomic_compare_exchange_weak(a, &cur, v)) {}
}

static void fetch_max(_Atomic uint64_t* a, uint64_t v) {
  uint64_t cur = atomic_load(a);
  while (v > cur && !atomic_compare_exchange_weak(a, &cur, v)) {}
}

static ncclResult_t otp_record_state(void* handle, int state,
                                     ncclProfilerEventStateArgs_v5_t* args) {
  if (handle == NULL || args == NULL || state != ncclProfilerKernelChStop) return 0;
  if (*(uint64_t*)handle != ncclProfileKernelCh) return 0;
  otp_channel* ch = (otp_channel*)handle;
  uint64_t stop = args->kernelCh.pTimer;
  if (ch->start != 0 && stop >= ch->start) {
    fetch_min(&ch->op->gpu_min, ch->start);
    fetch_max(&ch->op->gpu_max, stop);
    atomic_fetch_add(&ch->op->timed, 1);
  }
  return 0;
}

static ncclResult_t otp_stop_(void* handle) {
  if (handle == NULL) return 0;
  uint64_t type = *(uint64_t*)handle;
  if (type == ncclProfileKernelCh) {
    otp_channel* ch = (otp_channel*)handle;
    otp_op* op = ch->op;
    int stopped = atomic_fetch_add(&op->ch_stopped, 1) + 1;
    if (stopped == op->rec.nchannels) { /* exactly one stop sees this */
      finish(op);
      release(op); /* the completion's reference */
    }
    release(op); /* this channel's */
  } else if (type == ncclProfileKernelLaunch) {
    launch_stop((otp_launch*)handle);
  } else if (type == ncclProfileColl || type == ncclProfileP2p) {
    otp_op* op = (otp_op*)handle;
    if (op->events) {
      /* no launch to time it (graph capture, copy-engine collectives): CPU times only */
      if (!op->attached) {
        atomic_fetch_add(&g_untimed, 1);
        finish(op);
      }
    } else if (op->rec.nchannels == 0) {
      /* a task whose kernel reports no channel (nothing to move) is done when NCCL stops it */
      finish(op);
    }
    release(op);
  }
  return 0;
}

/* the callbacks NCCL calls, timed when OTEL_TRAIN_NCCL_SELF_TIME=1 (kernel-channel events run
 * on NCCL's proxy thread: not counted as the enqueuing thread's) */
static ncclResult_t otp_start(void* context, void** handle, ncclProfilerEventDescr_v5_t* d) {
  if (!g_self_time || d == NULL || d->type == ncclProfileKernelCh)
    return otp_start_(context, handle, d);
  int64_t t0 = self_cpu_ns();
  ncclResult_t r = otp_start_(context, handle, d);
  atomic_fetch_add_explicit(&g_cb_ns, (uint64_t)(self_cpu_ns() - t0), memory_order_relaxed);
  atomic_fetch_add_explicit(&g_cb_n, 1, memory_order_relaxed);
  return r;
}

static ncclResult_t otp_stop(void* handle) {
  if (!g_self_time || handle == NULL || *(uint64_t*)handle == ncclProfileKernelCh)
    return otp_stop_(handle);
  int64_t t0 = self_cpu_ns();
  ncclResult_t r = otp_stop_(handle);
  atomic_fetch_add_explicit(&g_cb_ns, (uint64_t)(self_cpu_ns() - t0), memory_order_relaxed);
  atomic_fetch_add_explicit(&g_cb_n, 1, memory_order_relaxed);
  return r;
}

static ncclResult_t otp_finalize(void* context) {
  (void)context;
  return 0;
}

__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
  "otel-train", otp_init, otp_start, otp_stop, otp_record_state, otp_finalize,
};

/* ---- what otel-train's emitter reads (ctypes) ------------------------------------------- */
__attribute__((visibility("default"))) int otel_train_nccl_version(void) { return OTP_VERSION; }

__attribute__((visibility("default"))) int otel_train_nccl_ncomms(void) {
  return atomic_load(&g_ncomms);
}

__attribute__((visibility("default"))) int otel_train_nccl_comms(otp_comm* out, int max) {
  int n = atomic_load(&g_ncomms);
  if (n > max) n = max;
  pthread_mutex_lock(&g_comm_lock);
  memcpy(out, g_comms, (size_t)n * sizeof(otp_comm));
  pthread_mutex_unlock(&g_comm_lock);
  return n;
}

/* Copy up to max records, oldest first; *lost gets the records overwritten before this read
 * (since the last call). Returns the number copied. */
__attribute__((visibility("default"))) int otel_train_nccl_read(otp_record* out, int max,
                                                               uint64_t* lost) {
  int n = 0;
  pthread_mutex_lock(&g_read_lock);
  uint64_t head = atomic_load_explicit(&g_head, memory_order_acquire);
  uint64_t lost_now = 0;
  if (head - g_tail > OTP_RING) {
    lost_now += head - g_tail - OTP_RING;
    g_tail = head - OTP_RING;
  }
  while (g_tail < head && n < max) {
    otp_slot* s = &g_ring[g_tail & (OTP_RING - 1)];
    uint64_t before = atomic_load_explicit(&s->stamp, memory_order_acquire);
    if (before == 0 || before < g_tail + 1) break; /* still being written */
    if (before > g_tail + 1) { lost_now++; g_tail++; continue; } /* overwritten: a lap on */
    out[n] = s->rec;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->stamp, memory_order_relaxed) != before) {
      lost_now++; /* overwritten while we copied */
    } else {
      n++;
    }
    g_tail++;
  }
  g_lost += lost_now;
  if (lost) *lost = lost_now;
  pthread_mutex_unlock(&g_read_lock);
  return n;
}

/* Complete now, on the calling thread, every launch that has finished (a poller's pass
 * without its wait): the reader calls it when instrumentation ends, so that the operations
 * of the last moments, finished on the GPU, are read rather than left to the next poll.
 * Never waits for the GPU; waits at most ~50 ms for a pass the poller is making. Returns
 * the launches still pending. */
__attribute__((visibility("default"))) uint64_t otel_train_nccl_complete(void) {
  pthread_once(&g_cu_once, cu_load);
  if (cu.ok) {
    CUcontext saved = NULL, current = NULL;
    cu.ctx_get(&saved);
    current = saved;
    for (int tries = 0; pass_all(&current) > 0 && tries < 50; tries++) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    if (current != saved) cu.ctx_set(saved); /* the caller's thread as it was */
  }
  uint64_t n = 0;
  pthread_mutex_lock(&g_launch_lock);
  for (otp_launch* l = g_pending_head; l != NULL; l = l->next) n++;
  pthread_mutex_unlock(&g_launch_lock);
  return n;
}

/* Tasks started but not finished: how many, and the oldest one's record as far as known
 * (t_issue, comm, seq, func, bytes). */
__attribute__((visibility("default"))) uint64_t otel_train_nccl_in_flight(otp_record* oldest) {
  pthread_mutex_lock(&g_flight_lock);
  uint64_t n = g_in_flight;
  if (n > 0 && oldest != NULL) *oldest = g_oldest->rec;
  pthread_mutex_unlock(&g_flight_lock);
  return n;
}

/* Totals since the plugin was loaded: tasks started, records written, overwritten, not
 * recorded (allocation failed), without GPU timing, poller passes, timing mode (bit 0: new
 * operations are timed by events, else by kernel channels; bit 1: chosen automatically),
 * kernel launches completed on the enqueuing thread (the rest by the poller). */
__attribute__((visibility("default"))) void otel_train_nccl_totals(uint64_t* out8) {
  out8[0] = atomic_load(&g_ops);
  out8[1] = atomic_load(&g_head);
  pthread_mutex_lock(&g_read_lock);
  out8[2] = g_lost;
  pthread_mutex_unlock(&g_read_lock);
  out8[3] = atomic_load(&g_dropped);
  out8[4] = atomic_load(&g_untimed);
  out8[5] = atomic_load(&g_polls);
  pthread_once(&g_mode_once, read_mode);
  out8[6] = (uint64_t)atomic_load(&g_mode_events) | (g_timing == OTP_TIMING_AUTO ? 2u : 0u);
  out8[7] = atomic_load(&g_by_enqueuer);
}

/* With OTEL_TRAIN_NCCL_SELF_TIME=1: thread CPU ns in the callbacks on NCCL's enqueuing
 * threads (harvests included), callbacks made, ns of those in harvest(). Zeros otherwise. */
__attribute__((visibility("default"))) void otel_train_nccl_self_time(uint64_t* out3) {
  out3[0] = atomic_load(&g_cb_ns);
  out3[1] = atomic_load(&g_cb_n);
  out3[2] = atomic_load(&g_harvest_enqueue_ns);
}

/* The self-timing's own part of each timed callback: the mean thread CPU ns of n empty timed
 * regions on the calling thread (two reads of its CPU clock, as each timed callback makes; a
 * thread-CPU read is a system call, ~0.2-0.3 us on the GPU hosts). A callback's figure holds
 * one such region beyond the callback itself. 0 for n == 0. */
__attribute__((visibility("default"))) uint64_t otel_train_nccl_self_time_floor(uint64_t n) {
  if (n == 0) return 0;
  int64_t total = 0;
  for (uint64_t i = 0; i < n; i++) {
    int64_t t0 = self_cpu_ns();
    total += self_cpu_ns() - t0;
  }
  return (uint64_t)(total / (int64_t)n);
}
