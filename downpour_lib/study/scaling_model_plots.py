"""The scaling study beside the performance model: ``scaling_model.png``, drawn from the study's CSV
(``results/<host>/scaling/runs.csv``, its real-compute rows) and the model's ``predictions.csv`` beside
it (``model_plots.model_for_study``). At the worker counts measured, each algorithm's measured
efficiency beside the predicted one; the model's curves out to 1,024 workers; and, for each point
where the two differ by more than ``MODEL_TOLERANCE``, why (``model_gaps``, ``model_notes``: what
grew in the measured step that the model holds at its 1-worker value).

``scaling_plots.make_figures`` draws it wherever the study has a ``predictions.csv``, and
``scaling_plots.report`` prints the notes.
"""

from __future__ import annotations

import pandas as pd

from ..records import TIME_PARTS
from .figures import figure_grid, measured_on
from .scaling_runs import dodged, real_only, scaling_table

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
