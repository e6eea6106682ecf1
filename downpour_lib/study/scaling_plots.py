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
from .core import latest_commit, read_runs_csv, with_series
from .emulated_check import emulated_vs_model
from .figures import figure_grid, measured_on, save_figure
from .load import LOADED_SHARE, MIN_WINDOW_S

GROUP = ["series", "algorithm", "model", "dataset", "batch_size"]
FIGURES = ("throughput", "speedup", "efficiency", "breakdown")


def load_runs(csv: str | Path) -> pd.DataFrame:
    """The study CSV's rows of the commit measured last (``core.latest_commit``): a machine's CSV
    keeps its earlier commits' rows, and a figure must not mix code versions. Each row gets its
    ``series`` (``with_series``)."""
    return with_series(latest_commit(read_runs_csv(csv)))


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


def under_load(runs: pd.DataFrame) -> pd.Series:
    """True for a run measured while other processes took ``load.LOADED_SHARE`` or more of the
    machine's cores (False where the CSV predates the load columns)."""
    if "under_load" not in runs:
        return pd.Series(False, index=runs.index)
    return runs.under_load.fillna(False).astype(bool)


def others_share(runs: pd.DataFrame) -> pd.Series:
    """The share of the machine's cores other processes took during each run (NaN if unknown)."""
    if "load_others_share" not in runs:
        return pd.Series(float("nan"), index=runs.index)
    return runs.load_others_share.astype(float)


def load_summary(runs: pd.DataFrame) -> str:
    """'5 of 48 runs measured under load (other processes took up to 41% of the cores, load
    average up to 6.2)', or '' when none was (or the CSV predates the load columns)."""
    loaded = under_load(runs)
    if not loaded.any():
        return ""
    share = others_share(runs)[loaded].max()
    text = (f"{int(loaded.sum())} of {len(runs)} runs measured under load (other processes took "
            f"up to {share:.0%} of the cores")
    if "load_avg_1m_end" in runs:
        text += f", load average up to {runs.load_avg_1m_end[loaded].max():.1f}"
    return text + ")"


def scaling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm and worker count: the mean throughput over repeats and its standard deviation
    (NaN with one repeat), the mean step-time parts and the spread of their total over repeats, the
    cores and whether the ranks exceeded them, how many repeats ran under load (``under_load`` if
    any did, and the largest share of the cores other processes took), and
    speedup and efficiency against ideal linear scaling with their spread (the two throughputs'
    relative deviations added in quadrature)."""
    if "series" not in runs:
        runs = with_series(runs)
    parts = {part: (part, "mean") for part in ("step_s", *TIME_PARTS) if part in runs}
    present = [part for part in TIME_PARTS if part in runs]
    table = (runs.assign(cores=run_cores(runs), ranks_exceed_cores=ranks_exceed_cores(runs),
                         under_load=under_load(runs), load_others_share=others_share(runs),
                         parts_total_s=runs[present].sum(axis=1) if present else float("nan"))
             .groupby(GROUP + ["num_workers"], as_index=False)
             .agg(samples_per_s=("samples_per_s", "mean"),
                  samples_per_s_std=("samples_per_s", "std"), runs=("samples_per_s", "size"),
                  world_size=("world_size", "first"), cores=("cores", "first"),
                  compute=("compute", "first"),
                  ranks_exceed_cores=("ranks_exceed_cores", "any"),
                  loaded_runs=("under_load", "sum"), load_others_share=("load_others_share", "max"),
                  parts_total_s_std=("parts_total_s", "std"), **parts))
    table["under_load"] = table.loaded_runs > 0
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


def real_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose compute was real: what the model is calibrated on and set beside (an
    emulated row's compute is a sleep; its check against the model is a table of its own)."""
    if "compute" not in runs:
        return runs
    return runs[runs["compute"].fillna("real") == "real"]


def _by_algorithm(table: pd.DataFrame):
    """(color, label, rows) per series: one color per algorithm, whatever its compute."""
    colors = {name: f"C{i}" for i, name in enumerate(sorted(table.algorithm.unique()))}
    for name, part in table.groupby("series"):
        yield colors[part.algorithm.iloc[0]], name, part




