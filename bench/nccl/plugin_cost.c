/* CPU cost of otel-train's NCCL profiler plugin per collective, in the training process.
 *
 * Makes the calls NCCL 2.28 makes for one collective (src/plugin/profiler.cc) and the
 * emitter's batched read of the records (otel_train_nccl_read, as ctypes calls it, every 64
 * collectives). Reports ns of thread CPU per collective for each part, median of 7 rounds, as
 * JSON.
 *   - "kernel" timing (default here; the plugin's OTEL_TRAIN_NCCL_TIMING=kernel): task start
 *     and stop on the enqueuing thread; per kernel channel a start, a stop state with the GPU
 *     stamp and a stop on the proxy thread.
 *   - "events" (needs a GPU): a kernel launch on a real CUDA stream (the plugin records its two
 *     events there; no kernel runs, so they complete at once), then the task's start and stop,
 *     on the enqueuing thread; the plugin's poller completes them on its own thread
 *     (poller_ns: its CPU per record), or with OTEL_TRAIN_NCCL_COMPLETE_ON_ENQUEUE=1 the
 *     enqueuing thread completes the earlier launches on its stream that have finished
 *     (completed_by_enqueuer).
 *     Its "enqueue_thread_ns" is a microbenchmark: bench/multigpu's cost mode times the
 *     callbacks where NCCL calls them (OTEL_TRAIN_NCCL_SELF_TIME=1), which the verdict
 *     prefers.
 *
 *   cc -O2 -o /tmp/plugin_cost bench/nccl/plugin_cost.c -lpthread -ldl
 *   /tmp/plugin_cost [channels] [kernel|events]
 */
#include "../../otel_train/nccl/profiler.c"

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double thread_cpu_ns(const char* name) { /* a named thread of this process */
  char path[300], comm[64];
  DIR* d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  struct dirent* e;
  double out = -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (f == NULL) continue;
    int match = fgets(comm, sizeof comm, f) && strncmp(comm, name, strlen(name)) == 0;
    fclose(f);
    if (!match) continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    f = fopen(path, "r");
    char buf[1024];
    if (f && fgets(buf, sizeof buf, f)) {
      char* p = strrchr(buf, ')');
      unsigned long ut = 0, st = 0;
      /* after the name: state, then fields 4..13, then utime(14) stime(15) */
      if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                      &st) == 2)
        out = (double)(ut + st) * 1e9 / sysconf(_SC_CLK_TCK);
    }
    if (f) fclose(f);
    break;
  }
  closedir(d);
  return out;
}

static int events_bench(void) {
  typedef int (*init_t)(unsigned);
  typedef int (*dev_t)(int*, int);
  typedef int (*retain_t)(void**, int);
  typedef int (*stream_t)(void**, unsigned);
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == NULL) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
  int dev = 0;
  void *cctx = NULL, *stream = NULL;
  if (((init_t)dlsym(h, "cuInit"))(0) || ((dev_t)dlsym(h, "cuDeviceGet"))(&dev, 0) ||
      ((retain_t)dlsym(h, "cuDevicePrimaryCtxRetain"))(&cctx, dev) ||
      ((int (*)(void*))dlsym(h, "cuCtxSetCurrent"))(cctx) ||
      ((stream_t)dlsym(h, "cuStreamCreate"))(&stream, 1)) {
    fprintf(stderr, "CUDA setup failed\n");
    return 1;
  }
  setenv("OTEL_TRAIN_NCCL_TIMING", "events", 1);
  void* ctx = NULL;
  int mask = 0;
  otp_init(&ctx, 0x1234, &mask, "bench", 1, 2, 0, NULL);
  const int n = 100000, rounds = 7;
  static otp_record out[4096];
  double enq[7];
  uint64_t got = 0, timed = 0;
  double poll0 = -1;
  for (int r = 0; r < rounds; r++) {
    double t = 0;
    for (int i = 0; i < n; i++) {
      ncclProfilerEventDescr_v5_t k, d;
      memset(&k, 0, sizeof k);
      memset(&d, 0, sizeof d);
      k.type = ncclProfileKernelLaunch;
      k.kernelLaunch.stream = stream;
      d.type = ncclProfileColl;
      d.coll.seqNumber = (uint64_t)i;
      d.coll.func = "AllGather";
      d.coll.count = 1 << 20;
      d.coll.datatype = "ncclBfloat16";
      d.coll.nChannels = 2;
      void *lh = NULL, *h2 = NULL;
      double t0 = cpu_ns();
      otp_start(ctx, &lh, &k);
      if (lh) otp_stop(lh);
      otp_start(ctx, &h2, &d);
      otp_stop(h2);
      t += cpu_ns() - t0;
      if ((i & 63) == 63) {
        uint64_t lost = 0;
        int m = otel_train_nccl_read(out, 4096, &lost);
        for (int j = 0; j < m; j++) timed += out[j].flags & 1;
        got += (uint64_t)m;
      }
      if (poll0 < 0 && i == 1000) poll0 = thread_cpu_ns("otel-nccl-poll");
    }
    enq[r] = t / n;
  }
  /* the poller completes the rest at its own pace (a pass every 10 ms) */
  for (int wait = 0; wait < 3000 && got < (uint64_t)n * rounds; wait++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
    for (;;) {
      uint64_t lost = 0;
      int m = otel_train_nccl_read(out, 4096, &lost);
      if (m <= 0) break;
      for (int j = 0; j < m; j++) timed += out[j].flags & 1;
      got += (uint64_t)m;
    }
  }
  double poll1 = thread_cpu_ns("otel-nccl-poll");
  double clock_cost;
  {
    double t0 = cpu_ns();
    for (int i = 0; i < 1000000; i++) cpu_ns();
    clock_cost = (cpu_ns() - t0) / 1e6;
  }
  qsort(enq, rounds, sizeof(double), cmp);
  printf("{\"timing\": \"events\", \"collectives\": %d, \"records\": %lu, \"gpu_timed\": %lu, "
         "\"enqueue_thread_ns\": %.1f, \"enqueue_range_ns\": [%.1f, %.1f], "
         "\"poller_ns\": %.1f, \"clock_read_ns\": %.1f, \"completed_by_enqueuer\": %lu}\n",
         n * rounds, (unsigned long)got, (unsigned long)timed, enq[rounds / 2] - clock_cost,
         enq[0] - clock_cost, enq[rounds - 1] - clock_cost,
         poll0 >= 0 && poll1 >= 0 && got > 1000 ? (poll1 - poll0) / (double)(got - 1000) : -1.0,
         clock_cost, (unsigned long)atomic_load(&g_by_enqueuer));
  return 0;
}

