"""Seeded augmentation: every random draw comes from (seed, epoch, sample index).

So the same sample is augmented the same way in every algorithm, at every worker count and with any
number of DataLoader workers (whichever process happens to read it): two runs that see the same
samples see the same pixels. The standard recipes: pad-4 random crop + horizontal flip for 32x32
images (He et al. 2016), random-resized-crop to 224 + flip for ImageNet-style folders (Szegedy et
al. 2015, as torchvision's reference scripts do). Augmentation works on images scaled to [0, 1],
before normalization, as torchvision's transforms do (the padding is black).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_MASK = (1 << 63) - 1


def generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator of its own for one sample of one epoch."""
    key = ((seed * 1_000_003 + epoch) * 2_147_483_659 + index) & _MASK
    return torch.Generator().manual_seed(key)


class CropFlip:
    """Random crop of the image padded by ``pad`` pixels on each side, then (with ``flip``) a
    horizontal flip with probability 1/2."""

    def __init__(self, pad: int, flip: bool) -> None:
        self.pad, self.flip = pad, flip

    def __repr__(self) -> str:
        return f"CropFlip(pad={self.pad}, flip={self.flip})"

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        h, w = x.shape[-2:]
        i, j = (int(v) for v in torch.randint(0, 2 * self.pad + 1, (2,), generator=g))
        x = F.pad(x, (self.pad,) * 4)[..., i:i + h, j:j + w]
        if self.flip and torch.rand(1, generator=g).item() < 0.5:
            x = x.flip(-1)
        return x.contiguous()


def resized_crop_box(width: int, height: int, g: torch.Generator, scale=(0.08, 1.0),
                     ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random-resized crop, torchvision's rule with ``g``'s draws."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(1, generator=g).item())
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * torch.rand(1, generator=g).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=g))
            left = int(torch.randint(0, width - w + 1, (1,), generator=g))
            return top, left, h, w
    in_ratio = width / height  # fallback: the centre crop of the nearest allowed ratio
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
