/* The step tracker's hot path in C: otel_train._fastpath.
 *
 * What runs on the training thread at every phase boundary (tracker.py's StepTracker.begin,
 * .end and ._finish_step, the data wait's, forward's and backward's wrappers and the
 * optimizer's step hooks) with no Python frame: on a step of a few hundred microseconds of torch work those frames, run
 * with the caches cold, were most of what otel-train cost the training thread
 * (docs/overhead.md, "The training thread in C"). The semantics are tracker.py's
 * _PyTrackerCore and StepHooks' Python wrappers, line for line: they are the reference, used
 * wherever this module is not built (no C compiler at install time, OTEL_TRAIN_FASTPATH=0),
 * and tests/sdk/test_tracker_core.py holds the two to the same records and state for any
 * sequence of calls. The rare paths call back into Python: a phase begun inside another
 * (_begin_inside), a failure of otel-train's own bookkeeping (_fail).
 *
 * Timestamps are time.perf_counter_ns()'s clock: CLOCK_MONOTONIC on Linux (CPython's own
 * choice there), PyTime_PerfCounterRaw from Python 3.13 on. Elsewhere before 3.13 the module
 * does not build and the Python tracker is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "structmember.h"
#ifdef __linux__
#include <dlfcn.h>
#include <sys/timerfd.h>
#include <unistd.h>
#endif

#if PY_VERSION_HEX < 0x030D0000 && !defined(__linux__)
#error "the fast path needs Linux's CLOCK_MONOTONIC before Python 3.13 (perf_counter's clock)"
#endif
#ifdef Py_GIL_DISABLED
#error "the fast path relies on the GIL (free-threaded builds use the Python tracker)"
#endif

/* set once by configure(): the record kinds and the phase names (semconv's strings) */
static PyObject *K_PHASE, *K_STEP, *P_DATA_WAIT, *P_FORWARD, *P_OPTIMIZER;
static PyObject *S_begin_inside, *S_fail, *S_put, *S_append;

static inline int64_t now_ns(void) {
#if PY_VERSION_HEX >= 0x030D0000
  PyTime_t t;
  (void)PyTime_PerfCounterRaw(&t);
  return (int64_t)t;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

/* phase names are semconv's constants, so identity decides almost always */
static inline int same(PyObject* a, PyObject* b) {
  if (a == b) return 1;
  if (a == NULL || b == NULL || !PyUnicode_CheckExact(a) || !PyUnicode_CheckExact(b)) return 0;
  return PyUnicode_Compare(a, b) == 0;
}

static inline int is_none(PyObject* o) { return o == NULL || o == Py_None; }

/* ---- TrackerCore: the state the hot path touches, as members with tracker.py's names ---- */
typedef struct {
  PyObject_HEAD
  char enabled;
  char count_batches;
  unsigned long thread_id;
  long long step, forwards, samples, tokens, phase_micro, depth;
  long long phase_start_ns, idle_since_ns;
  unsigned long long span_id;
  Py_ssize_t capacity;
  PyObject* step_start_ns;  /* None or int */
  PyObject* pending_end_ns; /* None or int */
  PyObject* phase;          /* None or str */
  PyObject* data_iter;
  PyObject* phase_hooks; /* tuple */
  PyObject* step_hooks;  /* tuple */
  PyObject* end_hooks;   /* dict: phase -> tuple */
  PyObject* queue;       /* the recorder's deque */
  PyObject* recorder;
  PyObject* fixed_samples; /* None or int */
  PyObject* fixed_tokens;
  int alarm_fd;              /* the gap sampler's overrun alarm (a timerfd), -1: none */
  long long alarm_after_ns;  /* armed this long after each step's start; 0: not armed */
} Core;

static PyTypeObject CoreType;

static int core_traverse(Core* self, visitproc visit, void* arg) {
  Py_VISIT(self->step_start_ns);
  Py_VISIT(self->pending_end_ns);
  Py_VISIT(self->phase);
  Py_VISIT(self->data_iter);
  Py_VISIT(self->phase_hooks);
  Py_VISIT(self->step_hooks);
  Py_VISIT(self->end_hooks);
  Py_VISIT(self->queue);
  Py_VISIT(self->recorder);
  Py_VISIT(self->fixed_samples);
  Py_VISIT(self->fixed_tokens);
  return 0;
}

static int core_clear(Core* self) {
  Py_CLEAR(self->step_start_ns);
  Py_CLEAR(self->pending_end_ns);
  Py_CLEAR(self->phase);
  Py_CLEAR(self->data_iter);
  Py_CLEAR(self->phase_hooks);
  Py_CLEAR(self->step_hooks);
  Py_CLEAR(self->end_hooks);
  Py_CLEAR(self->queue);
  Py_CLEAR(self->recorder);
  Py_CLEAR(self->fixed_samples);
  Py_CLEAR(self->fixed_tokens);
  return 0;
}

static void core_dealloc(Core* self) {
  PyObject_GC_UnTrack(self);
  core_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* A failure of the tracker's own bookkeeping (an Exception, not a BaseException): hand it to
 * self._fail, which stops recording and warns once. 0 handled, -1 anything else (raised). */
static int core_fail(Core* self) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
  PyObject* r = PyObject_CallMethodOneArg((PyObject*)self, S_fail, value ? value : Py_None);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* the recorder's queue while under capacity (one length check, one append), else
 * recorder.put, which counts the drop; steals nothing */
static int core_put(Core* self, PyObject* record) {
  PyObject* r;
  if (self->queue == NULL || self->recorder == NULL) {
    PyErr_SetString(PyExc_AttributeError, "otel-train: the tracker has no recorder");
    return -1;
  }
  Py_ssize_t n = PyObject_Size(self->queue);
  if (n < 0) return -1;
  if (n < self->capacity)
    r = PyObject_CallMethodOneArg(self->queue, S_append, record);
  else
    r = PyObject_CallMethodOneArg(self->recorder, S_put, record);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

static int call_phase_hooks(Core* self, PyObject* begin, int64_t now) {
  PyObject* hooks = self->phase_hooks;
  if (hooks == NULL || !PyTuple_Check(hooks) || PyTuple_GET_SIZE(hooks) == 0) return 0;
  PyObject* when = PyLong_FromLongLong(now);
  if (when == NULL) return -1;
  Py_INCREF(hooks); /* a hook may replace the tuple */
  int rc = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks); i++) {
    PyObject* args[2] = {begin, when};
    PyObject* r = PyObject_Vectorcall(PyTuple_GET_ITEM(hooks, i), args, 2, NULL);
    if (r == NULL) {
      rc = -1;
      break;
    }
    Py_DECREF(r);
  }
  Py_DECREF(hooks);
  Py_DECREF(when);
  return rc;
}

static int call_each(PyObject* hooks, PyObject* arg) {
  if (hooks == NULL) return 0;
  PyObject* seq = PySequence_Fast(hooks, "otel-train: hooks must be a sequence");
  if (seq == NULL) return -1;
  int rc = 0;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    PyObject* r = PyObject_Vectorcall(PySequence_Fast_GET_ITEM(seq, i), &arg, 1, NULL);
    if (r == NULL) {
      rc = -1;
      break;
    }
    Py_DECREF(r);
  }
  Py_DECREF(seq);
  return rc;
}

