"""Point-to-point gossip messages: post now, complete now or later; no-ops without peers.

The gossip algorithms (``algorithms/sgp``, ``osgp``, ``dpsgd``, ``adpsgd``) send one flat buffer to
each out-peer and receive one from each in-peer per step. ``exchange`` issues the receives and sends as
one ``batch_isend_irecv`` batch, so no ordering of sends and receives can deadlock on a directed
graph (gloo runs them as independent non-blocking operations; NCCL coalesces them). The returned
``Exchange`` can be completed at once (SGP, D-PSGD) or left in flight across the next forward and
backward pass (Overlap-SGP). A tag per step keeps messages of different steps apart when several
are in flight between the same pair.

``Comm.exchange`` meters what it does into the step's ``Meter`` (logical bytes: one message per
out-peer sent, one per in-peer received); ``p2p.exchange`` on a dedicated group (``new_group``) is
for a communication thread, which must not touch the training thread's meter nor share its group:
gloo does not allow two threads to drive the same process group at once. The exchange itself
lives in ``p2p``, under ``Communicator``; this module keeps the gossip groups and the consensus
measure.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import runtime
from .collectives import Comm
from .p2p import Exchange, exchange

__all__ = ["Exchange", "consensus_distance", "destroy_group", "exchange", "new_group"]


def new_group(comm: Comm) -> dist.ProcessGroup | None:
    """A process group of every rank for a communication thread (collective: every rank calls it,
    in the same order). None in a world of one."""
    if not comm.active:
        return None
    group = runtime.new_group(ranks=list(range(comm.size)))
    dist.barrier(group=group)  # its first use involves every rank, as batch_isend_irecv requires
    return group


def destroy_group(group: dist.ProcessGroup | None) -> None:
    """Collective: every rank is past its last message on ``group`` before any rank closes it
    (a gloo pair closed early would fail a peer's pending receive)."""
    if group is not None and dist.is_initialized():
        dist.barrier(group=group)
        dist.destroy_process_group(group)


def consensus_distance(comm: Comm, flat: torch.Tensor) -> float:
    """Mean over ranks of ||x_i - x_bar||, x_bar the ranks' average of ``flat``. Collective, and
    unmetered: it measures the algorithm, it is not part of its traffic. 0.0 in a world of one."""
    if not comm.active:
        return 0.0
    x = flat.detach().to(torch.float64)
    mean = x.clone()
    comm.allreduce(mean, account=None)
    mean /= comm.size
    distance = torch.linalg.vector_norm(x - mean).reshape(1)
    comm.allreduce(distance, account=None)
    return float(distance) / comm.size
