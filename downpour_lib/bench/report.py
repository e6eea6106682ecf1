"""What the `downpour bench` commands that launch training runs share around those runs: the exit
code for bad input (2, before anything launched) and for a failed run (1), the table, the JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from ..checkpoint import atomic_write_text
from ..errors import ConfigError, DownpourError

# What the training benches (train, emulated) default alike, each written once here; the per-worker
# batch is the config's own default (``Data.batch_size``).
#: a data set every machine has, of CIFAR's shape (throughput only)
DATASET = "synthetic-cifar"
#: first steps left out of throughput: the allocator and the caches settle over them
WARMUP_STEPS = 10
#: torch threads per rank: one, so ranks on one machine do not fight for its cores
THREADS = 1

Rows = list[dict[str, Any]]


def print_columns(cells: list[tuple[str, ...]]) -> None:
    """Rows of text cells, the first the header, each column as wide as its widest cell."""
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def run_command(name: str, launch: Callable[[], Rows], report: Callable[[Rows], None],
                json_path: str | None) -> int:
    """``launch()`` (its checks first, then the runs), then ``report`` the rows and write them to
    ``json_path``; the exit code of `downpour bench <name>`."""
    try:
        rows = launch()
    except ConfigError as exc:
        print(f"downpour bench {name}: error: {exc}", file=sys.stderr)
        return 2
    except DownpourError as exc:  # a run that failed (RunFailed), no mpiexec, ...
        print(f"downpour bench {name}: {exc}", file=sys.stderr)
        return 1
    report(rows)
    if json_path:
        atomic_write_text(json_path, json.dumps(rows, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")
    return 0
