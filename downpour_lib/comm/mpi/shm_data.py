"""Broadcast, reduce and allgather within one node through shared memory, with barriers that sleep.

Why: above 256 KB the backend used MPI's blocking calls for these (Open MPI's nonblocking ones,
libnbc, lose by multiples there once their waits nap), so ranks whose peer was stopped inside one
spun at 100% of a core until the watchdog ended the job (sync_ps's reduce and broadcast of its
flat parameters). Here they move through the buffer ``shm.ShmAllreduce`` already maps, and wait in
its ``NodeBarrier``: spin ``SPIN_S``, then sleep, with the group's deadline, giving up at once
when the heartbeat finds a rank silent. They are also as fast as Open MPI's own or faster
(measured in ``downpour bench collectives``; 2 ranks, 4 MB: see the commit that added this).

Each moves the buffer in pieces of at most ``PIECE_BYTES``, one barrier a piece, alternating the
two sets of slots as the allreduce does (a set is written again only after a barrier that follows
every rank's last reads of it), so a writer fills piece i + 1 while the readers copy piece i out:

* broadcast: the root copies a piece into its set; barrier; the others copy it out;
* reduce: every rank but the root copies a piece into its slot; barrier; the root reduces the
  slots into its tensor, in rank order;
* allgather: every rank copies a piece of its input into its slot; barrier; every rank copies the
  others' slots into its output.

Broadcast and allgather make these steps in C where the group has them (``native_shm.c``), in
pieces of ``PIECE_BYTES_C``; reduce stays here.
"""

from __future__ import annotations

import numpy as np
import torch

from .shm import _NUMPY_DTYPES, ShmAllreduce, _flat, _ops

PIECE_BYTES = 1 << 20  # small enough to pipeline a few MB, large enough that barriers are cheap
# In C a barrier costs a microsecond or less, and a piece that stays in the core's cache wins:
# 2 ranks, the steps alone, broadcast of 1 / 4 / 16 MB in 256 KB pieces 32 / 120 / 527 us, in 1 MB
# pieces 113 / 415 / 1903 (Open MPI's own 70 / 266 / 1481); allgather the same way.
PIECE_BYTES_C = 256 << 10


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """The contiguous CPU ``tensor``'s memory as a flat numpy byte array."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


class ShmCollectives(ShmAllreduce):
    """``ShmAllreduce`` with broadcast, reduce and allgather on one node."""

    def moves(self, tensor: torch.Tensor, nbytes: int, min_bytes: int) -> bool:
        """Whether a broadcast, reduce or allgather of ``nbytes`` a rank goes through shared
        memory: CPU, at least ``min_bytes``, and a group on one node. The same answer on every
        rank (``takes``)."""
        if nbytes < min_bytes or not self.takes(tensor, torch.add, nbytes):
            return False
        return self._cross is None

    def _piece(self, per_rank: bool) -> int:
        """Bytes a piece: a slot's (allgather, reduce) or the whole set's (broadcast)."""
        whole = self._chunk if per_rank else self._chunk * (self._n + 1)
        return min(whole, PIECE_BYTES_C if self._c is not None else PIECE_BYTES)

    def _set(self) -> np.ndarray:
        """The next set's bytes (n slots and the result area, contiguous); flips the phase."""
        size = self._chunk * (self._n + 1)
        start = self._flip() * size
        return self._bytes[start:start + size].numpy()

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        if self._c is not None:
            self._c.bcast(self._piece(False), root, tensor.data_ptr(), tensor.nbytes,
                          "broadcast over shared memory")
            self._count()
            return
        data, piece, barrier = _bytes(tensor), self._piece(False), self._barrier
        barrier.what = "broadcast over shared memory"
        for start in range(0, len(data), piece):
            mine = data[start:start + piece]
            area = self._set()[:len(mine)]
            if self._r == root:
                np.copyto(area, mine)
            barrier.wait()
            if self._r != root:
                np.copyto(mine, area)
        self._count()

    def reduce(self, tensor: torch.Tensor, kernel, average: bool, root: int) -> None:
        """Reduce into the root's ``tensor``; the others' tensors are left as they are."""
        reduce, copy, divide = _ops(tensor.dtype, kernel)
        flat, n, r, barrier = _flat(tensor), self._n, self._r, self._barrier
        per = self._piece(True) // tensor.element_size()
        barrier.what = "reduce over shared memory"
        slot_bytes = self._chunk
        for start in range(0, flat.shape[0], per):
            mine = flat[start:start + per]
            k = mine.shape[0]
            area = self._set()
            slots = [_typed(area[j * slot_bytes:j * slot_bytes + k * tensor.element_size()],
                            tensor.dtype) for j in range(n)]
            if r != root:
                copy(slots[r], mine)
            barrier.wait()
            if r == root:
                for j in range(n):
                    if j != r:
                        reduce(mine, slots[j], out=mine)
                if average:
                    divide(mine, n, out=mine)
        self._count()

    def allgather(self, tensor: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` (n times ``tensor``'s elements, contiguous) = every rank's ``tensor`` in rank
        order."""
        if self._c is not None:
            self._c.allgather(self._piece(True), tensor.data_ptr(), tensor.nbytes, out.data_ptr(),
                              "all_gather over shared memory")
            self._count()
            return
        data, whole, n, r = _bytes(tensor), _bytes(out), self._n, self._r
        size, piece, slot_bytes, barrier = len(data), self._piece(True), self._chunk, self._barrier
        barrier.what = "all_gather over shared memory"
        if data.ctypes.data != whole[r * size:].ctypes.data:
            np.copyto(whole[r * size:(r + 1) * size], data)
        for start in range(0, size, piece):
            mine = data[start:start + piece]
            k = len(mine)
            area = self._set()
            np.copyto(area[r * slot_bytes:r * slot_bytes + k], mine)
            barrier.wait()
            for j in range(n):
                if j != r:
                    np.copyto(whole[j * size + start:j * size + start + k],
                              area[j * slot_bytes:j * slot_bytes + k])
        self._count()


def _typed(area: np.ndarray, dtype: torch.dtype):
    """A byte area as an array of ``dtype`` (numpy's where numpy has it, else torch's: ``_flat``)."""
    as_torch = torch.from_numpy(area).view(dtype)
    return as_torch.numpy() if dtype in _NUMPY_DTYPES else as_torch
