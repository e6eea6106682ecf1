"""Real-format data sets made up on the spot: a JPEG ImageFolder tree and MNIST idx files.

Nothing is downloaded here, so the pipeline of the real data sets (files decoded in DataLoader
workers, augmented) is exercised, benchmarked and tested on files in the formats the real ones
have. The pixels are random; nothing is learned from them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def write_imagefolder(root: str | Path, classes: int = 4, per_class: int = 8,
                      size: tuple[int, int] = (320, 256), val_per_class: int = 2,
                      seed: int = 0) -> Path:
    """``root/train/<class>/*.jpg`` and ``root/val/<class>/*.jpg`` of ``size`` (width, height)
    JPEGs; returns ``root``. Existing files are kept (generation is deterministic)."""
    from PIL import Image

    root, rng = Path(root), np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = root / split / f"class{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                path = folder / f"{i:05d}.jpg"
                # smooth random colour fields compress like photographs, not like noise
                small = rng.integers(0, 256, (size[1] // 16, size[0] // 16, 3), dtype=np.uint8)
                if not path.exists():
                    Image.fromarray(small).resize(size, Image.BILINEAR).save(path, quality=90)
    return root


def write_mnist(root: str | Path, train: int = 600, test: int = 100, seed: int = 0) -> Path:
    """MNIST's four idx files (random 28x28 images, labels 0-9) under ``root/MNIST/raw``, where
    ``--dataset mnist --data-dir root`` reads them; returns ``root``."""
    root, rng = Path(root), np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
    return root
