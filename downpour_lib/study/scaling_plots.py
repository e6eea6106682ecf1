"""Scaling figures, made from the study's CSV alone (never from logs or live runs): notebook 02 and
``downpour plot`` draw them from ``results/<host>/scaling/runs.csv``, through its table
(``scaling_runs.scaling_table``): throughput, speedup and efficiency against workers, and where a
worker's step goes.

Each point is the mean over the study's repeats, its error bar their standard deviation; a point
whose ranks outnumber the machine's cores (e.g. sync_ps at 2 workers: 3 ranks) is ringed, since
its ranks shared cores. Speedup and efficiency are measured against ideal linear scaling of the same
algorithm's 1-worker throughput. The breakdown splits a worker's mean step into the record schema's
parts (``records.TIME_PARTS``): data, compute, communication, wait (blocked on another rank) and
update. Where the model was calibrated on the study (``calibration.json``), throughput, speedup and
efficiency draw its curve beside each emulated series; where the study has the model's
``predictions.csv`` (``model_plots.model_for_study``), ``make_figures`` adds ``scaling_model.png``
(``scaling_model_plots``), the measured points beside the model's curves out to 1,024 workers.

Each ``*_figure`` returns a matplotlib ``Figure`` built without pyplot (no global state, no backend
switch), so a notebook displays it inline and ``make_figures`` saves it. A notebook reads the
study's table and the model's notes from here too (``load_runs``, ``scaling_table``,
``model_notes``, ``scaling_model_figure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..records import TIME_PARTS
from .core import with_series
from .emulated_check import emulated_vs_model
from .figures import save_figure
from .load import LOADED_SHARE, MIN_WINDOW_S
from .scaling_model_plots import model_notes, scaling_model_figure
from .scaling_runs import (
    GROUP,
    dodged,
    load_runs,
    load_summary,
    one_workload,
    others_share,
    scaling_table,
)

FIGURES = ("throughput", "speedup", "efficiency", "breakdown")


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
    if "series" not in runs:
        runs = with_series(runs)
    first = runs.iloc[0]
    repeats = int(runs.groupby(GROUP + ["num_workers"]).size().min())
    setting = (f"{first.model}, {first.dataset}, batch {first.batch_size}/worker, "
               f"{first.get('measured_steps', '?')} measured steps, "
               f"mean ± std of {repeats} repeat(s)")
    if (runs.compute == "emulated").any():
        setting += "\nemulated: compute slept (its step in the legend), communication real"
    machine = [str(first.get("host", first.get("hosts", "?")))]
    if "cores" in first:
        machine.append(f"{first.cores} cores, {first.get('cpu_model', '?')}")
    machine += [f"torch {first.get('torch_version', '?')}",
                f"commit {str(first.get('git_sha', '?'))[:10]}"]
    loaded = load_summary(runs)
    return (setting + "\nmeasured on " + ", ".join(machine)
            + (f"\n{loaded}: marked (red x; ! in the breakdown)" if loaded else ""))


def _by_algorithm(table: pd.DataFrame):
    """(color, label, rows) per series: one color per algorithm, whatever its compute."""
    colors = {name: f"C{i}" for i, name in enumerate(sorted(table.algorithm.unique()))}
    for name, part in table.groupby("series"):
        yield colors[part.algorithm.iloc[0]], name, part


def _crowded_label(crowded: pd.DataFrame) -> str:
    """What a ring means, with this study's worst case, e.g. '3 ranks on 2 cores'."""
    worst = crowded.loc[(crowded.world_size / crowded.cores).idxmax()]
    return f"ringed: ranks > cores\n(e.g. {worst.world_size} ranks on {worst.cores:g} cores)"


