"""Notebook 04's study: gossip against allreduce, as in Assran et al., "Stochastic Gradient Push for
Distributed Deep Learning" (ICML 2019): consensus per topology, accuracy against time, bytes per step.

It has the shape of every study (``core``). The plan (``plan_study``) asks three questions of the same
``base`` (model, data, batch per rank, learning rate, seed), and a run two questions share (``sgp``
on the exponential graph at the full world size answers all three) is planned once:

- ``topologies``: the consensus algorithm on each graph, at the full world size;
- ``algorithms``: each algorithm on its default graph, at the full world size;
- ``world_sizes``: each algorithm on its default graph at each world size (a world an algorithm
  cannot run in, AD-PSGD's bipartite graph on an odd number of ranks, is skipped and said so).

``run_study`` runs what is missing through the shared resumable loop into
``results/<host>/gossip/``: ``runs.csv``, one row per run (the run's summary, every config field
and metric with its provenance, with a ``topology`` column, ``"-"`` for algorithms without one), and
``evals.csv``, one row per evaluation (``step``, ``time_s``, ``accuracy``, ``loss`` and, for the
gossip methods, ``consensus_distance``) keyed by the run's ``run_id``. ``GossipRuns`` holds those two
tidy frames; ``GossipRuns.load`` reads them back, and ``gossip_plots`` draws the figures from them.

``GossipStudy`` asks the same questions one at a time (interactively, or from a test's stand-in for
a cluster): each method runs what it has not run yet and returns its ``GossipRuns``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import TrainConfig
from ..errors import ConfigError
from ..options import OPTIONS
from .core import Outcome, PlannedRun, StudyStore, cluster_for, run_plan, scalar_fields

NO_TOPOLOGY = "-"
RUN = ["algorithm", "topology", "world_size"]
TABLE_COLUMNS = [*RUN, "samples_per_s", "test_accuracy", "final_consensus_distance",
                 "bytes_sent_per_step", "bytes_received_per_step"]
EVAL_COLUMNS = [*RUN, "step", "time_s", "loss", "accuracy", "consensus_distance"]
#: The study's companion table, beside runs.csv.
TABLES = ("evals",)


def topologies_of(algorithm: str) -> tuple[str, ...]:
    """The gossip graphs ``algorithm`` accepts (empty for one that has no graph, e.g. allreduce)."""
    if algorithm not in OPTIONS:
        raise ConfigError("algorithm", algorithm, "choose one of " + ", ".join(sorted(OPTIONS)))
    fields = {f.name: f for f in dataclasses.fields(OPTIONS[algorithm])}
    if "topology" not in fields:
        return ()
    hint = typing.get_type_hints(OPTIONS[algorithm])["topology"]
    return typing.get_args(hint)


def default_topology(algorithm: str) -> str:
    """The graph ``algorithm`` gossips over by default, or ``NO_TOPOLOGY``."""
    if not topologies_of(algorithm):
        return NO_TOPOLOGY
    return OPTIONS[algorithm]().topology


def run_config(base: Mapping[str, Any], algorithm: str, topology: str = NO_TOPOLOGY) -> TrainConfig:
    """``base`` with ``algorithm`` on ``topology`` (its default when ``NO_TOPOLOGY``); a
    ConfigError names the graphs the algorithm accepts."""
    choices = topologies_of(algorithm)
    if topology != NO_TOPOLOGY and topology not in choices:
        raise ConfigError("topology", topology,
                          f"{algorithm} gossips over " + (", ".join(choices) if choices else
                                                          "no graph: give topology '-'"))
    topology = default_topology(algorithm) if topology == NO_TOPOLOGY else topology
    options = {"topology": topology} if choices else None
    return TrainConfig.from_dict({**dict(base), "algorithm": algorithm, "options": options})


def topology(config: TrainConfig) -> str:
    return getattr(config.options, "topology", NO_TOPOLOGY)


def planned_run(config: TrainConfig, world_size: int) -> PlannedRun:
    """A run of the study loop, labelled as the log and the figures name it."""
    graph = topology(config)
    name = config.algorithm if graph == NO_TOPOLOGY else f"{config.algorithm} ({graph})"
    return PlannedRun(config, world_size, 0, columns={"topology": graph},
                      label=f"{name} on {world_size} rank(s)")


# -- the plan: three questions ---------------------------------------------------------------------

Planned = list[tuple[TrainConfig, int]]


def _check_size(world_size: int, max_world_size: int) -> None:
    if not 1 <= world_size <= max_world_size:
        raise ConfigError("world_size", world_size,
                          f"this cluster has {max_world_size} engines: use 1 to "
                          f"{max_world_size}, or start the cluster with more")


def _check(base: Mapping[str, Any], algorithm: str, topology_: str, world_size: int,
           max_world_size: int) -> TrainConfig:
    _check_size(world_size, max_world_size)
    config = run_config(base, algorithm, topology_)
    config.options.roles(world_size)  # a graph that does not fit this world: ConfigError now
    return config


def plan_topologies(base: Mapping[str, Any], topologies: Sequence[str], algorithm: str,
                    world_size: int, max_world_size: int) -> Planned:
    """``algorithm`` on each graph in ``topologies``, at ``world_size``."""
    return [(_check(base, algorithm, t, world_size, max_world_size), world_size) for t in topologies]


def plan_algorithms(base: Mapping[str, Any], algorithms: Sequence[str], world_size: int,
                    max_world_size: int) -> Planned:
    """Each algorithm on its default graph at ``world_size``."""
    return [(_check(base, a, NO_TOPOLOGY, world_size, max_world_size), world_size) for a in algorithms]


def plan_world_sizes(base: Mapping[str, Any], algorithms: Sequence[str], world_sizes: Sequence[int],
                     max_world_size: int) -> tuple[Planned, list[str]]:
    """Each algorithm on its default graph at each world size, and what was skipped: a world an
    algorithm cannot run in (AD-PSGD's bipartite graph on an odd number of ranks), said so."""
    planned, skipped = [], []
    for algorithm in algorithms:
        run_config(base, algorithm)  # a bad name or base fails here, not skipped
        for n in world_sizes:
            _check_size(n, max_world_size)  # past the cluster: an error, not a skip
            try:
                planned.append((_check(base, algorithm, NO_TOPOLOGY, n, max_world_size), n))
            except ConfigError as exc:  # a world the algorithm cannot run in
                skipped.append(f"{algorithm} on {n} rank(s): {exc}")
    return planned, skipped


@dataclass(frozen=True)
class GossipPlan:
    """Every run of the study's three questions, each once, checked before anything runs."""

    base: dict[str, Any]
    engines: int  # the full world size, the cluster's size
    planned: tuple[tuple[TrainConfig, int], ...]
    skipped: tuple[str, ...] = ()

    def runs(self) -> list[PlannedRun]:
        return [planned_run(config, n) for config, n in self.planned]

    def table(self) -> pd.DataFrame:
        """What will run, one row per run: algorithm, graph, ranks, run id (here, at this commit)."""
        return pd.DataFrame([{"algorithm": run.algorithm, "topology": run.columns["topology"],
                              "world_size": run.world_size, "run_id": run.run_id}
                             for run in self.runs()], columns=[*RUN, "run_id"])


def plan_study(base: Mapping[str, Any], *, engines: int,
               algorithms: Sequence[str] = ("sgp", "osgp", "dpsgd", "adpsgd", "allreduce"),
               topologies: Sequence[str] = ("exponential", "ring", "complete"),
               consensus_algorithm: str = "sgp",
               world_sizes: Sequence[int] = (2, 3, 4)) -> GossipPlan:
    """The study's plan: ``consensus_algorithm`` on each of ``topologies`` and each of ``algorithms``
    at ``engines`` ranks, and each of ``algorithms`` at each of ``world_sizes``."""
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise ConfigError("engines", engines, "give the full world size, a whole number >= 1")
    sizes, skipped = plan_world_sizes(base, algorithms, world_sizes, engines)
    planned: dict[tuple[str, str, int], tuple[TrainConfig, int]] = {}
    for config, n in (plan_topologies(base, topologies, consensus_algorithm, engines, engines)
                      + plan_algorithms(base, algorithms, engines, engines) + sizes):
        planned.setdefault((config.algorithm, topology(config), n), (config, n))
    return GossipPlan(dict(base), engines, tuple(planned.values()), tuple(skipped))


# -- the tidy frames ------------------------------------------------------------------------------


def _tidy(result: Any) -> tuple[dict[str, Any], pd.DataFrame]:
    """A ``RunResult`` as its row (the summary, led by algorithm, topology, world size) and its
    evaluations tagged with the same three."""
    key = {"algorithm": result.summary["algorithm"],
           "topology": result.summary.get("options.topology") or NO_TOPOLOGY,
           "world_size": int(result.summary["world_size"])}
    row = {**key, **{k: v for k, v in scalar_fields(result.summary).items() if k not in key}}
    return row, result.evals.assign(**key)


@dataclass(frozen=True)
class GossipRuns:
    """Runs of the study, as two tidy frames (see the module docstring), and the runs left out."""

    summary: pd.DataFrame
    evals: pd.DataFrame
    skipped: tuple[str, ...] = ()  # "adpsgd on 3 rank(s): <why>"

    @classmethod
    def from_frames(cls, summary: pd.DataFrame, evals: pd.DataFrame,
                    skipped: Sequence[str] = ()) -> GossipRuns:
        summary = summary.reset_index(drop=True)
        for column in TABLE_COLUMNS:
            if column not in summary:
                summary[column] = math.nan
        evals = evals if len(evals.columns) else pd.DataFrame(columns=EVAL_COLUMNS)
        for column in EVAL_COLUMNS:
            if column not in evals:
                evals[column] = math.nan
        order = EVAL_COLUMNS + [c for c in evals.columns if c not in EVAL_COLUMNS]
        return cls(summary, evals[order].sort_values([*RUN, "step"], ignore_index=True),
                   tuple(skipped))

    @classmethod
    def from_results(cls, results: Iterable[Any], skipped: Sequence[str] = ()) -> GossipRuns:
        """From ``RunResult``s (what ``ClusterSession.train`` returns)."""
        tidy = [_tidy(result) for result in results]
        summary = pd.DataFrame([row for row, _ in tidy], columns=None if tidy else TABLE_COLUMNS)
        evals = (pd.concat([frame for _, frame in tidy], ignore_index=True) if tidy
                 else pd.DataFrame(columns=EVAL_COLUMNS))
        return cls.from_frames(summary, evals, skipped)

    @classmethod
    def from_store(cls, store: StudyStore, run_ids: Sequence[str] | None = None,
                   skipped: Sequence[str] = ()) -> GossipRuns:
        """The runs ``run_ids`` of the store, in that order; without them, the rows of the commit
        measured last, the last run of each algorithm, graph and world size."""
        frames = store.read(run_ids)
        summary, evals = frames["runs"], frames["evals"]
        if run_ids is None and set(RUN) <= set(summary.columns):
            summary = summary.drop_duplicates(RUN, keep="last")
            if "run_id" in evals and "run_id" in summary:
                evals = evals[evals.run_id.isin(set(summary.run_id))]
        return cls.from_frames(summary, evals.reset_index(drop=True), skipped)

    @classmethod
    def load(cls, directory: str | Path) -> GossipRuns:
        """The study in ``directory`` from its CSVs alone (``runs.csv``, ``evals.csv``)."""
        missing = [f"{t}.csv" for t in ("runs", *TABLES) if not (Path(directory) / f"{t}.csv").is_file()]
        if missing:
            raise ConfigError("directory", str(directory),
                              f"no {', '.join(missing)} there; run_study writes them "
                              "(notebook 04 does, into results/<host>/gossip)")
        return cls.from_store(StudyStore(directory, TABLES))

    def save(self, folder: str | Path | None) -> list[Path]:
        """Write ``runs.csv`` and ``evals.csv`` into ``folder`` (nothing when it is None): a snapshot
        of runs held in memory. ``run_study`` writes its directory run by run."""
        if folder is None:
            return []
        from ..checkpoint import atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / "runs.csv", folder / "evals.csv"]
        atomic_write_text(paths[0], self.summary.drop(columns="config", errors="ignore")
                          .to_csv(index=False))
        atomic_write_text(paths[1], self.evals.to_csv(index=False))
        return paths


