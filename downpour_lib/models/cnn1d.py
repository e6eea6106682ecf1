"""The 1-D convolutional network of MNIST-1D.

Three strided convolutions of 25 channels and a linear classifier, as in the ``ConvBase`` of
Greydanus 2020, "Scaling down deep learning" (about 94% on MNIST-1D). The signal is the image read
row by row: (C, H, W) becomes C channels of length H*W, so MNIST-1D's (1, 1, 40) is one channel of 40.
A signal shorter than three samples is zero-padded to three, so any image size builds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS = 25
#: the shortest signal whose third convolution still has one output
MIN_LENGTH = 3


def _out(length: int, kernel: int) -> int:
    return (length + 2 - kernel) // 2 + 1  # stride 2, padding 1


class CNN1d(nn.Module):
    """conv(C,25,5,s2) -> conv(25,25,3,s2) -> conv(25,25,3,s2), ReLU after each -> linear."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.pad = max(0, MIN_LENGTH - height * width)
        length = _out(_out(_out(height * width + self.pad, 5), 3), 3)
        self.features = nn.Sequential(
            nn.Conv1d(channels, CHANNELS, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(CHANNELS, CHANNELS, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(CHANNELS, CHANNELS, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.classifier = nn.Linear(CHANNELS * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        signal = x.flatten(2)
        if self.pad:
            signal = F.pad(signal, (0, self.pad))
        return self.classifier(self.features(signal).flatten(1))


def cnn1d(input_shape: tuple[int, int, int], num_classes: int) -> CNN1d:
    return CNN1d(input_shape, num_classes)
