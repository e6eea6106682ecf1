"""Where samples come from: in-memory tensors, a synthetic pool, or torchvision's ImageFolder.

Each source answers ``batch(indices) -> (x, y)`` with ``x`` float32 (B, C, H, W), normalized, and
``y`` int64 (B,), and ``sample(index, epoch, augment, seed) -> (x, y)`` for one sample (what a
DataLoader worker reads). ``augmentation`` is the source's standard augmentation (None: it has
none), drawn per sample from (seed, epoch, index) (``augment``). ``in_workers`` says whether the
source is read in DataLoader worker processes (the real data sets: decoding and augmenting take
CPU) or in the training process (digits and synthetic data: a tensor index, which is what lets a
2-core laptop spend its time on the training algorithm rather than on a DataLoader).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from ..errors import DataError
from .augment import CropFlip, generator, resized_crop_box


class ImageSource(Protocol):
    num_classes: int
    input_shape: tuple[int, int, int]
    augmentation: object | None
    in_workers: bool

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]: ...

    def sample(self, index: int, epoch: int, augment: bool, seed: int
               ) -> tuple[torch.Tensor, int]: ...


def is_language_model(source: ImageSource) -> bool:
    """Whether the data set's samples are token windows (``data/text.py``)."""
    return getattr(source, "task", "classify") == "lm"


class TensorSource:
    """Images held in memory (uint8 or float), normalized per channel when a batch is taken."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                 mean: Sequence[float], std: Sequence[float], scale: float = 1.0,
                 augmentation: CropFlip | None = None, in_workers: bool = False) -> None:
        if images.dim() == 3:
            images = images.unsqueeze(1)  # (N, H, W) -> (N, 1, H, W)
        self.images, self.labels = images.contiguous(), labels.long()
        self.num_classes = num_classes
        self.input_shape = tuple(self.images.shape[1:])
        shape = (1, -1, 1, 1)
        self.scale = scale
        self.mean = torch.tensor(mean, dtype=torch.float32).view(shape)
        self.std = torch.tensor(std, dtype=torch.float32).view(shape)
        self.augmentation, self.in_workers = augmentation, in_workers

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[indices].float().mul_(1.0 / self.scale)
        if augment and self.augmentation is not None:
            x = torch.stack([self.augmentation(xi, generator(seed, epoch, int(i)))
                             for xi, i in zip(x, indices, strict=True)])
        return x.sub_(self.mean).div_(self.std), self.labels[indices]

    def sample(self, index: int, epoch: int, augment: bool, seed: int) -> tuple[torch.Tensor, int]:
        x, y = self.batch(torch.tensor([index]), epoch, augment, seed)
        return x[0], int(y[0])


class SyntheticSource:
    """Deterministic random images for throughput: sample i is ``pool[i % len(pool)]`` with label
    ``labels[i]``. A bounded pool keeps memory flat for ImageNet-sized inputs; nothing is learned."""

    def __init__(self, num_samples: int, input_shape: tuple[int, int, int], num_classes: int,
                 seed: int, pool: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pool = torch.randn((min(pool, num_samples), *input_shape), generator=g)
        self.labels = torch.randint(num_classes, (num_samples,), generator=g)
        self.num_classes, self.input_shape = num_classes, input_shape
        self.augmentation, self.in_workers = None, False

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[indices % len(self.pool)], self.labels[indices]

    def sample(self, index: int, epoch: int, augment: bool, seed: int) -> tuple[torch.Tensor, int]:
        return self.pool[index % len(self.pool)], int(self.labels[index])


class FolderSource:
    """Images in files, torchvision's ImageFolder layout: decoded when read (in DataLoader workers),
    then resized to 256 and centre-cropped to 224, or (augmented) random-resized-cropped to 224 and
    flipped, then normalized."""

    augmentation = "random-resized-crop 224 + flip"
    in_workers = True

    def __init__(self, folder, num_classes: int, mean: Sequence[float], std: Sequence[float],
                 size: int = 224) -> None:
        self.folder, self.num_classes, self.size = folder, num_classes, size
        self.input_shape = (3, size, size)
        self.mean, self.std = list(mean), list(std)

    def __len__(self) -> int:
        return len(self.folder.samples)

    def sample(self, index: int, epoch: int, augment: bool, seed: int) -> tuple[torch.Tensor, int]:
        from torchvision.transforms import functional as TF

        path, label = self.folder.samples[index]
        image = self.folder.loader(path)
        if augment:
            g = generator(seed, epoch, index)
            top, left, h, w = resized_crop_box(*image.size, g)
            image = TF.resized_crop(image, top, left, h, w, [self.size, self.size])
            if torch.rand(1, generator=g).item() < 0.5:
                image = TF.hflip(image)
        else:
            image = TF.center_crop(TF.resize(image, round(self.size * 256 / 224)), self.size)
        return TF.normalize(TF.to_tensor(image), self.mean, self.std), label

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.sample(int(i), epoch, augment, seed) for i in indices]
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def require_files(name: str, root: Path, needed: Sequence[str], hint: str) -> None:
    """Fail with the directory, the missing files and what to do, before torchvision is asked."""
    missing = [f for f in needed if not (root / f).exists()]
    if missing:
        raise DataError(
            f"data set {name!r}: missing {', '.join(missing)} under {root}. {hint} "
            f"Point --data-dir at the directory that holds them. Nothing is downloaded; "
            f"offline, use --dataset digits (accuracy) or a synthetic-* data set (throughput).")
