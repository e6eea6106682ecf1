"""Figures of a ``StalenessStudy`` (notebook 03): accuracy against wall time, throughput, and the
staleness histogram of every downpour run. They read the study's tidy frames only, which notebook 03
and ``downpour plot`` load from the study's CSVs (``StalenessStudy.load``, ``make_figures``).

Each run keeps its colour in every figure (``sync_ps`` black, the downpour runs C0, C1, ... in plan
order). Like ``plots``, every ``*_figure`` returns a matplotlib ``Figure`` built without pyplot.
"""

from __future__ import annotations

import math
from pathlib import Path

from .figures import figure_grid, measured_on, save_figure
from .staleness import StalenessStudy

#: Runs of these algorithms get this colour; the others C0, C1, ... in plan order.
ALGORITHM_COLOR = {"sync_ps": "black"}
FIGURES = ("accuracy_vs_time", "throughput", "staleness")


def run_colors(study: StalenessStudy) -> dict[str, str]:
    """label -> colour: black for sync_ps, C0, C1, ... for the others in plan order."""
    colors, i = {}, 0
    for label, algorithm in zip(study.runs.label, study.runs.algorithm, strict=True):
        if algorithm in ALGORITHM_COLOR:
            colors[label] = ALGORITHM_COLOR[algorithm]
        else:
            colors[label], i = f"C{i}", i + 1
    return colors


def _subtitle(study: StalenessStudy) -> str:
    r = study.runs.iloc[0]
    return (f"{r.model} on {r.dataset}, {r.workers} worker(s) x batch {r.batch_size}, "
            f"{r.steps} steps, seed {r.seed}\n{measured_on(study.runs)}")


def accuracy_vs_time_figure(study: StalenessStudy):
    """Test accuracy (left) and test loss (right) of every run against seconds since its start;
    the dotted line is the study's target accuracy."""
    fig, ((acc_ax, loss_ax),) = figure_grid(1, 2, 11, 4.2)
    colors = run_colors(study)
    for label in study.labels:
        run = study.evals[study.evals.label == label]
        acc_ax.plot(run.time_s, run.accuracy, ".-", color=colors[label], label=label)
        loss_ax.plot(run.time_s, run.loss, ".-", color=colors[label], label=label)
    acc_ax.axhline(study.target_accuracy, color="gray", linestyle=":", linewidth=1,
                   label=f"target {study.target_accuracy:g}")
    acc_ax.set(xlabel="seconds since the run's start", ylabel="test accuracy", ylim=(0, 1.02),
               title="test accuracy against wall time")
    loss_ax.set(xlabel="seconds since the run's start", ylabel="test cross-entropy",
                title="test loss against wall time")
    acc_ax.legend(fontsize=8, loc="best")
    for ax in (acc_ax, loss_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(_subtitle(study), fontsize=10)
    fig.tight_layout()
    return fig


def throughput_figure(study: StalenessStudy):
    """Samples per second over all workers (after the warm-up steps), one bar per run, annotated
    with the ranks it ran on."""
    table = study.runs
    colors = run_colors(study)
    fig, ((ax,),) = figure_grid(1, 1, 8, max(2.5, 0.55 * len(table) + 1.5))
    y = list(range(len(table)))[::-1]  # the first run on top
    ax.barh(y, table.samples_per_s, color=[colors[label] for label in table.label])
    ax.set_yticks(y, table.label)
    for yi, rate, ranks in zip(y, table.samples_per_s, table.world_size, strict=True):
        ax.annotate(f" {rate:,.0f}  ({ranks} rank(s))", (rate, yi), va="center", fontsize=8)
    ax.set_xlim(0, float(table.samples_per_s.max()) * 1.35)
    ax.set(xlabel="samples / s (all workers)", title=f"Throughput\n{_subtitle(study)}")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def staleness_figure(study: StalenessStudy, ncols: int = 3):
    """One panel per downpour run: the fraction of applied updates at each staleness (server
    version at apply time minus the version the gradient was computed from), with the mean and
    the max. The fraction is on a log scale: the rare, very stale updates (a worker descheduled
    or slow for a while) are the tail that matters."""
    from matplotlib.ticker import MaxNLocator

    hist = study.staleness
    labels = [label for label in study.labels if label in set(hist.label)]
    if not labels:
        fig, ((ax,),) = figure_grid(1, 1, 6, 2)
        ax.text(0.5, 0.5, "no downpour run recorded staleness", ha="center", va="center")
        ax.set_axis_off()
        return fig
    ncols = min(ncols, len(labels))
    nrows = math.ceil(len(labels) / ncols)
    fig, axes = figure_grid(nrows, ncols, 4 * ncols + 1, 3.2 * nrows + 0.6)
    colors = run_colors(study)
    runs = study.runs.set_index("label")
    top = int(hist.staleness.max())
    bottom = float(hist.fraction.min()) / 2
    for ax, label in zip(axes.flat, labels, strict=False):
        run = hist[hist.label == label]
        ax.bar(run.staleness, run.fraction, color=colors[label], width=0.8)
        mean, most = runs.loc[label, "staleness_mean"], runs.loc[label, "staleness_max"]
        ax.axvline(mean, color="gray", linestyle="--", linewidth=1,
                   label=f"mean {mean:.2f}, max {most:.0f}")
        ax.set(title=label, xlabel="staleness (updates)", ylabel="fraction of updates (log)",
               xlim=(-0.6, top + 0.6), yscale="log", ylim=(bottom, 1.5))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(labels):]:
        ax.set_axis_off()
    fig.suptitle(f"Staleness of the applied updates\n{_subtitle(study)}", fontsize=10)
    fig.tight_layout()
    return fig


def make_figures(directory: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every figure of the study in ``directory`` (``runs.csv``, ``evals.csv``, ``staleness.csv``),
    from its CSVs alone, as PNGs in ``out_dir`` (default: ``figures/`` in that directory)."""
    study = StalenessStudy.load(directory)
    out = Path(out_dir) if out_dir is not None else Path(directory) / "figures"
    makers = {"accuracy_vs_time": accuracy_vs_time_figure, "throughput": throughput_figure,
              "staleness": staleness_figure}
    return [save_figure(makers[name](study), out / f"{name}.png") for name in FIGURES]
