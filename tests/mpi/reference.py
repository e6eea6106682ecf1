"""The reference of synchronous data parallelism, shared by every script that checks it: N workers
on batches of B end with the parameters of one process (a world of one, no communication) on
batches of N x B, same model, seed and data order (tests/mpi/equivalence.py, collectives.py,
across_nodes.py, sharded_ps.py).
"""

from __future__ import annotations

import torch

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.comm.runtime import DistContext


def trained(config: TrainConfig, ctx) -> tuple[list, list, object]:
    """(initial, final) parameters of this rank's run, and its result (rank 0's, else None)."""
    trainer = make_trainer(config, ctx)
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.run()
    return initial, [p.detach().clone() for p in trainer.model.parameters()], result


def one_process(base: dict, batch_size: int, **same) -> tuple[list, list]:
    """(initial, final) parameters of ``base`` trained by ``local`` in one process on ``batch_size``
    (N x B); ``same``: settings the distributed run had that the reference must share (a schedule)."""
    config = TrainConfig(**{**base, "algorithm": "local", "batch_size": batch_size, **same})
    initial, final, _ = trained(config, DistContext.single())
    return initial, final


def compare(params: list, ref: list, initial: list, tol: float = 1e-5) -> dict:
    """How far ``params`` are from ``ref``, and how far ``ref`` moved from ``initial``: training must
    have moved the parameters, or equality would prove nothing."""
    moved = max(float((r - p0).abs().max()) for r, p0 in zip(ref, initial, strict=True))
    diff = max(float((p - r).abs().max()) for p, r in zip(params, ref, strict=True))
    close = all(torch.allclose(p, r, rtol=tol, atol=tol) for p, r in zip(params, ref, strict=True))
    return {"close": close, "max_abs_diff": diff, "reference_moved": moved}
