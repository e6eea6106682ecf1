/* What the two halves of the C data phase share (``native_calls.c``, MPI's calls; ``native_shm.c``,
   the shared-memory paths): the watchdog's word, the clock, and the errors raised. */
#ifndef DOWNPOUR_MPI_NATIVE_H
#define DOWNPOUR_MPI_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

/* liveness.py's SPIN_S, NAP_S and PAUSED_S */
#define SPIN_S 50e-6
#define NAP_S 1e-3
#define PAUSED_S 2.0

extern atomic_int dp_silent;     /* the watchdog heard that a rank went silent (``set_silent``) */
extern PyObject *dp_peer_timeout; /* liveness.PeerTimeout */

double dp_now(void); /* CLOCK_MONOTONIC, in seconds */

/* Raise liveness.PeerTimeout(what, waited); returns NULL. */
PyObject *dp_timeout(PyObject *what, double waited);

/* native_shm.c's: its type ShmGroup, added to the module; ``waiting()``, the notes of the waits
   that spun out (``dp_note_enter``: the slot, or -1 where every one is taken; ``dp_note_leave``) */
int dp_shm_add_types(PyObject *module);
PyObject *dp_shm_waiting(PyObject *self, PyObject *unused);
int dp_note_enter(const char *what, double since);
void dp_note_leave(int slot);

#endif