static inline void set_obj(PyObject** slot, PyObject* value) {
  Py_XINCREF(value);
  Py_XSETREF(*slot, value);
}

/* The gap sampler's overrun alarm (sources/gaps.py): at each step's start the training thread
 * moves a one-shot timer to where the step would have run past its typical length, so the
 * sampler sleeps while steps keep their length and wakes when one does not (one
 * timerfd_settime system call a step instead of the sampler waking to look). Errors are ignored:
 * a missed alarm costs a sample, never the step. */
static int alarm_arm(int fd, long long at_ns) {
#ifdef __linux__
  struct itimerspec when = {{0, 0}, {0, 0}};
  if (at_ns < 1) at_ns = 1; /* 0 would disarm it */
  when.it_value.tv_sec = (time_t)(at_ns / 1000000000LL);
  when.it_value.tv_nsec = (long)(at_ns % 1000000000LL);
  return timerfd_settime(fd, TFD_TIMER_ABSTIME, &when, NULL);
#else
  (void)fd;
  (void)at_ns;
  return -1;
#endif
}

/* _PyTrackerCore._finish_step; -1 with an exception set */
static int core_finish_step(Core* self) {
  PyObject* end = self->pending_end_ns ? self->pending_end_ns : Py_None;
  PyObject* start = is_none(self->step_start_ns) ? end : self->step_start_ns;
  Py_INCREF(end);
  Py_INCREF(start);
  long long forwards = self->forwards;
  PyObject* record = NULL;
  int rc = -1;
  if (self->step_hooks && PyTuple_Check(self->step_hooks) &&
      PyTuple_GET_SIZE(self->step_hooks) > 0) {
    PyObject* step = PyLong_FromLongLong(self->step);
    if (step == NULL) goto done;
    int hooks = call_each(self->step_hooks, step);
    Py_DECREF(step);
    if (hooks < 0) goto done;
  }
  record = PyTuple_New(7);
  if (record == NULL) goto done;
  PyObject* samples = is_none(self->fixed_samples) ? PyLong_FromLongLong(self->samples)
                                                   : Py_NewRef(self->fixed_samples);
  PyObject* tokens = is_none(self->fixed_tokens) ? PyLong_FromLongLong(self->tokens)
                                                 : Py_NewRef(self->fixed_tokens);
  PyObject* step = PyLong_FromLongLong(self->step);
  PyObject* micro = PyLong_FromLongLong(forwards > 1 ? forwards : 1);
  PyTuple_SET_ITEM(record, 0, Py_NewRef(K_STEP));
  PyTuple_SET_ITEM(record, 1, step);
  PyTuple_SET_ITEM(record, 2, Py_NewRef(start));
  PyTuple_SET_ITEM(record, 3, Py_NewRef(end));
  PyTuple_SET_ITEM(record, 4, micro);
  PyTuple_SET_ITEM(record, 5, samples);
  PyTuple_SET_ITEM(record, 6, tokens);
  if (!samples || !tokens || !step || !micro) goto done;
  if (core_put(self, record) < 0) goto done;
  self->step += 1;
  set_obj(&self->step_start_ns, end);
  set_obj(&self->pending_end_ns, Py_None);
  self->forwards = self->samples = self->tokens = 0;
  if (self->alarm_fd >= 0 && self->alarm_after_ns > 0 && PyLong_CheckExact(end)) {
    long long at = PyLong_AsLongLong(end);
    if (at == -1 && PyErr_Occurred())
      PyErr_Clear();
    else
      alarm_arm(self->alarm_fd, at + self->alarm_after_ns);
  }
  rc = 0;
done:
  Py_XDECREF(record);
  Py_DECREF(end);
  Py_DECREF(start);
  return rc;
}

