/* The data phase of the `mpi` backend's common collectives in C (``native.py`` builds it).

The data phase in Python (``data_phase.py`` with ``liveness.gate`` and ``wait_request``) cost more
than MPI's own call at 4-64 KB (issue 36). This module makes the same steps with the GIL released,
and nothing else: the caller (``process_group.py``) has checked the arguments and chosen the path.
What the watchdog needs of a call it knows only here, it has from here: a wait that spins out
notes itself (``waiting()``), and a thread inside a blocking call is marked committed with what it
is, its group, since when and its timeout (``committed()``), so that a synchronous call can come
here without entering the watchdog's table (``MPIProcessGroup``'s short paths).

  NB          MPI's nonblocking call, waited on spinning `spin` seconds, then with naps;
  GATED       the gate (MPI_Ibarrier waited on so), then MPI's blocking call, the thread marked
              committed to it for the watchdog (``committed()``);
  GATED_SPUN  the gate, then the nonblocking call waited on spinning `spin` seconds, then naps.

Every wait is liveness.wait_request's: a deadline of `timeout` seconds, moved on by any gap of more
than PAUSED_S between two looks (the process did not run), given up at once once the watchdog has
heard that a rank went silent (``set_silent``); naps of a 32nd of the wait so far, from SPIN_S to
NAP_S. A wait given up raises liveness.PeerTimeout(what, waited), which the group explains as the
Python path's does; an MPI error raises mpi4py's MPI.Exception, as mpi4py would.
*/
#include "native.h"

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { ALLREDUCE, BCAST, ALLGATHER, REDUCE_SCATTER_BLOCK };
enum { NB, GATED, GATED_SPUN };

#define FROM_HANDLE(type, value) ((type)(intptr_t)(value)) /* pointers (Open MPI) or ints (MPICH) */


/* The threads inside a blocking MPI call now, with what the call is, its group, since when and its
   timeout, for the watchdog (liveness.Watchdog._check_committed: once a rank is silent, such a
   thread never comes back; _check_stuck: the backstop). A slot is claimed with CLAIMED, filled,
   then given the thread; a reader that finds the same thread before and after its copy has a
   whole entry. */
#define SLOTS 64
#define CLAIMED 1UL
static struct {
  _Atomic unsigned long thread; /* pthread_self(), Python's threading.get_ident(); 0: free */
  double since, timeout;
  char what[48], group[48];
} committed[SLOTS];

static int commit(const char *what, const char *group, double timeout) {
  unsigned long me = (unsigned long)pthread_self(), free_slot = 0;
  for (int i = 0; i < SLOTS; i++) {
    if (atomic_compare_exchange_strong(&committed[i].thread, &free_slot, CLAIMED)) {
      committed[i].since = dp_now();
      committed[i].timeout = timeout;
      snprintf(committed[i].what, sizeof committed[i].what, "%s", what);
      snprintf(committed[i].group, sizeof committed[i].group, "%s", group);
      atomic_store(&committed[i].thread, me);
      return i;
    }
    free_slot = 0;
  }
  return -1; /* more threads than slots: not watched (the backstop still is) */
}

static void uncommit(int slot) {
  if (slot >= 0) atomic_store(&committed[slot].thread, 0);
}

/* Wait for `request`: MPI's return code; `*waited` 0 once done, else the seconds waited when it
   gave up (the request stays active: the job is ending). A wait that spins out notes itself as
   `what` until it ends (``waiting()``, native_common.c's notes), for the watchdog's probe answers. */
