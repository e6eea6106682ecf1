"""Data sets by name, and the per-worker sharding of their training split."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import user_code
from ..errors import unknown_name
from .catalog import DATASETS, DatasetSpec, Splits


def load_dataset(name: str, data_dir: str | Path = "data") -> Splits:
    """Train and test splits of ``name`` (a built-in, or your own: ``user_code``); DataError says
    what is missing and where to put it."""
    if user_code.is_user_code("dataset", name):
        from .yours import as_splits

        return as_splits(user_code.resolve("dataset", name)(Path(data_dir).expanduser()), name)
    if name not in DATASETS:
        raise unknown_name("dataset", name, [*DATASETS, "package.module:function"])
    return DATASETS[name].load(Path(data_dir).expanduser())


def register(name: str, load: Callable[[Path], object]) -> str:
    """Give your data-set function (``data_dir -> (train, validation)``, e.g. defined in a
    notebook cell) a name that ``TrainConfig(dataset=...)`` and a cluster's engines accept."""
    return user_code.register("dataset", name, load, DATASETS)


def __getattr__(name: str):
    """The torch-built parts when first asked for: the catalog alone imports no torch."""
    if name == "ShardSampler":
        from .sharding import ShardSampler

        return ShardSampler
    if name == "ImageSource":
        from .sources import ImageSource

        return ImageSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DATASETS", "DatasetSpec", "ImageSource", "ShardSampler", "Splits", "load_dataset",
           "register"]