/* _PyTrackerCore.begin: 1 recorded (the caller ends it), 0 declined, -1 raised */
static int core_begin(Core* self, PyObject* phase) {
  if (!self->enabled || PyThread_get_thread_ident() != self->thread_id) return 0;
  if (!is_none(self->phase)) {
    PyObject* r = PyObject_CallMethodOneArg((PyObject*)self, S_begin_inside, phase);
    if (r == NULL) goto fail;
    int nested = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (nested < 0) goto fail;
    if (nested) return 1;
  }
  int64_t now = now_ns();
  if (!is_none(self->pending_end_ns) && !same(phase, P_OPTIMIZER)) {
    if (core_finish_step(self) < 0) goto fail;
  }
  if (is_none(self->step_start_ns)) {
    PyObject* start = PyLong_FromLongLong(now);
    if (start == NULL) goto fail;
    Py_XSETREF(self->step_start_ns, start);
  }
  long long forwards = self->forwards;
  if (same(phase, P_FORWARD)) {
    self->phase_micro = forwards;
    self->forwards = forwards + 1;
  } else if (same(phase, P_DATA_WAIT)) {
    self->phase_micro = forwards;
  } else {
    self->phase_micro = forwards ? forwards - 1 : 0;
  }
  set_obj(&self->phase, phase);
  self->phase_start_ns = now;
  self->span_id = 0;
  if (call_phase_hooks(self, Py_True, now) < 0) goto fail;
  return 1;
fail:
  return core_fail(self) < 0 ? -1 : 1;
}

/* _PyTrackerCore.end: 0 done, -1 raised */
static int core_end(Core* self, PyObject* phase) {
  if (self->depth) {
    self->depth -= 1;
    return 0;
  }
  if (!same(self->phase ? self->phase : Py_None, phase)) return 0;
  int64_t now = now_ns();
  if (call_phase_hooks(self, Py_False, now) < 0) goto fail;
  if (self->end_hooks && PyDict_Check(self->end_hooks) && PyDict_GET_SIZE(self->end_hooks)) {
    PyObject* hooks = PyDict_GetItemWithError(self->end_hooks, phase); /* borrowed */
    if (hooks == NULL && PyErr_Occurred()) goto fail;
    if (hooks != NULL) {
      PyObject* when = PyLong_FromLongLong(now);
      if (when == NULL) goto fail;
      Py_INCREF(hooks);
      int rc = call_each(hooks, when);
      Py_DECREF(hooks);
      Py_DECREF(when);
      if (rc < 0) goto fail;
    }
  }
  /* span id 0: nobody asked for one while the phase ran, the emitter makes it */
  PyObject* record = PyTuple_New(7);
  if (record == NULL) goto fail;
  PyObject* step = PyLong_FromLongLong(self->step);
  PyObject* micro = PyLong_FromLongLong(self->phase_micro);
  PyObject* start = PyLong_FromLongLong(self->phase_start_ns);
  PyObject* end = PyLong_FromLongLong(now);
  PyObject* span = PyLong_FromUnsignedLongLong(self->span_id);
  PyTuple_SET_ITEM(record, 0, Py_NewRef(K_PHASE));
  PyTuple_SET_ITEM(record, 1, step);
  PyTuple_SET_ITEM(record, 2, Py_NewRef(phase));
  PyTuple_SET_ITEM(record, 3, micro);
  PyTuple_SET_ITEM(record, 4, start);
  PyTuple_SET_ITEM(record, 5, end);
  PyTuple_SET_ITEM(record, 6, span);
  if (!step || !micro || !start || !end || !span || core_put(self, record) < 0) {
    Py_DECREF(record);
    goto fail;
  }
  Py_DECREF(record);
  set_obj(&self->phase, Py_None);
  self->idle_since_ns = now;
  if (same(phase, P_OPTIMIZER)) {
    PyObject* pending = PyLong_FromLongLong(now);
    if (pending == NULL) goto fail;
    Py_XSETREF(self->pending_end_ns, pending);
  }
  return 0;
fail:
  return core_fail(self);
}

