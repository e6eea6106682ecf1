/* What both halves of the C data phase use (``native_calls.c``, MPI's calls; ``native_shm.c``, the
shared-memory paths): the clock and naps, the watchdog's word (``set_silent``), the errors a call
raises (``init``), and the notes of the waits that spun out (``waiting()``), which the watchdog
reads to answer liveness probes. Nothing here calls either half; ``native_module.c`` makes the
module of the three. */
#include "native.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>

PyObject *dp_peer_timeout;  /* liveness.PeerTimeout */
PyObject *dp_mpi_exception; /* mpi4py's MPI.Exception */
atomic_int dp_silent;       /* the watchdog heard that a rank went silent */

double dp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dp_nap(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

PyObject *dp_timeout(PyObject *what, double waited) {
  PyObject *error = PyObject_CallFunction(dp_peer_timeout, "Od", what, waited);
  if (error != NULL) {
    PyErr_SetObject(dp_peer_timeout, error);
    Py_DECREF(error);
  }
  return NULL;
}

/* The threads whose wait spun out, in what and since when (``waiting()``). Only such waits take
   the lock, so a call that meets its peers within the spin never does. */
#define NOTES 64
static struct {
  unsigned long thread; /* pthread_self(), which is Python's threading.get_ident(); 0: free */
  double since;
  char what[48];
} notes[NOTES];
static pthread_mutex_t notes_lock = PTHREAD_MUTEX_INITIALIZER;

int dp_note_enter(const char *what, double since) {
  int slot = -1;
  pthread_mutex_lock(&notes_lock);
  for (int i = 0; i < NOTES && slot < 0; i++)
    if (notes[i].thread == 0) slot = i;
  if (slot >= 0) {
    notes[slot].thread = (unsigned long)pthread_self();
    notes[slot].since = since;
    snprintf(notes[slot].what, sizeof notes[slot].what, "%s", what);
  }
  pthread_mutex_unlock(&notes_lock);
  return slot;
}

void dp_note_leave(int slot) {
  if (slot < 0) return;
  pthread_mutex_lock(&notes_lock);
  notes[slot].thread = 0;
  pthread_mutex_unlock(&notes_lock);
}

PyObject *dp_waiting(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  PyObject *out = PyList_New(0);
  pthread_mutex_lock(&notes_lock);
  for (int i = 0; out != NULL && i < NOTES; i++) {
    if (notes[i].thread == 0) continue;
    PyObject *note = Py_BuildValue("(ksd)", notes[i].thread, notes[i].what, notes[i].since);
    if (note == NULL || PyList_Append(out, note) < 0) Py_CLEAR(out);
    Py_XDECREF(note);
  }
  pthread_mutex_unlock(&notes_lock);
  return out;
}

PyObject *dp_init(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *timeout_type, *mpi_type;
  if (!PyArg_ParseTuple(args, "OO", &timeout_type, &mpi_type)) return NULL;
  Py_XSETREF(dp_peer_timeout, Py_NewRef(timeout_type));
  Py_XSETREF(dp_mpi_exception, Py_NewRef(mpi_type));
  Py_RETURN_NONE;
}

PyObject *dp_set_silent(PyObject *self, PyObject *flag) {
  (void)self;
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  atomic_store(&dp_silent, on);
  Py_RETURN_NONE;
}
