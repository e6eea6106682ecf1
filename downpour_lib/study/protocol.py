"""What every study is, and the one way to run one: ``run_study(study)``.

A ``Study`` has a name (its results directory: ``results/<host>/<name>/``) and four parts, the
stages every study goes through:

- ``plan()``: the runs, checked in full before anything runs (bad input fails here, naming the
  field, before a process starts; ``run_study`` then imports your own model and data functions
  and reads their signatures, once);
- ``measure(fresh, log)``: the runs missing from its CSVs (all of them if ``fresh``), each a row,
  through the shared resumable loop (``core.run_plan``);
- ``tables()``: the plan's runs as its CSVs hold them (a frame, or the study's results object);
- ``figures()``: its figures, from the CSVs alone, saved as PNGs; returns their paths.

``studies`` has them all (``Scaling``, ``Staleness``, ``Gossip``, ``Accuracy``, ``TimeToLoss``);
``downpour study`` and the notebooks call ``run_study`` on one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .core import PlannedRun


@runtime_checkable
class Study(Protocol):
    name: str  # "scaling", "staleness", "gossip", "accuracy" or "lm": its directory under results/<host>/

    def plan(self) -> Sequence[PlannedRun]: ...

    def measure(self, fresh: bool = False, log: Callable[[str], None] = print) -> None: ...

    def tables(self) -> Any: ...

    def figures(self) -> list[Path]: ...


def run_study(study: Study, *, fresh: bool = False, figures: bool = False,
              log: Callable[[str], None] = print) -> Any:
    """Plan ``study`` (checked before anything runs), measure what its CSVs lack (everything if
    ``fresh``), with ``figures`` redraw its figures from the CSVs; returns ``study.tables()``."""
    from ..notebooks import show_errors_in_one_line

    show_errors_in_one_line()  # the helper a study notebook calls first
    if not isinstance(study, Study):
        raise TypeError(f"run_study takes a Study (studies.Scaling, Staleness, Gossip, Accuracy, "
                        f"TimeToLoss), not {type(study).__name__}")
    from .. import user_code

    for model, dataset in dict.fromkeys((run.config.model, run.config.data.dataset)
                                        for run in study.plan()):
        user_code.check(model, dataset)  # a function that cannot be called fails here, not each run
    study.measure(fresh=fresh, log=log)
    if figures:
        for path in study.figures():
            log(f"wrote {path}")
    return study.tables()
