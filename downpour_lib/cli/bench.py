"""``downpour bench <name>``: one subcommand per benchmark module, registered in ``BENCHMARKS``.

A benchmark module (``downpour_lib/bench/NAME.py``) exposes ``add_parser(sub)``, which adds its
subcommand and sets ``func``.
"""

from __future__ import annotations

import argparse
import importlib

from . import summary

#: module names under downpour_lib.bench that provide a ``downpour bench`` subcommand
BENCHMARKS: list[str] = ["collectives", "train", "gpu", "engines", "emulated"]


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    if not BENCHMARKS:
        return
    from .._torch_import import import_torch

    import_torch(training=False)  # every benchmark module imports torch: with the GC paused
    p = sub.add_parser("bench", help=summary("bench"))
    bench = p.add_subparsers(dest="benchmark", required=True)
    for name in BENCHMARKS:
        importlib.import_module(f"downpour_lib.bench.{name}").add_parser(bench)
