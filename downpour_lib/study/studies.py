"""The studies as ``protocol.Study``: what ``downpour study`` and notebooks 02 to 05 and 07 hand to
``run_study``. Each wraps its module's plan and measurement (``scaling``, ``staleness``, ``gossip``,
``accuracy``) and its figures (``*_plots``); it lives here, not in its module, because the figures
import the study's module (a study module importing its figures would close a circle).

    from downpour_lib.study.studies import Staleness, run_study
    measured = run_study(Staleness(plan, out, target_accuracy=0.9), fresh=False)
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ..cluster.mpiexec import mpiexec_launch
from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from ..options import coerce
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
from .core import PlannedRun, StudyStore, cluster_for, read_runs_csv
from .protocol import Study, run_study

__all__ = ["Accuracy", "Gossip", "Scaling", "Staleness", "Study", "TimeToLoss", "run_study"]


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
        return self._measured if self._measured is not None else read_runs_csv(self.spec.csv)

    def figures(self) -> list[Path]:
        return scaling_plots.make_figures(self.spec.csv, Path(self.spec.csv).parent / "figures",
                                          self.spec.workload())


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
    timeout_s: float = RUN_TIMEOUT_S
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


@dataclass
class TimeToLoss(Accuracy):
    """The same study to a language model's validation loss (``accuracy.plan_study(...,
    metric="loss")``, notebook 07): its own directory, ``results/<host>/lm/``."""

    name: ClassVar[str] = "lm"


#: study name -> its class (the names ``core.STUDIES`` lists)
STUDY_CLASSES: dict[str, type] = {cls.name: cls for cls in (Scaling, Staleness, Gossip, Accuracy,
                                                            TimeToLoss)}


def emulated_variant(entry: str) -> tuple[str, dict[str, Any]]:
    """An emulated sweep's algorithm entry: a name (``"sync_ps"``), or a name with options of its
    own, ``"name:option=value,..."`` (``"sync_ps:servers=2"``: sharded over two servers), so one
    algorithm can be swept in two settings side by side."""
    from ..options import OPTIONS

    name, _, rest = entry.partition(":")
    if name not in OPTIONS:
        raise ConfigError("emulated_algorithms", entry, "an algorithm (" + ", ".join(OPTIONS)
                          + "), optionally with options: 'sync_ps:servers=2'")
    hints = typing.get_type_hints(OPTIONS[name])
    opts: dict[str, Any] = {}
    for pair in (p.strip() for p in rest.split(",") if p.strip()):
        key, eq, value = (s.strip() for s in pair.partition("="))
        if not eq or key not in hints:
            raise ConfigError("emulated_algorithms", entry, f"options of {name} as key=value: "
                              + ", ".join(hints) + " (e.g. 'sync_ps:servers=2')")
        opts[key] = coerce(key, hints[key], value, text=True)
    return name, opts


def run_emulated_sweep(algorithms: Sequence[str], workers: Sequence[int],
                       step_s: Sequence[float | None], overrides: dict | None = None,
                       options: dict | None = None, *, csv: str | os.PathLike,
                       repeats: int = 1, profile: str | None = "local-mpi",
                       links: Sequence[str] = (), sandbox_dir: str | os.PathLike | None = None,
                       log: Callable[[str], None] = print) -> str:
    """Notebook 02's sweep past the cores: ``algorithms`` (names, or ``emulated_variant``'s
    ``"sync_ps:servers=2"``) x ``workers`` under emulated compute, once for each compute time in
    ``step_s`` (None: this machine's own, timed), into ``csv`` beside the real runs, where each is
    a series of its own (``core.with_series``). Every run is planned and checked first.

    With ``links`` (e.g. ``["10gbit", "1gbit"]``) and a process that can make the multi-node Slurm
    sandbox (root, Slurm), the sweep runs there once per link rate (``emulated_sandbox``: 4 ranks
    a host, each host's link shaped to the rate), each run's row saying ``where`` it ran
    (``sandbox 1gbit``); otherwise, or without ``links``, on this machine's ranks (``where``:
    ``local``): all on one cluster of ``profile`` (its engines import torch once for the whole
    sweep), or each under mpiexec when ``profile`` is None. Returns where it ran (``sandbox`` or
    ``local``; ``none`` when ``workers`` or ``step_s`` is empty, and nothing ran), and logs why
    (``emulated_where`` says it in a sentence). ``options`` may name more algorithms (the real
    sweep's)."""
    from . import emulated_sandbox

    links = emulated_sandbox.check_links(links)
    entries = [emulated_variant(entry) for entry in algorithms]
    # the plain names share one spec (its repeats interleave over them); each variant has its own
    groups = [[(n, o) for n, o in entries if not o]] + [[(n, o)] for n, o in entries if o]
    why_not = emulated_sandbox.unavailable() if links and workers else None
    places = [emulated_sandbox.where(link) for link in links] if links and not why_not else ["local"]
    specs: dict[str, list[scaling.StudySpec]] = {place: [] for place in places}
    for place in places:
        for seconds in step_s if workers else ():
            emulated = {"steps": scaling.EMULATED_STEPS, **(overrides or {}), "compute": "emulated",
                        "emulated_step_s": seconds}
            for group in (g for g in groups if g):
                opts = {name: {**scaling.EMULATED_OPTIONS.get(name, {}),
                               **(options or {}).get(name, {}), **own} for name, own in group}
                specs[place].append(scaling.study_spec(
                    [name for name, _ in group], workers, emulated, opts, csv=csv,
                    repeats=repeats, columns={"where": place}))
    planned = [run for group in specs.values() for spec in group for run in spec.planned()]
    if not planned:  # every check before any run
        return "none"
    store = StudyStore.of_csv(csv)
    if places != ["local"]:
        return _sweep_on_sandbox(specs, planned, store, sandbox_dir, log)
    if why_not:
        log(f"emulated sweep: on this machine's ranks, not the sandbox's links ({why_not})")
    if profile is None:
        log(f"emulated sweep: {len(planned)} run(s), each under mpiexec on this machine's ranks")
        for spec in specs["local"]:
            scaling.measure_spec(spec, log=log)
        return "local"
    with cluster_for(planned, store, profile=profile, log=log) as cluster:
        if cluster is None:
            return "local"
        log(f"emulated sweep: on the engines of one {profile} cluster ("
            + ("ranks of this machine" if profile == "local-mpi" else "the profile's hosts")
            + ")")
        for spec in specs["local"]:
            scaling.measure_spec(spec, log=log, launch=cluster.launch, own_pids=cluster.local_pids)
    return "local"


def emulated_where(ran_on: str, links: Sequence[str] = (), profile: str | None = "local-mpi") -> str:
    """Where ``run_emulated_sweep``'s points ran (its answer, ``ran_on``), in a sentence."""
    if ran_on == "none":
        return "no emulated points: the sweep's workers or step times are empty (emulated_workers=[])"
    if ran_on == "sandbox":
        return "the emulated points ran on the multi-node sandbox, at " + ", ".join(links)
    ranks = ("this machine's ranks" if profile in (None, "local-mpi")
             else f"the engines of the {profile} cluster")
    return f"the emulated points ran on {ranks} (the CSV's `where`: local)"


def _sweep_on_sandbox(specs: dict[str, list[scaling.StudySpec]], planned: Sequence[PlannedRun],
                      store: StudyStore, sandbox_dir: str | os.PathLike | None,
                      log: Callable[[str], None]) -> str:
    """Each link rate's runs across the sandbox's hosts, the links shaped to it first."""
    from . import emulated_sandbox

    done = store.done()
    if all(run.run_id in done for run in planned):
        log(f"all {len(planned)} runs are already in {store}; nothing to run")
        return "sandbox"
    nodes = emulated_sandbox.nodes_for(max(run.world_size for run in planned))
    log(f"emulated sweep: on the multi-node Slurm sandbox, {emulated_sandbox.RANKS_PER_NODE} ranks "
        f"a host, up to {nodes} hosts, at " + ", ".join(p.split()[-1] for p in specs))
    with emulated_sandbox.SandboxLaunch(nodes, sandbox_dir, log=log) as sandbox:
        for place, group in specs.items():
            if all(run.run_id in done for spec in group for run in spec.planned()):
                continue
            sandbox.shape(place.split()[-1])
            for spec in group:
                scaling.measure_spec(spec, log=log, launch=sandbox)
    return "sandbox"
