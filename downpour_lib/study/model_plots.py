"""The performance model in the study: its curves beside the measured points, and where each algorithm
is fastest.

- ``predictions_table``: the model's rows for a study's algorithms at 1 to 1,024 workers, each
  carrying the calibration it came from (name and source); ``model_for_study`` calibrates on a
  scaling study (its one-worker runs, a ``bench collectives`` measurement beside it) and writes them
  as the study's ``predictions.csv``.
- ``staleness_model_figure``: a measured Downpour staleness distribution beside the simulated one.
- ``fastest_map`` and ``fastest_map_figure``: for workers x bandwidth of the card between nodes,
  which algorithm has the highest throughput (notebook 06, "at scale"), and which cells another
  algorithm wins at an end of what the calibration does not measure.
- ``prediction_figure``: ``downpour model predict --figure``, each algorithm's efficiency and its
  speedup over a reference, with their bands.
- ``published_figure``: the model against published results (``downpour model check``), per kind
  of check: each published efficiency beside the model's point and band.

Figures come from CSVs and calibrations only, like every study figure; the curves beside a scaling
study's measured points are ``scaling_model_plots.scaling_model_figure``, drawn by
``scaling_plots.make_figures`` wherever the study has a ``predictions.csv``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..perf.calibration import Calibration
from ..perf.hardware import with_fields
from ..perf.netmodel import GBIT, Link
from ..perf.perfmodel import predict_rows
from .core import RESULTS_ROOT, host_dirname
from .figures import figure_row

WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def model_dir(out: str | Path | None = None, root: str | Path = RESULTS_ROOT) -> Path:
    """Where this machine's calibration, predictions and model figures go: ``out`` if given, else
    ``<root>/<host>/model/``."""
    return Path(out) if out else Path(root) / host_dirname() / "model"


def predictions_table(cal: Calibration, algorithms, model: str,
                      workers=WORKERS) -> pd.DataFrame:
    """The model's prediction for each algorithm at each worker count, with its calibration."""
    table = pd.DataFrame(predict_rows(cal, list(algorithms), list(workers), model))
    table["calibration_source"] = cal.source
    return table


#: between nodes, where a study measured one machine: 10 Gbit/s Ethernet, 50 us a message (assumed)
ETHERNET_10G = Link(50e-6, 10 * GBIT)


def model_for_study(study: str | Path, out: str | Path | None = None,
                    collectives: str | Path | None = None, ranks: int = 2, workers=WORKERS,
                    between: Link = ETHERNET_10G) -> tuple[Calibration, pd.DataFrame]:
    """Calibrate the model on a scaling study (its directory or ``runs.csv``) and write, into
    ``out`` (default: the study's directory), ``collectives.json`` (measured here on ``ranks`` MPI
    ranks unless ``collectives`` is given or one is already there), ``calibration.json`` and
    ``predictions.csv``: every algorithm and model of the study's latest commit at ``workers``.

    One machine measures the link inside a node only: the node holds as many ranks as the study's
    largest run, and past them nodes are joined by ``between`` (an assumption, named in the
    calibration's source, which every row carries)."""
    from ..perf.calibrate import calibrate, measure_collectives, save
    from .scaling_runs import load_runs, real_only

    study = Path(study)
    csv = study / "runs.csv" if study.is_dir() else study
    out = Path(out) if out is not None else csv.parent
    runs = real_only(load_runs(csv))
    if collectives is None:
        collectives = out / "collectives.json"
        if not collectives.is_file():
            print(f"measuring this machine's link for the model: `downpour bench collectives` on "
                  f"{ranks} MPI ranks into {collectives} (once; 30-60 s) ...", flush=True)
            measure_collectives(collectives, ranks=ranks)
    cal = calibrate(collectives, runs, inter=between)
    save(cal, out / "calibration.json")
    table = pd.concat([predictions_table(cal, sorted(runs.algorithm.unique()), model, workers)
                       for model in sorted(runs.model.unique())], ignore_index=True)
    table.to_csv(out / "predictions.csv", index=False)
    print(f"calibrated the model on this study: {out / 'calibration.json'} (`downpour model "
          f"predict` reads it), {out / 'predictions.csv'}", flush=True)
    return cal, table


def staleness_model_figure(dists: pd.DataFrame):
    """Per Downpour run, the measured share of pushes at each staleness (bars) and the simulated
    one (outlined bars): ``calibrate.compare_staleness``'s second table."""
    labels = list(dict.fromkeys(dists.label))
    fig, axes = figure_row(len(labels), 3.2 * len(labels))
    for ax, label in zip(axes, labels, strict=True):
        mine = dists[dists.label == label]
        for source, offset, style in (("measured", -0.2, {"color": "C0"}),
                                      ("simulated", 0.2, {"fill": False, "edgecolor": "C3",
                                                          "hatch": "//"})):
            part = mine[mine.source == source]
            ax.bar(part.staleness + offset, part.fraction, width=0.4, label=source, **style)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("staleness (server updates)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of pushes")
    axes[0].legend(fontsize=7)
    return fig