def _link_styles(series: pd.Series) -> dict[str, str]:
    """Sandbox series (``..., sandbox 1gbit)``) of one algorithm share its colour: each link rate
    gets a line and marker of its own, the fastest dash-dot squares, then dotted triangles."""
    from ..sandbox.netns import parse_rate

    def rate(name: str) -> str:
        return name.rsplit(", sandbox ", 1)[1].rstrip(")")

    sandbox = {name for name in series.unique() if ", sandbox " in name}
    rates = sorted({rate(name) for name in sandbox}, key=parse_rate, reverse=True)
    fmts = ("s-.", "v:", "D--")
    return {name: fmts[rates.index(rate(name)) % len(fmts)] for name in sandbox}


def _scaling_lines(ax, table: pd.DataFrame, column: str, reference: str | None = None) -> None:
    """Each algorithm's mean with error bars from its repeats (dodged sideways, so none hides
    another); ringed where ranks exceed cores; the legend outside the axes, off the data."""
    x = dodged(table)
    links = _link_styles(table.series)
    for color, name, part in _by_algorithm(table):
        emulated = "(emulated" in name  # hollow squares on a dash-dot line: never read as real
        ax.errorbar(x[part.index], part[column], yerr=part[f"{column}_std"],
                    fmt=links.get(name, "s-." if emulated else "o-"),
                    mfc="none" if emulated else color,
                    color=color, capsize=3, label=name)
    crowded = table[table.ranks_exceed_cores]
    if len(crowded):
        ax.scatter(x[crowded.index], crowded[column], s=160, facecolors="none",
                   edgecolors="black", linewidths=1.2, zorder=3, label=_crowded_label(crowded))
    mark_loaded(ax, x, table, column)
    if reference:
        ax.plot([], [], "--", color="black", alpha=0.6, label=reference)
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


#: How a point with repeats measured under load is marked, in every scaling figure.
LOADED_MARK = "red x: measured under load"


def mark_loaded(ax, x: pd.Series, table: pd.DataFrame, column: str) -> None:
    """A red x over each point some of whose repeats ran under load, and 'k/n' beside it."""
    loaded = table[table.under_load]
    if not len(loaded):
        return
    ax.scatter(x[loaded.index], loaded[column], marker="x", s=70, color="red", linewidths=1.6,
               zorder=4, label=f"{LOADED_MARK}\n(other processes took >= {LOADED_SHARE:.0%}\n"
                               "of the cores; k/n repeats)")
    for i, row in loaded.iterrows():
        ax.annotate(f"{int(row.loaded_runs)}/{int(row.runs)}", (x[i], row[column]), fontsize=6,
                    color="red", xytext=(4, -9), textcoords="offset points")


def model_curves(table: pd.DataFrame, checked: pd.DataFrame | None) -> pd.DataFrame:
    """The performance model's throughput, speedup and efficiency for each series it was checked
    on (``checked``: ``emulated_check.emulated_vs_model``'s table, the emulated series), from
    ``scaling_table``'s ``table``: at each worker count the measured throughput scaled by measured
    over predicted step, so the model's curve is in the measured points' units whatever the
    algorithm counts as a sample; speedup and efficiency against the model's own 1-worker point.
    Empty without ``checked``."""
    columns = ["series", "num_workers", "samples_per_s", "speedup", "efficiency"]
    if checked is None or not len(checked):
        return pd.DataFrame(columns=columns)
    step = checked.rename(columns={"workers": "num_workers"})[
        ["series", "num_workers", "measured_step_s", "predicted_step_s"]]
    curves = table[["series", "num_workers", "samples_per_s"]].merge(step, on=["series",
                                                                               "num_workers"])
    curves["samples_per_s"] *= curves.measured_step_s / curves.predicted_step_s
    base = curves[curves.num_workers == 1].set_index("series").samples_per_s
    curves["speedup"] = curves.samples_per_s / curves.series.map(base)
    curves["efficiency"] = curves.speedup / curves.num_workers
    return curves.dropna(subset=["speedup"])[columns].sort_values(["series", "num_workers"])


