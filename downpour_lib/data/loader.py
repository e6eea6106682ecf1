"""A worker's batches, read in DataLoader worker processes or in the training process.

The order is ``ShardSampler``'s, whoever reads: ``StepBatches`` (a batch sampler) yields, step by
step, the (epoch, sample index) pairs of this worker's batch, and each sample's augmentation is
drawn from (seed, epoch, index) (``augment.generator``). So the batches are the same with 0, 1 or
8 DataLoader workers, for every algorithm, and two runs see the same pixels.

The real data sets (``source.in_workers``: decoding JPEGs, cropping) go through
``torch.utils.data.DataLoader`` worker processes with prefetching, persistent workers and, when
the model is on a GPU, pinned memory, so the host-to-device copy is asynchronous. In-memory
tensors (digits, synthetic data) are indexed in the training process: a batch is one gather, far
cheaper than a trip through a worker's queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .._threads import join_or_leave
from .sharding import ShardSampler
from .sources import ImageSource

Batch = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]  # epoch, indices, x, y


class StepBatches(Sampler):
    """The (epoch, index) pairs of each of ``steps``' batches of one worker's shard."""

    def __init__(self, sampler: ShardSampler, steps: range) -> None:
        self.sampler, self.steps = sampler, steps

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in self.steps:
            epoch, indices = self.sampler.indices(step)
            yield [(epoch, int(i)) for i in indices]


class Chunks(Sampler):
    """``indices`` in order, ``batch_size`` samples at a time (epoch 0): evaluation."""

    def __init__(self, indices: Sequence[int], batch_size: int) -> None:
        self.indices, self.batch_size = indices, batch_size

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for start in range(0, len(self.indices), self.batch_size):
            yield [(0, i) for i in self.indices[start:start + self.batch_size]]


def eval_indices(size: int, samples: int = 0) -> Sequence[int]:
    """The samples of a split of ``size`` an evaluation reads: all of them (a range: its length
    costs nothing), or ``samples`` of them spread evenly over it (the i-th at
    ``i * size // samples``), not the first ones: an ImageFolder's split is sorted by class, and a
    text's validation split by file."""
    if not samples or samples >= size:
        return range(size)
    return [i * size // samples for i in range(samples)]


class Samples(Dataset):
    """``source``'s samples by (epoch, index), augmented or not."""

    def __init__(self, source: ImageSource, augment: bool, seed: int) -> None:
        self.source, self.augment, self.seed = source, augment, seed

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, int, torch.Tensor, int]:
        epoch, index = key
        x, y = self.source.sample(index, epoch, self.augment, self.seed)
        return epoch, index, x, y

    def __len__(self) -> int:
        return len(self.source)


def collate(items: list[tuple[int, int, torch.Tensor, int]]) -> Batch:
    return (items[0][0], torch.tensor([i for _, i, _, _ in items]),
            torch.stack([x for _, _, x, _ in items]), torch.tensor([y for _, _, _, y in items]))


class TrainBatches:
    """An iterable of a worker's batches (epoch, indices, x, y) for ``steps``, on ``device``.
    ``close()`` ends the DataLoader's worker processes (they persist until then)."""

    def __init__(self, source: ImageSource, sampler: ShardSampler, steps: range, augment: bool,
                 seed: int, workers: int, device: torch.device,
                 memory_format: torch.memory_format | None = None) -> None:
        self.source, self.sampler, self.steps = source, sampler, steps
        self.augment, self.seed, self.device = augment, seed, device
        self.memory_format = memory_format
        self.workers = workers if source.in_workers else 0
        self.loader: DataLoader | None = None
        self._iterator = None
        self._ahead: Ahead | None = None

    def _read(self) -> Iterator[Batch]:
        for step in self.steps:
            epoch, indices = self.sampler.indices(step)
            x, y = self.source.batch(indices, epoch, self.augment, self.seed)
            yield epoch, indices, x, y

    def _host_batches(self) -> Iterable[Batch]:
        if self.workers == 0 and self.device.type == "cuda":
            # in memory, for a GPU: gathered and pinned a step ahead in a thread (the copies
            # release the GIL), so the host-to-device copy is asynchronous and the gather hidden
            self._ahead = Ahead((epoch, i, x.pin_memory(), y.pin_memory())
                                for epoch, i, x, y in self._read())
            yield from self._ahead
            return
        if self.workers == 0:
            yield from self._read()
            return
        self.loader = DataLoader(
            Samples(self.source, self.augment, self.seed),
            batch_sampler=StepBatches(self.sampler, self.steps), num_workers=self.workers,
            collate_fn=collate, pin_memory=self.device.type == "cuda", prefetch_factor=4,
            persistent_workers=True)
        self._iterator = iter(self.loader)
        yield from self._iterator

    def __iter__(self) -> Iterator[Batch]:
        device, fmt = self.device, self.memory_format
        for epoch, indices, x, y in self._host_batches():
            x = x.to(device, non_blocking=True)
            if fmt is not None and x.dim() == 4:
                x = x.contiguous(memory_format=fmt)
            yield epoch, indices, x, y.to(device, non_blocking=True)

    def close(self) -> None:
        if self._iterator is not None and hasattr(self._iterator, "_shutdown_workers"):
            self._iterator._shutdown_workers()
        if self._ahead is not None:
            self._ahead.close()
        self._iterator = self.loader = self._ahead = None


class Ahead:
    """Runs an iterator ``depth`` items ahead in a thread of its own; its errors surface in
    the consumer, in order."""

    _END = object()

    def __init__(self, items: Iterator, depth: int = 2) -> None:
        self.queue: queue.Queue = queue.Queue(depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(items,), daemon=True,
                                       name="downpour-batches")
        self.thread.start()

    def _put(self, entry: tuple) -> bool:
        """Queue ``entry`` unless closed first; whether it was queued."""
        while not self.stop.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((self._END, None))
        except BaseException as exc:  # handed to the consumer
            self._put((self._END, exc))

    def __iter__(self) -> Iterator:
        while True:
            item, error = self.queue.get()
            if error is not None:
                raise error
            if item is self._END:
                return
            yield item

    def close(self) -> None:
        self.stop.set()  # a batch still being made when the process exits: awaited there
        join_or_leave(self.thread, 5, at_exit_s=60)


def eval_batches(source: ImageSource, batch_size: int, workers: int, samples: int = 0
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole split (or ``samples`` of it: ``eval_indices``), unaugmented, in order, (x, y) on
    the host: through DataLoader workers for the sources read there (a validation set of JPEGs),
    else by index."""
    indices = eval_indices(len(source), samples)
    if not source.in_workers or workers == 0:
        for start in range(0, len(indices), batch_size):
            yield source.batch(torch.tensor(indices[start:start + batch_size], dtype=torch.long))
        return
    loader = DataLoader(Samples(source, False, 0), batch_sampler=Chunks(indices, batch_size),
                        num_workers=workers, collate_fn=collate)
    for _, _, x, y in loader:
        yield x, y


def loader_batches(source: ImageSource, sampler: ShardSampler, steps: range, augment: str,
                   seed: int, workers: int, device: torch.device,
                   memory_format: torch.memory_format | None = None) -> TrainBatches:
    """The batches a run's ``augment`` setting ("none" or "standard") asks for."""
    return TrainBatches(source, sampler, steps, augment == "standard", seed, workers, device,
                        memory_format)
