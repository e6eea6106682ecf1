"""The four studies as ``protocol.Study``: what ``downpour study`` and notebooks 02 to 05 hand to
``run_study``. Each wraps its module's plan and measurement (``scaling``, ``staleness``, ``gossip``,
``accuracy``) and its figures (``*_plots``); it lives here, not in its module, because the figures
import the study's module (a study module importing its figures would close a circle).

    from downpour_lib.study.studies import Staleness, run_study
    measured = run_study(Staleness(plan, out, target_accuracy=0.9), fresh=False)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from . import (
    accuracy,
    accuracy_plots,
    gossip,
    gossip_plots,
    scaling,
    scaling_plots,
    staleness,
    staleness_plots,
)
from .core import PlannedRun, StudyStore, mpiexec_launch
from .protocol import Study, run_study

__all__ = ["Accuracy", "Gossip", "Scaling", "Staleness", "Study", "run_study"]


@dataclass
class Scaling:
    """The scaling study of ``spec``: each run under mpiexec (``launch``, what ``downpour study``
    does), or with a ``profile`` on the engines of one cluster of it, started for the runs missing
    and sized to the largest of them (or ``engines``)."""

    spec: scaling.StudySpec
    profile: str | None = None
    engines: int | None = None
    launch: scaling.Launch = mpiexec_launch
    own_pids: Callable[[], Iterable[int]] | None = None  # the launcher's processes (load columns)
    name: ClassVar[str] = "scaling"
    _measured: pd.DataFrame | None = field(default=None, init=False, repr=False)

    def plan(self) -> list[PlannedRun]:
        return self.spec.planned()

    def measure(self, fresh: bool = False, log: Callable[[str], None] = print) -> None:
        if self.profile is None:
            self._measured = scaling.measure_spec(self.spec, fresh, log, self.launch, self.own_pids)
        else:
            self._measured = scaling.measure_spec_on_cluster(self.spec, self.profile, self.engines,
                                                             fresh, log)

    def tables(self) -> pd.DataFrame:
        return self._measured if self._measured is not None else pd.read_csv(self.spec.csv)

    def figures(self) -> list[Path]:
        return scaling_plots.make_figures(self.spec.csv, Path(self.spec.csv).parent / "figures")


@dataclass
class Staleness:
    """Downpour against sync_ps (``staleness.plan_variants``), into ``out``, on a cluster of the
    profile started only if runs are missing."""

    variants: Sequence[staleness.Variant]
    out: str | os.PathLike
    target_accuracy: float = 0.9
    profile: str = "local-mpi"
    engines: int | None = None
    timeout_s: float | None = None
    name: ClassVar[str] = "staleness"
    _measured: staleness.StalenessStudy | None = field(default=None, init=False, repr=False)

    def plan(self) -> list[PlannedRun]:
        staleness.cluster_size(self.variants, self.engines)
        return [staleness.planned_run(v, self.target_accuracy) for v in self.variants]

    def measure(self, fresh: bool = False, log: Callable[[str], None] = print) -> None:
        self._measured = staleness.measure_plan(
            self.variants, self.out, self.target_accuracy, profile=self.profile,
            engines=self.engines, fresh=fresh, timeout_s=self.timeout_s, log=log)

    def tables(self) -> staleness.StalenessStudy:
        if self._measured is not None:
            return self._measured
        store = StudyStore(self.out, staleness.TABLES)
        return staleness.StalenessStudy.from_store(store, [run.run_id for run in self.plan()])

    def figures(self) -> list[Path]:
        return staleness_plots.make_figures(self.out)


@dataclass
class Gossip:
    """The gossip study's three questions (``gossip.plan_study``), into ``out``, on a cluster of
    ``planned.engines`` engines of the profile, started only if runs are missing."""

    planned: gossip.GossipPlan
    out: str | os.PathLike
    profile: str = "local-mpi"
    name: ClassVar[str] = "gossip"
    _measured: gossip.GossipRuns | None = field(default=None, init=False, repr=False)

    def plan(self) -> list[PlannedRun]:
        return self.planned.runs()

    def measure(self, fresh: bool = False, log: Callable[[str], None] = print) -> None:
        self._measured = gossip.measure_plan(self.planned, self.out, profile=self.profile,
                                             fresh=fresh, log=log)

    def tables(self) -> gossip.GossipRuns:
        if self._measured is not None:
            return self._measured
        store = StudyStore(self.out, gossip.TABLES)
        return gossip.GossipRuns.from_store(store, [run.run_id for run in self.plan()],
                                            self.planned.skipped)

    def figures(self) -> list[Path]:
        return gossip_plots.make_figures(self.out)


@dataclass
class Accuracy:
    """Time to accuracy (``accuracy.plan_study``), into ``out``: each run on local ranks or on
    the multi-node Slurm sandbox (``sandbox_dir``), as its setting says."""

    runs: Sequence[PlannedRun]
    out: str | os.PathLike
    sandbox_dir: str | os.PathLike | None = None
    timeout_s: float = 900.0
    name: ClassVar[str] = "accuracy"

    def plan(self) -> list[PlannedRun]:
        return list(self.runs)

    def measure(self, fresh: bool = False, log: Callable[[str], None] = print) -> None:
        accuracy.measure_plan(self.runs, self.out, fresh=fresh, sandbox_dir=self.sandbox_dir,
                              timeout_s=self.timeout_s, log=log)

    def tables(self) -> accuracy_plots.AccuracyStudy:
        return accuracy_plots.AccuracyStudy.load(self.out)

    def figures(self) -> list[Path]:
        return accuracy_plots.make_figures(self.out)


#: study name -> its class (the names ``core.STUDIES`` lists)
STUDY_CLASSES: dict[str, type] = {cls.name: cls for cls in (Scaling, Staleness, Gossip, Accuracy)}


def run_emulated_sweep(algorithms: Sequence[str], workers: Sequence[int],
                       step_s: Sequence[float | None], overrides: dict | None = None,
                       options: dict | None = None, *, csv: str | os.PathLike,
                       repeats: int = 1, profile: str | None = "local-mpi") -> None:
    """Notebook 02's sweep past the cores: ``algorithms`` x ``workers`` under emulated compute,
    once for each compute time in ``step_s`` (None: this machine's own, timed), into ``csv`` beside
    the real runs, where each is a series of its own (``scaling_plots.with_series``). Nothing
    runs when ``workers`` is empty. ``options`` may name more algorithms (the real sweep's)."""
    options = {name: o for name, o in (options or {}).items() if name in algorithms}
    for seconds in step_s if workers else ():
        emulated = {**(overrides or {}), "compute": "emulated", "emulated_step_s": seconds}
        spec = scaling.study_spec(algorithms, workers, emulated, options, csv=csv, repeats=repeats)
        run_study(Scaling(spec, profile=profile))