static PyObject* core_begin_py(Core* self, PyObject* phase) {
  int r = core_begin(self, phase);
  if (r < 0) return NULL;
  return PyBool_FromLong(r);
}

static PyObject* core_end_py(Core* self, PyObject* phase) {
  if (core_end(self, phase) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* core_finish_step_py(Core* self, PyObject* Py_UNUSED(ignored)) {
  if (core_finish_step(self) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* core_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  if (K_PHASE == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "otel_train._fastpath: configure() was not called");
    return NULL;
  }
  Core* self = (Core*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->alarm_fd = -1;
  /* every object member starts as None, as tracker.py's __init__ would leave it */
  PyObject** objs[] = {&self->step_start_ns, &self->pending_end_ns, &self->phase,
                       &self->data_iter, &self->fixed_samples, &self->fixed_tokens};
  for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) *objs[i] = Py_NewRef(Py_None);
  self->phase_hooks = PyTuple_New(0);
  self->step_hooks = PyTuple_New(0);
  self->end_hooks = PyDict_New();
  if (!self->phase_hooks || !self->step_hooks || !self->end_hooks) {
    Py_DECREF(self);
    return NULL;
  }
  return (PyObject*)self;
}

#define M(name, type, field) {name, type, offsetof(Core, field), 0, NULL}
static PyMemberDef core_members[] = {
    M("enabled", T_BOOL, enabled),
    M("_count_batches", T_BOOL, count_batches),
    M("thread_id", T_ULONG, thread_id),
    M("step", T_LONGLONG, step),
    M("forwards", T_LONGLONG, forwards),
    M("samples", T_LONGLONG, samples),
    M("tokens", T_LONGLONG, tokens),
    M("phase_micro", T_LONGLONG, phase_micro),
    M("_depth", T_LONGLONG, depth),
    M("phase_start_ns", T_LONGLONG, phase_start_ns),
    M("idle_since_ns", T_LONGLONG, idle_since_ns),
    M("_span_id", T_ULONGLONG, span_id),
    M("_capacity", T_PYSSIZET, capacity),
    M("step_start_ns", T_OBJECT, step_start_ns),
    M("pending_end_ns", T_OBJECT, pending_end_ns),
    M("phase", T_OBJECT, phase),
    M("data_iter", T_OBJECT, data_iter),
    M("phase_hooks", T_OBJECT, phase_hooks),
    M("step_hooks", T_OBJECT, step_hooks),
    M("end_hooks", T_OBJECT, end_hooks),
    M("_queue", T_OBJECT, queue),
    M("_recorder", T_OBJECT, recorder),
    M("fixed_samples", T_OBJECT, fixed_samples),
    M("fixed_tokens", T_OBJECT, fixed_tokens),
    M("_alarm_fd", T_INT, alarm_fd),
    M("_alarm_after_ns", T_LONGLONG, alarm_after_ns),
    {NULL, 0, 0, 0, NULL},
};
#undef M

static PyMethodDef core_methods[] = {
    {"begin", (PyCFunction)core_begin_py, METH_O,
     "A phase begins now; False, recording nothing, off the training thread or once "
     "recording stopped (the caller then skips end too)."},
    {"end", (PyCFunction)core_end_py, METH_O,
     "The phase begun by the begin that returned True ends now."},
    {"_finish_step", (PyCFunction)core_finish_step_py, METH_NOARGS,
     "Put the step's record and start the next step."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._fastpath.TrackerCore",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The step tracker's state and hot path (tracker.py's _PyTrackerCore in C).",
    .tp_new = core_new,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_members = core_members,
    .tp_methods = core_methods,
};

/* the ``finally: end(phase)`` of a timed call: its result; or its exception, kept unless end
 * raises one of its own (then that one, with the call's as its context, as in Python) */
static PyObject* end_after(Core* tracker, PyObject* phase, PyObject* result) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (result == NULL) PyErr_Fetch(&type, &value, &tb);
  if (core_end(tracker, phase) < 0) {
    Py_XDECREF(result);
    if (value != NULL) {
      PyObject *t2, *v2, *tb2;
      PyErr_NormalizeException(&type, &value, &tb);
      PyErr_Fetch(&t2, &v2, &tb2);
      PyErr_NormalizeException(&t2, &v2, &tb2);
      if (v2 != NULL) PyException_SetContext(v2, Py_NewRef(value));
      PyErr_Restore(t2, v2, tb2);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return NULL;
  }
  if (result == NULL) PyErr_Restore(type, value, tb);
  return result;
}

/* ---- Timed: fn timed as a phase (tracker.py's _timed), and the optimizer's hooks ----- */
enum { TIMED_CALL = 0, HOOK_BEGIN = 1, HOOK_END = 2 };

typedef struct {
  PyObject_HEAD
  Core* tracker;
  PyObject* phase;
  PyObject* fn; /* TIMED_CALL only */
  PyObject* dict;
  vectorcallfunc vectorcall;
  int kind;
} Timed;

static PyObject* timed_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf,
                                  PyObject* kwnames) {
  Timed* t = (Timed*)op;
  Core* tracker = t->tracker;
  if (t->kind == HOOK_BEGIN) { /* optimizer step pre hook: (opt, args, kwargs) */
    if (core_begin(tracker, t->phase) < 0) return NULL;
    Py_RETURN_NONE;
  }
  if (t->kind == HOOK_END) { /* another thread's optimizer must not end the training thread's phase */
    if (tracker->enabled && PyThread_get_thread_ident() == tracker->thread_id &&
        core_end(tracker, t->phase) < 0)
      return NULL;
    Py_RETURN_NONE;
  }
  int began = core_begin(tracker, t->phase);
  if (began < 0) return NULL;
  PyObject* result = PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
  if (!began) return result;
  return end_after(tracker, t->phase, result);
}

static PyObject* timed_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static char* names[] = {"tracker", "phase", "fn", "kind", NULL};
  PyObject *tracker, *phase, *fn = Py_None;
  int kind = TIMED_CALL;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!U|Oi:Timed", names, &CoreType, &tracker,
                                   &phase, &fn, &kind))
    return NULL;
  if (kind < TIMED_CALL || kind > HOOK_END || (kind == TIMED_CALL && !PyCallable_Check(fn))) {
    PyErr_SetString(PyExc_TypeError, "Timed: kind 0 needs a callable fn; kinds 1, 2 none");
    return NULL;
  }
  Timed* self = (Timed*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->tracker = (Core*)Py_NewRef(tracker);
  self->phase = Py_NewRef(phase);
  self->fn = Py_NewRef(fn);
  self->kind = kind;
  self->vectorcall = timed_vectorcall;
  return (PyObject*)self;
}

