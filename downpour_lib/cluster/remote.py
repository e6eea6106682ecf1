"""What runs on the engines. Every function here executes inside an ipyparallel engine that is an MPI
rank (``ipengine --mpi`` under mpiexec or srun), called on every engine at once by ``ClusterSession``.

A job on ``world_size`` of the engines splits ``MPI.COMM_WORLD``: ranks below ``world_size`` form
the job's communicator (its rank order is COMM_WORLD's, so engine rank = MPI rank = torch rank) and
the others return at once. The split is collective, so all engines must be called, busy or not.
``runtime.init(comm=...)`` builds the process group over that communicator and ``runtime.shutdown()``
tears it down after each job, so the next job, of any size, can start.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..defaults import STARTUP_TIMEOUT_S, TIMEOUT_S

if TYPE_CHECKING:  # imported where used: the driver imports this module too, and needs no torch
    from ..comm import runtime


def engine_mpi_world():
    """mpi4py's COMM_WORLD, initializing MPI if ipengine has not: an engine is always an MPI rank
    (unlike ``comm.runtime.launch_mpi_world``, which answers None outside an MPI launch)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def machine_id() -> str:
    """Which machine and process id space this process runs in: the kernel's boot id and its PID
    namespace. A host name does not say it: the Slurm sandbox's nodes (node1, node2) are UTS
    namespaces on this machine, whose processes are this machine's, with the same pids. Where
    /proc cannot tell (not Linux), the host name."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return socket.gethostname()


def whoami() -> dict[str, Any]:
    """This engine's MPI rank, the MPI world's size, its host, process id and ``machine_id``."""
    world = engine_mpi_world()
    return {"rank": world.Get_rank(), "size": world.Get_size(), "host": socket.gethostname(),
            "pid": os.getpid(), "machine": machine_id()}


def introduce() -> dict[str, Any]:
    """``whoami``, once this engine has loaded the runtime (torch, the backends). The session asks
    every engine this as it connects, so those seconds are spent then, not in the first job's
    timeout. (Importing this module loads no torch: the driver imports it too.)"""
    from .._torch_import import import_torch

    import_torch(training=False)  # torch._dynamo with the first job that trains (``train``)
    from ..comm import runtime  # noqa: F401

    return whoami()


def hello() -> str:
    me = whoami()
    return f"hello from rank {me['rank']} of {me['size']} on {me['host']} (pid {me['pid']})"


@contextmanager
def job_world(world_size: int, backend: str = "auto", device: str = "auto",
              timeout_s: float = TIMEOUT_S,
              startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[runtime.DistContext | None]:
    """The process group of a job on MPI ranks 0..world_size-1; None on the ranks outside it."""
    from mpi4py import MPI

    world = engine_mpi_world()
    member = world.Get_rank() < world_size
    sub = world.Split(0 if member else MPI.UNDEFINED, world.Get_rank())
    if not member:
        yield None
        return
    from ..comm import runtime

    runtime.shutdown()  # a job starts clean, even after an interactive %px runtime.init()
    try:
        with runtime.session(backend, device, timeout_s, comm=sub,
                             startup_timeout_s=startup_timeout_s) as ctx:
            yield ctx
    finally:
        sub.Free()


def train(config: dict[str, Any], world_size: int, plan: Any = None, user: bytes | None = None):
    """Train ``config`` on ranks 0..world_size-1; rank 0 returns the ``RunResult``, others None.
    ``plan``: the client's pre-flight (``planning.plan_run``), made here when not given; engines
    in a Slurm job resume on their own (``TrainConfig.slurm_resume``), so they re-read only where
    the run starts (``planning.plan_resume``). ``user``: the client's own model and data-set
    functions, by value (``user_code.shipped``)."""
    from .. import user_code
    from .._torch_import import import_torch
    from ..config import TrainConfig
    from ..engine import Trainer, make_trainer
    from ..planning import plan_resume, quiet, warn

    user_code.receive(user)  # before the config names them
    import_torch()  # the optimizer's first step imports torch._dynamo: here, with the GC paused
    given = TrainConfig.from_dict(config)
    cfg = given.slurm_resume()  # after a preemption and a restart, the same call resumes
    system = cfg.system
    with job_world(world_size, system.backend, system.device, system.timeout_s,
                   cfg.runtime.startup_timeout_s) as ctx:
        if ctx is None:
            return None
        if plan is None:
            return make_trainer(cfg, ctx).run()
        if cfg is not given:
            plan = plan_resume(cfg, plan, world_size, warn if ctx.rank == 0 else quiet)
        return Trainer(cfg, ctx, plan).run()


def allreduce_ranks(world_size: int) -> dict[str, Any] | None:
    """Each rank contributes ``rank + 1``; returns what this rank sent and what the sum came back as."""
    import torch

    from ..comm.collectives import Comm

    with job_world(world_size, "gloo", "cpu") as ctx:
        if ctx is None:
            return None
        tensor = torch.tensor([float(ctx.rank + 1)])
        Comm(ctx).allreduce(tensor)
        return {"rank": ctx.rank, "host": socket.gethostname(), "sent": float(ctx.rank + 1),
                "received": float(tensor.item()), "backend": ctx.backend}

