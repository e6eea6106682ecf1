"""Data sets by name, and the per-worker sharding of their training split."""

from __future__ import annotations

from pathlib import Path

from ..errors import unknown_name
from .catalog import DATASETS, DatasetSpec, Splits
from .sharding import ShardSampler
from .sources import ImageSource


def load_dataset(name: str, data_dir: str | Path = "data") -> Splits:
    """Train and test splits of ``name``; DataError says what is missing and where to put it."""
    if name not in DATASETS:
        raise unknown_name("dataset", name, DATASETS)
    return DATASETS[name].load(Path(data_dir).expanduser())


__all__ = ["DATASETS", "DatasetSpec", "ImageSource", "ShardSampler", "Splits", "load_dataset"]
