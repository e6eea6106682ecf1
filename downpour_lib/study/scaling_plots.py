"""Scaling figures, made from the study's CSV alone (never from logs or live runs): notebook 02 and
``downpour plot`` draw them from ``results/<host>/scaling/runs.csv``.

Each point is the mean over the study's repeats, its error bar their standard deviation; a point
whose ranks outnumber the machine's cores (e.g. sync_ps at 2 workers: 3 ranks) is ringed, since
its ranks shared cores. Speedup and efficiency are measured against ideal linear scaling of the same
algorithm's 1-worker throughput: speedup(N) = throughput(N) / throughput(1), efficiency(N) =
speedup(N) / N. The breakdown splits a worker's mean step into the record schema's parts
(``records.TIME_PARTS``): data, compute, communication, wait (blocked on another rank) and update.
Where the study has the performance model's ``predictions.csv`` (``model_plots.model_for_study``),
``scaling_model.png`` shows the measured points beside the model's curves out to 1,024 workers.

Each ``*_figure`` returns a matplotlib ``Figure`` built without pyplot (no global state, no backend
switch), so a notebook displays it inline and ``make_figures`` saves it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..records import TIME_PARTS
from .core import latest_commit
from .figures import figure_row, save_figure

GROUP = ["algorithm", "model", "dataset", "batch_size"]
FIGURES = ("throughput", "speedup", "efficiency", "breakdown")


def load_runs(csv: str | Path) -> pd.DataFrame:
    """The study CSV's rows of the commit measured last (``core.latest_commit``): a machine's CSV
    keeps its earlier commits' rows, and a figure must not mix code versions."""
    return latest_commit(pd.read_csv(csv))


def run_cores(runs: pd.DataFrame) -> pd.Series:
    """The cores a run's ranks had: its host's cores times its hosts (a cluster's nodes are alike);
    NaN where the CSV predates the ``cores`` column."""
    if "cores" not in runs:
        return pd.Series(float("nan"), index=runs.index)
    hosts = runs.hosts.astype(str).str.count(",") + 1 if "hosts" in runs else 1
    return runs.cores * hosts


def ranks_exceed_cores(runs: pd.DataFrame) -> pd.Series:
    """True for a run with more ranks than cores: its ranks shared cores, so its throughput
    measures the oversubscription as much as the algorithm (False where cores are unknown)."""
    return runs.world_size > run_cores(runs)


def scaling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm and worker count: the mean throughput over repeats and its standard deviation
    (NaN with one repeat), the mean step-time parts, the cores and whether the ranks exceeded them, and
    speedup and efficiency against ideal linear scaling with their spread (the two throughputs'
    relative deviations added in quadrature)."""
    parts = {part: (part, "mean") for part in ("step_s", *TIME_PARTS) if part in runs}
    table = (runs.assign(cores=run_cores(runs), ranks_exceed_cores=ranks_exceed_cores(runs))
             .groupby(GROUP + ["num_workers"], as_index=False)
             .agg(samples_per_s=("samples_per_s", "mean"),
                  samples_per_s_std=("samples_per_s", "std"), runs=("samples_per_s", "size"),
                  world_size=("world_size", "first"), cores=("cores", "first"),
                  ranks_exceed_cores=("ranks_exceed_cores", "any"), **parts))
    table["relative_std"] = table.samples_per_s_std / table.samples_per_s
    base = table[table.num_workers == 1].set_index(GROUP)[["samples_per_s", "relative_std"]]
    table = table.join(base.add_prefix("base_"), on=GROUP)
    table["ideal_samples_per_s"] = table.base_samples_per_s * table.num_workers
    table["speedup"] = table.samples_per_s / table.base_samples_per_s
    spread = (table.relative_std ** 2 + table.base_relative_std ** 2) ** 0.5
    table["speedup_std"] = (table.speedup * spread).where(table.num_workers != 1, 0.0)
    table["efficiency"] = table.speedup / table.num_workers
    table["efficiency_std"] = table.speedup_std / table.num_workers
    return (table.drop(columns=["base_samples_per_s", "base_relative_std"])
            .sort_values(GROUP + ["num_workers"]).reset_index(drop=True))


def _axes(title: str, ylabel: str, width: float = 8.5):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4.4), dpi=120)
    ax = fig.subplots()
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("workers")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _subtitle(runs: pd.DataFrame) -> str:
    """The setting and the machine it was measured on (older CSVs lack some of the latter)."""
    first = runs.iloc[0]
    repeats = int(runs.groupby(GROUP + ["num_workers"]).size().min())
    setting = (f"{first.model}, {first.dataset}, batch {first.batch_size}/worker, "
               f"{first.get('measured_steps', '?')} measured steps, "
               f"mean ± std of {repeats} repeat(s)")
    machine = [str(first.get("host", first.get("hosts", "?")))]
    if "cores" in first:
        machine.append(f"{first.cores} cores, {first.get('cpu_model', '?')}")
    machine += [f"torch {first.get('torch_version', '?')}",
                f"commit {str(first.get('git_sha', '?'))[:10]}"]
    return setting + "\nmeasured on " + ", ".join(machine)


def _by_algorithm(table: pd.DataFrame):
    for i, (name, part) in enumerate(table.groupby("algorithm")):
        yield f"C{i}", name, part


#: How far apart, in workers, the first and last algorithm's points sit at one worker count: at
#: the same x their error bars would hide behind each other.
DODGE = 0.24


def dodged(table: pd.DataFrame) -> pd.Series:
    """Each row's x: its worker count, shifted by its algorithm's place among the algorithms."""
    names = sorted(table.algorithm.unique())
    shift = {name: (i - (len(names) - 1) / 2) * DODGE / max(1, len(names) - 1)
             for i, name in enumerate(names)}
    return table.num_workers + table.algorithm.map(shift)


def _crowded_label(crowded: pd.DataFrame) -> str:
    """What a ring means, with this study's worst case, e.g. '3 ranks on 2 cores'."""
    worst = crowded.loc[(crowded.world_size / crowded.cores).idxmax()]
    return f"ringed: ranks > cores\n(e.g. {worst.world_size} ranks on {worst.cores:g} cores)"


