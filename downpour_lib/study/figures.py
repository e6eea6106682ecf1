"""What every study's figures share: a pyplot-free ``Figure`` (no global state, no backend switch, so
a notebook displays it inline and ``make_figures`` saves it) and how it is saved."""

from __future__ import annotations

from pathlib import Path


def figure_grid(nrows: int, ncols: int, width: float, height: float = 3.8):
    """A pyplot-free ``Figure`` and its axes as an nrows x ncols array (every study figure's start)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def figure_row(ncols: int, width: float):
    """``figure_grid`` with one row: the figure and its ``ncols`` axes."""
    fig, axes = figure_grid(1, ncols, width)
    return fig, axes[0]


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")  # the scaling legends sit outside the axes
    return path


def measured_on(runs) -> str:
    """'measured on HOST, N cores, CPU, torch V, commit SHA', from a study's rows (the last one's),
    for a figure's title: a figure names the machine and code it shows (older CSVs lack some)."""
    if len(runs) == 0:
        return ""
    last = runs.iloc[-1]
    machine = [str(last.get("host", last.get("hosts", "?")))]
    if "cores" in last and last.cores == last.cores:  # not NaN
        machine.append(f"{int(last.cores)} cores, {last.get('cpu_model', '?')}")
    machine += [f"torch {last.get('torch_version', '?')}", f"commit {str(last.get('git_sha', '?'))[:10]}"]
    return "measured on " + ", ".join(machine)
