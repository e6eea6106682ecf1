"""The time-and-bytes-to-target study's tables and figures (notebooks 05 and 07), from its CSVs alone.

``AccuracyStudy.load(directory)`` reads ``runs.csv`` and ``evals.csv`` (the rows of the commit
measured last, the last run of each algorithm in each setting) and, where there is one,
``predictions.csv`` (``accuracy.predict_to_target``); ``table`` gives seconds and megabytes to the
target, one row per algorithm and one column per setting; the figures show the target's metric (test
accuracy, or a language model's validation loss per token with its perplexity) against wall time and
against the bytes all ranks sent, one panel per setting, and for a loss target the seconds and bytes
to it per algorithm, with the performance model's prediction beside the measured seconds. Each
algorithm keeps its colour in every panel. Every ``*_figure`` returns a pyplot-free ``Figure``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .accuracy import PREDICTIONS, TABLES, Target
from .core import StudyStore
from .figures import figure_grid, measured_on, save_figure

FIGURES = ("accuracy_vs_time", "accuracy_vs_bytes")
#: a loss target's figures (the language model's study, notebook 07)
LOSS_FIGURES = ("loss_vs_time", "loss_vs_bytes", "time_to_target", "bytes_to_target")


def setting_name(row) -> str:
    slow = f", {int(row.slow_workers)} slow x{row.slowdown:g}" if row.slow_workers else ""
    return f"{row.link}{slow}"


@dataclass(frozen=True, eq=False)
class AccuracyStudy:
    runs: pd.DataFrame  # one row per run: setting, algorithm, time and bytes to target, summary
    evals: pd.DataFrame  # every evaluation: setting, algorithm, step, time_s, accuracy, bytes_sent
    #: per run (``run_id``): the model's step and time to the target; empty without predictions.csv
    predictions: pd.DataFrame = None  # type: ignore[assignment]

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
        path = Path(directory) / PREDICTIONS
        predictions = pd.read_csv(path) if path.is_file() else pd.DataFrame({"run_id": []})
        predictions = predictions[predictions.run_id.isin(set(runs.run_id))].reset_index(drop=True)
        return cls(runs, evals.reset_index(drop=True), predictions)

    @property
    def settings(self) -> list[str]:
        return list(dict.fromkeys(self.runs.setting))

    @property
    def algorithms(self) -> list[str]:
        return list(dict.fromkeys(self.runs.algorithm))

    @property
    def goal(self) -> Target:
        """The runs' target (``target_accuracy`` or ``target_loss``)."""
        return Target.of_columns(self.runs.iloc[0].to_dict())

    @property
    def metric(self) -> str:
        return self.goal.metric

    @property
    def target(self) -> float:
        return self.goal.value

    @property
    def network(self) -> str:
        return str(self.runs.network.iloc[0])

    def table(self) -> pd.DataFrame:
        """Per algorithm (rows) and setting (columns): seconds to the target, megabytes all ranks
        had sent by then, and the final test accuracy (for a loss target: the steps to it, the
        model's predicted seconds where there are predictions, and the final test loss)."""
        runs = self.runs.assign(mb_to_target=self.runs.bytes_to_target / 1e6)
        if self.metric == "loss":
            values = ["time_to_target_s", "mb_to_target", "steps_to_target", "test_loss"]
            if len(self.predictions):
                runs = runs.merge(self.predictions[["run_id", "predicted_time_to_target_s"]],
                                  on="run_id", how="left")
                values.insert(1, "predicted_time_to_target_s")
        else:
            values = ["time_to_target_s", "mb_to_target", "test_accuracy"]
        wide = runs.pivot(index="algorithm", columns="setting", values=values)
        wide = wide.reindex(index=self.algorithms)
        return wide.reindex(columns=pd.MultiIndex.from_product([values, self.settings]))

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
    loss = study.metric == "loss"
    for ax, setting in zip(axes[0], settings, strict=True):
        here = study.evals[study.evals.setting == setting]
        for algorithm in study.algorithms:
            run = here[here.algorithm == algorithm].sort_values("time_s")
            ax.plot(run[x] * scale, run[study.metric], ".-", markersize=3,
                    color=palette[algorithm], label=algorithm)
        ax.axhline(study.target, color="gray", linestyle=":", linewidth=1,
                   label=f"target {study.target:g}"
                   + (f" (perplexity {math.exp(study.target):.1f})" if loss else ""))
        ax.set(title=setting, xlabel=xlabel, xscale="log" if log else "linear")
        if not loss:
            ax.set_ylim(0, 1.0)
        else:  # perplexity on the right: e to the loss
            ax.secondary_yaxis("right", functions=(np.exp, _log)).set_ylabel(
                "perplexity" if setting == settings[-1] else "")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation loss per token (nats)" if loss else "test accuracy")
    axes[0][-1].legend(fontsize=8, loc="upper right" if loss else "lower right")
    fig.suptitle(f"{title}\n{study.subtitle()}", fontsize=10)
    return fig


