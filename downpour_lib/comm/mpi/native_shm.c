/* The shared-memory paths of broadcast, allgather and allreduce in C (``shm.py``, ``shm_data.py``).

The same steps as the Python ones, on the same buffer and semaphores, with the GIL released and
without the interpreter between them (a group takes one or the other on every rank: agreed at
setup). In Python a 64 KB broadcast over shared memory cost 3-4x Open MPI's own call, nearly all
of it the numpy slices and ctypes calls around two copies and a barrier; in C the steps alone
take a sixth of Open MPI's time (2 ranks: 1.2 against 7.5 us; a 4 KB allreduce 1.8 against 3.8).

The layout (``ShmAllreduce._setup``): one semaphore per rank at `sems`, SEM_STRIDE apart; at
`areas` two sets of `set_bytes`, each n slots of `slot_bytes` and a result area. A call uses the
set of `phase` for each step and flips it.
The barrier is ``shm.NodeBarrier``'s: each rank posts every other rank's semaphore and takes its own
n - 1 times, spinning SPIN_S, then asleep in slices, up to the group's deadline (moved on by any
gap of more than PAUSED_S: the process did not run), given up at once once the watchdog has heard
that a rank went silent. A barrier given up raises liveness.PeerTimeout(what, waited).

A group is a ``ShmGroup``, made once at setup with the layout and its allreduce's sizes:
ShmGroup(sems, areas, set_bytes, slot_bytes, rank, n, timeout, small, chunk). It keeps the phase
(``phase``, which the Python steps read and flip too: both use the same sets). Its calls:

  bcast(piece, root, data, nbytes, what)
  allgather(piece, data, size, out, what)            out: n x size bytes, in rank order
  allreduce(data, count, dtype, op, average, what)

A wait that spins out notes itself (``waiting()``: the thread, `what`, since when) until its call
ends, for the watchdog's answers to liveness probes, which the Python paths give through its table:
a call whose ranks meet within the spin pays nothing for it. Its own deadline and the watchdog's
word end a wait, so nothing else of the watchdog's is needed around these calls.

Allreduces of up to `small` bytes take shm.py's one barrier; larger ones its two barriers a chunk,
in chunks of `chunk` bytes (at most a slot's).

Allreduce takes float32, float64, int32 and int64 (`dtype` 0-3), sum and product (`op` 0-1), and
averages floats (``shm.py`` keeps the rest); it reduces in the same order as ``shm.py``, so every
rank ends with the same bits.
*/
#include "native.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define SEM_STRIDE 64 /* shm.py's */
#define SLICE_S 0.05  /* a sleeping barrier looks at the deadline and the watchdog this often */

typedef struct {
  char *sems, *areas;
  long long set_bytes, slot_bytes;
  int rank, n, phase;
  double timeout;
  /* one call's */
  const char *what; /* what it is, for its note */
  int note;         /* its note's slot (``note_enter``), or -1 */
  double waited;    /* > 0: a barrier gave up after this long */
  int error;        /* errno of a failed sem_timedwait */
} Shm;

static sem_t *sem_of(const Shm *s, int rank) {
  return (sem_t *)(s->sems + (long long)rank * SEM_STRIDE);
}

/* The next set (n slots, then the result area); flips the phase. */
static char *next_set(Shm *s) {
  char *set = s->areas + (long long)s->phase * s->set_bytes;
  s->phase ^= 1;
  return set;
}

static char *slot(const Shm *s, char *set, int rank) {
  return set + (long long)rank * s->slot_bytes;
}

