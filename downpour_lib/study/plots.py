"""Scaling figures, made from the study's CSV alone (never from logs or live runs).

Speedup and efficiency are measured against ideal linear scaling of the same algorithm's 1-worker
throughput: speedup(N) = throughput(N) / throughput(1), efficiency(N) = speedup(N) / N. The breakdown
splits a worker's mean step into the record schema's parts (``records.TIME_PARTS``): data, compute,
communication, wait (blocked on another rank) and update.

Each ``*_figure`` returns a matplotlib ``Figure`` built without pyplot (no global state, no backend
switch), so a notebook displays it inline and ``make_figures`` saves it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..records import TIME_PARTS

GROUP = ["algorithm", "model", "dataset", "batch_size"]
FIGURES = ("throughput", "speedup", "efficiency", "breakdown")


def figure_grid(nrows: int, ncols: int, width: float, height: float = 3.8):
    """A pyplot-free ``Figure`` and its axes as an nrows x ncols array (every study figure's start)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def figure_row(ncols: int, width: float):
    """``figure_grid`` with one row: the figure and its ``ncols`` axes."""
    fig, axes = figure_grid(1, ncols, width)
    return fig, axes[0]


def scaling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Median throughput and step-time parts per algorithm and worker count, with speedup and
    efficiency against ideal linear scaling."""
    parts = {part: (part, "median") for part in ("step_s", *TIME_PARTS) if part in runs}
    table = (runs.groupby(GROUP + ["num_workers"], as_index=False)
             .agg(samples_per_s=("samples_per_s", "median"), runs=("samples_per_s", "size"),
                  world_size=("world_size", "first"), **parts))
    base = table[table.num_workers == 1].set_index(GROUP).samples_per_s.rename("base")
    table = table.join(base, on=GROUP)
    table["ideal_samples_per_s"] = table.base * table.num_workers
    table["speedup"] = table.samples_per_s / table.base
    table["efficiency"] = table.speedup / table.num_workers
    return table.drop(columns="base").sort_values(GROUP + ["num_workers"]).reset_index(drop=True)


def _axes(title: str, ylabel: str, width: float = 6.0):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4), dpi=120)
    ax = fig.subplots()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("workers")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _subtitle(runs: pd.DataFrame) -> str:
    first = runs.iloc[0]
    return f"{first.model}, {first.dataset}, batch {first.batch_size}/worker"


def _by_algorithm(table: pd.DataFrame):
    for i, (name, part) in enumerate(table.groupby("algorithm")):
        yield f"C{i}", name, part


def throughput_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Throughput\n{_subtitle(runs)}", "samples / s")
    for color, name, part in _by_algorithm(table):
        ax.plot(part.num_workers, part.samples_per_s, "o-", color=color, label=name)
        ax.plot(part.num_workers, part.ideal_samples_per_s, "--", color=color, alpha=0.5,
                label=f"{name}, ideal linear")
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.legend(fontsize=8)
    return fig


def speedup_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Speedup over 1 worker\n{_subtitle(runs)}", "throughput(N) / throughput(1)")
    workers = sorted(table.num_workers.unique())
    ax.plot(workers, workers, "--", color="gray", label="ideal linear scaling")
    for color, name, part in _by_algorithm(table):
        ax.plot(part.num_workers, part.speedup, "o-", color=color, label=name)
    ax.set_xticks(workers)
    ax.legend(fontsize=8)
    return fig


def efficiency_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Scaling efficiency against ideal linear scaling\n{_subtitle(runs)}",
                    "throughput / (N x 1-worker throughput)")
    ax.axhline(1.0, color="gray", linestyle="--", label="ideal linear scaling")
    for color, name, part in _by_algorithm(table):
        ax.plot(part.num_workers, part.efficiency, "o-", color=color, label=name)
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.set_ylim(0, max(1.1, float(table.efficiency.max()) * 1.1))
    ax.legend(fontsize=8)
    return fig


def breakdown_figure(runs: pd.DataFrame):
    """Stacked bars: a worker's mean step split into data / compute / comm / wait / update."""
    table = scaling_table(runs)
    labels = [f"{a}\n{n}w" for a, n in zip(table.algorithm, table.num_workers, strict=True)]
    fig, ax = _axes(f"Where a worker's step goes\n{_subtitle(runs)}", "seconds per step",
                    width=max(6.0, 0.8 * len(table) + 2))
    ax.set_xlabel("algorithm, workers")
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(TIME_PARTS):
        ax.bar(labels, table[part], bottom=bottom, color=f"C{i}", label=part.removesuffix("_s"))
        bottom += table[part]
    ax.legend(fontsize=8, ncol=len(TIME_PARTS), loc="upper left")
    ax.set_ylim(0, float(bottom.max()) * 1.25)
    return fig


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def make_figures(csv: str | Path, out_dir: str | Path) -> list[Path]:
    """Every scaling figure from the CSV at ``csv``, as PNGs in ``out_dir``."""
    runs = pd.read_csv(csv)
    makers = {"throughput": throughput_figure, "speedup": speedup_figure,
              "efficiency": efficiency_figure, "breakdown": breakdown_figure}
    return [save_figure(makers[name](runs), Path(out_dir) / f"{name}.png") for name in FIGURES]

