"""Token data for language models: text on every machine, a user's own text or token file, and
synthetic tokens for throughput.

A ``TokenSource`` holds one flat int64 array of token ids and answers the same protocol as the
image sources (``data/sources.py``): sample ``i`` is the window ``tokens[i*T : i*T + T]`` and its
target the same window one token on (next-token prediction), so windows never overlap and the
``ShardSampler`` gives each worker disjoint text. ``input_shape`` is ``(T,)`` (the context) and
``num_classes`` the vocabulary, which is the model registry's builder contract for a language
model. ``task = "lm"`` tells the engine to report perplexity beside the loss.

The built-in corpus, ``stdlib-text``, is the Python standard library's own ``.py`` sources read
as bytes (a 256-token vocabulary): real text that ships with every Python, no download. Files are
split into training and validation by a fixed seed, whole files to one side, so no validation
text is seen in training; the corpus therefore follows the Python version (recorded in the run).
"""

from __future__ import annotations

import random
import sys
import sysconfig
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError

BYTE_VOCABULARY = 256
GPT2_VOCABULARY = 50257


class TokenSource:
    """Next-token windows over one flat array of token ids (see the module's docstring)."""

    task = "lm"
    augmentation = None
    in_workers = False

    def __init__(self, tokens: np.ndarray | torch.Tensor, context: int, vocabulary: int,
                 name: str = "tokens") -> None:
        tokens = torch.from_numpy(np.array(tokens, dtype=np.int64))
        if tokens.dim() != 1:
            raise DataError(f"data set {name!r}: tokens must be one flat array, got shape "
                            f"{tuple(tokens.shape)}")
        if len(tokens) < context + 1:
            raise DataError(f"data set {name!r}: {len(tokens)} tokens, fewer than one window of "
                            f"{context} + 1; give it more text or a shorter context")
        high = int(tokens.max())
        if int(tokens.min()) < 0 or high >= vocabulary:
            raise DataError(f"data set {name!r}: token id {high} outside the vocabulary of "
                            f"{vocabulary}; the file holds ids from another tokenizer, or the "
                            "vocabulary is set too small")
        self.tokens, self.context = tokens, context
        self.num_classes, self.input_shape = vocabulary, (context,)
        self._offsets = torch.arange(context + 1)

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.context

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.tokens[torch.as_tensor(indices).view(-1, 1) * self.context + self._offsets]
        return windows[:, :-1], windows[:, 1:]

    def sample(self, index: int, epoch: int, augment: bool, seed: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batch(torch.tensor([index]))
        return x[0], y[0]


class SyntheticTokens(TokenSource):
    """Random token ids with GPT-2's vocabulary and context (throughput): a bounded pool of windows
    repeated, so memory stays flat; nothing is learned."""

    def __init__(self, num_samples: int, context: int, vocabulary: int, seed: int,
                 pool: int = 256) -> None:
        g = torch.Generator().manual_seed(seed)
        super().__init__(torch.randint(vocabulary, (min(pool, num_samples) * context + 1,),
                                       generator=g), context, vocabulary, "synthetic-tokens")
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def batch(self, indices: torch.Tensor, epoch: int = 0, augment: bool = False,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        pool = (len(self.tokens) - 1) // self.context
        return super().batch(torch.as_tensor(indices) % pool, epoch, augment, seed)


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, sorted (the test suites left out: they are mostly
    long tables of literals)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__")
    return sorted(p for p in root.rglob("*.py")
                  if not any(part in skip for part in p.relative_to(root).parts))


def stdlib_corpus(max_bytes: int = 2_000_000, validation: float = 0.04,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) byte arrays: the files shuffled by ``seed``, the first ``validation``
    share of the bytes to validation, the rest to training until ``max_bytes``."""
    files = stdlib_files()
    if not files:
        raise DataError(f"data set 'stdlib-text': no .py files under "
                        f"{sysconfig.get_paths()['stdlib']}; this Python ships without its "
                        "sources. Use --dataset textfile with --data-dir, or synthetic-tokens")
    random.Random(seed).shuffle(files)
    val, train, val_budget = [], [], int(max_bytes * validation)
    size = 0
    for path in files:
        data = path.read_bytes()
        if size < val_budget:
            val.append(data)
        elif size < max_bytes + val_budget:
            train.append(data)
        else:
            break
        size += len(data)
    as_array = lambda parts: np.frombuffer(b"".join(parts), dtype=np.uint8)  # noqa: E731
    return as_array(train), as_array(val)


def stdlib_label() -> str:
    return f"Python {sys.version_info.major}.{sys.version_info.minor} standard library sources"


def read_text_file(root: Path, context: int) -> tuple[TokenSource, TokenSource]:
    """A user's own text, as bytes: ``root/train.txt`` and ``root/val.txt``, or one
    ``root/input.txt`` whose last tenth is the validation split (as nanoGPT's character-level
    Shakespeare is split)."""
    train, val = root / "train.txt", root / "val.txt"
    if train.is_file() and val.is_file():
        parts = train.read_bytes(), val.read_bytes()
    elif (root / "input.txt").is_file():
        data = (root / "input.txt").read_bytes()
        cut = int(len(data) * 0.9)
        parts = data[:cut], data[cut:]
    else:
        raise DataError(f"data set 'textfile': no {train} and {val}, nor {root / 'input.txt'}. "
                        "Put your text there (UTF-8 or any bytes) and point --data-dir at that "
                        "directory; offline without text of your own, use --dataset stdlib-text")
    return tuple(TokenSource(np.frombuffer(p, dtype=np.uint8), context, BYTE_VOCABULARY,
                             "textfile") for p in parts)


def read_token_files(root: Path, context: int, vocabulary: int) -> tuple[TokenSource, TokenSource]:
    """Pre-tokenized text as nanoGPT's ``prepare.py`` writes it: ``root/train.bin`` and
    ``root/val.bin``, each a flat array of uint16 token ids (GPT-2's tokenizer: 50,257 ids)."""
    sources = []
    for split in ("train", "val"):
        path = root / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"data set 'tokens': no {path}. Write the token ids there as a flat "
                            "uint16 array (numpy's tofile, as nanoGPT's prepare.py does) and point "
                            "--data-dir at that directory; offline, use --dataset stdlib-text or "
                            "synthetic-tokens")
        if path.stat().st_size % 2:
            raise DataError(f"data set 'tokens': {path} has an odd number of bytes "
                            f"({path.stat().st_size}), so it is no uint16 array; write it with "
                            "np.array(ids, dtype=np.uint16).tofile(path)")
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        sources.append(TokenSource(np.array(tokens), context, vocabulary, "tokens"))
    return sources[0], sources[1]