/* Take `sem` once: 0, or -1 with s->waited or s->error set. */
static int take(Shm *s, sem_t *sem) {
  if (sem_trywait(sem) == 0) return 0;
  double start = dp_now(), t = start;
  while (t - start < SPIN_S) {
    if (sem_trywait(sem) == 0) return 0;
    t = dp_now();
  }
  if (s->note < 0) s->note = dp_note_enter(s->what, start);
  double deadline = start + s->timeout, last = start;
  for (;;) {
    t = dp_now();
    if (t - last > PAUSED_S) deadline += t - last; /* this process did not run meanwhile */
    last = t;
    if (t >= deadline || atomic_load(&dp_silent)) {
      s->waited = t > start ? t - start : 1e-9;
      return -1;
    }
    double slice = deadline - t < SLICE_S ? deadline - t : SLICE_S;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* sem_timedwait's clock */
    long long ns = until.tv_nsec + (long long)(slice * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    if (sem_timedwait(sem, &until) == 0) return 0;
    if (errno != ETIMEDOUT && errno != EINTR) {
      s->error = errno;
      return -1;
    }
  }
}

/* Every rank of the node has arrived: 0, or -1 (``take``). */
static int barrier(Shm *s) {
  for (int j = 0; j < s->n; j++)
    if (j != s->rank) sem_post(sem_of(s, j));
  for (int j = 1; j < s->n; j++)
    if (take(s, sem_of(s, s->rank)) != 0) return -1;
  return 0;
}

static int bcast(Shm *s, long long piece, int root, char *data, long long nbytes) {
  for (long long start = 0; start < nbytes; start += piece) {
    long long k = nbytes - start < piece ? nbytes - start : piece;
    char *area = next_set(s);
    if (s->rank == root) memcpy(area, data + start, (size_t)k);
    if (barrier(s) != 0) return -1;
    if (s->rank != root) memcpy(data + start, area, (size_t)k);
  }
  return 0;
}

static int allgather(Shm *s, long long piece, const char *data, long long size, char *out) {
  int r = s->rank;
  if (size > 0 && out + (long long)r * size != data)
    memcpy(out + (long long)r * size, data, (size_t)size);
  for (long long start = 0; start < size; start += piece) {
    long long k = size - start < piece ? size - start : piece;
    char *set = next_set(s);
    memcpy(slot(s, set, r), data + start, (size_t)k);
    if (barrier(s) != 0) return -1;
    for (int j = 0; j < s->n; j++)
      if (j != r) memcpy(out + (long long)j * size + start, slot(s, set, j), (size_t)k);
  }
  return 0;
}

/* The reductions: out[i] = a[i] (op) b[i]; out may be a. Then out[i] /= n for AVG. Integers
   are added and multiplied as unsigned (W), so that they wrap as torch's and numpy's do, where a
   signed overflow would be undefined in C. */
#define KERNELS(T, W, NAME)                                                                   \
  static void sum_##NAME(T *out, const T *a, const T *b, long long k) {                       \
    for (long long i = 0; i < k; i++) out[i] = (T)((W)a[i] + (W)b[i]);                        \
  }                                                                                           \
  static void prod_##NAME(T *out, const T *a, const T *b, long long k) {                      \
    for (long long i = 0; i < k; i++) out[i] = (T)((W)a[i] * (W)b[i]);                        \
  }
KERNELS(float, float, f32)
KERNELS(double, double, f64)
KERNELS(int32_t, uint32_t, i32)
KERNELS(int64_t, uint64_t, i64)

static void div_f32(void *out, long long k, int n) {
  float *x = out, d = (float)n;
  for (long long i = 0; i < k; i++) x[i] = x[i] / d;
}

static void div_f64(void *out, long long k, int n) {
  double *x = out, d = (double)n;
  for (long long i = 0; i < k; i++) x[i] = x[i] / d;
}

typedef void (*Kernel)(void *out, const void *a, const void *b, long long k);
typedef void (*Divide)(void *out, long long k, int n);

static const Kernel kernels[4][2] = {
    {(Kernel)sum_f32, (Kernel)prod_f32},
    {(Kernel)sum_f64, (Kernel)prod_f64},
    {(Kernel)sum_i32, (Kernel)prod_i32},
    {(Kernel)sum_i64, (Kernel)prod_i64}};
static const Divide divides[4] = {div_f32, div_f64, NULL, NULL};
static const int itemsizes[4] = {4, 8, 4, 8};

/* shm.py's _allreduce_small: every rank copies its buffer into its slot; barrier; every rank
   reduces all the slots into its buffer, in rank order. */
static int allreduce_small(Shm *s, char *data, long long count, int item, Kernel kernel,
                           Divide divide) {
  char *set = next_set(s);
  long long bytes = count * item;
  memcpy(slot(s, set, s->rank), data, (size_t)bytes);
  if (barrier(s) != 0) return -1;
  kernel(data, slot(s, set, 0), slot(s, set, 1), count);
  for (int j = 2; j < s->n; j++) kernel(data, data, slot(s, set, j), count);
  if (divide) divide(data, count, s->n);
  return 0;
}

/* shm.py's _allreduce_chunks: two barriers a chunk, a reduce-scatter into the result area, then
   an allgather from it. Rank r reduces the r-th part of the chunk in place in its buffer. */
