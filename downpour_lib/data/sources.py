"""Where samples come from: in-memory tensors, a synthetic pool, or torchvision's ImageFolder.

Each source answers ``batch(indices) -> (x, y)`` with ``x`` float32 (B, C, H, W), normalized, and
``y`` int64 (B,). In-memory sources index a tensor directly, which is what lets a 2-core laptop spend
its time on the training algorithm rather than on a DataLoader.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from ..errors import DataError


class ImageSource(Protocol):
    num_classes: int
    input_shape: tuple[int, int, int]

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class TensorSource:
    """Images held in memory (uint8 or float), normalized per channel when a batch is taken."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 mean: Sequence[float], std: Sequence[float], scale: float = 1.0) -> None:
        if images.dim() == 3:
            images = images.unsqueeze(1)  # (N, H, W) -> (N, 1, H, W)
        self.images, self.labels = images.contiguous(), labels.long()
        self.num_classes = num_classes
        self.input_shape = tuple(self.images.shape[1:])
        shape = (1, -1, 1, 1)
        self.scale = scale
        self.mean = torch.tensor(mean, dtype=torch.float32).view(shape)
        self.std = torch.tensor(std, dtype=torch.float32).view(shape)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[indices].float().mul_(1.0 / self.scale)
        return x.sub_(self.mean).div_(self.std), self.labels[indices]


class SyntheticSource:
    """Deterministic random images for throughput: sample i is ``pool[i % len(pool)]`` with label
    ``labels[i]``. A bounded pool keeps memory flat for ImageNet-sized inputs; nothing is learned."""

    def __init__(self, num_samples: int, input_shape: tuple[int, int, int], num_classes: int,
                 seed: int, pool: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pool = torch.randn((min(pool, num_samples), *input_shape), generator=g)
        self.labels = torch.randint(num_classes, (num_samples,), generator=g)
        self.num_classes, self.input_shape = num_classes, input_shape

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[indices % len(self.pool)], self.labels[indices]


class DatasetSource:
    """Any map-style torch Dataset of (tensor image, label) pairs, e.g. torchvision's ImageFolder."""

    def __init__(self, dataset, num_classes: int, input_shape: tuple[int, int, int]) -> None:
        self.dataset, self.num_classes, self.input_shape = dataset, num_classes, input_shape

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.dataset[int(i)] for i in indices]
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def require_files(name: str, root: Path, needed: Sequence[str], hint: str) -> None:
    """Fail with the directory, the missing files and what to do, before torchvision is asked."""
    missing = [f for f in needed if not (root / f).exists()]
    if missing:
        raise DataError(
            f"data set {name!r}: missing {', '.join(missing)} under {root}. {hint} "
            f"Point --data-dir at the directory that holds them. Nothing is downloaded; "
            f"offline, use --dataset digits (accuracy) or a synthetic-* data set (throughput).")