#: How far apart, in workers, the first and last algorithm's points sit at one worker count: at
#: the same x their error bars would hide behind each other.
DODGE = 0.24


def dodged(table: pd.DataFrame) -> pd.Series:
    """Each row's x: its worker count, shifted by its algorithm's place among the algorithms."""
    names = sorted(table.series.unique())
    shift = {name: (i - (len(names) - 1) / 2) * DODGE / max(1, len(names) - 1)
             for i, name in enumerate(names)}
    return table.num_workers + table.series.map(shift)


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


#: A measured efficiency this far from the model's (or two standard deviations, if more) is a
#: disagreement the figure explains.
MODEL_TOLERANCE = 0.1


def model_gaps(runs: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Each measured point past one worker beside the model's prediction for it: measured and
    predicted efficiency, the gap, whether it exceeds ``MODEL_TOLERANCE``, and ``why``, read from
    the measurements. The model holds a worker's compute per step at its 1-worker time (one worker
    per core, nothing else running) and adds what it predicts communication costs; so where the
    measured compute per step grew with the workers (ranks sharing cores, other processes), or
    communication and waiting took longer than predicted, the measurement falls below it."""
    runs = real_only(runs)
    measured = scaling_table(runs)
    if predictions.empty or measured.empty:
        return pd.DataFrame()
    pred = predictions.rename(columns={"workers": "num_workers", "efficiency": "predicted",
                                       "compute_s": "predicted_compute_s",
                                       "comm_s": "predicted_comm_s"})
    table = measured.merge(pred[["algorithm", "model", "num_workers", "predicted",
                                 "predicted_compute_s", "predicted_comm_s"]],
                           on=["algorithm", "model", "num_workers"])
    one = measured[measured.num_workers == 1].set_index(["algorithm", "model"])
    table = table[table.num_workers > 1].reset_index(drop=True)
    for part in TIME_PARTS:  # each part of the 1-worker step, beside this point's
        table[f"{part.removesuffix('_s')}_1_s"] = [
            one[part].get((a, m), float("nan")) if part in one else float("nan")
            for a, m in zip(table.algorithm, table.model, strict=True)]
    table["gap"] = table.efficiency - table.predicted
    limit = (2 * table.efficiency_std.fillna(0)).clip(lower=MODEL_TOLERANCE)
    table["differs"] = table.gap.abs() > limit
    table["why"] = [_why(row) if row.differs else "" for row in table.itertuples()]
    return table


def _seconds(before: float, after: float) -> str:
    """'0.40 -> 0.70 s', or '1.2 -> 3.7 ms' for steps too short for hundredths of a second."""
    if max(before, after) >= 0.1:
        return f"{before:.2f} -> {after:.2f} s"
    return f"{before * 1e3:.1f} -> {after * 1e3:.1f} ms"


def _why(row) -> str:
    """The measured step's parts against the model's, and what on this machine explains them."""
    causes = []
    if row.ranks_exceed_cores:
        causes.append(f"{row.world_size} ranks on {row.cores:g} cores")
    if row.under_load:
        causes.append(f"other processes took up to {row.load_others_share:.0%} of the cores")
    where = f" ({', '.join(causes)})" if causes else ""
    if row.gap > 0:
        return ("faster than the model: its 1-worker runs, which calibrate it, were slower than "
                "this point's (load while they ran?)")
    reasons = []
    growth = getattr(row, "compute_s", float("nan")) / row.compute_1_s
    if growth > 1.15:
        reasons.append(f"compute per step grew {growth:.2f}x over 1 worker ("
                       f"{_seconds(row.compute_1_s, row.compute_s)}"
                       f"{': ' + ', '.join(causes) if causes else ''}); "
                       "the model keeps the 1-worker compute")
        where = ""
    comm = getattr(row, "comm_s", 0.0) + getattr(row, "wait_s", 0.0)
    if comm - row.predicted_comm_s > 0.05 * row.predicted_compute_s:
        reasons.append(f"communication and waiting took {comm:.3f} s a step against the model's "
                       f"{row.predicted_comm_s:.3f} s")
    if not reasons:
        deltas = {part.removesuffix("_s"): getattr(row, part, float("nan"))
                  - getattr(row, f"{part.removesuffix('_s')}_1_s") for part in TIME_PARTS}
        before = sum(getattr(row, f"{p.removesuffix('_s')}_1_s") for p in TIME_PARTS)
        grown = ", ".join(f"{name} {delta:+.3f}" for name, delta in deltas.items()
                          if delta == delta and abs(delta) >= 0.005)
        reasons.append(f"a worker's step grew {before:.2f} -> {before + sum(deltas.values()):.2f} "
                       f"s in small parts ({grown or 'none over 5 ms'} s); the model adds only "
                       f"{row.predicted_comm_s:.3f} s of communication to the 1-worker step")
    return "; ".join(reasons) + where


def model_notes(runs: pd.DataFrame, predictions: pd.DataFrame) -> list[str]:
    """One line per point where measurement and model disagree: what each says, and why."""
    gaps = model_gaps(runs, predictions)
    if gaps.empty:
        return []
    return [f"{row.algorithm} at {row.num_workers} workers: measured {row.efficiency:.2f}, "
            f"predicted {row.predicted:.2f}: {row.why}" for row in gaps[gaps.differs].itertuples()]


def _model_caption(gaps: pd.DataFrame) -> str:
    """The figure's note: how many points disagree with the model, and the common cause."""
    if gaps.empty:
        return "no measured point past 1 worker to compare with the model"
    off = gaps[gaps.differs]
    if off.empty:
        return (f"every measured point is within {MODEL_TOLERANCE:.2f} (or 2 std) of the model")
    lines = [f"{len(off)} of {len(gaps)} measured points differ from the model by more than "
             f"{MODEL_TOLERANCE:.2f}; measured {_span(off.efficiency)} against predicted "
             f"{_span(off.predicted)}."]
    growth = (off.compute_s / off.compute_1_s) if "compute_s" in off else pd.Series(dtype=float)
    if len(growth.dropna()) and growth.max() > 1.15:
        lines.append(f"Why: a worker's compute per step grew {_span(growth)}x "
                     "over its 1-worker time (ranks shared the cores"
                     + (", under load" if off.under_load.any() else "")
                     + "); the model assumes each worker keeps its 1-worker compute.")
    else:  # no one cause: each point's own (the study prints them all)
        import textwrap

        for row in off.head(3).itertuples():
            lines += textwrap.wrap(f"{row.algorithm} at {row.num_workers} workers: {row.why}", 150)
        if len(off) > 3:
            lines.append(f"... and {len(off) - 3} more (scaling_plots.model_notes, printed by the "
                         "study)")
    return "\n".join(lines)


