"""Which parameter server owns which tensor: whole tensors, balanced by bytes.

Dean et al. (NIPS 2012, "Large Scale Distributed Deep Networks") shard the model's parameters over
several parameter servers so that no single server carries all the traffic. We shard by whole
tensors, as TensorFlow's ``GreedyLoadBalancingStrategy`` places variables on parameter servers:
largest tensor first, each to the server holding the fewest bytes so far (LPT scheduling, within
4/3 of the best balance). Whole tensors keep every optimizer update a plain per-tensor step.

Pure functions of the tensor sizes: every rank computes the same layout with no communication, and
the pre-flight check runs on a model built on the meta device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError


def shard_tensors(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors a parameter server holds: trainable parameters, then floating-point buffers
    (batch-norm statistics travel with them; integer counters stay on each rank)."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    return params, buffers


def assign(sizes: Sequence[int], shards: int) -> tuple[int, ...]:
    """The shard of each tensor, given its size in bytes: largest first, to the lightest shard
    (ties go to the lower index, so the result is the same on every rank)."""
    load = [0] * shards
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = min(range(shards), key=lambda s: (load[s], s))
        owner[i] = s
        load[s] += sizes[i]
    return tuple(owner)


@dataclass(frozen=True)
class ShardLayout:
    """``owner[i]`` is the shard of tensor i, counting parameters first, then buffers."""

    owner: tuple[int, ...]
    num_params: int
    shards: int
    sizes: tuple[int, ...]  # bytes of each tensor

    def params(self, shard: int) -> list[int]:
        """Indices (into the parameter list) of the parameters ``shard`` owns."""
        return [i for i in range(self.num_params) if self.owner[i] == shard]

    def buffers(self, shard: int) -> list[int]:
        """Indices (into the buffer list) of the buffers ``shard`` owns."""
        return [i - self.num_params for i in range(self.num_params, len(self.owner))
                if self.owner[i] == shard]

    def bytes(self, shard: int) -> int:
        return sum(n for n, s in zip(self.sizes, self.owner, strict=True) if s == shard)


def layout(params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], shards: int,
           field: str = "servers") -> ShardLayout:
    """Balance ``params`` and ``buffers`` over ``shards`` servers; refuse a layout that leaves a
    server with nothing to hold, or tensors of mixed dtypes (a shard travels as one flat buffer)."""
    tensors = [*params, *buffers]
    if shards < 1:
        raise ConfigError(field, shards, "must be a whole number >= 1")
    if len(tensors) < shards:
        raise ConfigError(field, shards,
                          f"the model has only {len(tensors)} tensor(s) to shard (parameters and "
                          f"floating-point buffers), so {shards - len(tensors)} server(s) would "
                          f"hold nothing; use at most {len(tensors)} server(s)")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ConfigError("model", sorted(map(str, dtypes)),
                          "a parameter server needs one floating-point dtype for all tensors; "
                          "cast the model to one dtype")
    sizes = tuple(t.numel() * t.element_size() for t in tensors)
    return ShardLayout(assign(sizes, shards), len(params), shards, sizes)


def model_layout(model: nn.Module, shards: int, field: str = "servers") -> ShardLayout:
    params, buffers = shard_tensors(model)
    return layout(params, buffers, shards, field)
