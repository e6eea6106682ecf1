"""The time-and-bytes-to-accuracy study's tables and figures (notebook 05), from its CSVs alone.

``AccuracyStudy.load(directory)`` reads ``runs.csv`` and ``evals.csv`` (the rows of the commit
measured last, the last run of each algorithm in each setting); ``table`` gives seconds and
megabytes to the target accuracy, one row per algorithm and one column per setting; the figures show
test accuracy against wall time and against the bytes all ranks sent, one panel per setting. Each
algorithm keeps its colour in every panel. Every ``*_figure`` returns a pyplot-free ``Figure``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import ConfigError
from .accuracy import TABLES
from .core import StudyStore
from .figures import figure_grid, measured_on, save_figure

FIGURES = ("accuracy_vs_time", "accuracy_vs_bytes")


def setting_name(row) -> str:
    slow = f", {int(row.slow_workers)} slow x{row.slowdown:g}" if row.slow_workers else ""
    return f"{row.link}{slow}"


@dataclass(frozen=True, eq=False)
class AccuracyStudy:
    runs: pd.DataFrame  # one row per run: setting, algorithm, time and bytes to target, summary
    evals: pd.DataFrame  # every evaluation: setting, algorithm, step, time_s, accuracy, bytes_sent

    @classmethod
    def load(cls, directory: str | Path) -> AccuracyStudy:
        store = StudyStore(directory, TABLES)
        if not store.path("runs").is_file():
            raise ConfigError("directory", str(directory), "no runs.csv there; run_study writes it "
                              "(notebook 05 does, into results/<host>/accuracy)")
        frames = store.read()
        runs = frames["runs"].assign(setting=lambda f: [setting_name(r) for r in f.itertuples()])
        runs = runs.drop_duplicates(["setting", "algorithm"], keep="last").reset_index(drop=True)
        evals = frames["evals"]
        evals = evals[evals.run_id.isin(set(runs.run_id))] if "run_id" in evals else evals
        evals = evals.merge(runs[["run_id", "setting"]], on="run_id") if len(evals) else \
            evals.assign(setting=[])
        return cls(runs, evals.reset_index(drop=True))

    @property
    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.runs.setting))

    @property
    def algorithms(self) -> list[str]:
        return list(dict.fromkeys(self.runs.algorithm))

    @property
    def target(self) -> float:
        return float(self.runs.target_accuracy.iloc[0])

    @property
    def network(self) -> str:
        return str(self.runs.network.iloc[0])

    def table(self) -> pd.DataFrame:
        """Per algorithm (rows) and setting (columns): seconds to the target, megabytes all ranks
        had sent by then, and the final test accuracy."""
        runs = self.runs.assign(mb_to_target=self.runs.bytes_to_target / 1e6)
        wide = runs.pivot(index="algorithm", columns="setting",
                          values=["time_to_target_s", "mb_to_target", "test_accuracy"])
        wide = wide.reindex(index=self.algorithms)
        return wide.reindex(columns=pd.MultiIndex.from_product(
            [["time_to_target_s", "mb_to_target", "test_accuracy"], self.settings]))

    def subtitle(self) -> str:
        r = self.runs.iloc[0]
        where = ("ranks on 2 emulated hosts (network namespaces, links shaped with tc)"
                 if self.network == "sandbox" else "ranks of one machine (no link to shape)")
        return (f"{r.model} on {r.dataset}, {int(r.workers)} workers x batch {int(r.batch_size)}, "
                f"{int(r.total_steps)} steps, seed {int(r.seed)}; {where}\n{measured_on(self.runs)}")


def colors(study: AccuracyStudy) -> dict[str, str]:
    return {algorithm: f"C{i}" for i, algorithm in enumerate(study.algorithms)}


def _panels(study: AccuracyStudy, x: str, xlabel: str, title: str, scale: float = 1.0,
            log: bool = False):
    settings = study.settings
    fig, axes = figure_grid(1, len(settings), 4.2 * len(settings) + 0.5, 4.4)
    palette = colors(study)
    for ax, setting in zip(axes[0], settings, strict=True):
        here = study.evals[study.evals.setting == setting]
        for algorithm in study.algorithms:
            run = here[here.algorithm == algorithm].sort_values("time_s")
            ax.plot(run[x] * scale, run.accuracy, ".-", markersize=3, color=palette[algorithm],
                    label=algorithm)
        ax.axhline(study.target, color="gray", linestyle=":", linewidth=1, label=f"target {study.target:g}")
        ax.set(title=setting, xlabel=xlabel, ylim=(0, 1.0), xscale="log" if log else "linear")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{title}\n{study.subtitle()}", fontsize=10)
    return fig


def accuracy_vs_time_figure(study: AccuracyStudy):
    """Test accuracy against seconds since the run's start, one panel per setting."""
    return _panels(study, "time_s", "seconds since the run's start", "Time to accuracy")


def accuracy_vs_bytes_figure(study: AccuracyStudy):
    """Test accuracy against the megabytes every rank had sent by then (log scale), per setting."""
    return _panels(study, "bytes_sent", "MB sent by all ranks (log)", "Bytes to accuracy",
                   scale=1e-6, log=True)


def make_figures(directory: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Both figures of the study in ``directory``, from its CSVs alone, as PNGs in ``out_dir``
    (default: ``figures/`` in that directory)."""
    study = AccuracyStudy.load(directory)
    out = Path(out_dir) if out_dir is not None else Path(directory) / "figures"
    makers = {"accuracy_vs_time": accuracy_vs_time_figure, "accuracy_vs_bytes": accuracy_vs_bytes_figure}
    return [save_figure(makers[name](study), out / f"{name}.png") for name in FIGURES]
