"""The data sets: scikit-learn's bundled digits, MNIST-1D (generated offline), torchvision's MNIST,
CIFAR and ImageFolder, and deterministic synthetic stand-ins with the real ones' shapes for throughput
measurements.

The catalog itself needs no torch (the config's checks, a study's planner and ``downpour datasets``
read it); each loader imports torch and the sources it builds when it runs."""

from __future__ import annotations

import io
import os
import random
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..checkpoint import atomic_write_bytes
from ..errors import DataError

if TYPE_CHECKING:
    from .sources import ImageSource

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Splits:
    train: ImageSource
    test: ImageSource


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    kind: Literal["bundled", "real", "synthetic"]
    input_shape: tuple[int, ...]
    """(channels, height, width) of an image, or (context,) tokens of a language model's sample."""
    num_classes: int | None  # None: read from the files (ImageFolder)
    train_size: int | None
    test_size: int | None
    load: Callable[[Path], Splits]
    task: Literal["classify", "lm"] = "classify"
    """What a model learns from it: classes of images, or the next token (a language model)."""


def _digits(root: Path) -> Splits:
    """The 1,797 8x8 digits scikit-learn ships; a fixed stratified split of 360 test images. Kept
    in the cache directory (``_cached``) once split: importing scikit-learn costs every rank a
    second of CPU, and a job's ranks all load the same digits."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        sklearn = version("scikit-learn")  # the split is scikit-learn's: one file per version
    except PackageNotFoundError:
        sklearn = "none"  # _split_digits says what to install
    import torch

    from .sources import TensorSource

    data = _cached(f"digits_sklearn{sklearn}.npz", _split_digits,
                   ("images", "labels", "train_idx", "test_idx"))
    images = torch.tensor(data["images"], dtype=torch.float32)
    labels = torch.tensor(data["labels"], dtype=torch.int64)
    train_idx, test_idx = data["train_idx"].tolist(), data["test_idx"].tolist()
    train_x = images[train_idx]
    mean, std = train_x.mean().item(), train_x.std().item()
    make = lambda idx: TensorSource(images[idx], labels[idx], 10, [mean], [std])  # noqa: E731
    return Splits(make(train_idx), make(test_idx))


def _split_digits() -> dict[str, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise DataError(f"data set 'digits' needs scikit-learn ({exc}): pip install scikit-learn "
                        "(it is a dependency of downpour)") from None
    digits = load_digits()
    train_idx, test_idx = train_test_split(range(len(digits.target)), test_size=360, random_state=0,
                                           stratify=digits.target)
    return {"images": digits.images.astype(np.uint8),  # whole numbers 0 to 16
            "labels": digits.target.astype(np.int64),
            "train_idx": np.asarray(train_idx, dtype=np.int64),
            "test_idx": np.asarray(test_idx, dtype=np.int64)}


def _mnist1d(root: Path) -> Splits:
    """MNIST-1D (Greydanus 2020, "Scaling down deep learning"): 4,000 training and 1,000 test
    signals of length 40, made by the ``mnist1d`` package from its ten templates with its published
    arguments (seed 42), so it needs no download. Harder than digits where it matters for comparing
    algorithms: a CNN reaches about 94%, an MLP about 68%, logistic regression about 32% (the
    paper's Table 1). Made once (a few seconds) and kept in the cache directory (``_cached``)."""
    import torch

    from .sources import TensorSource

    data = _cached("mnist1d_seed42.npz", _make_mnist1d, ("x", "y", "x_test", "y_test"))
    images = lambda x: torch.tensor(x, dtype=torch.float32).view(len(x), 1, 1, -1)  # noqa: E731
    # the package already centres the signals and scales them to unit variance
    make = lambda x, y: TensorSource(images(x), torch.tensor(y), 10, [0.0], [1.0])  # noqa: E731
    return Splits(make(data["x"], data["y"]), make(data["x_test"], data["y_test"]))


def _cached(name: str, make: Callable[[], dict[str, np.ndarray]],
            keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays ``make`` returns (``keys``), kept as ``name`` in the user's cache directory
    (``$XDG_CACHE_HOME/downpour``, else ``~/.cache/downpour``) where it can be written."""
    cache = _cache_dir() / name
    try:
        with np.load(cache) as arrays:
            return {k: arrays[k] for k in keys}
    # not there yet, cut short, or without one of the arrays: make it
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        data = make()
        buffer = io.BytesIO()
        np.savez(buffer, **data)
        try:  # ranks making it at once each replace it whole
            atomic_write_bytes(cache, buffer.getvalue())
        except OSError:  # a read-only cache: made again next time, nothing else lost
            pass
        return data


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "downpour"


def _make_mnist1d() -> dict[str, np.ndarray]:
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise DataError(f"data set 'mnist1d' needs the mnist1d package ({exc}): "
                        "pip install mnist1d (it is a dependency of downpour)") from None
    # make_dataset seeds Python's and NumPy's global generators; give them back as they were
    state, np_state = random.getstate(), np.random.get_state()
    try:
        made = make_dataset(get_dataset_args())
    finally:
        random.setstate(state)
        np.random.set_state(np_state)
    return {k: np.asarray(made[k]) for k in ("x", "y", "x_test", "y_test")}


def _mnist(root: Path) -> Splits:
    from torchvision.datasets import MNIST

    from .augment import CropFlip
    from .sources import TensorSource, require_files

    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    raw = root / "MNIST" / "raw"
    if not all((raw / n).exists() or (raw / f"{n}.gz").exists() for n in names):
        require_files("mnist", raw, names, "Put the four MNIST idx files (or their .gz) there.")
    make = lambda train: MNIST(str(root), train=train, download=False)  # noqa: E731
    train, test = make(True), make(False)
    # pad-2 crops; no flips, which would turn digits into other shapes
    return Splits(TensorSource(train.data, train.targets, 10, [0.1307], [0.3081], 255.0,
                               CropFlip(pad=2, flip=False), in_workers=True),
                  TensorSource(test.data, test.targets, 10, [0.1307], [0.3081], 255.0,
                               in_workers=True))


def _cifar(classes: int) -> Callable[[Path], Splits]:
    def load(root: Path) -> Splits:
        import torch
        from torchvision.datasets import CIFAR10, CIFAR100

        from .augment import CropFlip
        from .sources import TensorSource, require_files

        cls, folder, files = (
            (CIFAR10, "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"])
            if classes == 10 else (CIFAR100, "cifar-100-python", ["train", "test"]))
        require_files(f"cifar{classes}", root / folder, files,
                      f"Unpack the python version of CIFAR-{classes} there.")

        def source(train: bool) -> TensorSource:
            ds = cls(str(root), train=train, download=False)
            images = torch.from_numpy(ds.data).permute(0, 3, 1, 2)  # NHWC uint8 -> NCHW
            return TensorSource(images, torch.tensor(ds.targets), classes, CIFAR_MEAN, CIFAR_STD,
                                255.0, CropFlip(pad=4, flip=True) if train else None,
                                in_workers=True)

        return Splits(source(True), source(False))

    return load


def _imagefolder(root: Path) -> Splits:
    """``root/train/<class>/*`` and ``root/val/<class>/*``, decoded when read (``FolderSource``)."""
    from torchvision.datasets import ImageFolder

    from .sources import FolderSource

    for split in ("train", "val"):
        if not (root / split).is_dir():
            raise DataError(
                f"data set 'imagefolder': no directory {root / split}. Lay the images out as "
                f"{root}/train/<class>/<image> and {root}/val/<class>/<image>, or point "
                "--data-dir at such a directory. Nothing is downloaded; offline, use "
                "--dataset synthetic-imagenet.")
    train, val = ImageFolder(str(root / "train")), ImageFolder(str(root / "val"))
    n = len(train.classes)
    return Splits(FolderSource(train, n, IMAGENET_MEAN, IMAGENET_STD),
                  FolderSource(val, n, IMAGENET_MEAN, IMAGENET_STD))


def _synthetic(shape: tuple[int, int, int], classes: int, train: int, test: int,
               pool: int) -> Callable[[Path], Splits]:
    def load(root: Path) -> Splits:
        from .sources import SyntheticSource

        return Splits(SyntheticSource(train, shape, classes, seed=1, pool=pool),
                      SyntheticSource(test, shape, classes, seed=2, pool=pool))

    return load


def _stdlib_text(root: Path) -> Splits:
    from .text import BYTE_VOCABULARY, TokenSource, stdlib_corpus

    train, val = stdlib_corpus()
    return Splits(TokenSource(train, 128, BYTE_VOCABULARY, "stdlib-text"),
                  TokenSource(val, 128, BYTE_VOCABULARY, "stdlib-text"))


def _textfile(root: Path) -> Splits:
    from .text import read_text_file

    return Splits(*read_text_file(root, 128))


def _token_files(root: Path) -> Splits:
    from .text import GPT2_VOCABULARY, read_token_files

    return Splits(*read_token_files(root, 1024, GPT2_VOCABULARY))


def _synthetic_tokens(root: Path) -> Splits:
    from .text import GPT2_VOCABULARY, SyntheticTokens

    return Splits(SyntheticTokens(100_000, 1024, GPT2_VOCABULARY, seed=1),
                  SyntheticTokens(64, 1024, GPT2_VOCABULARY, seed=2))


DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    DatasetSpec("digits", "scikit-learn's bundled 8x8 handwritten digits (offline accuracy)",
                "bundled", (1, 8, 8), 10, 1437, 360, _digits),
    DatasetSpec("mnist1d", "MNIST-1D (Greydanus 2020), 40-sample signals made offline "
                "(harder than digits)", "bundled", (1, 1, 40), 10, 4000, 1000, _mnist1d),
    DatasetSpec("mnist", "MNIST (LeCun et al. 1998) via torchvision; files under DATA_DIR/MNIST/raw",
                "real", (1, 28, 28), 10, 60000, 10000, _mnist),
    DatasetSpec("cifar10", "CIFAR-10 (Krizhevsky 2009) via torchvision; DATA_DIR/cifar-10-batches-py",
                "real", (3, 32, 32), 10, 50000, 10000, _cifar(10)),
    DatasetSpec("cifar100", "CIFAR-100 via torchvision; DATA_DIR/cifar-100-python",
                "real", (3, 32, 32), 100, 50000, 10000, _cifar(100)),
    DatasetSpec("imagefolder", "any ImageFolder tree: DATA_DIR/train/<class>, DATA_DIR/val/<class>",
                "real", (3, 224, 224), None, None, None, _imagefolder),
    DatasetSpec("synthetic-mnist", "random MNIST-shaped images, random labels (throughput)",
                "synthetic", (1, 28, 28), 10, 60000, 1024, _synthetic((1, 28, 28), 10, 60000, 1024, 1024)),
    DatasetSpec("synthetic-cifar", "random CIFAR-shaped images, random labels (throughput)",
                "synthetic", (3, 32, 32), 10, 50000, 1024, _synthetic((3, 32, 32), 10, 50000, 1024, 1024)),
    DatasetSpec("synthetic-imagenet", "random 224x224 images, 1000 classes (throughput)",
                "synthetic", (3, 224, 224), 1000, 1281167, 256,
                _synthetic((3, 224, 224), 1000, 1281167, 256, 64)),
    DatasetSpec("stdlib-text", "the Python standard library's .py sources as bytes, 128-token "
                "windows, split by file (a language model's text, offline)", "bundled", (128,), 256,
                None, None, _stdlib_text, "lm"),
    DatasetSpec("textfile", "your text as bytes: DATA_DIR/train.txt and val.txt, or DATA_DIR/input.txt "
                "(last tenth validation)", "real", (128,), 256, None, None, _textfile, "lm"),
    DatasetSpec("tokens", "pre-tokenized text as nanoGPT writes it: DATA_DIR/train.bin, val.bin "
                "(flat uint16 GPT-2 token ids), 1024-token windows", "real", (1024,), 50257, None,
                None, _token_files, "lm"),
    DatasetSpec("synthetic-tokens", "random GPT-2 token ids, 1024-token windows (throughput)",
                "synthetic", (1024,), 50257, 100000, 64, _synthetic_tokens, "lm"),
)}
