"""Time and bytes to accuracy: Downpour's low-communication descendants beside allreduce, SGP and
Downpour itself (what notebook 05 shows).

Every run trains the same model on the same data from the same seed with the same number of workers;
what changes is the algorithm and the *setting*: where the ranks run and how fast the links between
them are, and whether one worker is a straggler (``slow_workers``/``slowdown``: every step of the
last worker takes F times its compute time). Two kinds of setting:

- ``sandbox``: the multi-node Slurm sandbox (``sandbox/slurm.py``, root only): two emulated hosts,
  each a network namespace with its link shaped to the setting's rate (e.g. 1gbit and 50mbit), the
  ranks started by ``srun`` across both (cyclic, so neighbours sit on different hosts), talking over
  those links (gloo, TCP) as ranks on different machines do;
- ``local``: ranks of this machine under ``mpiexec`` (shared memory; no link to shape), for anyone
  who is not root. The rows and figures say which.

It has the shape of every study (``core``): the plan (``plan_study``) is checked in full before the
first run; runs missing from ``results/<host>/accuracy/`` are measured one after the other into
``runs.csv`` (one row per run: every config field and summary metric, its provenance, the
setting, seconds and bytes to the target accuracy) and ``evals.csv`` (every evaluation: step,
seconds since the start, accuracy, loss, and the bytes every rank had sent by then). A run already
there (same config and setting, this host, this commit) is skipped. ``accuracy_plots`` draws the
figures from those CSVs alone.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..cluster.mpiexec import MPIExecNotFound, find_mpiexec, run_mpiexec
from ..config import TrainConfig
from ..errors import ConfigError
from .core import Outcome, PlannedRun, StudyError, StudyStore, run_plan, scalar_fields
from .on_sandbox import SandboxUse

#: The algorithms compared: the synchronous, gossip and asynchronous baselines, then the four
#: low-communication methods.
COMPARED_ALGORITHMS = ("allreduce", "sgp", "downpour", "localsgd", "easgd", "diloco", "slowmo")
#: The task: MNIST-1D (harder than digits: the algorithms' differences show) and its paper's CNN,
#: the same for every run. 40 epochs of 4 workers x 32 samples are 1,240 steps; evaluated every 40.
#: Each algorithm's own optimizer and learning rate (SGD + momentum 0.9 at 0.05; Adagrad for
#: downpour's servers; AdamW at 0.003 for diloco's inner steps), unless ``base`` names them.
BASE: dict[str, Any] = {
    "model": "cnn1d", "dataset": "mnist1d", "batch_size": 32, "epochs": 40, "seed": 0, "threads": 1,
    "eval_every": 40, "warmup_steps": 5,
}
#: Per-algorithm options under the user's: each method at a setting its paper recommends at small
#: scale (communicating every 4 steps for the local methods; DiLoCo's H kept short for a short run).
OPTIONS: dict[str, dict[str, Any]] = {
    "localsgd": {"period": 4}, "easgd": {"period": 4}, "slowmo": {"period": 4},
    "diloco": {"period": 8}, "downpour": {"warmstart": 0},
}
#: The two link rates of the sandbox settings: a data-centre link and a slow one.
LINKS = ("1gbit", "50mbit")
#: The study's default target accuracy (MNIST-1D's CNN reaches about 0.94 in its paper).
TARGET = 0.80
#: The columns a setting adds to each run's row (and to its identity, with the target accuracy,
#: which the row's seconds and bytes to target depend on).
SETTING_COLUMNS = ("label", "network", "link", "slow_workers", "slowdown")
EVAL_COLUMNS = (*SETTING_COLUMNS, "algorithm", "step", "time_s", "loss", "accuracy", "bytes_sent")
TABLES = ("evals",)


@dataclass(frozen=True)
class Setting:
    """Where a run's ranks run and whether one of them straggles."""

    network: str  # "sandbox" or "local"
    link: str  # the sandbox links' rate (e.g. "1gbit"), "local" for ranks of this machine
    slow_workers: int = 0
    slowdown: float = 1.0

    @property
    def name(self) -> str:
        """How figures and tables name the setting: ``50mbit``, ``50mbit, 1 slow x2``."""
        slow = f", {self.slow_workers} slow x{self.slowdown:g}" if self.slow_workers else ""
        return f"{self.link}{slow}"


def settings(network: str, links: Sequence[str] = LINKS, slowdown: float = 2.0,
             stragglers: Sequence[int] = (0, 1)) -> list[Setting]:
    """Every link rate (one ``local`` setting off the sandbox) with and without stragglers."""
    if network not in ("sandbox", "local"):
        raise ConfigError("network", network, "choose sandbox (as root: the multi-node Slurm "
                          "sandbox) or local (ranks of this machine under mpiexec)")
    rates = tuple(links) if network == "sandbox" else ("local",)
    if network == "sandbox":
        from ..sandbox.netns import parse_rate

        if not rates:
            raise ConfigError("links", links, 'give at least one rate, e.g. ["1gbit", "50mbit"]')
        for rate in rates:
            try:
                parse_rate(rate)
            except ConfigError:
                raise ConfigError("links", rate, "each a rate such as 1gbit or 50mbit") from None
    return [Setting(network, rate, k, slowdown if k else 1.0) for rate in rates for k in stragglers]


