"""The per-device backend torch looks up on the ``mpi`` backend's groups.

torch keeps, on every process group, a backend per device type (``group._get_backend(device)``,
``group._device_types``), and some of its APIs go through it: ``batch_isend_irecv`` asks the
backend of its tensors' device whether it coalesces, ``monitored_barrier`` and ``async_save`` need
a backend for cpu, FSDP2 asks the backend to allocate, and the group's C++ methods this backend
does not define in Python (``monitored_barrier``) call the backend of the device. Our group is
its own backend (a Python ``ProcessGroup`` whose methods are the operations) and registered none,
so those APIs failed ("No backend type associated with device type cpu").

``register(group)`` registers one ``DeviceBackend`` for cpu and for cuda, as gloo registers itself
for both (the group hands CUDA tensors to a CUDA-aware MPI, or stages them through host memory).
It forwards every operation to the group, so whichever way torch reaches an operation, it is the
group's (same checks, same executor, same profiler events); what the group does not do, the
backend refuses with torch's "Backend mpi does not support ...".
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend

# The operations torch's Backend lets Python define (the names its C++ calls reach), each defined
# by MPIProcessGroup.
FORWARDED = ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_single",
             "reduce_scatter_single_coalesced", "broadcast", "allgather", "all_gather_single",
             "all_gather_single_coalesced", "gather", "scatter", "alltoall", "all_to_all_single",
             "barrier", "send", "recv", "recv_anysource")
DEVICES = ("cpu", "cuda")


class DeviceBackend(C10dBackend):
    """What ``group._get_backend(device)`` returns for a group of the ``mpi`` backend."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group.rank(), group.size())
        self._group = weakref.ref(group)  # the group keeps this backend, not the reverse

    def getBackendName(self) -> str:
        return "mpi"

    # torch's Backend answers these through methods a Python subclass may define under the same
    # names as its properties: left undefined, the property finds itself and recurses
    supports_coalescing = supports_splitting = supports_shrinking = property(lambda self: False)
    supports_time_estimate = supports_reconfigure = supports_window = property(lambda self: False)

    @property
    def options(self):
        raise AttributeError("mpi backend: the backend has no options (the group's timeout is "
                             "init_process_group's or new_group's)")

    def monitored_barrier(self, opts: dist.BarrierOptions, wait_all_ranks: bool = False) -> None:
        self._of().monitored_barrier(opts.timeout, wait_all_ranks)

    def _of(self) -> dist.ProcessGroup:
        group = self._group()
        if group is None:
            raise RuntimeError("mpi backend: the process group of this backend was destroyed")
        return group


def _forward(name: str):
    def operation(self, *args, **kwargs):
        return getattr(self._of(), name)(*args, **kwargs)

    operation.__name__ = operation.__qualname__ = name
    return operation


for _name in FORWARDED:
    setattr(DeviceBackend, _name, _forward(_name))


def register(group: dist.ProcessGroup) -> DeviceBackend:
    """Register a ``DeviceBackend`` of ``group`` for cpu and cuda; ``group`` keeps it alive (its
    Python methods are what torch's C++ calls reach)."""
    for name in FORWARDED + ("monitored_barrier",):
        # one the group left to torch's C++ would come back here through the device's backend
        if getattr(type(group), name) is getattr(dist.ProcessGroup, name, None):
            raise TypeError(f"mpi backend: {type(group).__name__} does not define {name}")
    backend = DeviceBackend(group)
    kind = dist.ProcessGroup.BackendType.MPI  # what torch maps "mpi" to (Backend.backend_type_map)
    for device in DEVICES:
        group._register_backend(torch.device(device), kind, backend)
    group._set_default_backend(kind)
    return backend