static int timed_traverse(Timed* self, visitproc visit, void* arg) {
  Py_VISIT(self->tracker);
  Py_VISIT(self->phase);
  Py_VISIT(self->fn);
  Py_VISIT(self->dict);
  return 0;
}

static int timed_clear(Timed* self) {
  Py_CLEAR(self->tracker);
  Py_CLEAR(self->phase);
  Py_CLEAR(self->fn);
  Py_CLEAR(self->dict);
  return 0;
}

static void timed_dealloc(Timed* self) {
  PyObject_GC_UnTrack(self);
  timed_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* a copy of a module (an EMA's deepcopy) shares the wrapper as it would share a function */
static PyObject* timed_copy(PyObject* self, PyObject* Py_UNUSED(arg)) { return Py_NewRef(self); }

static PyMethodDef timed_methods[] = {
    {"__copy__", timed_copy, METH_NOARGS, NULL},
    {"__deepcopy__", timed_copy, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef timed_members[] = {
    {"phase", T_OBJECT, offsetof(Timed, phase), READONLY, NULL},
    {"fn", T_OBJECT, offsetof(Timed, fn), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._fastpath.Timed",
    .tp_basicsize = sizeof(Timed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Timed(tracker, phase, fn): fn timed as phase on the training thread; "
              "Timed(tracker, phase, kind=1 or 2): an optimizer step pre or post hook.",
    .tp_new = timed_new,
    .tp_dealloc = (destructor)timed_dealloc,
    .tp_traverse = (traverseproc)timed_traverse,
    .tp_clear = (inquiry)timed_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Timed, vectorcall),
    .tp_dictoffset = offsetof(Timed, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_methods = timed_methods,
    .tp_members = timed_members,
};

/* ---- NextTimed: the DataLoader iterator's __next__ timed as the data wait ------------- */
/* tracker.py's StepHooks.hook_dataloader wrapper: set on the iterator class, so it binds as
 * a method (a method descriptor, as a Python function is). The batch is counted as there: a
 * tuple or list whose first item is a plain tensor inline (its shape, and its dtype for
 * token ids), anything else through count_batch. */
static PyObject *S_dataset, *S_shape, *S_dtype;

typedef struct {
  PyObject_HEAD
  Core* tracker;
  PyObject* original;
  PyObject* dataset; /* None: every DataLoader */
  PyObject* count_batch;
  PyObject* tensor_type;
  PyObject* token_dtypes;
  PyObject* dict;
  vectorcallfunc vectorcall;
} NextTimed;

/* the common batch, inline: 0 counted or not countable here (*done says which), -1 raised */
static int count_inline(NextTimed* n, PyObject* batch, int* done) {
  *done = 0;
  if (!PyTuple_CheckExact(batch) && !PyList_CheckExact(batch)) return 0;
  if (PySequence_Fast_GET_SIZE(batch) == 0) return 0;
  PyObject* first = PySequence_Fast_GET_ITEM(batch, 0);
  if ((PyObject*)Py_TYPE(first) != n->tensor_type || !n->tracker->count_batches) return 0;
  *done = 1;
  Py_INCREF(first);
  int rc = -1;
  PyObject *shape = PyObject_GetAttr(first, S_shape), *dtype = NULL;
  if (shape == NULL) goto out;
  Py_ssize_t dims = PyObject_Size(shape);
  if (dims < 0) goto out;
  if (dims > 0) {
    PyObject* s0 = PySequence_GetItem(shape, 0);
    long long samples = s0 ? PyLong_AsLongLong(s0) : -1;
    Py_XDECREF(s0);
    if (samples == -1 && PyErr_Occurred()) goto out;
    n->tracker->samples += samples;
    if (dims >= 2) {
      dtype = PyObject_GetAttr(first, S_dtype);
      int tokens = dtype ? PySet_Contains(n->token_dtypes, dtype) : -1;
      if (tokens < 0) goto out;
      if (tokens) {
        PyObject* s1 = PySequence_GetItem(shape, 1);
        long long width = s1 ? PyLong_AsLongLong(s1) : -1;
        Py_XDECREF(s1);
        if (width == -1 && PyErr_Occurred()) goto out;
        n->tracker->tokens += samples * width;
      }
    }
  }
  rc = 0;
out:
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_DECREF(first);
  return rc;
}

static PyObject* next_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf,
                                 PyObject* kwnames) {
  NextTimed* n = (NextTimed*)op;
  Core* tracker = n->tracker;
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL)
    return PyObject_Vectorcall(n->original, args, nargsf, kwnames);
  PyObject* it = args[0];
  if (n->dataset != Py_None) {
    PyObject* ds = PyObject_GetAttr(it, S_dataset);
    if (ds == NULL) return NULL;
    int other = ds != n->dataset;
    Py_DECREF(ds);
    if (other) return PyObject_Vectorcall(n->original, args, nargsf, NULL);
  }
  int began = core_begin(tracker, P_DATA_WAIT);
  if (began < 0) return NULL;
  if (!began) return PyObject_Vectorcall(n->original, args, nargsf, NULL);
  set_obj(&tracker->data_iter, it); /* only while waiting: never keeps workers alive */
  PyObject* batch = PyObject_Vectorcall(n->original, args, nargsf, NULL);
  set_obj(&tracker->data_iter, Py_None);
  batch = end_after(tracker, P_DATA_WAIT, batch);
  if (batch == NULL) return NULL;
  int done;
  if (count_inline(n, batch, &done) < 0) {
    Py_DECREF(batch);
    return NULL;
  }
  if (!done) {
    PyObject* r = PyObject_Vectorcall(n->count_batch, &batch, 1, NULL);
    if (r == NULL) {
      Py_DECREF(batch);
      return NULL;
    }
    Py_DECREF(r);
  }
  return batch;
}

static PyObject* next_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static char* names[] = {"tracker", "original", "dataset", "count_batch", "tensor_type",
                          "token_dtypes", NULL};
  PyObject *tracker, *original, *dataset, *count_batch, *tensor_type, *token_dtypes;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOOO!:NextTimed", names, &CoreType,
                                   &tracker, &original, &dataset, &count_batch, &tensor_type,
                                   &PyFrozenSet_Type, &token_dtypes))
    return NULL;
  if (!PyCallable_Check(original) || !PyCallable_Check(count_batch) ||
      !PyType_Check(tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "NextTimed: original and count_batch must be callable, "
                                     "tensor_type a type");
    return NULL;
  }
  NextTimed* self = (NextTimed*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->tracker = (Core*)Py_NewRef(tracker);
  self->original = Py_NewRef(original);
  self->dataset = Py_NewRef(dataset);
  self->count_batch = Py_NewRef(count_batch);
  self->tensor_type = Py_NewRef(tensor_type);
  self->token_dtypes = Py_NewRef(token_dtypes);
  self->vectorcall = next_vectorcall;
  return (PyObject*)self;
}

static int next_traverse(NextTimed* self, visitproc visit, void* arg) {
  Py_VISIT(self->tracker);
  Py_VISIT(self->original);
  Py_VISIT(self->dataset);
  Py_VISIT(self->count_batch);
  Py_VISIT(self->tensor_type);
  Py_VISIT(self->token_dtypes);
  Py_VISIT(self->dict);
  return 0;
}

static int next_clear(NextTimed* self) {
  Py_CLEAR(self->tracker);
  Py_CLEAR(self->original);
  Py_CLEAR(self->dataset);
  Py_CLEAR(self->count_batch);
  Py_CLEAR(self->tensor_type);
  Py_CLEAR(self->token_dtypes);
  Py_CLEAR(self->dict);
  return 0;
}

static void next_dealloc(NextTimed* self) {
  PyObject_GC_UnTrack(self);
  next_clear(self);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

/* looked up on an iterator (it.__next__), it binds to it as a function does */
static PyObject* next_get(PyObject* self, PyObject* obj, PyObject* type) {
  if (obj == NULL || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

static PyTypeObject NextTimedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train._fastpath.NextTimed",
    .tp_basicsize = sizeof(NextTimed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "NextTimed(tracker, original, dataset, count_batch, tensor_type, token_dtypes): "
              "a DataLoader iterator's __next__ timed as the data wait.",
    .tp_new = next_new,
    .tp_dealloc = (destructor)next_dealloc,
    .tp_traverse = (traverseproc)next_traverse,
    .tp_clear = (inquiry)next_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(NextTimed, vectorcall),
    .tp_dictoffset = offsetof(NextTimed, dict),
    .tp_descr_get = next_get,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
};

/* ---- the module ------------------------------------------------------------------------ */
/* The records this file builds (record_step, end_phase), field by field: configure() is
   handed wire/hot_path.py's layouts and refuses any other, so a change there cannot pass
   unseen (tracker.py then runs the Python tracker). */
static const char* PHASE_LAYOUT[] = {"kind", "step", "phase", "micro", "start_ns", "end_ns",
                                     "span_id", NULL};
static const char* STEP_LAYOUT[] = {"kind", "step", "start_ns", "end_ns", "micro_batches",
                                    "samples", "tokens", NULL};

static int check_layout(PyObject* given, const char** built, const char* what) {
  Py_ssize_t n = 0;
  while (built[n] != NULL) n++;
  int same = PyTuple_Check(given) && PyTuple_GET_SIZE(given) == n;
  for (Py_ssize_t i = 0; same && i < n; i++) {
    PyObject* name = PyTuple_GET_ITEM(given, i);
    same = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, built[i]) == 0;
  }
  if (!same) {
    PyErr_Format(PyExc_ValueError,
                 "the C tracker builds %s records of %zd fields other than %R", what, n, given);
    return -1;
  }
  return 0;
}

static PyObject* configure(PyObject* module, PyObject* args, PyObject* kwds) {
  static char* names[] = {"phase_record", "step_record", "data_wait", "forward", "optimizer",
                          "phase_fields", "step_fields", NULL};
  PyObject *kp, *ks, *dw, *fw, *op, *pf, *sf;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "UUUUUO!O!:configure", names, &kp, &ks, &dw,
                                   &fw, &op, &PyTuple_Type, &pf, &PyTuple_Type, &sf))
    return NULL;
  if (check_layout(pf, PHASE_LAYOUT, "phase") < 0 || check_layout(sf, STEP_LAYOUT, "step") < 0)
    return NULL;
  set_obj(&K_PHASE, kp);
  set_obj(&K_STEP, ks);
  set_obj(&P_DATA_WAIT, dw);
  set_obj(&P_FORWARD, fw);
  set_obj(&P_OPTIMIZER, op);
  Py_RETURN_NONE;
}

/* --- GPU event times for sources/gpu/cuda_timing.py (the emitter thread, not the hot path) ---
 *
 * cuda_elapsed(base, events, query_last): the milliseconds from the CUDA event ``base`` to
 * each of ``events`` (raw handles: torch.cuda.Event.cuda_event), through the driver's
 * cuEventQuery / cuEventElapsedTime, or None while one is not complete (``query_last``: the
 * last event is queried first). torch's Event.elapsed_time costs several microseconds of
 * Python, argument parsing and a device guard around the same driver call, once a phase
 * boundary, on the emitter's cold core. libcuda is the one torch already loaded (RTLD_NOLOAD):
 * none is loaded here. A driver error raises RuntimeError with its code; the caller then
 * goes back to torch's calls for the run. The GIL is held, as torch holds it for these. */
typedef int (*cu_query_fn)(void*);
typedef int (*cu_elapsed_fn)(float*, void*, void*);
static cu_query_fn cu_query = NULL;
static cu_elapsed_fn cu_elapsed = NULL;
#define CU_SUCCESS 0
#define CU_NOT_READY 600

static int load_driver(void) {
#ifdef __linux__
  if (cu_query != NULL && cu_elapsed != NULL) return 0;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 is not loaded in this process");
    return -1;
  }
  cu_query = (cu_query_fn)dlsym(lib, "cuEventQuery");
  cu_elapsed = (cu_elapsed_fn)dlsym(lib, "cuEventElapsedTime");
  if (cu_query == NULL || cu_elapsed == NULL) {
    cu_query = NULL;
    cu_elapsed = NULL;
    PyErr_SetString(PyExc_RuntimeError, "libcuda.so.1 lacks cuEventQuery/cuEventElapsedTime");
    return -1;
  }
  return 0;
#else
  PyErr_SetString(PyExc_RuntimeError, "CUDA driver calls are made on Linux only");
  return -1;
#endif
}

static void* handle_of(PyObject* obj) {
  void* h = PyLong_AsVoidPtr(obj);
  if (h == NULL && !PyErr_Occurred())
    PyErr_SetString(PyExc_ValueError, "an event not recorded yet (handle 0)");
  return h;
}

static PyObject* cuda_elapsed(PyObject* self, PyObject* args) {
  PyObject *base_obj, *events;
  int query_last;
  if (!PyArg_ParseTuple(args, "OO!p", &base_obj, &PyTuple_Type, &events, &query_last))
    return NULL;
  if (load_driver() < 0) return NULL;
  void* base = handle_of(base_obj);
  if (base == NULL) return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(events);
  if (n == 0) return PyTuple_New(0);
  int rc;
  if (query_last) {
    void* last = handle_of(PyTuple_GET_ITEM(events, n - 1));
    if (last == NULL) return NULL;
    rc = cu_query(last);
    if (rc == CU_NOT_READY) Py_RETURN_NONE;
    if (rc != CU_SUCCESS) return PyErr_Format(PyExc_RuntimeError, "cuEventQuery: CUDA error %d", rc);
  }
  PyObject* out = PyTuple_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    void* h = handle_of(PyTuple_GET_ITEM(events, i));
    if (h == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    float ms = 0.0f;
    if (h != base) {
      rc = cu_elapsed(&ms, base, h);
      if (rc != CU_SUCCESS) {
        Py_DECREF(out);
        if (rc == CU_NOT_READY) Py_RETURN_NONE;
        return PyErr_Format(PyExc_RuntimeError, "cuEventElapsedTime: CUDA error %d", rc);
      }
    }
    PyObject* v = PyFloat_FromDouble((double)ms);
    if (v == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    PyTuple_SET_ITEM(out, i, v);
  }
  return out;
}

#ifdef __linux__
/* alarm_open(): a timer on CLOCK_MONOTONIC (perf_counter's clock), non-blocking, closed on
 * exec; alarm_set(fd, at_ns): it fires once at perf_counter ns at_ns. */
static PyObject* alarm_open(PyObject* self, PyObject* Py_UNUSED(ignored)) {
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0) return PyErr_SetFromErrno(PyExc_OSError);
  return PyLong_FromLong(fd);
}

static PyObject* alarm_set(PyObject* self, PyObject* args) {
  int fd;
  long long at_ns;
  if (!PyArg_ParseTuple(args, "iL", &fd, &at_ns)) return NULL;
  if (alarm_arm(fd, at_ns) < 0) return PyErr_SetFromErrno(PyExc_OSError);
  Py_RETURN_NONE;
}
#endif

static PyMethodDef module_methods[] = {
#ifdef __linux__
    {"alarm_open", alarm_open, METH_NOARGS,
     "alarm_open(): a one-shot timer's file descriptor on perf_counter's clock (a timerfd, "
     "non-blocking): the gap sampler's overrun alarm, which the tracker moves at each step's "
     "start (its _alarm_fd, _alarm_after_ns)."},
    {"alarm_set", alarm_set, METH_VARARGS,
     "alarm_set(fd, at_ns): the alarm fires once at perf_counter ns at_ns."},
#endif
    {"cuda_elapsed", cuda_elapsed, METH_VARARGS,
     "cuda_elapsed(base, events, query_last): milliseconds from event handle base to each of "
     "events (a tuple of handles), or None while one is not complete."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(phase_record, step_record, data_wait, forward, optimizer, phase_fields, "
     "step_fields): the record kinds, phase names and record layouts (wire/hot_path.py; "
     "tracker.py calls it once at import)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "otel_train._fastpath",
    "The step tracker's hot path in C (see tracker.py).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
  if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&TimedType) < 0 ||
      PyType_Ready(&NextTimedType) < 0)
    return NULL;
  S_dataset = PyUnicode_InternFromString("_dataset");
  S_shape = PyUnicode_InternFromString("shape");
  S_dtype = PyUnicode_InternFromString("dtype");
  if (!S_dataset || !S_shape || !S_dtype) return NULL;
  S_begin_inside = PyUnicode_InternFromString("_begin_inside");
  S_fail = PyUnicode_InternFromString("_fail");
  S_put = PyUnicode_InternFromString("put");
  S_append = PyUnicode_InternFromString("append");
  if (!S_begin_inside || !S_fail || !S_put || !S_append) return NULL;
  PyObject* m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddObject(m, "TrackerCore", Py_NewRef((PyObject*)&CoreType)) < 0 ||
      PyModule_AddObject(m, "Timed", Py_NewRef((PyObject*)&TimedType)) < 0 ||
      PyModule_AddObject(m, "NextTimed", Py_NewRef((PyObject*)&NextTimedType)) < 0 ||
      PyModule_AddIntConstant(m, "HOOK_BEGIN", HOOK_BEGIN) < 0 ||
      PyModule_AddIntConstant(m, "HOOK_END", HOOK_END) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
