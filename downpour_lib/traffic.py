"""How many bytes a collective moves, written once: for the meter and for bus bandwidth.

Logical bytes, the ones a bandwidth-optimal algorithm moves on each rank, as nccl-tests counts them
(its doc/PERFORMANCE.md): a ring allreduce (a reduce-scatter then an allgather) sends, and receives,
2(N-1)/N of the buffer on every rank; a ring allgather or reduce-scatter (N-1)/N of the whole buffer
(the gathered output, the scattered input); an alltoall (N-1)/N of it. That share is nccl-tests' bus
factor, which makes a measured bandwidth comparable to a link's. Rooted operations are counted at the
root: a broadcast's root sends the buffer to each of the N-1 others, each of which receives it once;
a reduce the reverse (their bus factor is 1: a pipelined ring passes the whole buffer over each link).
Sizes are written as nccl-tests writes them (``parse_size``, ``parse_sizes``: binary K, M, G).
"""

from __future__ import annotations

import re
from fractions import Fraction

from .errors import ConfigError

RING_OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall")
ROOTED_OPS = ("broadcast", "reduce")


def ring_share(op: str, size: int) -> Fraction:
    """The share of the whole buffer each of ``size`` ranks sends (and receives) in ``op``: the
    bus factor of nccl-tests."""
    return Fraction(*_share(op, size))


def _share(op: str, size: int) -> tuple[int, int]:
    if op == "allreduce":
        return 2 * (size - 1), size
    if op in RING_OPS:
        return size - 1, size
    if op in ROOTED_OPS:
        return 1, 1
    raise ValueError(f"op={op!r} is not valid: choose one of {', '.join(RING_OPS + ROOTED_OPS)}")


def collective_bytes(op: str, nbytes: int, size: int, rank: int = 0,
                     root: int = 0) -> tuple[int, int]:
    """(sent, received) logical bytes on ``rank`` when ``size`` ranks run ``op`` on a buffer of
    ``nbytes`` (the whole buffer, as in ``ring_share``); ``root`` matters for rooted ops only."""
    if size <= 1:
        return 0, 0
    if op == "broadcast":
        return (nbytes * (size - 1), 0) if rank == root else (0, nbytes)
    if op == "reduce":
        return (0, nbytes * (size - 1)) if rank == root else (nbytes, 0)
    num, den = _share(op, size)  # integers: a byte count is exact, however large
    moved = nbytes * num // den
    return moved, moved


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30,
          "GB": 1 << 30}


def parse_size(text: str) -> int:
    """``4K`` -> 4096, ``64M`` -> 67108864 (binary units, as nccl-tests uses)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", text.upper())
    if not match:
        raise ConfigError("sizes", text, "sizes are bytes with an optional K, M or G suffix, "
                          "e.g. 4K,64K,1M")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_sizes(text: str) -> list[int]:
    """``4K,64K,1M`` -> their bytes (``parse_size``); a ConfigError names ``sizes`` when none."""
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise ConfigError("sizes", text, "give a comma-separated list, e.g. 4K,64K,1M")
    return sizes
