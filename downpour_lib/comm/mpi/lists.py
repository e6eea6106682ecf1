"""The tensor-list arguments of ``MPIProcessGroup``'s collectives as MPI buffers: the checks that
raise on the calling thread, and the flat buffers a list is packed into and unpacked from (where
the tensors do not already lie back to back). Single tensors: ``types.Operand``."""

from __future__ import annotations

import torch

from .types import check_dtype, scratch


def one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"mpi backend: {what} takes exactly one tensor per rank, got {len(tensors)}")
    check_dtype(tensors[0].dtype, what)
    return tensors[0]


def same(tensors: list[torch.Tensor], like: torch.Tensor, n: int, what: str) -> list[int]:
    """Element counts of ``tensors`` (one per rank), which must share ``like``'s dtype."""
    if len(tensors) != n:
        raise ValueError(f"mpi backend: {what} needs a list of {n} tensors (one per rank), "
                         f"got {len(tensors)}")
    for t in tensors:
        if t.dtype != like.dtype:
            raise TypeError(f"mpi backend: {what} mixes {t.dtype} and {like.dtype} tensors")
    return [t.numel() for t in tensors]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    return spans_overlap(a.data_ptr(), a.nbytes, b.data_ptr(), b.nbytes)


def spans_overlap(a0: int, a_bytes: int, b0: int, b_bytes: int) -> bool:
    """Whether the bytes from ``a0`` and from ``b0`` share any (``overlaps``, for a short path that
    has the addresses and sizes already)."""
    return a_bytes > 0 and b_bytes > 0 and a0 < b0 + b_bytes and b0 < a0 + a_bytes


def ready(t: torch.Tensor) -> torch.Tensor:
    """MPI reads ``t`` next: finish the CUDA kernels that wrote it."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return t


def concat(tensors: list[torch.Tensor], counts: list[int], direct: bool) -> torch.Tensor:
    flat = scratch(sum(counts), tensors[0], direct)
    for piece, t in zip(flat.split(counts), tensors, strict=True):
        piece.copy_(t.reshape(-1))
    return ready(flat)


def tiled(outputs: list[torch.Tensor], numel: int, direct: bool) -> torch.Tensor | None:
    """One flat tensor over ``outputs`` where they lie back to back in one buffer, in order
    (``list(out.chunk(n))``, ``out.unbind(0)``), for MPI to gather straight into; else None (a
    scratch buffer, then a copy to each output: at 1 MB a rank on 2 ranks, the copy took more
    than MPI's allgather). ``numel``: the outputs' elements together."""
    first = outputs[0]
    if not (first.is_cpu or direct):
        return None
    at = first.data_ptr()
    for t in outputs:
        if not t.is_contiguous() or t.device != first.device or t.data_ptr() != at:
            return None
        at += t.nbytes
    if first.untyped_storage().data_ptr() != outputs[-1].untyped_storage().data_ptr():
        return None  # two buffers that happen to meet
    return first.as_strided((numel,), (1,), first.storage_offset())


def split_into(flat: torch.Tensor, counts: list[int], outputs: list[torch.Tensor]) -> None:
    for piece, out in zip(flat.split(counts), outputs, strict=True):
        out.copy_(piece.view(out.shape))


def counts(t: torch.Tensor, splits: list[int], n: int, what: str) -> list[int]:
    """Elements per rank for all_to_all_single's split sizes (rows of dim 0); none = equal parts."""
    if not splits:
        if t.numel() % n:
            raise ValueError(f"mpi backend: {what} of {t.numel()} elements does not split into "
                             f"{n} equal parts; give split sizes")
        return [t.numel() // n] * n
    row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 0
    if len(splits) != n or sum(splits) != (t.shape[0] if t.dim() else 1):
        raise ValueError(f"mpi backend: {what} split sizes {list(splits)} do not cover dim 0 "
                         f"({t.shape[0] if t.dim() else 1}) in {n} parts")
    return [s * row for s in splits]