def default_network() -> str:
    """``sandbox`` where this process can make one (root, Slurm, ``ip netns``), else ``local``."""
    from ..sandbox.status import missing_requirements

    return "sandbox" if os.geteuid() == 0 and not missing_requirements() else "local"


def run_config(base: Mapping[str, Any], algorithm: str, setting: Setting,
               options: Mapping[str, Mapping[str, Any]] | None = None) -> TrainConfig:
    opts = {**OPTIONS.get(algorithm, {}), **(options or {}).get(algorithm, {})}
    return TrainConfig.from_dict({**base, "algorithm": algorithm, "options": opts,
                                  "slow_workers": setting.slow_workers, "slowdown": setting.slowdown})


def plan_study(base: Mapping[str, Any] | None = None,
               algorithms: Sequence[str] = COMPARED_ALGORITHMS, *, network: str | None = None,
               links: Sequence[str] = LINKS, workers: int = 4,
               slowdown: float = 2.0, stragglers: Sequence[int] = (0, 1),
               options: Mapping[str, Mapping[str, Any]] | None = None,
               target: float = TARGET) -> list[PlannedRun]:
    """Every algorithm in every setting, ``workers`` workers each (servers added as the algorithm
    needs), on ``base``'s model, data and seed (BASE under it); each row will say when the run
    first reached ``target`` test accuracy. Every config is checked here."""
    from ..data import load_dataset
    from ..engine import plan_run
    from ..errors import unknown_name
    from ..options import OPTIONS as KNOWN

    base = {**BASE, **(base or {})}
    for name in ("algorithm", "options", "slow_workers", "slowdown"):
        if name in base:
            raise ConfigError(name, base[name], "the study sets it per run: give algorithms, "
                              "options, stragglers and slowdown instead")
    if not algorithms:
        raise ConfigError("algorithms", algorithms, f"give at least one of {', '.join(KNOWN)}")
    for algorithm in algorithms:
        if algorithm not in KNOWN:
            raise unknown_name("algorithms", algorithm, KNOWN)
    for k in stragglers:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < workers:
            raise ConfigError("stragglers", k, f"each a number of slow workers from 0 to {workers - 1}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ConfigError("target", target, "an accuracy between 0 and 1, e.g. 0.8")
    network = network or default_network()
    train = None
    plan = []
    for setting in settings(network, links, slowdown, stragglers):
        for algorithm in algorithms:
            config = run_config(base, algorithm, setting, options)
            world_size = config.options.roles_for(workers).world_size
            if train is None:
                train = load_dataset(config.data.dataset, config.data.data_dir).train
            plan_run(config, world_size, train)  # servers, shards, stragglers, refusals: now
            columns = {"label": algorithm, "network": setting.network, "link": setting.link,
                       "slow_workers": setting.slow_workers, "slowdown": setting.slowdown,
                       "target_accuracy": float(target)}
            plan.append(PlannedRun(config, world_size, columns=columns,
                                   label=f"{algorithm} [{setting.name}]"))
    return plan


def plan_table(plan: Sequence[PlannedRun]) -> pd.DataFrame:
    """What will run: setting, algorithm, world size, one row per run."""
    return pd.DataFrame([{**run.columns, "algorithm": run.algorithm, "world_size": run.world_size}
                         for run in plan])


# -- measuring ---------------------------------------------------------------------------------------

def train_command(config: TrainConfig, directory: Path) -> list[str]:
    """One rank's ``downpour train`` of ``config`` (written to ``directory``), its records to
    ``directory/out`` (steps.csv, evals.csv, summary.json): what a launcher runs on every rank."""
    path = directory / "config.json"
    path.write_text(json.dumps(config.to_dict(), default=str))
    return [sys.executable, "-m", "downpour_lib", "train", "--config", str(path),
            "--output-dir", str(directory / "out")]


def _read_output(directory: Path, what: str, proc: subprocess.CompletedProcess) -> tuple:
    out = directory / "out"
    if proc.returncode != 0 or not (out / "summary.json").exists():
        tail = "\n".join(((proc.stderr or "") + (proc.stdout or "")).splitlines()[-15:])
        raise StudyError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("config", None)
    return summary, pd.read_csv(out / "steps.csv"), pd.read_csv(out / "evals.csv")


class LocalRanks:
    """Runs each planned run as ranks of this machine under mpiexec."""

    network = "local"

    def __init__(self, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def __enter__(self) -> LocalRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def prepare(self, run: PlannedRun) -> None:
        return None

    def train(self, run: PlannedRun) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
        try:
            mpiexec = find_mpiexec()
        except MPIExecNotFound as exc:
            raise StudyError(str(exc)) from None
        with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
            cmd = [mpiexec, "-n", str(run.world_size), "--oversubscribe", "--bind-to", "none",
                   *train_command(run.config, Path(tmp))]
            try:
                proc = run_mpiexec(cmd, capture_output=True, text=True, timeout_s=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise StudyError(f"{run.label} ran past {self.timeout_s} s") from exc
            return _read_output(Path(tmp), run.label, proc)


class SandboxNodes(SandboxUse):
    """Runs each planned run across the nodes of the multi-node Slurm sandbox (``srun``), its links
    shaped to the run's rate first. A sandbox already running in ``directory`` with ``nodes`` nodes
    is used and left running; one started here is taken down on the way out."""

    network = "sandbox"

    def __init__(self, directory: str | os.PathLike | None = None, nodes: int = 2,
                 timeout_s: float = 900.0, log: Callable[[str], None] = print) -> None:
        super().__init__(directory, nodes, log)
        self.timeout_s = timeout_s

    def prepare(self, run: PlannedRun) -> None:
        """Shape the links to the run's rate (only when it changes)."""
        self.shape(run.columns["link"])

    def train(self, run: PlannedRun) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
        minutes = math.ceil(self.timeout_s / 60) + 1
        with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
            cmd = ["srun", f"--nodes={self.nodes}", f"--ntasks={run.world_size}",
                   "--distribution=cyclic", "--kill-on-bad-exit=1", f"--time={minutes}",
                   *train_command(run.config, Path(tmp))]
            try:
                proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True,
                                      timeout=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise StudyError(f"{run.label} ran past {self.timeout_s} s") from exc
            return _read_output(Path(tmp), run.label, proc)


def bytes_by_eval(steps: pd.DataFrame, evals: pd.DataFrame) -> pd.Series:
    """For each evaluation, the bytes every rank (workers and servers) had sent by its time."""
    sent = steps.sort_values("time_s")
    cumulative = sent.bytes_sent.cumsum().to_numpy()
    times = sent.time_s.to_numpy()
    index = times.searchsorted(evals.time_s.to_numpy(), side="right")
    return pd.Series([int(cumulative[i - 1]) if i else 0 for i in index], index=evals.index,
                     dtype="int64")


def first_reaching(evals: pd.DataFrame, target: float, column: str) -> float:
    """``column`` (time_s or bytes_sent) at the first evaluation at or above ``target``; NaN if none."""
    reached = evals[evals.accuracy >= target].sort_values("time_s")
    return float(reached[column].iloc[0]) if len(reached) else math.nan


def outcome(run: PlannedRun, summary: Mapping[str, Any], steps: pd.DataFrame,
            evals: pd.DataFrame) -> Outcome:
    """The run's row (its setting, time and bytes to its target, then its summary) and its evals."""
    target = run.columns["target_accuracy"]
    evals = evals.sort_values(["time_s", "step"]).reset_index(drop=True)
    evals = evals.assign(bytes_sent=bytes_by_eval(steps, evals), algorithm=run.algorithm,
                         **run.columns)
    row = {
        "algorithm": run.algorithm, "workers": int(summary["num_workers"]),
        "world_size": run.world_size,
        "time_to_target_s": first_reaching(evals, target, "time_s"),
        "bytes_to_target": first_reaching(evals, target, "bytes_sent"),
        "bytes_sent_total": int(steps.bytes_sent.sum()),
        "best_accuracy": float(evals.accuracy.max()) if len(evals) else math.nan,
    }
    row.update({k: v for k, v in scalar_fields(summary).items() if k not in row})
    note = (f"test accuracy {summary['test_accuracy']:.3f} in {summary['wall_s']:.1f} s, "
            f"{row['bytes_sent_total'] / 1e6:.1f} MB sent")
    return Outcome(row, {"evals": evals[list(EVAL_COLUMNS)]}, note)


def measure_plan(plan: Sequence[PlannedRun], out: str | os.PathLike, *, fresh: bool = False,
                 sandbox_dir: str | os.PathLike | None = None, timeout_s: float = 900.0,
                 log: Callable[[str], None] = print) -> list[str]:
    """Measure the runs of ``plan`` missing from the study in ``out`` (all of them if ``fresh``),
    each where its setting says; returns the plan's run ids (``AccuracyStudy.load`` reads them)."""
    if not plan:
        raise ConfigError("plan", list(plan), "plan_study gives the runs to measure")
    networks = {run.columns["network"] for run in plan}
    if len(networks) > 1:
        raise ConfigError("plan", sorted(networks), "one network per study directory")
    store = StudyStore(out, TABLES)
    if not fresh and all(run.run_id in store.done() for run in plan):
        log(f"all {len(plan)} runs are already in {store}; nothing to run (fresh=True starts over)")
        return [run.run_id for run in plan]
    where = (SandboxNodes(sandbox_dir, timeout_s=timeout_s, log=log) if networks == {"sandbox"}
             else LocalRanks(timeout_s))

    def measure(run: PlannedRun) -> Outcome:
        where.prepare(run)
        log(f"run   {run.label} on {run.world_size} ranks ({where.network}) ...")
        return outcome(run, *where.train(run))

    with where:
        return run_plan(plan, store, measure, fresh=fresh, log=log)