# -- running --------------------------------------------------------------------------------------

Train = Callable[[TrainConfig, int], Any]  # (config, world_size) -> RunResult


@dataclass
class GossipStudy:
    """Runs ``base`` with each algorithm, graph and world size asked for, each combination once.

    ``train`` is how a run happens: ``ClusterSession.train`` (``GossipStudy.on(cluster, base)``).
    Every configuration a method asks for is checked before the first of its runs starts. With a
    ``store`` on a directory, every run is added to its CSVs as it finishes, and a run already
    there (this host, this commit) is not run again."""

    train: Train
    base: dict[str, Any]
    max_world_size: int
    log: Callable[[str], None] = print
    #: Before the first run, train a few steps of sgp on the complete graph on every engine,
    #: unrecorded: a fresh engine's first job pays for imports, loading the data and opening its
    #: connections to every peer, which would otherwise land in the first run's times.
    warm_up: bool = True
    store: StudyStore = field(default_factory=lambda: StudyStore(tables=TABLES))
    #: (algorithm, topology, world size) -> run id, of every run this study made or found
    runs: dict[tuple[str, str, int], str] = field(default_factory=dict)
    warmed: bool = field(default=False, init=False)

    @classmethod
    def on(cls, cluster, base: Mapping[str, Any], log: Callable[[str], None] = print,
           store: StudyStore | None = None) -> GossipStudy:
        return cls(cluster.train, dict(base), cluster.size, log,
                   store=store if store is not None else StudyStore(tables=TABLES))

    def _warm_up(self) -> None:
        warm = {**{k: v for k, v in self.base.items() if k != "epochs"}, "steps": 5,
                "warmup_steps": 1, "eval_every": 0, "output_dir": None,
                "checkpoint_dir": None, "checkpoint_every": 0, "resume": None}
        self.train(run_config(warm, "sgp", "complete"), self.max_world_size)
        self.warmed = True

    def _measure(self, run: PlannedRun) -> Outcome:
        result = self.train(run.config, run.world_size)
        row, evals = _tidy(result)
        return Outcome(row, {"evals": evals},
                       note=f"test accuracy {row['test_accuracy']:.3f}, "
                            f"{row['samples_per_s']:.0f} samples/s, "
                            f"{row['bytes_sent_per_step'] / 1e3:.1f} kB sent per rank per step")

    def _run(self, planned: Planned, skipped: Sequence[str] = ()) -> GossipRuns:
        runs = [planned_run(config, n) for config, n in planned]
        todo: dict[str, PlannedRun] = {}
        for run in runs:
            key = (run.algorithm, run.columns["topology"], run.world_size)
            if key not in self.runs:
                todo.setdefault(run.run_id, run)
        warm = self._warm_up if self.warm_up and not self.warmed else None
        run_plan(list(todo.values()), self.store, self._measure, log=self.log, before_first=warm)
        for run in runs:
            self.runs[(run.algorithm, run.columns["topology"], run.world_size)] = run.run_id
        for line in skipped:
            self.log("skipped " + line)
        return GossipRuns.from_store(self.store, [run.run_id for run in runs], skipped)

    def topologies(self, topologies: Sequence[str], algorithm: str = "sgp",
                   world_size: int | None = None) -> GossipRuns:
        """``algorithm`` on each graph in ``topologies``, at ``world_size`` (default: every engine)."""
        world_size = world_size or self.max_world_size
        return self._run(plan_topologies(self.base, topologies, algorithm, world_size,
                                         self.max_world_size))

    def algorithms(self, algorithms: Sequence[str], world_size: int | None = None) -> GossipRuns:
        """Each algorithm on its default graph at ``world_size`` (default: every engine)."""
        world_size = world_size or self.max_world_size
        return self._run(plan_algorithms(self.base, algorithms, world_size, self.max_world_size))

    def world_sizes(self, algorithms: Sequence[str], world_sizes: Sequence[int]) -> GossipRuns:
        """Each algorithm on its default graph at each world size; a world an algorithm cannot run
        in (AD-PSGD's bipartite graph on an odd number of ranks) is skipped and said so."""
        return self._run(*plan_world_sizes(self.base, algorithms, world_sizes, self.max_world_size))

    def run(self, plan: GossipPlan) -> GossipRuns:
        """Every run of ``plan`` this study has not made yet."""
        return self._run(list(plan.planned), plan.skipped)

    def everything(self) -> GossipRuns:
        """Every run made so far, once each."""
        return GossipRuns.from_store(self.store, list(self.runs.values()))


def measure_plan(plan: GossipPlan, out: str | Path, *, profile: str = "local-mpi", fresh: bool = False,
                 log: Callable[[str], None] = print) -> GossipRuns:
    """The runs of ``plan`` missing from the study in ``out`` (all of them if ``fresh``) on a
    cluster of ``plan.engines`` engines of the profile, started only if some are missing; returns
    the plan's runs as the CSVs in ``out`` hold them."""
    store = StudyStore(out, TABLES)
    runs = plan.runs()
    with cluster_for(runs, store, profile=profile, engines=plan.engines, fresh=fresh,
                     log=log) as cluster:
        if cluster is None:
            return GossipRuns.from_store(store, [run.run_id for run in runs], plan.skipped)
        if fresh:
            store.clear()
        return GossipStudy.on(cluster, plan.base, log, store=store).run(plan)