def map_preset(preset: str, model: str, algorithms, gbits) -> Calibration:
    """The preset a fastest-algorithm map is drawn on, with the map's settings checked up front (a
    notebook's parameters: ``preset``, ``preset_model``, ``map_algorithms``, ``gbits``)."""
    from ..errors import ConfigError, unknown_name
    from ..perf.perfmodel import MODELLED_ALGORITHMS
    from ..perf.presets import PRESETS

    if preset not in PRESETS:
        raise unknown_name("preset", preset, PRESETS)
    cal = PRESETS[preset]
    if model not in cal.workloads:
        raise ConfigError("preset_model", model, f"preset {preset!r} has "
                          + ", ".join(sorted(cal.workloads)))
    if isinstance(algorithms, str) or not algorithms:
        raise ConfigError("map_algorithms", algorithms, "a list of algorithms, e.g. "
                          '["allreduce", "sgp", "localsgd"]')
    for name in algorithms:
        if name not in MODELLED_ALGORITHMS:
            raise unknown_name("map_algorithms", name, MODELLED_ALGORITHMS)
    if isinstance(gbits, str) or not gbits or not all(
            isinstance(g, (int, float)) and not isinstance(g, bool) and g > 0 for g in gbits):
        raise ConfigError("gbits", gbits, "a list of link rates in Gbit/s > 0, e.g. [1, 10, 100]")
    return cal


def fastest_map(cal: Calibration, algorithms, model: str, workers=WORKERS[1:],
                gbits=(1, 10, 25, 100, 400)) -> pd.DataFrame:
    """Every algorithm's throughput at every (workers, Gbit/s of a node's card), and which is fastest
    there; the card's latency stays the calibration's, and what a collective gets of its line
    rate is the range of the calibration's transport (``terms.transport_rate``) or the fitted
    share (``terms.LINK_EFFICIENCY``)."""
    rows = []
    for rate in gbits:
        at = with_fields(cal, inter_gbit=rate, inter_transport=cal.inter_transport)
        for r in predict_rows(at, list(algorithms), list(workers), model):
            rows.append({**r, "gbit": rate})
    table = pd.DataFrame(rows)
    table["fastest"] = _fastest(table, table.samples_per_s)
    # the same at each end of what the calibration does not measure (one model and batch, so the
    # shorter step is the higher throughput): the cell is settled where the same one wins at both
    ends = [table.loc[_fastest(table, 1 / table[end]), ["gbit", "workers", "algorithm"]]
            for end in ("step_s_low", "step_s_high")]
    winners = table[table.fastest][["gbit", "workers", "algorithm"]]
    for i, end in enumerate(ends):
        winners = winners.merge(end.rename(columns={"algorithm": f"end{i}"}), on=["gbit", "workers"])
    winners["contender"] = [", ".join(dict.fromkeys(e for e in (e0, e1) if e != a)) for a, e0, e1
                            in zip(winners.algorithm, winners.end0, winners.end1, strict=True)]
    table = table.merge(winners[["gbit", "workers", "contender"]], on=["gbit", "workers"])
    table["settled"] = table.contender == ""
    return table


def _fastest(table: pd.DataFrame, rate: pd.Series) -> pd.Series:
    """Which row of each (gbit, workers) is fastest by ``rate``: within 1% of the best counts as a
    tie, won by the algorithm listed first (list the exact ones, allreduce, first: at equal speed
    an exact average beats an approximate one)."""
    top = rate.groupby([table.gbit, table.workers]).transform("max")
    near = table[rate >= 0.99 * top]
    return pd.Series(table.index.isin(near.groupby(["gbit", "workers"]).head(1).index),
                     index=table.index)