static int allreduce_chunks(Shm *s, long long chunk, char *data, long long count, int item,
                            Kernel kernel, Divide divide) {
  int n = s->n, r = s->rank;
  long long per_chunk = (chunk < s->slot_bytes ? chunk : s->slot_bytes) / item;
  for (long long start = 0; start < count; start += per_chunk) {
    long long k = count - start < per_chunk ? count - start : per_chunk;
    char *set = next_set(s), *mine = data + start * item, *own_slot = slot(s, set, r);
    char *result = slot(s, set, n);
    long long part = (k + n - 1) / n;
    long long lo = r * part < k ? r * part : k, hi = (r + 1) * part < k ? (r + 1) * part : k;
    if (lo) memcpy(own_slot, mine, (size_t)(lo * item));
    if (hi < k) memcpy(own_slot + hi * item, mine + hi * item, (size_t)((k - hi) * item));
    if (barrier(s) != 0) return -1;
    if (hi > lo) {
      char *own = mine + lo * item;
      for (int j = 0; j < n; j++)
        if (j != r) kernel(own, own, slot(s, set, j) + lo * item, hi - lo);
      if (divide) divide(own, hi - lo, n);
      memcpy(result + lo * item, own, (size_t)((hi - lo) * item));
    }
    if (barrier(s) != 0) return -1;
    if (lo) memcpy(mine, result, (size_t)(lo * item));
    if (hi < k) memcpy(mine + hi * item, result + hi * item, (size_t)((k - hi) * item));
  }
  return 0;
}

/* ShmGroup: one group's layout, its allreduce's sizes and the phase. */
typedef struct {
  PyObject_HEAD
  Shm shm; /* a call works on a copy and keeps the phase it leaves */
  long long small, chunk;
} ShmGroup;

static int group_init(ShmGroup *self, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"sems", "areas", "set_bytes", "slot_bytes", "rank", "n", "timeout",
                          "small", "chunk", NULL};
  unsigned long long sems, areas;
  Shm *s = &self->shm;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKLLiidLL", names, &sems, &areas, &s->set_bytes,
                                   &s->slot_bytes, &s->rank, &s->n, &s->timeout, &self->small,
                                   &self->chunk))
    return -1;
  s->sems = (char *)(uintptr_t)sems;
  s->areas = (char *)(uintptr_t)areas;
  s->phase = 0;
  if (s->n < 1 || s->rank < 0 || s->rank >= s->n || s->slot_bytes <= 0 ||
      s->set_bytes < s->slot_bytes * (s->n + 1)) {
    PyErr_Format(PyExc_ValueError, "ShmGroup: rank %d of %d in sets of %lld bytes, slots of %lld",
                 s->rank, s->n, s->set_bytes, s->slot_bytes);
    return -1;
  }
  if (self->chunk < 8LL * s->n || self->small > s->slot_bytes) { /* 8: the widest item */
    PyErr_Format(PyExc_ValueError, "ShmGroup: allreduce chunks of %lld bytes, one barrier up to "
                 "%lld, in slots of %lld", self->chunk, self->small, s->slot_bytes);
    return -1;
  }
  return 0;
}

/* A call of `name` taking `want` arguments, the last its `what`: its copy of the group in `s`;
   0, or -1 with a Python error set. */
static int begin(ShmGroup *self, Shm *s, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                 const char *name) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "ShmGroup.%s takes %zd arguments, not %zd", name, want, nargs);
    return -1;
  }
  if (self->shm.n < 1) { /* made without __init__ */
    PyErr_Format(PyExc_RuntimeError, "ShmGroup.%s on a group that was not set up", name);
    return -1;
  }
  *s = self->shm;
  s->note = -1;
  s->waited = 0;
  s->error = 0;
  s->what = PyUnicode_AsUTF8(args[want - 1]);
  return s->what == NULL ? -1 : 0;
}

/* The call is over: None, the group keeping the phase it left; or the error of a barrier that
   gave up. */
static PyObject *end(ShmGroup *self, const Shm *s, int rc, PyObject *what) {
  dp_note_leave(s->note);
  if (rc == 0) {
    self->shm.phase = s->phase;
    Py_RETURN_NONE;
  }
  if (s->error) {
    PyObject *text = PyUnicode_FromFormat("mpi backend: sem_timedwait failed in a %S: errno %d",
                                          what, s->error);
    if (text != NULL) {
      PyErr_SetObject(PyExc_RuntimeError, text);
      Py_DECREF(text);
    }
    return NULL;
  }
  return dp_timeout(what, s->waited);
}

/* A piece of `piece` bytes fits `room`: 0, or -1 with a ValueError (a piece of 0 would never end). */
static int check_piece(long long piece, long long room, const char *name) {
  if (piece > 0 && piece <= room) return 0;
  PyErr_Format(PyExc_ValueError, "%s: a piece of %lld bytes does not fit %lld", name, piece, room);
  return -1;
}

