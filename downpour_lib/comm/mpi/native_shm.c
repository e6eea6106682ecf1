/* The shared-memory paths of broadcast, allgather and allreduce in C (``shm.py``, ``shm_data.py``).

The same steps as the Python ones, on the same buffer and semaphores, with the GIL released and
without the interpreter between them (a group takes one or the other on every rank: agreed at
setup). In Python a 64 KB broadcast over shared memory cost 3-4x Open MPI's own call, nearly all
of it the numpy slices and ctypes calls around two copies and a barrier; in C the steps alone
take a sixth of Open MPI's time (2 ranks: 1.2 against 7.5 us; a 4 KB allreduce 1.8 against 3.8).

The layout (``ShmAllreduce._setup``): one semaphore per rank at `sems`, SEM_STRIDE apart; at
`areas` two sets of `set_bytes`, each n slots of `slot_bytes` and a result area. A call uses the
set of `phase` for each step and flips it, and returns the phase it leaves, which the caller keeps.
The barrier is ``shm.NodeBarrier``'s: each rank posts every other rank's semaphore and takes its own
n - 1 times, spinning SPIN_S, then asleep in slices, up to the group's deadline (moved on by any
gap of more than PAUSED_S: the process did not run), given up at once once the watchdog has heard
that a rank went silent. A barrier given up raises liveness.PeerTimeout(what, waited).

Every function takes the layout first, as seven arguments: sems, areas, set_bytes, slot_bytes,
rank, n, timeout. Then:

  shm_bcast(..., phase, piece, root, data, nbytes, what)
  shm_allgather(..., phase, piece, data, size, out, what)     out: n x size bytes, in rank order
  shm_allreduce(..., phase, small, chunk, data, count, dtype, op, average, what)

Allreduces of up to `small` bytes take shm.py's one barrier; larger ones its two barriers a chunk,
in chunks of `chunk` bytes (at most a slot's).

Allreduce takes float32, float64, int32 and int64 (`dtype` 0-3), sum and product (`op` 0-1), and
averages floats (``shm.py`` keeps the rest); it reduces in the same order as ``shm.py``, so every
rank ends with the same bits.
*/
#include "native.h"

#include <errno.h>
#include <semaphore.h>
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
  double waited; /* > 0: a barrier gave up after this long */
  int error;     /* errno of a failed sem_timedwait */
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

/* The layout's seven arguments into `s`; 0, or -1 with a Python error set. */
static int layout(Shm *s, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                  const char *name) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, not %zd", name, want, nargs);
    return -1;
  }
  s->sems = PyLong_AsVoidPtr(args[0]);
  s->areas = PyLong_AsVoidPtr(args[1]);
  s->set_bytes = PyLong_AsLongLong(args[2]);
  s->slot_bytes = PyLong_AsLongLong(args[3]);
  s->rank = (int)PyLong_AsLong(args[4]);
  s->n = (int)PyLong_AsLong(args[5]);
  s->timeout = PyFloat_AsDouble(args[6]);
  s->phase = (int)PyLong_AsLong(args[7]) & 1;
  s->waited = 0;
  s->error = 0;
  if (PyErr_Occurred()) return -1;
  if (s->n < 1 || s->rank < 0 || s->rank >= s->n || s->slot_bytes <= 0 ||
      s->set_bytes < s->slot_bytes * (s->n + 1)) {
    PyErr_Format(PyExc_ValueError, "%s: rank %d of %d in sets of %lld bytes, slots of %lld", name,
                 s->rank, s->n, s->set_bytes, s->slot_bytes);
    return -1;
  }
  return 0;
}

/* A piece of `piece` bytes fits `room`: 0, or -1 with a ValueError (a piece of 0 would never end). */
static int check_piece(long long piece, long long room, const char *name) {
  if (piece > 0 && piece <= room) return 0;
  PyErr_Format(PyExc_ValueError, "%s: a piece of %lld bytes does not fit %lld", name, piece, room);
  return -1;
}

/* The phase left, or the error of a barrier that gave up. */
static PyObject *finish(const Shm *s, int rc, PyObject *what) {
  if (rc == 0) return PyLong_FromLong(s->phase);
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

PyObject *dp_shm_bcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  Shm s;
  if (layout(&s, args, nargs, 13, "shm_bcast") != 0) return NULL;
  long long piece = PyLong_AsLongLong(args[8]);
  int root = (int)PyLong_AsLong(args[9]);
  char *data = PyLong_AsVoidPtr(args[10]);
  long long nbytes = PyLong_AsLongLong(args[11]);
  if (PyErr_Occurred() || check_piece(piece, s.set_bytes, "shm_bcast") != 0) return NULL;
  if (root < 0 || root >= s.n) {
    PyErr_Format(PyExc_ValueError, "shm_bcast: root %d of %d ranks", root, s.n);
    return NULL;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = bcast(&s, piece, root, data, nbytes);
  Py_END_ALLOW_THREADS
  return finish(&s, rc, args[12]);
}

PyObject *dp_shm_allgather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  Shm s;
  if (layout(&s, args, nargs, 13, "shm_allgather") != 0) return NULL;
  long long piece = PyLong_AsLongLong(args[8]);
  const char *data = PyLong_AsVoidPtr(args[9]);
  long long size = PyLong_AsLongLong(args[10]);
  char *out = PyLong_AsVoidPtr(args[11]);
  if (PyErr_Occurred() || check_piece(piece, s.slot_bytes, "shm_allgather") != 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = allgather(&s, piece, data, size, out);
  Py_END_ALLOW_THREADS
  return finish(&s, rc, args[12]);
}

PyObject *dp_shm_allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  Shm s;
  if (layout(&s, args, nargs, 16, "shm_allreduce") != 0) return NULL;
  long long small = PyLong_AsLongLong(args[8]), chunk = PyLong_AsLongLong(args[9]);
  char *data = PyLong_AsVoidPtr(args[10]);
  long long count = PyLong_AsLongLong(args[11]);
  int dtype = (int)PyLong_AsLong(args[12]), op = (int)PyLong_AsLong(args[13]);
  int average = PyObject_IsTrue(args[14]);
  if (PyErr_Occurred() || average < 0) return NULL;
  if (dtype < 0 || dtype > 3 || op < 0 || op > 1 || (average && divides[dtype] == NULL)) {
    PyErr_Format(PyExc_ValueError, "shm_allreduce: no kernel for dtype %d, op %d, average %d",
                 dtype, op, average);
    return NULL;
  }
  int item = itemsizes[dtype], rc;
  if (chunk < item * s.n || small > s.slot_bytes) {
    PyErr_Format(PyExc_ValueError, "shm_allreduce: chunks of %lld bytes, one barrier up to %lld, "
                 "in slots of %lld", chunk, small, s.slot_bytes);
    return NULL;
  }
  Kernel kernel = kernels[dtype][op];
  Divide divide = average ? divides[dtype] : NULL;
  Py_BEGIN_ALLOW_THREADS
  if (count * item <= small)
    rc = allreduce_small(&s, data, count, item, kernel, divide);
  else
    rc = allreduce_chunks(&s, chunk, data, count, item, kernel, divide);
  Py_END_ALLOW_THREADS
  return finish(&s, rc, args[15]);
}
