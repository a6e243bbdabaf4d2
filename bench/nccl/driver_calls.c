/* What each CUDA driver call the NCCL plugin makes per collective costs, alone and while a
 * second thread makes the other side's calls (the training thread records events while the
 * plugin's poller reads them), in thread CPU ns per call: the floor under GPU timing by CUDA
 * events, part by part (docs/overhead.md, "The plugin's floor").
 *
 *   cc -O2 -o /tmp/driver_calls bench/nccl/driver_calls.c -lpthread -ldl
 *   /tmp/driver_calls > driver-calls.json
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void* CUevent;
typedef void* CUstream;
typedef void* CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int*, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext*);
static CUresult (*cuStreamCreate)(CUstream*, unsigned);
static CUresult (*cuStreamIsCapturing)(CUstream, int*);
static CUresult (*cuEventCreate)(CUevent*, unsigned);
static CUresult (*cuEventRecord)(CUevent, CUstream);
static CUresult (*cuEventQuery)(CUevent);
static CUresult (*cuEventSynchronize)(CUevent);
static CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
static CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
static CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}
static double wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

#define N 100000
#define NEV 4096
static CUcontext ctx;
static CUstream stream, stream2;
static CUevent ev_t[NEV], ev_nt[NEV];
static CUdeviceptr buf;
static volatile float sink;

static void out(const char* name, double cpu, double wall, int last) {
  printf("  \"%s\": {\"cpu_ns\": %.1f, \"wall_ns\": %.1f}%s\n", name, cpu, wall, last ? "" : ",");
}

#define TIME(name, body, last)                                   \
  do {                                                           \
    double c0 = cpu_ns(), w0 = wall_ns();                        \
    for (int i = 0; i < N; i++) { body; }                        \
    out(name, (cpu_ns() - c0) / N, (wall_ns() - w0) / N, last);  \
  } while (0)

static atomic_int stop_flag;
static atomic_long reader_calls;
static double reader_cpu;

static void* reader(void* arg) { /* the poller's side: elapsed times of finished pairs */
  (void)arg;
  cuCtxSetCurrent(ctx);
  double c0 = cpu_ns();
  long n = 0;
  while (!atomic_load(&stop_flag)) {
    float ms;
    cuEventElapsedTime(&ms, ev_t[NEV - 2], ev_t[NEV - 1]); /* not re-recorded meanwhile */
    sink = ms;
    n++;
  }
  reader_cpu = (cpu_ns() - c0) / (double)n;
  atomic_store(&reader_calls, n);
  return NULL;
}

