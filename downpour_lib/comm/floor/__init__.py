"""Two yardstick backends for ``downpour bench collectives --breakdown``, not backends to train on.

``noop``: a process group whose collectives do nothing (``noop_group``), the floor of torch's
dispatch into a Python backend. ``native_floor``: a C++ backend whose collectives are MPI's blocking
calls and nothing else (``native_floor.cpp``, built here; ``native_group``), without and with the
``mpi`` backend's liveness gate: what a native backend with none (or one) of our guarantees takes.
Both register through torch's public extension API, as ``comm/mpi`` registers ``mpi``; ``bench/``
only times them.
"""
