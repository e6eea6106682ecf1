/* The module ``downpour_mpi_native`` (``native.py`` builds it): the methods of the two halves
(``native_calls.c``, ``native_shm.c``) and of what they share (``native_common.c``). */
#include "native.h"

static PyMethodDef methods[] = {
    {"collective", (PyCFunction)(void (*)(void))dp_collective, METH_FASTCALL,
     "One collective's data phase (native_calls.c)."},
    {"init", dp_init, METH_VARARGS, "init(PeerTimeout, MPI.Exception): the errors it raises."},
    {"set_silent", dp_set_silent, METH_O, "Whether the watchdog heard that a rank went silent."},
    {"committed", dp_committed, METH_NOARGS,
     "(ident, what, group, since, timeout) of each thread inside a blocking MPI call now."},
    {"waiting", dp_waiting, METH_NOARGS,
     "(ident, what, since) of each thread whose wait in C spun out (native_common.c's notes)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "downpour_mpi_native", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_downpour_mpi_native(void) {
  PyObject *m = PyModule_Create(&module);
  if (m != NULL && dp_shm_add_types(m) < 0) Py_CLEAR(m);
  return m;
}
