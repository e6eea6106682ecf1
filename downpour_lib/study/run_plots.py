"""Figures of one run, from its ``RunResult`` (what notebook 01 shows): learning curves and where the
time of each step goes (the record schema's parts, ``records.TIME_PARTS``)."""

from __future__ import annotations

import pandas as pd

from ..records import TIME_PARTS, RunResult
from .figures import figure_row


def _title(result: RunResult) -> str:
    s = result.summary
    return (f"{s['algorithm']} on {s['world_size']} rank(s) ({s['num_workers']} worker(s)), "
            f"{s['model']} on {s['dataset']}")


def curves_figure(result: RunResult):
    """Training loss per step (mean over workers) and test loss / accuracy at each evaluation."""
    fig, (loss_ax, acc_ax) = figure_row(2, 10)
    workers = result.steps[result.steps.role == "worker"]
    train = workers.groupby("step").loss.mean()
    loss_ax.plot(train.index, train.values, label="train (mean over workers)")
    evals = result.evals.sort_values("step")
    if len(evals):
        loss_ax.plot(evals.step, evals.loss, "o-", label="test")
        acc_ax.plot(evals.step, evals.accuracy, "o-", color="C1")
    loss_ax.set(xlabel="step", ylabel="cross-entropy", title="loss")
    acc_ax.set(xlabel="step", ylabel="accuracy", title="test accuracy", ylim=(0, 1))
    loss_ax.legend(fontsize=8)
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(_title(result), fontsize=10)
    fig.tight_layout()
    return fig


def step_parts(steps: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds of each part per step over the workers (one row per step)."""
    workers = steps[steps.role == "worker"]
    return workers.groupby("step")[list(TIME_PARTS)].mean()


def step_breakdown_figure(result: RunResult):
    """Left: each step's time split into its parts (mean over workers). Right: per rank, the mean
    step, workers and servers, after the warm-up steps."""
    fig, (steps_ax, ranks_ax) = figure_row(2, 11)
    per_step = step_parts(result.steps)
    steps_ax.stackplot(per_step.index, *[per_step[p] for p in TIME_PARTS],
                       labels=[p.removesuffix("_s") for p in TIME_PARTS],
                       colors=[f"C{i}" for i in range(len(TIME_PARTS))])
    steps_ax.set(xlabel="step", ylabel="seconds", title="each step, mean over workers")
    steps_ax.legend(fontsize=8, loc="upper right")
    warm = result.summary.get("warmup_steps", 0)
    measured = result.steps[result.steps.step >= warm]
    per_rank = measured.groupby(["rank", "role"])[list(TIME_PARTS)].mean().reset_index()
    labels = [f"{r}\n{role}" for r, role in zip(per_rank["rank"], per_rank.role, strict=True)]
    bottom = pd.Series(0.0, index=per_rank.index)
    for i, part in enumerate(TIME_PARTS):
        ranks_ax.bar(labels, per_rank[part], bottom=bottom, color=f"C{i}")
        bottom += per_rank[part]
    ranks_ax.set(xlabel="rank", ylabel="seconds per step", title=f"mean step per rank (after {warm} "
                 "warm-up steps)")
    for ax in (steps_ax, ranks_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(_title(result), fontsize=10)
    fig.tight_layout()
    return fig
