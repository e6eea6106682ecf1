"""The ``mpi`` backend for torch.distributed with the stock PyPI torch wheel, written on mpi4py.

PyPI's torch is built without MPI, so ``init_process_group("mpi")`` fails with "Distributed package
doesn't have MPI built in". On one node, MPI's shared-memory transport is an order of magnitude
faster than gloo's TCP loopback, and on a cluster MPI is what the job launcher already set up.

How ``"mpi"`` comes to mean this backend: ``register()`` calls torch's public extension API,
``Backend.register_backend("mpi", creator, extended_api=True, devices=["cpu", "cuda"])``, before the
name's first use, so torch's own entry point (whose creator raises) is never consulted. Nothing in
torch is patched; where torch was built with MPI, ``register()`` does nothing. Importing this module
registers; ``register()`` is idempotent. Before that, ``import torch`` itself registers a creator
that imports this module on first use (``downpour_lib/torch_backends.py``, a ``torch.backends``
entry point), so a script that imports nothing of ours can ``init_process_group("mpi")``.

Rendezvous: rank and world size come from MPI, with no store and no MASTER_ADDR. The default group
duplicates ``MPI_COMM_WORLD`` (or the communicator given to ``use_world``); ``new_group(...,
backend="mpi")`` creates ``MPI_Comm_create_group`` over its members, which requires torch's ranks to
be MPI's. As with torch's native MPI backend, ``new_group(backend="gloo")`` under an ``mpi`` default
group is not possible; the reverse is.

Operations live in ``process_group``, dtypes and staging in ``types``, async work in ``work``; CUDA
tensors go to a CUDA-aware MPI directly, otherwise through host memory (use ``nccl`` on GPUs).
Every wait honours the group's timeout and sleeps rather than spins (``liveness``), and an uncaught
exception on any rank ends every rank with one line naming it (``job_end``). The guide's mpi
backend page (docs/mpi_backend.md) has every operation, dtype and guarantee.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import sys

import torch
import torch.distributed as dist

from ...defaults import TORCH_TIMEOUT_S
from ...launch_env import discover
from .. import job_end

_CREATE_TAG = 0x1D0  # MPI_Comm_create_group's tag (members create groups in program order)
_registered = False
_abort_on_uncaught = False
_world = None  # the mpi4py communicator whose ranks are torch's ranks; None: MPI_COMM_WORLD


def name_is_free() -> bool:
    """Whether this torch lets a registered backend take the name ``"mpi"``: from torch 2.14 its
    built-in backends are entries of the plugin table like any other (``_register_builtin_mpi_
    backend``); before (torch 2.11 was seen), c10d sends ``"mpi"`` straight to its own MPI build,
    which the PyPI wheel lacks, and a registered ``mpi`` is never asked."""
    return hasattr(dist.distributed_c10d, "_register_builtin_mpi_backend")


def usable() -> bool:
    """Whether ``"mpi"`` works here: torch's own MPI build, or ours where the name is free."""
    return dist.is_mpi_available() or name_is_free()


def register() -> bool:
    """Make ``"mpi"`` mean this backend unless torch has MPI built in (or keeps the name, before
    2.14). True when ours is in use."""
    global _registered
    if dist.is_mpi_available() or not name_is_free():
        return False
    if not _registered:
        dist.Backend.register_backend("mpi", _create_group, extended_api=True,
                                      devices=["cpu", "cuda"])
        _registered = True
    return True


def use_world(comm) -> None:
    """Make ``comm`` (an mpi4py intracommunicator) torch's world for groups created from now on:
    the default group duplicates it and subgroups are made within it. For MPI processes that run
    jobs on a subset of themselves (``COMM_WORLD.Split``); ``None`` restores ``MPI_COMM_WORLD``.
    """
    global _world
    _world = comm


def world():
    """The mpi4py communicator whose ranks are torch's ranks (``use_world``'s, or COMM_WORLD)."""
    return _world if _world is not None else _mpi().COMM_WORLD


