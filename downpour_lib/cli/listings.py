"""``downpour models`` and ``downpour datasets``: the registries, one line each."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from . import summary


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import MODELS, build_shaped, parameter_count

    rows = []
    for spec in MODELS.values():
        # shapes only: GPT-2's and ResNet-152's weights are not drawn to be counted
        model = build_shaped(spec.name, spec.default_input, spec.default_classes)
        shape = "x".join(map(str, spec.default_input))
        rows.append((spec.name, f"{parameter_count(model):,}", f"{shape}/{spec.default_classes}",
                     spec.description))
    _table(("model", "parameters", "input/classes", "description"), rows)
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from ..data import DATASETS

    rows = [(s.name, s.kind, "x".join(map(str, s.input_shape)), s.num_classes or "from files",
             s.train_size or "-", s.test_size or "-", s.description) for s in DATASETS.values()]
    _table(("dataset", "kind", "input", "classes", "train", "test", "description"), rows)
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help=summary("models")).set_defaults(func=cmd_models)


def add_datasets_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("datasets", help=summary("datasets")).set_defaults(func=cmd_datasets)

