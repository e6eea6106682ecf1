"""Which samples each worker reads at each step.

Every epoch the whole training set is shuffled by one permutation drawn from the seed and the epoch
number alone; worker w of W reads every W-th entry of it (as torch's DistributedSampler does), so the
workers' shards are disjoint and the W batches of step t together are exactly batch t of one process
with a W-times larger batch. That is what makes N-worker synchronous SGD comparable with (and, in the
tests, equal to) one process, and two algorithms with the same global batch see the same samples.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError


class ShardSampler:
    def __init__(self, num_samples: int, batch_size: int, worker_index: int, num_workers: int,
                 seed: int) -> None:
        if not 0 <= worker_index < num_workers:
            raise ValueError(f"worker_index {worker_index} outside 0..{num_workers - 1}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.worker_index, self.num_workers, self.seed = worker_index, num_workers, seed
        self.shard_size = num_samples // num_workers  # equal shards: the remainder is dropped
        self.steps_per_epoch = self.shard_size // batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError("batch_size", batch_size,
                              f"{num_workers} worker(s) x {batch_size} samples is more than the "
                              f"{num_samples} training samples; use a batch size <= "
                              f"{max(1, self.shard_size)}")
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def shard(self, epoch: int) -> torch.Tensor:
        """This worker's sample indices for ``epoch``, in reading order."""
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.num_samples, generator=g)
            self._order = order[: self.shard_size * self.num_workers][self.worker_index::self.num_workers]
            self._epoch = epoch
        return self._order

    def indices(self, step: int) -> tuple[int, torch.Tensor]:
        """(epoch, sample indices) of global step ``step``."""
        epoch, i = divmod(step, self.steps_per_epoch)
        start = i * self.batch_size
        return epoch, self.shard(epoch)[start:start + self.batch_size]
