"""LeNet-5 style convolutional network.

Two convolution + pooling stages and three fully connected layers, after LeCun, Bottou, Bengio &
Haffner 1998, "Gradient-based learning applied to document recognition", with ReLU and max pooling
in place of the original sigmoid units and subsampling layers.
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet(nn.Module):
    """conv(C,6,5) -> pool -> conv(6,16,5) -> pool -> 120 -> 84 -> classes, all with ReLU."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        # padding=2 keeps each convolution size-preserving, so the same network fits 8x8 digits,
        # 28x28 MNIST and 32x32 CIFAR; only the pools shrink the image.
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        # Computed from the input shape rather than with a lazy layer, so the parameters exist (and
        # can be counted, broadcast and seeded) before the first forward.
        flat = 16 * (height // 4) * (width // 4)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def lenet(input_shape: tuple[int, int, int], num_classes: int) -> LeNet:
    return LeNet(input_shape, num_classes)
