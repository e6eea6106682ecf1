"""Figures of the gossip study (notebook 04), from its CSVs alone: consensus distance per graph,
test accuracy against time and steps, and measured bytes per step against world size; and its table.

Each figure takes a ``GossipRuns`` (``GossipRuns.load`` reads it from ``results/<host>/gossip/``),
and returns a matplotlib ``Figure`` built without pyplot. Which runs each figure shows is read off
the CSV, not from the plan that made it, so ``downpour plot`` redraws exactly what the notebook drew:

- ``consensus_runs``: the gossip method run on the most graphs (the plan's consensus algorithm), on
  each of them, at the largest world size;
- ``algorithm_runs``: each algorithm on its default graph at the largest world size;
- ``size_runs``: each algorithm on its default graph at every world size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..perf.calibrate import parameter_bytes  # notebook 04 reads it from here too
from .figures import figure_row, measured_on, save_figure
from .gossip import NO_TOPOLOGY, RUN, TABLE_COLUMNS, GossipRuns, default_topology

FIGURES = ("consensus", "accuracy_vs_time", "bytes_per_step")


def _subset(runs: GossipRuns, keep: pd.Series) -> GossipRuns:
    summary = runs.summary[keep].reset_index(drop=True)
    keys = set(map(tuple, summary[RUN].itertuples(index=False, name=None)))
    evals = runs.evals[[key in keys for key in runs.evals[RUN].itertuples(index=False, name=None)]]
    return GossipRuns(summary, evals.reset_index(drop=True), runs.skipped)


def _on_default_graph(summary: pd.DataFrame) -> pd.Series:
    return pd.Series([t == default_topology(a) for a, t in zip(summary.algorithm, summary.topology,
                                                               strict=True)], index=summary.index,
                     dtype=bool)


def consensus_runs(runs: GossipRuns) -> GossipRuns:
    """The gossip method with the most graphs at the largest world size, on each of them."""
    summary = runs.summary
    gossip = summary[summary.topology != NO_TOPOLOGY]
    if gossip.empty:
        return _subset(runs, summary.index < 0)
    top = gossip[gossip.world_size == gossip.world_size.max()]
    graphs = top.groupby("algorithm", sort=False).topology.nunique()
    algorithm = graphs.idxmax()  # ties: the first in the CSV
    return _subset(runs, (summary.algorithm == algorithm) & (summary.world_size == top.world_size.max()))


def algorithm_runs(runs: GossipRuns) -> GossipRuns:
    """Each algorithm on its default graph at the largest world size."""
    summary = runs.summary
    if summary.empty:
        return runs
    return _subset(runs, _on_default_graph(summary) & (summary.world_size == summary.world_size.max()))


def size_runs(runs: GossipRuns) -> GossipRuns:
    """Each algorithm on its default graph at every world size."""
    if runs.summary.empty:
        return runs
    return _subset(runs, _on_default_graph(runs.summary))


def _label(algorithm: str, topology: str) -> str:
    return algorithm if topology == NO_TOPOLOGY else f"{algorithm} ({topology})"


def _subtitle(runs: GossipRuns) -> str:
    if runs.summary.empty:
        return "no runs"
    first = runs.summary.iloc[0]
    return (f"{first.model} on {first.dataset}, batch {first.batch_size}/rank, {first.steps} steps\n"
            f"{measured_on(runs.summary)}")


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


def make_figures(directory: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every figure of the study in ``directory`` (``runs.csv``, ``evals.csv``), from its CSVs
    alone, as PNGs in ``out_dir`` (default: ``figures/`` in that directory)."""
    runs = GossipRuns.load(directory)
    out = Path(out_dir) if out_dir is not None else Path(directory) / "figures"
    model_bytes = None
    if len(runs.summary):
        first = runs.summary.iloc[0]
        model_bytes = parameter_bytes(first.model, first.dataset)
    figures = {"consensus": consensus_figure(consensus_runs(runs)),
               "accuracy_vs_time": accuracy_time_figure(algorithm_runs(runs)),
               "bytes_per_step": bytes_figure(size_runs(runs), model_bytes=model_bytes)}
    return [save_figure(figures[name], out / f"{name}.png") for name in FIGURES]