def fastest_map_figure(table: pd.DataFrame):
    """A grid over workers x bandwidth, each cell coloured by its fastest algorithm and labelled
    with it and its efficiency; hatched, and naming them, where other algorithms are the fastest
    at an end of what the calibration does not measure (``fastest_map``'s ``contender``)."""
    best = table[table.fastest].copy()
    names = sorted(table.algorithm.unique())
    workers = sorted(best.workers.unique())
    gbits = sorted(best.gbit.unique())
    fig, (ax,) = figure_row(1, max(7.0, 0.75 * len(workers) + 2))
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    grid = best.pivot(index="gbit", columns="workers", values="algorithm").loc[gbits, workers]
    codes = grid.apply(lambda col: col.map(names.index))
    ax.imshow(codes.to_numpy(dtype=float), cmap=ListedColormap([f"C{i}" for i in range(len(names))]),
              vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower", alpha=0.55)
    eff = best.pivot(index="gbit", columns="workers", values="efficiency").loc[gbits, workers]
    rival = best.pivot(index="gbit", columns="workers", values="contender").loc[gbits, workers]
    for y, rate in enumerate(gbits):
        for x, n in enumerate(workers):
            other = rival.loc[rate, n]
            ax.text(x, y, f"{grid.loc[rate, n]}\n{eff.loc[rate, n]:.0%}"
                    + "".join(f"\nor {o}" for o in other.split(", ") if o), ha="center",
                    va="center", fontsize=6.5)
            if other:
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="///",
                                       edgecolor="0.55", lw=0))
    ax.set_xticks(range(len(workers)), [str(n) for n in workers])
    ax.set_yticks(range(len(gbits)), [f"{g:g}" for g in gbits])
    ax.set_xlabel("workers")
    ax.set_ylabel("Gbit/s of a node's card")
    first = table.iloc[0]
    ax.set_title(f"Fastest algorithm (and its efficiency), {first.model}, calibration "
                 f"{first.calibration}; of {', '.join(names)}; hatched: another wins at one "
                 "end of what it does not measure", fontsize=9)
    return fig


def prediction_figure(table: pd.DataFrame):
    """``downpour model predict``'s rows drawn (``perfmodel.predict_rows``, or its CSV): each
    algorithm's efficiency over the workers, its band shaded where the calibration left quantities
    unmeasured; beside it, where the rows carry one, each algorithm's speedup over the reference
    (``against``) with the band of that comparison, which shares the unknowns."""
    compare = "speedup" in table and table.speedup.notna().any()
    fig, axes = figure_row(2 if compare else 1, 10.0 if compare else 5.5)
    panels = [("efficiency", "efficiency_low", "efficiency_high", "scaling efficiency")]
    if compare:
        panels.append(("speedup", "speedup_low", "speedup_high",
                       f"samples/s over {table.against.dropna().iloc[0]}'s"))
    for ax, (point, low, high, label) in zip(axes, panels, strict=True):
        for i, (name, rows) in enumerate(table.groupby("algorithm", sort=False)):
            rows = rows.sort_values("workers")
            # each its own line style and marker too: algorithms the model prices alike
            # (allreduce, ddp) lie on one line, which would hide all but the last drawn
            ax.plot(rows.workers, rows[point], marker="osv^Dx*P"[i % 8], ms=4, color=f"C{i}",
                    ls=("-", "--", ":", "-.")[i % 4], label=name)
            if low in rows and (rows[high] > rows[low]).any():
                ax.fill_between(rows.workers, rows[low], rows[high], color=f"C{i}", alpha=0.18, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    first = table.iloc[0]
    fig.suptitle(f"{first.model} on {first.calibration}: the point, and shaded the band of what "
                 "it does not measure", fontsize=9)
    return fig


def published_figure(table: pd.DataFrame):
    """The model against published results (``presets.published_table``, or its CSV), one panel per
    kind of check (``presets.KINDS``): each published efficiency (x) against the model's point
    (y), the band a vertical bar. On the diagonal the point is right; the dashed lines are 10
    points either side, the goal's largest error. A published value outside its band is drawn
    hollow and red. Speedups (no kind) are left to the table."""
    from ..perf.presets import KINDS

    kinds = table.kind.fillna("")
    efficiency = table[kinds != ""]
    present = [k for k in KINDS if (efficiency.kind == k).any()]
    fig, axes = figure_row(len(present), 3.4 * len(present))
    for ax, kind in zip(axes, present, strict=True):
        part = efficiency[efficiency.kind == kind]
        inside = part.outside_band == 0  # presets.Published.outside_band, as check counts it
        low = min(part.published.min(), part.low.min()) - 0.01
        high = max(part.published.max(), part.high.max()) + 0.01
        ax.plot([low, high], [low, high], color="0.25", lw=0.8)
        for off, label in ((-0.1, "10 points off"), (0.1, None)):
            ax.plot([low, high], [low + off, high + off], color="0.6", lw=0.8, ls="--", label=label)
        for mask, label, style in ((inside, "inside its band", {"color": "C0"}),
                                   (~inside, "outside its band", {"color": "C3", "mfc": "none"})):
            rows = part[mask]
            if len(rows):
                ax.errorbar(rows.published, rows.predicted,
                            yerr=[rows.predicted - rows.low, rows.high - rows.predicted], fmt="o",
                            ms=3.5, elinewidth=0.8, capsize=1.5, label=label, **style)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal")
        ax.set_title(f"{kind}: {int(inside.sum())} of {len(part)} inside", fontsize=8)
        ax.set_xlabel("published efficiency")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("the model: point and band")
    axes[0].legend(fontsize=7, loc="upper left")
    return fig
