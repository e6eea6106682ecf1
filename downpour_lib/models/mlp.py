"""Multilayer perceptron: two hidden layers of 128 ReLU units.

The smallest model in the registry, for checking algorithms against exact references quickly
(Rumelhart, Hinton & Williams 1986, "Learning representations by back-propagating errors").
"""

from __future__ import annotations

from torch import nn

HIDDEN = 128


def mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Sequential:
    """Flatten -> Linear(C*H*W, 128) -> ReLU -> Linear(128, 128) -> ReLU -> Linear(128, classes)."""
    channels, height, width = input_shape
    # No dropout: tests compare gradients across processes exactly, and each process would draw
    # its own dropout mask.
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(channels * height * width, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, num_classes),
    )