#: The legend's entry for the model's curves.
MODEL_LABEL = "model, same compute and links (thin, dotted)"


def _model_lines(ax, table: pd.DataFrame, curves: pd.DataFrame, column: str) -> None:
    """The model's curve of each series in ``curves``, thin and dotted in the series' colour."""
    if not len(curves):
        return
    colors = {name: color for color, name, _ in _by_algorithm(table)}
    for name, part in curves.groupby("series"):
        ax.plot(part.num_workers, part[column], ":", color=colors.get(name, "black"),
                linewidth=1.2, alpha=0.9)
    ax.plot([], [], ":", color="black", linewidth=1.2, label=MODEL_LABEL)


def throughput_figure(runs: pd.DataFrame, checked: pd.DataFrame | None = None):
    """Samples/s against workers: ideal linear (dashed), the measured points and, for the series
    in ``checked`` (``emulated_vs_model``), the model's curve."""
    table = scaling_table(runs)
    fig, ax = _axes(f"Throughput\n{_subtitle(runs)}", "samples / s")
    for color, _, part in _by_algorithm(table):
        ax.plot(part.num_workers, part.ideal_samples_per_s, "--", color=color, alpha=0.5)
    _model_lines(ax, table, model_curves(table, checked), "samples_per_s")
    _scaling_lines(ax, table, "samples_per_s", reference="ideal linear (N x 1-worker), dashed")
    return fig


def speedup_figure(runs: pd.DataFrame, checked: pd.DataFrame | None = None):
    table = scaling_table(runs)
    fig, ax = _axes(f"Speedup over 1 worker\n{_subtitle(runs)}", "throughput(N) / throughput(1)")
    workers = sorted(table.num_workers.unique())
    ax.plot(workers, workers, "--", color="black", alpha=0.6)
    _model_lines(ax, table, model_curves(table, checked), "speedup")
    _scaling_lines(ax, table, "speedup", reference="ideal linear scaling")
    return fig


def efficiency_figure(runs: pd.DataFrame, checked: pd.DataFrame | None = None):
    table = scaling_table(runs)
    fig, ax = _axes(f"Scaling efficiency against ideal linear scaling\n{_subtitle(runs)}",
                    "throughput / (N x 1-worker throughput)")
    ax.axhline(1.0, color="black", alpha=0.6, linestyle="--")
    curves = model_curves(table, checked)
    _model_lines(ax, table, curves, "efficiency")
    _scaling_lines(ax, table, "efficiency", reference="ideal linear scaling")
    top = max((table.efficiency + table.efficiency_std.fillna(0)).max(),
              curves.efficiency.max() if len(curves) else 0.0)
    ax.set_ylim(0, max(1.1, float(top) * 1.1))
    return fig


def breakdown_figure(runs: pd.DataFrame):
    """Stacked bars: a worker's mean step split into data / compute / comm / wait / update."""
    table = scaling_table(runs)
    labels = [f"{a}\n{n}w" + ("*" if crowded else "") for a, n, crowded
              in zip(table.algorithm, table.num_workers, table.ranks_exceed_cores, strict=True)]
    labels = [label + ("!" if loaded else "") for label, loaded in zip(labels, table.under_load,
                                                                          strict=True)]
    fig, ax = _axes(f"Where a worker's step goes (bars: mean parts; whiskers: ± std of the step "
                    f"over repeats)\n{_subtitle(runs)}", "seconds per step",
                    width=max(6.0, 0.8 * len(table) + 2))
    ax.set_xlabel("algorithm, workers (* ranks > cores" + (", ! measured under load"
                                                           if table.under_load.any() else "") + ")")
    bottom = pd.Series(0.0, index=table.index)
    for i, part in enumerate(TIME_PARTS):
        ax.bar(labels, table[part], bottom=bottom, color=f"C{i}", label=part.removesuffix("_s"))
        bottom += table[part]
    ax.errorbar(labels, bottom, yerr=table.parts_total_s_std.fillna(0.0), fmt="none",
                ecolor="black", capsize=4, linewidth=1.2, label="± std over repeats")
    ax.legend(fontsize=8, ncol=len(TIME_PARTS) + 1, loc="upper left")
    top = bottom + table.parts_total_s_std.fillna(0.0)
    ax.set_ylim(0, float(top.max()) * 1.3)
    return fig