int main(int argc, char** argv) {
  int channels = argc > 1 ? atoi(argv[1]) : 2;
  if (argc > 2 && strcmp(argv[2], "events") == 0) return events_bench();
  setenv("OTEL_TRAIN_NCCL_TIMING", "kernel", 1);
  const int n = 200000, rounds = 7;
  void* ctx = NULL;
  int mask = 0;
  otp_init(&ctx, 0x1234, &mask, "bench", 1, 2, 0, NULL);
  static otp_record out[4096];
  double enqueue[7], proxy[7], reading[7];
  for (int r = 0; r < rounds; r++) {
    double t_enq = 0, t_proxy = 0, t_read = 0;
    for (int i = 0; i < n; i++) {
      ncclProfilerEventDescr_v5_t d;
      memset(&d, 0, sizeof d);
      d.type = ncclProfileColl;
      d.coll.seqNumber = (uint64_t)i;
      d.coll.func = (i & 1) ? "ReduceScatter" : "AllGather";
      d.coll.count = 1 << 20;
      d.coll.datatype = "ncclBfloat16";
      d.coll.nChannels = (uint8_t)channels;
      d.coll.algo = "RING";
      d.coll.proto = "SIMPLE";
      void* h = NULL;
      double t0 = cpu_ns();
      otp_start(ctx, &h, &d);
      otp_stop(h); /* NCCL stops the task at launch, before the kernel ends */
      double t1 = cpu_ns();
      for (int c = 0; c < channels; c++) {
        ncclProfilerEventDescr_v5_t k;
        memset(&k, 0, sizeof k);
        k.type = ncclProfileKernelCh;
        k.parentObj = h;
        k.kernelCh.channelId = (uint8_t)c;
        k.kernelCh.pTimer = 1000 + (uint64_t)c;
        void* kh = NULL;
        ncclProfilerEventStateArgs_v5_t a;
        a.kernelCh.pTimer = 5000 + (uint64_t)c;
        otp_start(ctx, &kh, &k);
        otp_record_state(kh, ncclProfilerKernelChStop, &a);
        otp_stop(kh);
      }
      double t2 = cpu_ns();
      t_enq += t1 - t0;
      t_proxy += t2 - t1;
      if ((i & 63) == 63) {
        uint64_t lost = 0;
        double t3 = cpu_ns();
        otel_train_nccl_read(out, 4096, &lost);
        t_read += cpu_ns() - t3;
      }
    }
    /* clock reads cost ~20-40 ns each: measured below and subtracted */
    enqueue[r] = t_enq / n;
    proxy[r] = t_proxy / n;
    reading[r] = t_read / n;
  }
  double clock_cost = 0;
  {
    double t0 = cpu_ns();
    for (int i = 0; i < 1000000; i++) cpu_ns();
    clock_cost = (cpu_ns() - t0) / 1e6;
  }
  qsort(enqueue, rounds, sizeof(double), cmp);
  qsort(proxy, rounds, sizeof(double), cmp);
  qsort(reading, rounds, sizeof(double), cmp);
  double e = enqueue[rounds / 2] - clock_cost, p = proxy[rounds / 2] - clock_cost;
  printf("{\"channels\": %d, \"collectives_per_round\": %d, \"rounds\": %d, "
         "\"enqueue_thread_ns\": %.1f, \"proxy_thread_ns\": %.1f, \"read_ns\": %.2f, "
         "\"total_ns\": %.1f, \"enqueue_range_ns\": [%.1f, %.1f], "
         "\"proxy_range_ns\": [%.1f, %.1f], \"clock_read_ns\": %.1f}\n",
         channels, n, rounds, e, p, reading[rounds / 2], e + p + reading[rounds / 2],
         enqueue[0] - clock_cost, enqueue[rounds - 1] - clock_cost, proxy[0] - clock_cost,
         proxy[rounds - 1] - clock_cost, clock_cost);
  return 0;
}
