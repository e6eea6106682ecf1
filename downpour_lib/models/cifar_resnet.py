"""ResNets for CIFAR-10: ResNet-20, -32, -56 and -110.

The networks of He, Zhang, Ren & Sun 2016, "Deep Residual Learning for Image Recognition",
section 4.2: a 3x3 convolution with 16 filters, three stages of n basic blocks with 16, 32 and 64
filters (depth 6n+2), global average pooling and a linear classifier. Shortcuts are option A
(parameter-free), so the counts match the paper's table: 0.27M, 0.46M, 0.85M and 1.7M.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from downpour_lib.errors import ConfigError

WIDTHS = (16, 32, 64)


class Subsample(nn.Module):
    """Option A shortcut: keep every stride-th pixel and append zero channels."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride, self.extra_channels = stride, extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers around an identity (or option A) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        # Subsampling with x[::2] rounds up, as the padded stride-2 conv does, so the two paths
        # agree on odd sizes too.
        self.shortcut: nn.Module = (
            Subsample(stride, out_channels - in_channels)
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """conv 3x3 16 -> 3 stages x n blocks (16, 32, 64 filters) -> average pool -> Linear(64)."""

    def __init__(self, depth: int, in_channels: int, num_classes: int) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ConfigError("depth", depth, "6n+2 for a CIFAR ResNet: 20, 32, 44, 56, 110, ...")
        blocks_per_stage = (depth - 2) // 6
        self.conv = nn.Conv2d(in_channels, WIDTHS[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(WIDTHS[0])
        blocks: list[nn.Module] = []
        channels = WIDTHS[0]
        for stage, width in enumerate(WIDTHS):
            for i in range(blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(channels, width, stride))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        # He initialisation (He et al. 2015, "Delving deep into rectifiers"), which the paper uses.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(self.pool(out), 1))


def cifar_resnet(depth: int, input_shape: tuple[int, int, int], num_classes: int) -> CifarResNet:
    return CifarResNet(depth, input_shape[0], num_classes)