def make_figures(source: str | Path, out_dir: str | Path | None = None,
                 workload: Mapping[str, Any] | None = None) -> list[Path]:
    """Every scaling figure from the study's CSV (``source``: the CSV, or the study's directory
    holding ``runs.csv``), as PNGs in ``out_dir`` (default: ``figures/`` beside the CSV), of one
    workload: ``workload`` (a spec's ``workload()``), else the one measured last
    (``one_workload``). Where the model was calibrated on the study (``calibration.json`` beside
    the CSV: ``model_plots.model_for_study``), throughput, speedup and efficiency draw its curve
    beside each emulated series (``emulated_check.emulated_vs_model``)."""
    source = Path(source)
    csv = source / "runs.csv" if source.is_dir() else source
    out_dir = Path(out_dir) if out_dir is not None else csv.parent / "figures"
    runs = one_workload(load_runs(csv), workload)
    checked = None
    if (csv.parent / "calibration.json").is_file() and "compute" in runs \
            and (runs["compute"] == "emulated").any():
        from ..perf.calibrate import load

        checked = emulated_vs_model(runs, load(csv.parent / "calibration.json"))
    makers = {"throughput": throughput_figure, "speedup": speedup_figure,
              "efficiency": efficiency_figure}
    saved = [save_figure(makers[name](runs, checked) if name in makers
                         else breakdown_figure(runs), Path(out_dir) / f"{name}.png")
             for name in FIGURES]
    predictions = csv.parent / "predictions.csv"
    if predictions.is_file():  # the performance model's curves (model_plots.model_for_study)
        saved.append(save_figure(scaling_model_figure(runs, pd.read_csv(predictions)),
                                 Path(out_dir) / "scaling_model.png"))
    return saved


def report(runs: pd.DataFrame, saved, predictions: pd.DataFrame | None = None) -> str:
    """What a study ends by saying: where its figures are, whether runs were measured under load
    (and what that does to them), and where the model and the measurements disagree, and why."""
    lines = ["figures (from " + (f"{len(runs)} runs" if len(runs) else "no runs") + "):"]
    lines += [f"  {Path(p).resolve()}" for p in saved]
    loaded = load_summary(runs)
    if loaded:
        table = scaling_table(runs)
        lines.append(f"MEASURED UNDER LOAD: {loaded}. Their points are marked (red x, '!' in the "
                     f"breakdown; the CSV's under_load column); {int(table.under_load.sum())} of "
                     f"{len(table)} points have such repeats, so their means are low and their "
                     "spread wide. Rerun on a quiet machine (fresh = True) for numbers to compare.")
    elif "under_load" not in runs:
        lines.append("this CSV predates the load columns: how busy the machine was is unknown")
    else:
        unknown = int(others_share(runs).isna().sum())
        if unknown == len(runs):
            lines.append(f"how busy the machine was is unknown: every run was shorter than "
                         f"{MIN_WINDOW_S:g} s, too short for /proc/stat to tell")
        else:
            lines.append(f"no run was measured under load (other processes took less than "
                         f"{LOADED_SHARE:.0%} of the cores)" + (
                             f"; unknown for {unknown} run(s) shorter than {MIN_WINDOW_S:g} s"
                             if unknown else ""))
    if predictions is not None and len(predictions):
        notes = model_notes(runs[runs.model == runs.model.iloc[0]], predictions)
        if notes:
            lines.append("the model and the measurements differ (scaling_model.png):")
            lines += [f"  {note}" for note in notes]
    return "\n".join(lines)