static PyObject *group_bcast(ShmGroup *self, PyObject *const *args, Py_ssize_t nargs) {
  Shm s;
  if (begin(self, &s, args, nargs, 5, "bcast") != 0) return NULL;
  long long piece = PyLong_AsLongLong(args[0]);
  int root = (int)PyLong_AsLong(args[1]);
  char *data = PyLong_AsVoidPtr(args[2]);
  long long nbytes = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred() || check_piece(piece, s.set_bytes, "ShmGroup.bcast") != 0) return NULL;
  if (root < 0 || root >= s.n) {
    PyErr_Format(PyExc_ValueError, "ShmGroup.bcast: root %d of %d ranks", root, s.n);
    return NULL;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = bcast(&s, piece, root, data, nbytes);
  Py_END_ALLOW_THREADS
  return end(self, &s, rc, args[4]);
}

static PyObject *group_allgather(ShmGroup *self, PyObject *const *args, Py_ssize_t nargs) {
  Shm s;
  if (begin(self, &s, args, nargs, 5, "allgather") != 0) return NULL;
  long long piece = PyLong_AsLongLong(args[0]);
  const char *data = PyLong_AsVoidPtr(args[1]);
  long long size = PyLong_AsLongLong(args[2]);
  char *out = PyLong_AsVoidPtr(args[3]);
  if (PyErr_Occurred() || check_piece(piece, s.slot_bytes, "ShmGroup.allgather") != 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = allgather(&s, piece, data, size, out);
  Py_END_ALLOW_THREADS
  return end(self, &s, rc, args[4]);
}

static PyObject *group_allreduce(ShmGroup *self, PyObject *const *args, Py_ssize_t nargs) {
  Shm s;
  if (begin(self, &s, args, nargs, 6, "allreduce") != 0) return NULL;
  char *data = PyLong_AsVoidPtr(args[0]);
  long long count = PyLong_AsLongLong(args[1]);
  int dtype = (int)PyLong_AsLong(args[2]), op = (int)PyLong_AsLong(args[3]);
  int average = PyObject_IsTrue(args[4]);
  if (PyErr_Occurred() || average < 0) return NULL;
  if (dtype < 0 || dtype > 3 || op < 0 || op > 1 || (average && divides[dtype] == NULL)) {
    PyErr_Format(PyExc_ValueError, "ShmGroup.allreduce: no kernel for dtype %d, op %d, "
                 "average %d", dtype, op, average);
    return NULL;
  }
  int item = itemsizes[dtype], rc;
  Kernel kernel = kernels[dtype][op];
  Divide divide = average ? divides[dtype] : NULL;
  Py_BEGIN_ALLOW_THREADS
  if (count * item <= self->small)
    rc = allreduce_small(&s, data, count, item, kernel, divide);
  else
    rc = allreduce_chunks(&s, self->chunk, data, count, item, kernel, divide);
  Py_END_ALLOW_THREADS
  return end(self, &s, rc, args[5]);
}

static PyObject *get_phase(ShmGroup *self, void *unused) {
  (void)unused;
  return PyLong_FromLong(self->shm.phase);
}

static int set_phase(ShmGroup *self, PyObject *value, void *unused) {
  (void)unused;
  long phase = value == NULL ? -1 : PyLong_AsLong(value);
  if (phase == -1 && PyErr_Occurred()) return -1;
  if (phase != 0 && phase != 1) {
    PyErr_SetString(PyExc_ValueError, "ShmGroup.phase is 0 or 1");
    return -1;
  }
  self->shm.phase = (int)phase;
  return 0;
}

static PyMethodDef group_methods[] = {
    {"bcast", (PyCFunction)(void (*)(void))group_bcast, METH_FASTCALL,
     "bcast(piece, root, data, nbytes, what)"},
    {"allgather", (PyCFunction)(void (*)(void))group_allgather, METH_FASTCALL,
     "allgather(piece, data, size, out, what)"},
    {"allreduce", (PyCFunction)(void (*)(void))group_allreduce, METH_FASTCALL,
     "allreduce(data, count, dtype, op, average, what)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef group_getset[] = {
    {"phase", (getter)get_phase, (setter)set_phase, "The set the next step uses (0 or 1).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject group_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "downpour_mpi_native.ShmGroup",
    .tp_basicsize = sizeof(ShmGroup),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The shared-memory steps of one group (native_shm.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)group_init,
    .tp_methods = group_methods,
    .tp_getset = group_getset,
};

int dp_shm_add_types(PyObject *module) {
  if (PyType_Ready(&group_type) < 0) return -1;
  Py_INCREF(&group_type);
  if (PyModule_AddObject(module, "ShmGroup", (PyObject *)&group_type) < 0) {
    Py_DECREF(&group_type);
    return -1;
  }
  return 0;
}