static int wait_request(MPI_Request *request, double timeout, double spin, const char *what,
                        double *waited) {
  int done = 0, rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
  *waited = 0;
  if (rc != MPI_SUCCESS || done) return rc;
  double start = dp_now(), t = start;
  while (t - start < spin) {
    if ((rc = MPI_Test(request, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || done) return rc;
    t = dp_now();
  }
  int note = dp_note_enter(what, start);
  double deadline = start + timeout, last = start;
  for (;;) {
    t = dp_now();
    if (t - last > PAUSED_S) deadline += t - last; /* this process did not run meanwhile */
    last = t;
    if (t >= deadline || atomic_load(&dp_silent)) {
      *waited = t > start ? t - start : 1e-9; /* not 0, which says done */
      rc = MPI_SUCCESS;
      break;
    }
    double sleep = (t - start) / 32;
    sleep = sleep < SPIN_S ? SPIN_S : sleep > NAP_S ? NAP_S : sleep;
    dp_nap(sleep < deadline - t ? sleep : deadline - t);
    if ((rc = MPI_Test(request, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS || done) break;
  }
  dp_note_leave(note);
  return rc;
}

typedef struct {
  int op, mode, root;
  MPI_Comm comm;
  void *send, *recv; /* send NULL: in place (allreduce) */
  long long count;   /* elements: the buffer (allreduce, bcast), each rank's block (the others) */
  MPI_Datatype type;
  MPI_Op reduce;
  double timeout, spin;
  const char *what, *group; /* for the notes and the committed mark */
} Call;

static int start(const Call *c, MPI_Request *r) {
  int n = (int)c->count;
  switch (c->op) {
    case ALLREDUCE:
      return MPI_Iallreduce(c->send ? c->send : MPI_IN_PLACE, c->recv, n, c->type, c->reduce,
                            c->comm, r);
    case BCAST: return MPI_Ibcast(c->recv, n, c->type, c->root, c->comm, r);
    case ALLGATHER: return MPI_Iallgather(c->send, n, c->type, c->recv, n, c->type, c->comm, r);
    default:
      return MPI_Ireduce_scatter_block(c->send, c->recv, n, c->type, c->reduce, c->comm, r);
  }
}

static int blocking(const Call *c) {
  int n = (int)c->count;
  switch (c->op) {
    case ALLREDUCE:
      return MPI_Allreduce(c->send ? c->send : MPI_IN_PLACE, c->recv, n, c->type, c->reduce,
                           c->comm);
    case BCAST: return MPI_Bcast(c->recv, n, c->type, c->root, c->comm);
    case ALLGATHER: return MPI_Allgather(c->send, n, c->type, c->recv, n, c->type, c->comm);
    default: return MPI_Reduce_scatter_block(c->send, c->recv, n, c->type, c->reduce, c->comm);
  }
}

/* The whole data phase, without the GIL: MPI's return code, `*waited` as wait_request's. */
static int run(const Call *c, double *waited) {
  MPI_Request request;
  int rc, size = 1;
  *waited = 0;
  if (c->mode != NB) {
    if ((rc = MPI_Comm_size(c->comm, &size)) != MPI_SUCCESS) return rc;
    if (size > 1) {
      if ((rc = MPI_Ibarrier(c->comm, &request)) != MPI_SUCCESS) return rc;
      if ((rc = wait_request(&request, c->timeout, SPIN_S, c->what, waited)) != MPI_SUCCESS ||
          *waited)
        return rc;
    }
    if (c->mode == GATED) {
      int slot = commit(c->what, c->group, c->timeout);
      rc = blocking(c);
      uncommit(slot);
      return rc;
    }
  }
  if ((rc = start(c, &request)) != MPI_SUCCESS) return rc;
  return wait_request(&request, c->timeout, c->mode == NB ? SPIN_S : c->spin, c->what, waited);
}

/* collective(op, mode, comm, count, datatype, reduce, root, timeout, spin, what, group, send,
   recv): handles and addresses as ints (mpi4py's .handle, tensor.data_ptr()), send 0 for in
   place; the buffers last, so that a caller can keep the rest for its next call of the kind. */
PyObject *dp_collective(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 13) {
    PyErr_Format(PyExc_TypeError, "collective takes 13 arguments, not %zd", nargs);
    return NULL;
  }
  Call c;
  c.op = (int)PyLong_AsLong(args[0]);
  c.mode = (int)PyLong_AsLong(args[1]);
  c.comm = FROM_HANDLE(MPI_Comm, PyLong_AsVoidPtr(args[2]));
  c.count = PyLong_AsLongLong(args[3]);
  c.type = FROM_HANDLE(MPI_Datatype, PyLong_AsVoidPtr(args[4]));
  c.reduce = FROM_HANDLE(MPI_Op, PyLong_AsVoidPtr(args[5]));
  c.root = (int)PyLong_AsLong(args[6]);
  c.timeout = PyFloat_AsDouble(args[7]);
  c.spin = PyFloat_AsDouble(args[8]);
  c.what = PyUnicode_AsUTF8(args[9]);
  c.group = PyUnicode_AsUTF8(args[10]);
  c.send = PyLong_AsVoidPtr(args[11]);
  c.recv = PyLong_AsVoidPtr(args[12]);
  if (PyErr_Occurred()) return NULL;
  if (c.count < 0 || c.count > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "collective: count %lld is not an MPI count", c.count);
    return NULL;
  }
  double waited;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = run(&c, &waited);
  Py_END_ALLOW_THREADS
  if (rc != MPI_SUCCESS) {
    PyObject *error = PyObject_CallFunction(dp_mpi_exception, "i", rc);
    if (error != NULL) {
      PyErr_SetObject(dp_mpi_exception, error);
      Py_DECREF(error);
    }
    return NULL;
  }
  if (waited > 0) return dp_timeout(args[9], waited);
  Py_RETURN_NONE;
}

PyObject *dp_committed(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *out = PyList_New(0);
  for (int i = 0; out != NULL && i < SLOTS; i++) {
    unsigned long thread = atomic_load(&committed[i].thread);
    if (thread <= CLAIMED) continue;
    double since = committed[i].since, timeout = committed[i].timeout;
    char what[48], group[48];
    memcpy(what, committed[i].what, sizeof what);
    memcpy(group, committed[i].group, sizeof group);
    what[sizeof what - 1] = group[sizeof group - 1] = 0;
    if (atomic_load(&committed[i].thread) != thread) continue; /* it left meanwhile */
    PyObject *entry = Py_BuildValue("(kssdd)", thread, what, group, since, timeout);
    if (entry == NULL || PyList_Append(out, entry) < 0) Py_CLEAR(out);
    Py_XDECREF(entry);
  }
  return out;
}

