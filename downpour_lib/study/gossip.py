"""Notebook 04: gossip against allreduce, as in Assran et al., "Stochastic Gradient Push for
Distributed Deep Learning" (ICML 2019): consensus per topology, accuracy against time, bytes per step.

``GossipStudy`` runs configurations on a cluster's engines and keeps every run it made, so a run
that two questions share (``sgp`` on the exponential graph at the full world size answers all
three) happens once. Each question is one method that returns a ``GossipRuns``, two tidy frames:

- ``summary``: one row per run, the run's summary (every config field and metric, as ``downpour
  train --summary-json`` writes it) with a ``topology`` column (``"-"`` for algorithms without one);
- ``evals``: one row per evaluation of a run (``step``, ``time_s``, ``accuracy``, ``loss`` and, for
  the gossip methods, ``consensus_distance``), with the run's ``algorithm``, ``topology`` and
  ``world_size``.

Everything compared runs with the same model, data, batch per worker, learning rate and seed (the
study's ``base``); only the algorithm, its graph and the number of ranks change. The figures and the
table are made from ``GossipRuns`` alone and return matplotlib ``Figure``s built without pyplot.
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

from ..algorithms import ALGORITHMS
from ..config import TrainConfig, check_world
from ..errors import ConfigError
from .plots import figure_row

NO_TOPOLOGY = "-"
RUN = ["algorithm", "topology", "world_size"]
TABLE_COLUMNS = [*RUN, "samples_per_s", "test_accuracy", "final_consensus_distance",
                 "bytes_sent_per_step", "bytes_received_per_step"]
EVAL_COLUMNS = [*RUN, "step", "time_s", "loss", "accuracy", "consensus_distance"]


def topologies_of(algorithm: str) -> tuple[str, ...]:
    """The gossip graphs ``algorithm`` accepts (empty for one that has no graph, e.g. allreduce)."""
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, "choose one of " + ", ".join(sorted(ALGORITHMS)))
    fields = {f.name: f for f in dataclasses.fields(ALGORITHMS[algorithm].Options)}
    if "topology" not in fields:
        return ()
    hint = typing.get_type_hints(ALGORITHMS[algorithm].Options)["topology"]
    return typing.get_args(hint)


def default_topology(algorithm: str) -> str:
    """The graph ``algorithm`` gossips over by default, or ``NO_TOPOLOGY``."""
    if not topologies_of(algorithm):
        return NO_TOPOLOGY
    return ALGORITHMS[algorithm].Options().topology


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


@dataclass(frozen=True)
class GossipRuns:
    """Runs of the study, as two tidy frames (see the module docstring), and the runs left out."""

    summary: pd.DataFrame
    evals: pd.DataFrame
    skipped: tuple[str, ...] = ()  # "adpsgd on 3 ranks: <why>"

    @classmethod
    def from_results(cls, results: Iterable[Any], skipped: Sequence[str] = ()) -> GossipRuns:
        """From ``RunResult``s (what ``ClusterSession.train`` returns)."""
        rows, evals = [], []
        for result in results:
            key = {"algorithm": result.summary["algorithm"],
                   "topology": result.summary.get("options.topology") or NO_TOPOLOGY,
                   "world_size": int(result.summary["world_size"])}
            rows.append({**key, **{k: v for k, v in result.summary.items() if k not in key}})
            evals.append(result.evals.assign(**key))
        summary = pd.DataFrame(rows, columns=None if rows else TABLE_COLUMNS)
        for column in TABLE_COLUMNS:
            if column not in summary:
                summary[column] = math.nan
        frame = pd.concat(evals, ignore_index=True) if evals else pd.DataFrame(columns=EVAL_COLUMNS)
        for column in EVAL_COLUMNS:
            if column not in frame:
                frame[column] = math.nan
        order = EVAL_COLUMNS + [c for c in frame.columns if c not in EVAL_COLUMNS]
        return cls(summary, frame[order].sort_values([*RUN, "step"], ignore_index=True),
                   tuple(skipped))

    def save(self, folder: str | Path | None) -> list[Path]:
        """Write ``runs.csv`` and ``evals.csv`` into ``folder`` (nothing when it is None)."""
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


Train = Callable[[TrainConfig, int], Any]  # (config, world_size) -> RunResult


@dataclass
class GossipStudy:
    """Runs ``base`` with each algorithm, graph and world size asked for, each combination once.

    ``train`` is how a run happens: ``ClusterSession.train`` (``GossipStudy.on(cluster, base)``).
    Every configuration a method asks for is checked before the first of its runs starts."""

    train: Train
    base: dict[str, Any]
    max_world_size: int
    log: Callable[[str], None] = print
    #: Before the first run, train a few steps of sgp on the complete graph on every engine,
    #: unrecorded: a fresh engine's first job pays for imports, loading the data and opening its
    #: connections to every peer, which would otherwise land in the first run's times.
    warm_up: bool = True
    results: dict[tuple[str, str, int], Any] = field(default_factory=dict)
    warmed: bool = field(default=False, init=False)

    @classmethod
    def on(cls, cluster, base: Mapping[str, Any], log: Callable[[str], None] = print) -> GossipStudy:
        return cls(cluster.train, dict(base), cluster.size, log)

    def _check(self, algorithm: str, topology: str, world_size: int) -> TrainConfig:
        if not 1 <= world_size <= self.max_world_size:
            raise ConfigError("world_size", world_size,
                              f"this cluster has {self.max_world_size} engines: use 1 to "
                              f"{self.max_world_size}, or start the cluster with more")
        config = run_config(self.base, algorithm, topology)
        check_world(config, world_size)
        return config

    def _run(self, planned: list[tuple[TrainConfig, int]], skipped: Sequence[str] = ()) -> GossipRuns:
        results = []
        for config, world_size in planned:
            key = (config.algorithm, getattr(config.options, "topology", NO_TOPOLOGY), world_size)
            if key not in self.results:
                if self.warm_up and not self.warmed:
                    warm = {**{k: v for k, v in self.base.items() if k != "epochs"}, "steps": 5,
                            "warmup_steps": 1, "eval_every": 0, "output_dir": None,
                            "checkpoint_dir": None, "checkpoint_every": 0, "resume": None}
                    self.train(run_config(warm, "sgp", "complete"), self.max_world_size)
                    self.warmed = True
                result = self.train(config, world_size)
                s = result.summary
                self.log(f"{key[0]} ({key[1]}) on {world_size} rank(s): test accuracy "
                         f"{s['test_accuracy']:.3f}, {s['samples_per_s']:.0f} samples/s, "
                         f"{s['bytes_sent_per_step'] / 1e3:.1f} kB sent per rank per step")
                self.results[key] = result
            results.append(self.results[key])
        for line in skipped:
            self.log("skipped " + line)
        return GossipRuns.from_results(results, skipped)

    def topologies(self, topologies: Sequence[str], algorithm: str = "sgp",
                   world_size: int | None = None) -> GossipRuns:
        """``algorithm`` on each graph in ``topologies``, at ``world_size`` (default: every engine)."""
        world_size = world_size or self.max_world_size
        return self._run([(self._check(algorithm, t, world_size), world_size) for t in topologies])

    def algorithms(self, algorithms: Sequence[str], world_size: int | None = None) -> GossipRuns:
        """Each algorithm on its default graph at ``world_size`` (default: every engine)."""
        world_size = world_size or self.max_world_size
        return self._run([(self._check(a, NO_TOPOLOGY, world_size), world_size) for a in algorithms])

    def world_sizes(self, algorithms: Sequence[str], world_sizes: Sequence[int]) -> GossipRuns:
        """Each algorithm on its default graph at each world size; a world an algorithm cannot run
        in (AD-PSGD's bipartite graph on an odd number of ranks) is skipped and said so."""
        planned, skipped = [], []
        for algorithm in algorithms:
            run_config(self.base, algorithm)  # a bad name or base fails here, not skipped
            for n in world_sizes:
                try:
                    planned.append((self._check(algorithm, NO_TOPOLOGY, n), n))
                except ConfigError as exc:
                    if exc.field == "world_size":
                        raise
                    skipped.append(f"{algorithm} on {n} rank(s): {exc}")
        return self._run(planned, skipped)

    def everything(self) -> GossipRuns:
        """Every run made so far, once each."""
        return GossipRuns.from_results(self.results.values())


# -- figures and the table --------------------------------------------------------------------------


def _label(algorithm: str, topology: str) -> str:
    return algorithm if topology == NO_TOPOLOGY else f"{algorithm} ({topology})"


def _subtitle(runs: GossipRuns) -> str:
    if runs.summary.empty:
        return "no runs"
    first = runs.summary.iloc[0]
    return f"{first.model} on {first.dataset}, batch {first.batch_size}/rank, {first.steps} steps"


MARKERS = "osD^vP*X"


def _style(i: int) -> dict[str, Any]:
    """Colour, marker and dash per line, so lines that coincide (sgp and osgp send the same bytes)
    stay visible."""
    return {"color": f"C{i % 10}", "marker": MARKERS[i % len(MARKERS)],
            "linestyle": ("-", "--", ":", "-.")[i % 4], "markersize": 7 - (i % 3)}


def _curves(evals: pd.DataFrame, by: list[str]):
    for i, (key, part) in enumerate(evals.groupby(by, sort=True)):
        yield _style(i), key, part.sort_values("step")


def consensus_figure(runs: GossipRuns):
    """Left: consensus distance (mean over ranks of ||x_i - x_bar||) at each evaluation, one curve
    per graph. Right: rank 0's test accuracy at the same points. Log scale when every distance is
    positive (one step on the complete graph is the exact average: ~0)."""
    fig, (dist_ax, acc_ax) = figure_row(2, 11)
    evals = runs.evals.dropna(subset=["consensus_distance"])
    for style, (algorithm, topology, n), part in _curves(evals, RUN):
        label = f"{_label(algorithm, topology)}, {n} ranks"
        dist_ax.plot(part.step, part.consensus_distance, label=label, **style)
        acc_ax.plot(part.step, part.accuracy, label=label, **style)
    if len(evals) and (evals.consensus_distance > 0).all():
        dist_ax.set_yscale("log")
    dist_ax.set(xlabel="step", ylabel="mean ||x_i - mean x||", title="consensus distance")
    acc_ax.set(xlabel="step", ylabel="accuracy", title="test accuracy (rank 0's model)", ylim=(0, 1))
    for ax in (dist_ax, acc_ax):
        ax.grid(alpha=0.3)
    if len(evals):
        dist_ax.legend(fontsize=8)
    fig.suptitle(f"Consensus per gossip graph: {_subtitle(runs)}", fontsize=10)
    fig.tight_layout()
    return fig


def accuracy_time_figure(runs: GossipRuns):
    """Test accuracy against seconds since the run's common start (left) and against steps
    (right), one curve per algorithm: what each step costs, and what each step is worth."""
    fig, (time_ax, step_ax) = figure_row(2, 11)
    for style, (algorithm, topology, n), part in _curves(runs.evals, RUN):
        label = f"{_label(algorithm, topology)}, {n} ranks"
        time_ax.plot(part.time_s, part.accuracy, label=label, **style)
        step_ax.plot(part.step, part.accuracy, label=label, **style)
    time_ax.set(xlabel="seconds since the start", ylabel="accuracy", title="test accuracy against time",
                ylim=(0, 1))
    step_ax.set(xlabel="step", ylabel="accuracy", title="test accuracy against steps", ylim=(0, 1))
    for ax in (time_ax, step_ax):
        ax.grid(alpha=0.3)
    if len(runs.evals):
        time_ax.legend(fontsize=8)
    fig.suptitle(f"Gossip against allreduce: {_subtitle(runs)}", fontsize=10)
    fig.tight_layout()
    return fig


def parameter_bytes(model: str, dataset: str, data_dir: str = "data") -> int:
    """Bytes of one copy of ``model``'s parameters for ``dataset`` (built on the meta device)."""
    import torch

    from ..comm.collectives import nbytes
    from ..data import load_dataset
    from ..models import build_model

    train = load_dataset(dataset, data_dir).train
    with torch.device("meta"):
        module = build_model(model, train.input_shape, train.num_classes)
    return sum(nbytes(p) for p in module.parameters())


def bytes_figure(runs: GossipRuns, model_bytes: int | None = None):
    """Measured bytes each rank sends per step (the records' logical traffic, mean over ranks and
    post-warm-up steps) against the number of ranks, one line per algorithm and graph. With
    ``model_bytes``, a dashed line marks one copy of the model (computed, not measured)."""
    fig, (ax,) = figure_row(1, 7)
    table = runs.summary.sort_values("world_size")
    for i, ((algorithm, topology), part) in enumerate(table.groupby(["algorithm", "topology"])):
        ax.plot(part.world_size, part.bytes_sent_per_step / 1e3, label=_label(algorithm, topology),
                **_style(i))
    if model_bytes:
        ax.axhline(model_bytes / 1e3, color="gray", linestyle="--",
                   label="one copy of the model (computed)")
    if len(table):
        ax.set_xticks(sorted(table.world_size.unique()))
        ax.legend(fontsize=8)
    ax.set(xlabel="ranks", ylabel="kB sent per rank per step", ylim=(0, None),
           title=f"Bytes per step against world size\n{_subtitle(runs)}")
    ax.title.set_fontsize(10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def summary_table(runs: GossipRuns) -> pd.DataFrame:
    """One row per run: algorithm, graph, ranks, throughput, final test accuracy, final consensus
    distance (NaN where not measured: allreduce keeps every rank's model identical) and bytes."""
    return runs.summary[TABLE_COLUMNS].sort_values(["world_size", "algorithm", "topology"],
                                                   ignore_index=True)
