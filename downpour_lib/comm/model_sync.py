"""Two calls that make a model data-parallel by hand, after TorchMPI's ``synchronizeParameters`` and
``synchronizeGradients`` (Tran et al. 2016): start every rank from the same weights, and average the
gradients after each backward. The bucketed, overlapped version of the second is
``algorithms.allreduce``; these are the plain, blocking ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..errors import DownpourError
from .collectives import Communicator

Signature = list[tuple[str, str, tuple[int, ...], str]]  # (kind, name, shape, dtype) in model order


class ModelMismatchError(DownpourError, ValueError):
    """The ranks hold models with different parameters, so they cannot be synchronized."""


def signature(model: nn.Module) -> Signature:
    """What must agree across ranks: every parameter's and buffer's name, shape and dtype."""
    return ([("parameter", n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
            + [("buffer", n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()])


def first_mismatch(signatures: Sequence[Signature], root: int = 0) -> str | None:
    """A message naming the first entry where some rank's model differs from ``root``'s, and the
    ranks that differ; None when every rank agrees. A pure function of the gathered signatures."""
    ref = signatures[root]
    for i in range(max(len(s) for s in signatures)):
        mine = ref[i] if i < len(ref) else None
        bad = [r for r, s in enumerate(signatures) if (s[i] if i < len(s) else None) != mine]
        if not bad:
            continue
        ranks = ", ".join(map(str, bad))
        if mine is None:
            other = signatures[bad[0]][i]
            return (f"{other[0]} {other[1]!r} exists on rank(s) {ranks} but not on rank {root} "
                    f"(the root): rank {root}'s model has only {len(ref)} parameters and buffers")
        kind, name, shape, dtype = mine
        details = []
        for r in bad:
            theirs = signatures[r][i] if i < len(signatures[r]) else None
            if theirs is None:
                details.append(f"rank {r} has no {kind} there")
            elif theirs[:2] != mine[:2]:
                details.append(f"rank {r} has {theirs[0]} {theirs[1]!r} there")
            else:
                details.append(f"rank {r} has shape {theirs[2]}, dtype {theirs[3]}")
        return (f"{kind} {name!r} differs on rank(s) {ranks} from rank {root} (the root, shape "
                f"{shape}, dtype {dtype}): " + "; ".join(details))
    return None


def _by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


@torch.no_grad()
def synchronize_parameters(model: nn.Module, root: int = 0,
                           group: Communicator | None = None) -> None:
    """Copy ``root``'s parameters and buffers to every rank (one broadcast per dtype).

    First checks that every rank's model has the same parameter and buffer names, shapes and
    dtypes; if not, every rank raises ``ModelMismatchError`` naming the first difference and the
    ranks that have it (instead of a backend error about sizes, or a hang).
    """
    comm = group or Communicator.world()
    if not comm.active:
        return
    problem = first_mismatch(comm.allgather_object(signature(model)), root)
    if problem is not None:
        raise ModelMismatchError(f"synchronize_parameters: {problem}")
    for tensors in _by_dtype([p.detach() for p in model.parameters()] + list(model.buffers())):
        comm.broadcast(tensors, root=root)


@torch.no_grad()
def synchronize_gradients(model: nn.Module, group: Communicator | None = None) -> None:
    """Average the gradients of ``model``'s trainable parameters over the ranks, in place.

    A parameter without a gradient on this rank counts as a zero gradient (another rank may have
    one), so every rank sends the same buffer; afterwards every trainable parameter has a gradient.
    """
    comm = group or Communicator.world()
    if not comm.active:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for grads in _by_dtype([p.grad for p in params]):
        comm.allreduce(grads, op="mean")
