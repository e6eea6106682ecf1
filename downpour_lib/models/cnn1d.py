"""The 1-D convolutional network of MNIST-1D.

Three strided convolutions of 25 channels and a linear classifier, as in the ``ConvBase`` of
Greydanus 2020, "Scaling down deep learning" (about 94% on MNIST-1D). The signal is the image read
row by row: (C, H, W) becomes C channels of length H*W, so MNIST-1D's (1, 1, 40) is one channel of 40.
"""

from __future__ import annotations

import torch
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
        length = _out(_out(_out(height * width, 5), 3), 3)
        self.features = nn.Sequential(
            nn.Conv1d(channels, CHANNELS, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(CHANNELS, CHANNELS, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(CHANNELS, CHANNELS, 3, stride=2, padding=1), nn.ReLU(),
        )
        self.classifier = nn.Linear(CHANNELS * length, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x.flatten(2)).flatten(1))


def cnn1d(input_shape: tuple[int, int, int], num_classes: int) -> CNN1d:
    if input_shape[1] * input_shape[2] < MIN_LENGTH:
        from downpour_lib.errors import ConfigError

        raise ConfigError("model", "cnn1d", f"needs signals of at least {MIN_LENGTH} samples; the "
                          f"data set gives {input_shape[1]}x{input_shape[2]}")
    return CNN1d(input_shape, num_classes)
