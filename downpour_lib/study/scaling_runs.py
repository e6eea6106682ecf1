"""The scaling study's table, read from its CSV alone (``results/<host>/scaling/runs.csv``): the rows of
the commit measured last, and per series and worker count the mean throughput over repeats with its
spread, the step's parts (``records.TIME_PARTS``), the cores the ranks had and whether they exceeded
them, how many repeats ran under load, and speedup and efficiency against ideal linear scaling of the
same algorithm's 1-worker throughput: speedup(N) = throughput(N) / throughput(1), efficiency(N) =
speedup(N) / N. It draws nothing: the scaling figures (``scaling_plots``) and the figure beside the
performance model (``scaling_model_plots``) both read it, and where each point sits on their workers
axis (``dodged``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..records import TIME_PARTS
from .core import latest_commit, read_runs_csv, with_series

GROUP = ["series", "algorithm", "model", "dataset", "batch_size"]
#: what a worker of a run computes on: a figure draws one (``one_workload``)
WORKLOAD = ["model", "dataset", "batch_size"]


def load_runs(csv: str | Path, workload: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The study CSV's rows of the commit measured last (``core.latest_commit``): a machine's CSV
    keeps its earlier commits' rows, and a figure must not mix code versions. With ``workload``,
    only its rows (``one_workload``). Each row gets its ``series`` (``with_series``)."""
    runs = latest_commit(read_runs_csv(csv))
    return with_series(runs if workload is None else one_workload(runs, workload))


def one_workload(runs: pd.DataFrame, workload: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The rows of ``workload`` (its ``WORKLOAD`` fields), or of the one measured last (the last
    row's). A study of your own model run into the same directory as ``make study`` adds its rows
    to the same CSV, and a figure that drew both would join two models' throughput in one line."""
    if not len(runs):
        return runs
    where = workload if workload is not None else runs.iloc[-1]
    keep = pd.Series(True, index=runs.index)
    for field in WORKLOAD:
        keep &= runs[field] == where[field]
    return runs[keep].reset_index(drop=True)


def other_workloads(runs: pd.DataFrame, workload: Mapping[str, Any]) -> list[str]:
    """Each workload but ``workload`` that ``runs`` (``load_runs``' rows) hold, described."""
    others = runs[WORKLOAD].drop_duplicates()
    return [f"{row.model} on {row.dataset}, batch {row.batch_size}" for row in others.itertuples()
            if any(getattr(row, field) != workload[field] for field in WORKLOAD)]


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


def real_only(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows whose compute was real: what the model is calibrated on and set beside (an
    emulated row's compute is a sleep; its check against the model is a table of its own)."""
    if "compute" not in runs:
        return runs
    return runs[runs["compute"].fillna("real") == "real"]


#: How far apart, in workers, the first and last algorithm's points sit at one worker count: at
#: the same x their error bars would hide behind each other.
DODGE = 0.24


def dodged(table: pd.DataFrame) -> pd.Series:
    """Each row's x: its worker count, shifted by its algorithm's place among the algorithms."""
    names = sorted(table.series.unique())
    shift = {name: (i - (len(names) - 1) / 2) * DODGE / max(1, len(names) - 1)
             for i, name in enumerate(names)}
    return table.num_workers + table.series.map(shift)
