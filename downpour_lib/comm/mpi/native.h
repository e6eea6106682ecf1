/* The C data phase's parts and what each gives the others. ``native_common.c`` is the one home of
   what both halves use; the halves (``native_calls.c``, MPI's calls; ``native_shm.c``, the
   shared-memory paths) call only it, never each other; ``native_module.c`` makes the module. */
#ifndef DOWNPOUR_MPI_NATIVE_H
#define DOWNPOUR_MPI_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

/* SPIN_S, NAP_S and PAUSED_S are waits.py's, which native.py defines on the compiler's line */
#if !defined(SPIN_S) || !defined(NAP_S) || !defined(PAUSED_S)
#error "build with native.py, which defines SPIN_S, NAP_S and PAUSED_S from waits.py"
#endif

/* native_common.c: the clock, naps, the watchdog's word, the errors, the notes of waits */
extern atomic_int dp_silent;       /* the watchdog heard that a rank went silent (``set_silent``) */
extern PyObject *dp_peer_timeout;  /* liveness.PeerTimeout */
extern PyObject *dp_mpi_exception; /* mpi4py's MPI.Exception */
double dp_now(void);               /* CLOCK_MONOTONIC, in seconds */
void dp_nap(double seconds);
/* Raise liveness.PeerTimeout(what, waited); returns NULL. */
PyObject *dp_timeout(PyObject *what, double waited);
/* Note the calling thread's wait that spun out, as `what` since `since`: its slot, or -1 where
   every slot is taken (the note is lost); ``dp_note_leave`` ends it. */
int dp_note_enter(const char *what, double since);
void dp_note_leave(int slot);
/* the module's methods init(PeerTimeout, MPI.Exception), set_silent(flag) and waiting() */
PyObject *dp_init(PyObject *self, PyObject *args);
PyObject *dp_set_silent(PyObject *self, PyObject *flag);
PyObject *dp_waiting(PyObject *self, PyObject *unused);

/* native_calls.c: the module's collective(...) and committed() */
PyObject *dp_collective(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *dp_committed(PyObject *self, PyObject *unused);

/* native_shm.c: its type ShmGroup, added to the module */
int dp_shm_add_types(PyObject *module);

#endif
