"""Scaling figures, made from the study's CSV alone (never from logs or live runs).

Speedup and efficiency are measured against ideal linear scaling of the same algorithm's 1-worker
throughput: efficiency(N) = throughput(N) / (N x throughput(1)).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

GROUP = ["algorithm", "model", "dataset", "batch_size"]


def scaling_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Median throughput per algorithm and worker count, with speedup and efficiency."""
    table = (runs.groupby(GROUP + ["num_workers"], as_index=False)
             .agg(samples_per_s=("samples_per_s", "median"), runs=("samples_per_s", "size"),
                  world_size=("world_size", "first")))
    base = table[table.num_workers == 1].set_index(GROUP).samples_per_s.rename("base")
    table = table.join(base, on=GROUP)
    table["ideal_samples_per_s"] = table.base * table.num_workers
    table["speedup"] = table.samples_per_s / table.base
    table["efficiency"] = table.speedup / table.num_workers
    return table.drop(columns="base").sort_values(GROUP + ["num_workers"]).reset_index(drop=True)


def _axes(title: str, ylabel: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("workers")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _subtitle(runs: pd.DataFrame) -> str:
    first = runs.iloc[0]
    return f"{first.model}, {first.dataset}, batch {first.batch_size}/worker"


def plot_throughput(runs: pd.DataFrame, path: str | Path) -> Path:
    table = scaling_table(runs)
    fig, ax = _axes(f"Throughput\n{_subtitle(runs)}", "samples / s")
    for i, (name, part) in enumerate(table.groupby("algorithm")):
        color = f"C{i}"
        ax.plot(part.num_workers, part.samples_per_s, "o-", color=color, label=name)
        ax.plot(part.num_workers, part.ideal_samples_per_s, "--", color=color, alpha=0.5,
                label=f"{name}, ideal linear")
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_efficiency(runs: pd.DataFrame, path: str | Path) -> Path:
    table = scaling_table(runs)
    fig, ax = _axes(f"Scaling efficiency against ideal linear scaling\n{_subtitle(runs)}",
                    "throughput / (N x 1-worker throughput)")
    ax.axhline(1.0, color="gray", linestyle="--", label="ideal linear scaling")
    for i, (name, part) in enumerate(table.groupby("algorithm")):
        ax.plot(part.num_workers, part.efficiency, "o-", color=f"C{i}", label=name)
    ax.set_xticks(sorted(table.num_workers.unique()))
    ax.set_ylim(0, max(1.1, float(table.efficiency.max()) * 1.1))
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def make_figures(csv: str | Path, out_dir: str | Path) -> list[Path]:
    runs = pd.read_csv(csv)
    out = Path(out_dir)
    return [plot_throughput(runs, out / "throughput.png"),
            plot_efficiency(runs, out / "efficiency.png")]