def _scaling_lines(ax, table: pd.DataFrame, column: str, reference: str | None = None) -> None:
    """Each algorithm's mean with error bars from its repeats (dodged sideways, so none hides
    another); ringed where ranks exceed cores; the legend outside the axes, off the data."""
    x = dodged(table)
    for color, name, part in _by_algorithm(table):
        ax.errorbar(x[part.index], part[column], yerr=part[f"{column}_std"], fmt="o-",
                    color=color, capsize=3, label=name)
    crowded = table[table.ranks_exceed_cores]
    if len(crowded):
        ax.scatter(x[crowded.index], crowded[column], s=160, facecolors="none",
                   edgecolors="black", linewidths=1.2, zorder=3, label=_crowded_label(crowded))
    if reference:
        ax.plot([], [], "--", color="black", alpha=0.6, label=reference)
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def throughput_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Throughput\n{_subtitle(runs)}", "samples / s")
    for color, _, part in _by_algorithm(table):
        ax.plot(part.num_workers, part.ideal_samples_per_s, "--", color=color, alpha=0.5)
    _scaling_lines(ax, table, "samples_per_s", reference="ideal linear (N x 1-worker), dashed")
    return fig


def speedup_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Speedup over 1 worker\n{_subtitle(runs)}", "throughput(N) / throughput(1)")
    workers = sorted(table.num_workers.unique())
    ax.plot(workers, workers, "--", color="black", alpha=0.6)
    _scaling_lines(ax, table, "speedup", reference="ideal linear scaling")
    return fig


def efficiency_figure(runs: pd.DataFrame):
    table = scaling_table(runs)
    fig, ax = _axes(f"Scaling efficiency against ideal linear scaling\n{_subtitle(runs)}",
                    "throughput / (N x 1-worker throughput)")
    ax.axhline(1.0, color="black", alpha=0.6, linestyle="--")
    _scaling_lines(ax, table, "efficiency", reference="ideal linear scaling")
    top = (table.efficiency + table.efficiency_std.fillna(0)).max()
    ax.set_ylim(0, max(1.1, float(top) * 1.1))
    return fig


def breakdown_figure(runs: pd.DataFrame):
    """Stacked bars: a worker's mean step split into data / compute / comm / wait / update."""
    table = scaling_table(runs)
    labels = [f"{a}\n{n}w" + ("*" if crowded else "") for a, n, crowded
              in zip(table.algorithm, table.num_workers, table.ranks_exceed_cores, strict=True)]
    fig, ax = _axes(f"Where a worker's step goes\n{_subtitle(runs)}", "seconds per step",
                    width=max(6.0, 0.8 * len(table) + 2))
    ax.set_xlabel("algorithm, workers (* ranks > cores)")
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(TIME_PARTS):
        ax.bar(labels, table[part], bottom=bottom, color=f"C{i}", label=part.removesuffix("_s"))
        bottom += table[part]
    ax.legend(fontsize=8, ncol=len(TIME_PARTS), loc="upper left")
    ax.set_ylim(0, float(bottom.max()) * 1.25)
    return fig


def scaling_model_figure(runs: pd.DataFrame, predictions: pd.DataFrame):
    """Measured efficiency (markers, error bars over repeats) and the model's (lines) per algorithm."""
    model = runs.model.iloc[0]  # a study trains one model; the figure shows the first
    measured = scaling_table(runs[runs.model == model])
    predictions = predictions[predictions.model == model]
    fig, (ax,) = figure_row(1, 9.0)
    names = sorted(set(measured.algorithm) | set(predictions.algorithm))
    for i, name in enumerate(names):
        curve = predictions[predictions.algorithm == name].sort_values("workers")
        ax.plot(curve.workers, curve.efficiency, "-", color=f"C{i}", alpha=0.8, label=name)
        points = measured[measured.algorithm == name]
        ax.errorbar(points.num_workers, points.efficiency, yerr=points.efficiency_std, fmt="o",
                    color=f"C{i}", capsize=3, markeredgecolor="black")
    ax.plot([], [], "-", color="gray", label="model (lines)")
    ax.plot([], [], "o", color="gray", markeredgecolor="black", label="measured (points)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers")
    ax.set_ylabel("throughput / (N x 1-worker throughput)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    cal = predictions.calibration.iloc[0] if len(predictions) else "?"
    ax.set_title(f"Scaling efficiency of {model}, measured and predicted (calibration {cal})",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def make_figures(source: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every scaling figure from the study's CSV (``source``: the CSV, or the study's directory
    holding ``runs.csv``), as PNGs in ``out_dir`` (default: ``figures/`` beside the CSV)."""
    source = Path(source)
    csv = source / "runs.csv" if source.is_dir() else source
    out_dir = Path(out_dir) if out_dir is not None else csv.parent / "figures"
    runs = load_runs(csv)
    makers = {"throughput": throughput_figure, "speedup": speedup_figure,
              "efficiency": efficiency_figure, "breakdown": breakdown_figure}
    saved = [save_figure(makers[name](runs), Path(out_dir) / f"{name}.png") for name in FIGURES]
    predictions = csv.parent / "predictions.csv"
    if predictions.is_file():  # the performance model's curves (model_plots.model_for_study)
        saved.append(save_figure(scaling_model_figure(runs, pd.read_csv(predictions)),
                                 Path(out_dir) / "scaling_model.png"))
    return saved