def _span(values: pd.Series) -> str:
    """'0.41-0.68', or '0.55' where all round alike."""
    low, high = f"{values.min():.2f}", f"{values.max():.2f}"
    return low if low == high else f"{low}-{high}"


#: model curves closer than this everywhere are drawn as one line (named after all of them)
SAME_CURVE = 0.02


def _merged_curves(predictions: pd.DataFrame, names: list[str]):
    """The model's curves, algorithms whose curves coincide (within ``SAME_CURVE`` everywhere: closer
    than a line's width on the figure) drawn as one,
    labelled with all their names: (color, label, curve)."""
    groups: list[tuple[list[str], pd.DataFrame]] = []
    for name in names:
        curve = predictions[predictions.algorithm == name].sort_values("workers")
        if curve.empty:
            continue
        for members, first in groups:
            if (list(first.workers) == list(curve.workers)
                    and abs(first.efficiency.to_numpy() - curve.efficiency.to_numpy()).max()
                    < SAME_CURVE):
                members.append(name)
                break
        else:
            groups.append(([name], curve))
    for members, curve in groups:
        yield f"C{names.index(members[0])}", ", ".join(members), curve


def scaling_model_figure(runs: pd.DataFrame, predictions: pd.DataFrame):
    """Left: at the worker counts measured here, each algorithm's measured efficiency (filled, error
    bars over repeats) beside the model's (hollow diamond), a thin line between them. Right: the
    model's curves out to 1,024 workers, coinciding curves drawn once, each with its band where
    the calibration leaves quantities unmeasured (a hardware file's ranges). The title names the machine
    and commit; the note under the axes says where and why the two differ (``model_gaps``)."""
    runs = real_only(runs)
    model = runs.model.iloc[0]  # a study trains one model; the figure shows the first
    runs = runs[runs.model == model]
    measured = scaling_table(runs)
    predictions = predictions[predictions.model == model]
    names = sorted(set(measured.algorithm) | set(predictions.algorithm))
    gaps = model_gaps(runs, predictions)
    fig, axes = figure_grid(1, 2, 13.0, 5.2)
    near, far = axes[0]
    if not gaps.empty:
        gaps = gaps.sort_values(["num_workers", "algorithm"]).reset_index(drop=True)
        x = dodged(gaps.assign(num_workers=gaps.num_workers.map(
            {n: i for i, n in enumerate(sorted(gaps.num_workers.unique()))}))) * 2.5
        for i, row in gaps.iterrows():
            color = f"C{names.index(row.algorithm)}"
            near.plot([x[i], x[i]], [row.efficiency, row.predicted], "-", color=color, alpha=0.4)
            near.errorbar(x[i], row.efficiency, yerr=row.efficiency_std, fmt="o", color=color,
                          capsize=3, markeredgecolor="black")
            near.plot(x[i], row.predicted, "D", markerfacecolor="none", markeredgecolor=color,
                      markersize=7)
            if row.under_load:
                near.plot(x[i], row.efficiency, "x", color="red", markersize=9, mew=1.6)
        counts = sorted(gaps.num_workers.unique())
        near.set_xticks([i * 2.5 for i in range(len(counts))], [str(n) for n in counts])
        for color, name in ((f"C{names.index(n)}", n) for n in names if n in set(gaps.algorithm)):
            near.plot([], [], "s", color=color, label=name)
        near.plot([], [], "o", color="gray", markeredgecolor="black", label="measured (± std)")
        near.plot([], [], "D", markerfacecolor="none", markeredgecolor="gray", label="predicted")
        if gaps.under_load.any():
            near.plot([], [], "x", color="red", mew=1.6, label="measured under load")
        near.legend(fontsize=7, loc="lower left", ncol=2)
    near.set_xlabel("workers (measured here; algorithms side by side)")
    near.set_ylabel("throughput / (N x 1-worker throughput)")
    near.set_ylim(0, 1.15)
    near.set_title("measured here, beside the model", fontsize=9)
    for color, label, curve in _merged_curves(predictions, names):
        far.plot(curve.workers, curve.efficiency, "-", color=color, alpha=0.85, label=label)
        if {"efficiency_low", "efficiency_high"} <= set(curve) and curve.efficiency_low.notna().all():
            # what the model cannot know for hardware nobody measured (perf.terms' ranges)
            far.fill_between(curve.workers, curve.efficiency_low, curve.efficiency_high,
                             color=color, alpha=0.15, linewidth=0)
    far.set_xscale("log", base=2)
    far.set_xlabel("workers")
    far.set_ylim(0, 1.15)
    far.set_title(f"the model out to 1,024 workers (curves within {SAME_CURVE} of each other "
                  "drawn once)", fontsize=9)
    far.legend(fontsize=7, loc="lower left")
    for ax in (near, far):
        ax.grid(alpha=0.3)
    cal = predictions.calibration.iloc[0] if len(predictions) else "?"
    fig.suptitle(f"Scaling efficiency of {model}, measured and predicted (calibration {cal})\n"
                 f"{measured_on(runs)}", fontsize=9)
    fig.text(0.01, -0.02, _model_caption(gaps), fontsize=8, ha="left", va="top", wrap=True)
    return fig


def make_figures(source: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every scaling figure from the study's CSV (``source``: the CSV, or the study's directory
    holding ``runs.csv``), as PNGs in ``out_dir`` (default: ``figures/`` beside the CSV). Where
    the model was calibrated on the study (``calibration.json`` beside the CSV:
    ``model_plots.model_for_study``), throughput, speedup and efficiency draw its curve beside
    each emulated series (``emulated_check.emulated_vs_model``)."""
    source = Path(source)
    csv = source / "runs.csv" if source.is_dir() else source
    out_dir = Path(out_dir) if out_dir is not None else csv.parent / "figures"
    runs = load_runs(csv)
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

