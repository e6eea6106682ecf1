"""Data sets by name, and the per-worker sharding of their training split."""

from __future__ import annotations

from pathlib import Path

from ..errors import unknown_name
from .catalog import DATASETS, DatasetSpec, Splits


def load_dataset(name: str, data_dir: str | Path = "data") -> Splits:
    """Train and test splits of ``name``; DataError says what is missing and where to put it."""
    if name not in DATASETS:
        raise unknown_name("dataset", name, DATASETS)
    return DATASETS[name].load(Path(data_dir).expanduser())


def __getattr__(name: str):
    """The torch-built parts when first asked for: the catalog alone imports no torch."""
    if name == "ShardSampler":
        from .sharding import ShardSampler

        return ShardSampler
    if name == "ImageSource":
        from .sources import ImageSource

        return ImageSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DATASETS", "DatasetSpec", "ImageSource", "ShardSampler", "Splits", "load_dataset"]