def _log(values):
    """The perplexity axis' inverse, safe where matplotlib probes values <= 0."""
    return np.log(np.clip(values, 1e-300, None))


def _bars(study: AccuracyStudy, column: str, ylabel: str, title: str, scale: float = 1.0,
          predicted: str | None = None):
    """One bar per algorithm in each setting's panel (none: the target was not reached); the
    model's prediction as a black diamond on each measured bar, where there is one, and the
    measured seconds of the same training steps (no evaluations: what the model predicts) as a
    ring."""
    settings = study.settings
    fig, axes = figure_grid(1, len(settings), 1.0 + 0.55 * len(study.algorithms) * len(settings)
                            + 1.5, 4.2)
    palette = colors(study)
    pred = study.predictions.set_index("run_id") if predicted and len(study.predictions) else None
    for ax, setting in zip(axes[0], settings, strict=True):
        here = study.runs[study.runs.setting == setting].set_index("algorithm")
        label = "the model's prediction"  # on the first mark of each panel
        for i, algorithm in enumerate(study.algorithms):
            if algorithm not in here.index:
                continue
            row = here.loc[algorithm]
            value = float(row[column]) * scale
            ax.bar(i, value if math.isfinite(value) else 0, color=palette[algorithm])
            if not math.isfinite(value):
                ax.annotate("not\nreached", (i, 0), ha="center", va="bottom", fontsize=7)
            if pred is not None and row.run_id in pred.index:
                p = float(pred.loc[row.run_id, predicted])
                if math.isfinite(p):
                    ax.plot(i, p * scale, "kD", markersize=5, label=label)
                    train = float(pred.loc[row.run_id, "train_s_to_target"]) * scale
                    ax.plot(i, train, "ko", markersize=6, mfc="none",
                            label="measured, its training steps alone" if label else None)
                    label = None
        ax.set_xticks(range(len(study.algorithms)), study.algorithms, rotation=45, ha="right")
        ax.set(title=setting)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(ylabel)
    if pred is not None and axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=8)
    target = study.goal
    what = (f"validation loss {target.value:g} (perplexity {math.exp(target.value):.1f})"
            if target.metric == "loss" else f"test accuracy {target.value:g}")
    fig.suptitle(f"{title} {what}\n{study.subtitle()}", fontsize=10)
    return fig


def time_to_target_figure(study: AccuracyStudy):
    """Seconds from the run's start to the first evaluation at the target, per algorithm and
    setting; beside each, the performance model's seconds (its step times the steps measured)."""
    return _bars(study, "time_to_target_s", "seconds to the target", "Time to",
                 predicted="predicted_time_to_target_s")


def bytes_to_target_figure(study: AccuracyStudy):
    """Megabytes all ranks had sent by the first evaluation at the target, per algorithm and
    setting."""
    return _bars(study, "bytes_to_target", "MB sent by all ranks to the target", "Bytes to",
                 scale=1e-6)


def accuracy_vs_time_figure(study: AccuracyStudy):
    """The target's metric (test accuracy, or validation loss) against seconds since the run's
    start, one panel per setting."""
    return _panels(study, "time_s", "seconds since the run's start", f"Time to {study.metric}")


def accuracy_vs_bytes_figure(study: AccuracyStudy):
    """The target's metric against the megabytes every rank had sent by then (log scale), per
    setting."""
    return _panels(study, "bytes_sent", "MB sent by all ranks (log)", f"Bytes to {study.metric}",
                   scale=1e-6, log=True)


#: the same figures under the names a loss study gives them
loss_vs_time_figure, loss_vs_bytes_figure = accuracy_vs_time_figure, accuracy_vs_bytes_figure


def make_figures(directory: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """The figures of the study in ``directory`` (``FIGURES``, or ``LOSS_FIGURES`` for a loss
    target), from its CSVs alone, as PNGs in ``out_dir`` (default: ``figures/`` in that
    directory)."""
    study = AccuracyStudy.load(directory)
    out = Path(out_dir) if out_dir is not None else Path(directory) / "figures"
    makers = {"accuracy_vs_time": accuracy_vs_time_figure, "accuracy_vs_bytes": accuracy_vs_bytes_figure,
              "loss_vs_time": loss_vs_time_figure, "loss_vs_bytes": loss_vs_bytes_figure,
              "time_to_target": time_to_target_figure, "bytes_to_target": bytes_to_target_figure}
    names = LOSS_FIGURES if study.metric == "loss" else FIGURES
    return [save_figure(makers[name](study), out / f"{name}.png") for name in names]