def _mpi():
    """mpi4py's MPI module: importing it initializes MPI (with mpi4py's default, THREAD_MULTIPLE)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("the mpi backend needs mpi4py and an MPI library: "
                           "pip install 'downpour[mpi]' (or mpi4py built against your cluster's MPI)"
                           ) from exc
    return MPI


def _create_group(opts: dist.distributed_c10d._DistributedBackendOptions,
                  backend_options: object | None) -> dist.ProcessGroup:
    """torch's creator hook: the default group (empty rank list) or a subgroup of MPI's world."""
    MPI = _mpi()
    from . import device
    from .liveness import WATCHDOG
    from .process_group import MPIProcessGroup
    from .work import EXECUTOR

    timeout_s = opts.timeout.total_seconds() if isinstance(opts.timeout, datetime.timedelta) \
        else TORCH_TIMEOUT_S
    world = _world if _world is not None else MPI.COMM_WORLD
    ranks = list(opts.global_ranks_in_group)
    EXECUTOR.drain(timeout_s)  # creating a communicator is collective: after the queued work
    if not ranks:
        if _world is None:  # a plain init_process_group("mpi"): MPI must see the whole launch
            _check_launch(world.Get_size())
        comm = world.Dup()
    else:
        _check_same_ranks(world.Get_rank(), world.Get_size())
        world_group = world.Get_group()
        members = world_group.Incl(ranks)
        comm = world.Create_group(members, _CREATE_TAG)
        members.Free()
        world_group.Free()
        if comm.Get_rank() != opts.group_rank:
            raise RuntimeError(f"mpi backend: group rank {comm.Get_rank()} differs from torch's "
                               f"{opts.group_rank} for ranks {ranks}")
    default = not ranks
    if default:
        WATCHDOG.start(world, timeout_s)  # collective: watches the ranks while the group lives
    name = "default group" if default else "group of ranks " + ", ".join(map(str, ranks))
    group = MPIProcessGroup(comm, timeout_s, torch.cuda.is_available() and cuda_aware(),
                            on_shutdown=_default_group_gone if default else None, name=name)
    group._device_backend = device.register(group)  # what torch looks up by device (cpu, cuda)
    EXECUTOR.acquire()
    if default and comm.Get_size() > 1:
        _abort_on_uncaught_exception(comm.Get_rank(), comm.Get_size())
    return group


def _check_launch(mpi_size: int) -> None:
    placement = discover(os.environ)
    if placement.world_size != mpi_size:
        raise RuntimeError(
            f"mpi backend: MPI sees {mpi_size} process(es), but this {placement.launcher} launch has "
            f"{placement.world_size}. Launch with mpiexec, or under Slurm with srun --mpi=pmix "
            "(see `srun --mpi=list`); torchrun launches need backend gloo or nccl")


def _check_same_ranks(mpi_rank: int, mpi_size: int) -> None:
    if (dist.get_rank(), dist.get_world_size()) != (mpi_rank, mpi_size):
        raise RuntimeError(
            f"mpi backend: new_group(backend='mpi') needs torch's ranks to be MPI's, but this is torch "
            f"rank {dist.get_rank()} of {dist.get_world_size()} and MPI rank {mpi_rank} of "
            f"{mpi_size}; launch with mpiexec (or srun --mpi=pmix) and let the launcher set ranks")


def _abort_on_uncaught_exception(rank: int, size: int) -> None:
    """An uncaught exception on this rank ends the MPI job instead of leaving peers blocked."""
    global _abort_on_uncaught
    if _abort_on_uncaught:
        return
    _abort_on_uncaught = True
    previous = sys.excepthook

    def abort_job(exc_type, exc, tb) -> None:
        if not _abort_on_uncaught:
            return previous(exc_type, exc, tb)
        job_end.report(rank, size, f"{exc_type.__name__}: {exc}", exc)
        job_end.end_job(130 if issubclass(exc_type, KeyboardInterrupt) else 1, _mpi().COMM_WORLD)

    sys.excepthook = abort_job


def _default_group_gone() -> None:
    """After the default group is destroyed, an exception no longer needs to end the job, and
    nobody will probe this process."""
    global _abort_on_uncaught
    from .liveness import WATCHDOG

    _abort_on_uncaught = False
    WATCHDOG.close()


_cuda_aware: bool | None = None


def cuda_aware() -> bool:
    """Is the MPI library CUDA-aware? (``DOWNPOUR_MPI_CUDA_AWARE=0/1`` overrides the query.)"""
    global _cuda_aware
    if _cuda_aware is None:
        forced = os.environ.get("DOWNPOUR_MPI_CUDA_AWARE")
        _cuda_aware = forced == "1" if forced in ("0", "1") else _query_cuda_support()
    return _cuda_aware


def _query_cuda_support() -> bool:
    lib = _loaded_libmpi()
    if lib is None:
        return False
    query = getattr(lib, "MPIX_Query_cuda_support", None)  # Open MPI (mpi-ext.h)
    if query is not None:
        query.restype = ctypes.c_int
        return bool(query())
    query = getattr(lib, "MPIX_GPU_query_support", None)  # MPICH >= 4: (MPIX_GPU_SUPPORT_CUDA=0, int*)
    if query is not None:
        flag = ctypes.c_int(0)
        return query(0, ctypes.byref(flag)) == 0 and bool(flag.value)
    return False


def _loaded_libmpi() -> ctypes.CDLL | None:
    """The MPI library mpi4py loaded into this process (from the process's memory map)."""
    _mpi()
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith("libmpi."):
            return ctypes.CDLL(path)
    return None


register()
