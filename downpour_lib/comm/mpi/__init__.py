"""The ``mpi`` backend for torch.distributed on the stock PyPI torch wheel, written on mpi4py.

    from downpour_lib.comm.mpi import register, use_world
    register()            # "mpi" now names this backend (a no-op where torch has MPI built in)
    use_world(comm)       # optional: an mpi4py sub-communicator is torch's world from now on

Importing this package registers the backend (``import downpour_lib.comm`` does, through
``comm.runtime``; ``import downpour_lib`` alone imports nothing). The modules: ``backend``
(registration, group creation, failure handling: the design is in its docstring),
``process_group`` (the operations), ``paths`` (which path a collective takes on one node, as
measured), ``data_phase`` (the MPI call of each, and how it waits), ``native`` (the same in C for
the common collectives, built on first use), ``types`` (dtypes and staging), ``work`` (async work
and its thread), ``liveness`` (timeouts, the watchdog), ``shm`` (the
shared-memory allreduce), ``shm_data`` (broadcast, reduce and allgather through shared memory),
``profiling`` (the profiler events native backends record), ``device`` (the backend torch looks up
per device), ``monitored`` (monitored_barrier).
"""

from .backend import register, usable, use_world

__all__ = ["register", "usable", "use_world"]
