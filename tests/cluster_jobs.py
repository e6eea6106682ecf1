"""Jobs the cluster tests send to the engines (importable there: the test cluster puts tests/ on
the engines' PYTHONPATH)."""

import os
import signal
import time

import torch

from downpour_lib.cluster.remote import job_world, whoami
from downpour_lib.comm.collectives import Comm


def library_file() -> str:
    """Where this engine imported downpour_lib from."""
    import downpour_lib

    return downpour_lib.__file__


def fail_on_rank(bad_rank: int, world_size: int):
    """Every rank joins an allreduce, except ``bad_rank``, which raises instead."""
    with job_world(world_size, "gloo", "cpu", timeout_s=60) as ctx:
        if ctx is None:
            return None
        if ctx.rank == bad_rank:
            raise RuntimeError(f"injected failure on rank {bad_rank}")
        tensor = torch.ones(1)
        Comm(ctx).allreduce(tensor)
        return float(tensor.item())


def sleep_on_rank(rank: int, seconds: float) -> int:
    me = whoami()["rank"]
    if me == rank:
        time.sleep(seconds)
    return me


def fail_or_sleep(bad_rank: int, seconds: float) -> int:
    """``bad_rank`` raises; the others wait on something that is not a collective, so nothing tells
    them their peer is gone."""
    me = whoami()["rank"]
    if me == bad_rank:
        raise ValueError(f"rank {me} gives up")
    time.sleep(seconds)
    return me


def stop_on_rank(silent_rank: int, world_size: int, timeout_s: float):
    """Every rank joins two allreduces on the mpi backend; between them ``silent_rank`` stops its
    own engine (SIGSTOP: alive, silent, as a hung process is)."""
    with job_world(world_size, "mpi", "cpu", timeout_s=timeout_s) as ctx:
        if ctx is None:
            return None
        tensor = torch.ones(1)
        Comm(ctx).allreduce(tensor)
        if ctx.rank == silent_rank:
            os.kill(os.getpid(), signal.SIGSTOP)
        Comm(ctx).allreduce(tensor)
        return float(tensor.item())


def stop_or_end_job(silent_rank: int, after_s: float) -> int:
    """``silent_rank`` stops its own engine (SIGSTOP); the others end the whole MPI job ``after_s``
    later, as the mpi backend's watchdog does when a thread stuck inside MPI waits on a silent
    peer (``job_end.end_job``): every engine of the job dies."""
    from downpour_lib.cluster.remote import engine_mpi_world
    from downpour_lib.comm import job_end

    me = whoami()["rank"]
    if me == silent_rank:
        os.kill(os.getpid(), signal.SIGSTOP)
        return me
    time.sleep(after_s)
    job_end.end_job(1, engine_mpi_world())
