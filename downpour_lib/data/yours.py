"""Your own data set (``user_code``): what a data-set function returns, read as a source.

The function returns ``(train, validation)``, each a torch ``Dataset`` of ``(x, y)`` pairs or one
of downpour's own sources (``TensorSource``, ``TokenSource``...), or a ``Splits``. A Dataset
becomes a ``DatasetSource``: a ``TensorDataset`` is read by index (a tensor gather a step), any
other Dataset sample by sample in the training process.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError, DataError
from .catalog import Splits


class DatasetSource:
    """A torch Dataset of (x, y) as a source: ``task`` "lm" where ``y`` is a tensor shaped like
    ``x`` (next tokens), else "classify"."""

    augmentation = None
    in_workers = False

    def __init__(self, dataset: Any, num_classes: int, name: str) -> None:
        self.dataset, self.num_classes = dataset, num_classes
        x, y = _pair(dataset, name)
        self.input_shape = tuple(x.shape)
        self.task = "lm" if torch.is_tensor(y) and y.dim() > 0 else "classify"
        self._tensors = getattr(dataset, "tensors", None)  # a TensorDataset: gather by index

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tensors is not None:
            x, y = self._tensors[0][indices], self._tensors[1][indices]
        else:
            pairs = [self.dataset[int(i)] for i in indices]
            x = torch.stack([torch.as_tensor(p[0]) for p in pairs])
            y = torch.stack([torch.as_tensor(p[1]) for p in pairs])
        return (x if self.task == "lm" or x.is_floating_point() else x.float()), y.long()

    def sample(self, index: int, epoch: int, augment: bool, seed: int):
        x, y = self.batch(torch.tensor([index]))
        return x[0], y[0]


def _pair(dataset: Any, name: str) -> tuple[torch.Tensor, Any]:
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ConfigError("dataset", name, f"it returned a {type(dataset).__name__}; return "
                                           "(train, validation) torch Datasets of (x, y) pairs")
    if len(dataset) == 0:
        raise DataError(f"data set {name!r}: a split is empty; give it samples")
    item = dataset[0]
    if not isinstance(item, (tuple, list)) or len(item) != 2 or not torch.is_tensor(item[0]):
        raise ConfigError("dataset", name, "its samples must be (x, y) pairs with x a tensor; "
                                           f"sample 0 is {_described(item)}")
    y = torch.as_tensor(item[1])
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ConfigError("dataset", name, "its labels y must be class indices (integers), or a "
                                           "language model's next tokens (integers shaped like "
                                           f"x); sample 0's y is {_tensor_described(y)}")
    return item[0], item[1]


def _tensor_described(t: torch.Tensor) -> str:
    return f"a {str(t.dtype).removeprefix('torch.')} " + (
        f"tensor of shape {tuple(t.shape)}" if t.dim() else f"number ({t.item():g})")


def _check_labels(dataset: Any, classes: int, split: str, name: str) -> None:
    """A TensorDataset's labels, all of them (one comparison): in [0, classes), which the loss
    indexes; a label outside would fail mid-run, or after training, at the evaluation."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is None or len(tensors) != 2 or not len(tensors[1]):
        return
    low, high = int(tensors[1].min()), int(tensors[1].max())
    if low < 0 or high >= classes:
        raise ConfigError("dataset", name, f"its {split} labels run from {low} to {high}; give "
                                           f"class indices from 0 to {classes - 1} ({classes} "
                                           "classes, counted from the train split's labels or "
                                           "its num_classes)")


def _described(item: Any) -> str:
    """What a sample is, in a few words: a tuple's length and its parts' types."""
    if isinstance(item, (tuple, list)):
        parts = ", ".join(type(part).__name__ for part in item[:3]) + (", ..." if len(item) > 3 else "")
        return f"a {type(item).__name__} of {len(item)} ({parts})"
    return f"a {type(item).__name__}"


def _classes(dataset: Any, name: str) -> int:
    given = getattr(dataset, "num_classes", None) or getattr(dataset, "vocabulary", None)
    if given is not None:
        return int(given)
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None and len(tensors) == 2:
        return int(tensors[1].max()) + 1
    raise ConfigError("dataset", name, "say how many classes (or tokens) there are: give the "
                                       "train Dataset a num_classes attribute, or return "
                                       "TensorDatasets")


def as_splits(made: Any, name: str) -> Splits:
    """What your function returned, as the splits a run reads."""
    if isinstance(made, Splits):
        return made
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        raise ConfigError("dataset", name, f"it returned a {type(made).__name__}; return "
                                           "(train, validation), two torch Datasets of (x, y)")
    train, val = made
    if hasattr(train, "batch") and hasattr(train, "input_shape"):  # downpour's own sources
        return Splits(train, val)
    _pair(train, name)  # pairs first: the classes are counted from them
    classes = _classes(train, name)
    splits = Splits(DatasetSource(train, classes, name), DatasetSource(val, classes, name))
    for split, dataset in (("train", train), ("validation", val)):  # integers, by _pair there
        _check_labels(dataset, classes, split, name)
    return splits
