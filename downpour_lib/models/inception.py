"""Small Inception network for CIFAR-10.

The network of Zhang, Bengio, Hardt, Recht & Vinyals 2017, "Understanding deep learning requires
rethinking generalization" (appendix, Figure 3): a 3x3 convolution, Inception modules that
concatenate a 1x1 and a 3x3 branch, and two Downsample modules that concatenate a stride-2
convolution with a stride-2 max pool. 1,649,402 parameters for CIFAR-10, as the paper gives.
"""

from __future__ import annotations

import torch
from torch import nn


class Shift(nn.Module):
    """A learned per-channel offset: the beta of a batch norm that has no gamma."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias.view(1, -1, 1, 1)


class ConvModule(nn.Sequential):
    """Conv k x k -> BatchNorm (shift, no scale) -> ReLU."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1
    ) -> None:
        # No convolution bias: the batch norm would cancel it. No batch-norm scale either: the
        # paper's 1,649,402 is exactly the count with a shift but no scale, the default of
        # TensorFlow's batch_norm (scale=False), and the next layer can absorb a positive scale.
        # The normalisation stays a stock BatchNorm2d so convert_sync_batchnorm still finds it.
        super().__init__(
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride=stride,
                padding=kernel_size // 2,
                bias=False,
            ),
            nn.BatchNorm2d(out_channels, affine=False),
            Shift(out_channels),
            nn.ReLU(),
        )


class InceptionModule(nn.Module):
    """concat(Conv 1x1 with ch1 filters, Conv 3x3 with ch3 filters); size-preserving."""

    def __init__(self, in_channels: int, ch1: int, ch3: int) -> None:
        super().__init__()
        self.branch1 = ConvModule(in_channels, ch1, 1)
        self.branch3 = ConvModule(in_channels, ch3, 3)
        self.out_channels = ch1 + ch3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x)], dim=1)


class DownsampleModule(nn.Module):
    """concat(Conv 3x3 stride 2 with ch3 filters, MaxPool 3x3 stride 2); halves the image."""

    def __init__(self, in_channels: int, ch3: int) -> None:
        super().__init__()
        self.conv = ConvModule(in_channels, ch3, 3, stride=2)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        # The pool passes every input channel through, so the module widens rather than replaces.
        self.out_channels = ch3 + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv(x), self.pool(x)], dim=1)


# The body of Figure 3, in order: ("inception", ch1, ch3) or ("downsample", ch3).
LAYOUT: tuple[tuple[str, int] | tuple[str, int, int], ...] = (
    ("inception", 32, 32),
    ("inception", 32, 48),
    ("downsample", 80),
    ("inception", 112, 48),
    ("inception", 96, 64),
    ("inception", 80, 80),
    ("inception", 48, 96),
    ("downsample", 96),
    ("inception", 176, 160),
    ("inception", 176, 160),
)


class InceptionSmall(nn.Module):
    """Conv(96, 3x3) -> the modules of LAYOUT -> global average pool -> Linear(336, classes)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvModule(in_channels, 96, 3)]
        channels = 96
        for kind, *widths in LAYOUT:
            block = (
                InceptionModule(channels, *widths)
                if kind == "inception"
                else DownsampleModule(channels, *widths)
            )
            layers.append(block)
            channels = block.out_channels
        self.features = nn.Sequential(*layers)
        # Adaptive pooling makes the head independent of the image size.
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def inception_small(input_shape: tuple[int, int, int], num_classes: int) -> InceptionSmall:
    return InceptionSmall(input_shape[0], num_classes)
