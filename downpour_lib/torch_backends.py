"""torch's ``torch.backends`` entry point: ``"mpi"`` names downpour's backend from ``import torch`` on.

With this package installed, PyTorch's own one-line check of an MPI setup works on the stock wheel
as written, with nothing of ours imported by the script (tests/test_mpi_backend.py runs it)::

    mpirun -np 4 python -c 'import torch.distributed as dist; dist.init_process_group(backend="mpi");
                            print("hello", dist.get_rank())'

torch calls the entry points of its ``torch.backends`` group at the end of ``import torch``
(``torch._import_device_backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off, as torch
documents). At that moment ``torch.distributed`` is already imported, so registering a name is a
dictionary write. ``register_mpi`` registers a creator that imports the backend (``comm.mpi``,
mpi4py, and with it MPI's initialization) only when a group is created: a process that never makes
an ``mpi`` group never loads MPI, and ``import torch`` costs what it did. Stdlib only here; the
rules (torch's own MPI build wins, torch before 2.14 keeps the name) are ``comm.mpi.backend``'s.
"""

from __future__ import annotations


def register_mpi() -> None:
    """Point ``"mpi"`` at ``_create_group`` unless torch has MPI built in or keeps the name."""
    import torch.distributed as dist  # already imported by torch/__init__ before entry points

    if not dist.is_available() or dist.is_mpi_available():
        return
    if not hasattr(dist.distributed_c10d, "_register_builtin_mpi_backend"):  # torch < 2.14
        return
    dist.Backend.register_backend("mpi", _create_group, extended_api=True, devices=["cpu", "cuda"])


def _create_group(opts, backend_options):
    """torch's creator hook, on first use: import the backend (it registers itself in place of
    this function) and let it create the group."""
    from .comm.mpi import backend

    return backend._create_group(opts, backend_options)