int main(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h == NULL) { fprintf(stderr, "no libcuda.so.1\n"); return 1; }
#define LOAD(f) *(void**)&f = dlsym(h, #f)
  LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent);
  LOAD(cuCtxGetCurrent); LOAD(cuStreamCreate); LOAD(cuStreamIsCapturing); LOAD(cuEventCreate);
  LOAD(cuEventRecord); LOAD(cuEventQuery); LOAD(cuEventSynchronize); LOAD(cuMemAlloc);
  LOAD(cuMemsetD8Async); LOAD(cuStreamSynchronize);
  *(void**)&cuEventElapsedTime = dlsym(h, "cuEventElapsedTime");
  if (cuEventElapsedTime == NULL) *(void**)&cuEventElapsedTime = dlsym(h, "cuEventElapsedTime_v2");
  if (dlsym(h, "cuMemAlloc_v2")) *(void**)&cuMemAlloc = dlsym(h, "cuMemAlloc_v2");
  if (dlsym(h, "cuMemsetD8Async_v2")) *(void**)&cuMemsetD8Async = dlsym(h, "cuMemsetD8Async_v2");
  int dev = 0;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx) || cuStreamCreate(&stream, 1) || cuStreamCreate(&stream2, 1) ||
      cuMemAlloc(&buf, 64 << 20)) {
    fprintf(stderr, "CUDA setup failed\n");
    return 1;
  }
  for (int i = 0; i < NEV; i++) {
    cuEventCreate(&ev_t[i], 0);      /* CU_EVENT_DEFAULT: timing */
    cuEventCreate(&ev_nt[i], 2);     /* CU_EVENT_DISABLE_TIMING */
  }
  for (int i = 0; i < NEV; i++) cuEventRecord(ev_t[i], stream);
  cuStreamSynchronize(stream);
  struct timespec ts;
  CUcontext c;
  int capturing;
  float ms;
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  printf("{\n");
  TIME("clock_gettime_monotonic", clock_gettime(CLOCK_MONOTONIC, &ts), 0);
  TIME("cuCtxGetCurrent", cuCtxGetCurrent(&c), 0);
  TIME("cuStreamIsCapturing", cuStreamIsCapturing(stream, &capturing), 0);
  TIME("mutex_lock_unlock", pthread_mutex_lock(&m); pthread_mutex_unlock(&m), 0);
  TIME("calloc_free_128", free(calloc(1, 128)), 0);
  TIME("cuEventRecord_timing_idle_stream", cuEventRecord(ev_t[i % NEV], stream), 0);
  cuStreamSynchronize(stream);
  TIME("cuEventRecord_no_timing_idle_stream", cuEventRecord(ev_nt[i % NEV], stream), 0);
  cuStreamSynchronize(stream);
  TIME("cuEventQuery_done", cuEventQuery(ev_t[i % NEV]), 0);
  TIME("cuEventElapsedTime_done", cuEventElapsedTime(&ms, ev_t[i % NEV], ev_t[(i + 1) % NEV]); sink = ms, 0);
  /* fresh events, as the plugin reads them: each pair recorded once, then read once (a
   * query, its duration, the gap from the previous pair's end) */
  {
    double tq = 0, te = 0, cq = 0, ce = 0;
    int pairs = 0;
    for (int r = 0; r < N / (NEV / 2); r++) {
      for (int i = 0; i < NEV; i++) cuEventRecord(ev_t[i], stream);
      cuStreamSynchronize(stream);
      for (int i = 0; i < NEV; i += 2) {
        double c0 = cpu_ns();
        cuEventQuery(ev_t[i + 1]);
        double c1 = cpu_ns();
        cuEventElapsedTime(&ms, ev_t[i], ev_t[i + 1]);
        if (i > 0) cuEventElapsedTime(&ms, ev_t[i - 1], ev_t[i]);
        double c2 = cpu_ns();
        sink = ms;
        tq += c1 - c0;
        te += c2 - c1;
        pairs++;
      }
    }
    double clk = 0;
    { double c0 = cpu_ns(); for (int i = 0; i < 100000; i++) cpu_ns(); clk = (cpu_ns() - c0) / 100000; }
    cq = tq / pairs - clk;
    ce = (te / pairs - clk) / 2;
    out("cuEventQuery_fresh", cq, 0, 0);
    out("cuEventElapsedTime_fresh", ce, 0, 0);
  }
  /* a busy stream: 1 MiB memsets between records, as kernels run between NCCL launches */
  {
    double c0 = cpu_ns(), w0 = wall_ns(), cm = 0;
    for (int i = 0; i < N; i++) {
      if ((i & 7) == 0) {
        double t = cpu_ns();
        cuMemsetD8Async(buf, (unsigned char)i, 1 << 20, stream);
        cm += cpu_ns() - t;
      }
      cuEventRecord(ev_t[i % NEV], stream);
      if ((i & 1023) == 1023) cuStreamSynchronize(stream);
    }
    out("cuEventRecord_timing_busy_stream", (cpu_ns() - c0 - cm) / N, (wall_ns() - w0) / N, 0);
    out("cuMemsetD8Async_launch", cm / (N / 8), 0, 0);
  }
  cuStreamSynchronize(stream);
  /* the two threads at once: records on this thread, elapsed times on the reader */
  {
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    double c0 = cpu_ns(), w0 = wall_ns();
    for (int i = 0; i < N; i++) {
      cuEventRecord(ev_t[i % (NEV - 2)], stream);
      if ((i & 1023) == 1023) cuStreamSynchronize(stream);
    }
    double rec = (cpu_ns() - c0) / N, recw = (wall_ns() - w0) / N;
    atomic_store(&stop_flag, 1);
    pthread_join(t, NULL);
    out("cuEventRecord_while_other_thread_reads", rec, recw, 0);
    out("cuEventElapsedTime_while_other_thread_records", reader_cpu, 0, 0);
  }
  cuStreamSynchronize(stream);
  printf("  \"n\": %d\n}\n", N);
  return 0;
}
