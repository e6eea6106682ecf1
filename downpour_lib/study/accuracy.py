"""Time and bytes to a target: Downpour's low-communication descendants beside allreduce, SGP and
Downpour itself, to a test accuracy (an image classifier, notebook 05) or to a validation loss (a
language model, notebook 07).

The target is one ``Target``: a ``metric`` and a value, reached at the first evaluation whose test
accuracy is at or above it (``accuracy``) or whose test loss per token is at or below it (``loss``);
the rows name it ``target_accuracy`` or ``target_loss``.

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
setting, seconds, steps and bytes to the target) and ``evals.csv`` (every evaluation: step,
seconds since the start, accuracy, loss, and the bytes every rank had sent by then). A run already
there (same config and setting, this host, this commit) is skipped. ``accuracy_plots`` draws the
figures from those CSVs alone; ``predict_to_target`` puts the performance model's step time, times
the steps each run took to its target, beside them (``predictions.csv``).
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
from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from .core import (
    REFERENCE_ROOT,
    Outcome,
    PlannedRun,
    StudyError,
    StudyStore,
    run_plan,
    scalar_fields,
)
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
#: What a target can be: the evaluation's column it reads, and how it is reached.
METRICS = ("accuracy", "loss")
#: The columns a setting adds to each run's row (and to its identity, with the target,
#: which the row's seconds and bytes to target depend on).
SETTING_COLUMNS = ("label", "network", "link", "slow_workers", "slowdown")
EVAL_COLUMNS = (*SETTING_COLUMNS, "algorithm", "step", "time_s", "loss", "accuracy", "bytes_sent")
TABLES = ("evals",)


@dataclass(frozen=True)
class Target:
    """What a run must reach: a test ``accuracy`` at or above ``value`` (a share in (0, 1]), or a
    test ``loss`` (per token, for a language model) at or below it (> 0)."""

    value: float
    metric: str = "accuracy"  # "accuracy" or "loss"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError("metric", self.metric, "accuracy (reached at or above the target) "
                              "or loss (reached at or below it)")
        v = self.value
        number = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if self.metric == "accuracy" and not (number and 0 < v <= 1):
            raise ConfigError("target", v, "an accuracy in (0, 1], e.g. 0.8")
        if self.metric == "loss" and not (number and v > 0):
            raise ConfigError("target", v, "a validation loss per token > 0, e.g. 2.5 (perplexity "
                              "12.2)")
        object.__setattr__(self, "value", float(v))

    @property
    def column(self) -> str:
        """The rows' column that holds it: ``target_accuracy`` or ``target_loss``."""
        return f"target_{self.metric}"

    def reached(self, evals: pd.DataFrame) -> pd.Series:
        """Which evaluations reached it."""
        if self.metric == "loss":
            return evals.loss <= self.value
        return evals.accuracy >= self.value

    @classmethod
    def of_columns(cls, columns: Mapping[str, Any]) -> Target:
        """The target a run's columns (or a study's row) name."""
        for metric in METRICS:
            value = columns.get(f"target_{metric}")
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                return cls(float(value), metric)
        raise ConfigError("columns", sorted(columns), "target_accuracy or target_loss")


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
               target: float | Target = TARGET, metric: str | None = None) -> list[PlannedRun]:
    """Every algorithm in every setting, ``workers`` workers each (servers added as the algorithm
    needs), on ``base``'s model, data and seed (BASE under it); each row will say when the run
    first reached ``target``: a test accuracy (``metric="accuracy"``, the default) or a test loss
    (``metric="loss"``), or a ``Target``. Every config is checked here."""
    from ..data import load_dataset
    from ..errors import unknown_name
    from ..options import OPTIONS as KNOWN
    from ..planning import plan_run

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
    if isinstance(target, Target):
        if metric is not None and metric != target.metric:
            raise ConfigError("metric", metric, f"the Target's own, {target.metric}, or None")
    else:
        target = Target(target, metric or "accuracy")
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
                       target.column: target.value}
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

    def __init__(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
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
                 timeout_s: float = RUN_TIMEOUT_S, log: Callable[[str], None] = print) -> None:
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


def first_reaching(evals: pd.DataFrame, target: Target | float, column: str) -> float:
    """``column`` (time_s, step or bytes_sent) at the first evaluation that reached ``target`` (a
    number: an accuracy); NaN if none."""
    target = target if isinstance(target, Target) else Target(target)
    reached = evals[target.reached(evals)].sort_values("time_s")
    return float(reached[column].iloc[0]) if len(reached) else math.nan


def train_seconds_through(steps: pd.DataFrame, step: float) -> float:
    """The workers' mean seconds of steps 0 to ``step`` (their ``step_s``: training alone, without
    the evaluations between them); NaN for a NaN step."""
    if not math.isfinite(step):
        return math.nan
    workers = steps[(steps.role == "worker") & (steps.step <= step)] if "role" in steps else steps
    return float(workers.groupby("rank").step_s.sum().mean()) if len(workers) else math.nan


def outcome(run: PlannedRun, summary: Mapping[str, Any], steps: pd.DataFrame,
            evals: pd.DataFrame) -> Outcome:
    """The run's row (its setting, time and bytes to its target, then its summary) and its evals."""
    target = Target.of_columns(run.columns)
    evals = evals.sort_values(["time_s", "step"]).reset_index(drop=True)
    evals = evals.assign(bytes_sent=bytes_by_eval(steps, evals), algorithm=run.algorithm,
                         **run.columns)
    row = {
        "algorithm": run.algorithm, "workers": int(summary["num_workers"]),
        "world_size": run.world_size,
        "time_to_target_s": first_reaching(evals, target, "time_s"),
        "bytes_to_target": first_reaching(evals, target, "bytes_sent"),
        "steps_to_target": first_reaching(evals, target, "step") + 1,
        "bytes_sent_total": int(steps.bytes_sent.sum()),
        "best_accuracy": float(evals.accuracy.max()) if len(evals) else math.nan,
        "best_loss": float(evals.loss.min()) if len(evals) else math.nan,
    }
    row["train_s_to_target"] = train_seconds_through(steps, row["steps_to_target"] - 1)
    row.update({k: v for k, v in scalar_fields(summary).items() if k not in row})
    reached = (f"{target.metric} {target.value:g} at {row['time_to_target_s']:.1f} s"
               if math.isfinite(row["time_to_target_s"]) else f"{target.metric} {target.value:g} "
               "not reached")
    note = (f"test loss {summary['test_loss']:.3f}, accuracy {summary['test_accuracy']:.3f} in "
            f"{summary['wall_s']:.1f} s, {row['bytes_sent_total'] / 1e6:.1f} MB sent; {reached}")
    return Outcome(row, {"evals": evals[list(EVAL_COLUMNS)]}, note)


def measure_plan(plan: Sequence[PlannedRun], out: str | os.PathLike, *, fresh: bool = False,
                 sandbox_dir: str | os.PathLike | None = None, timeout_s: float = RUN_TIMEOUT_S,
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


# -- the performance model beside the measured points ---------------------------------------------

#: the file ``predict_to_target`` writes beside ``runs.csv`` (``accuracy_plots`` reads it)
PREDICTIONS = "predictions.csv"
#: the calibration ``predict_to_target`` starts from: this repository's committed one (notebook 06)
CALIBRATION = Path(__file__).resolve().parents[2] / REFERENCE_ROOT / "model" / "calibration.json"
#: a sandbox's nodes (``SandboxNodes``: two, ranks placed cyclically)
SANDBOX_NODES = 2


def run_calibration(base: Any, row: Mapping[str, Any]) -> Any:
    """``base`` (a ``perf.Calibration``) for one measured run: its workload is the run's own
    (compute, data and update per step as measured, the model's parameter bytes), and its network
    the run's: on the sandbox, a node card shaped to the run's link (at the sandbox's fitted
    ``LINK_EFFICIENCY``) shared by the ranks on each of the two nodes, ``base``'s link inside a
    node; on local ranks, ``base``'s link (this machine's) between all of them."""
    from dataclasses import replace

    from ..perf.calibrate import parameter_bytes
    from ..perf.calibration import Workload
    from ..perf.netmodel import Link
    from ..perf.terms import LINK_EFFICIENCY
    from ..sandbox.netns import parse_rate

    compute = float(row["data_s"]) + float(row["compute_s"]) + float(row["update_s"])
    w = Workload(str(row["model"]), int(row["batch_size"]), compute,
                 parameter_bytes(str(row["model"]), str(row["dataset"]), str(row["data_dir"])),
                 source=f"the run's own compute per step ({row['algorithm']}, {row['link']})")
    world = int(row["world_size"])
    if row["network"] == "sandbox":
        rate = parse_rate(str(row["link"])) / 8 * LINK_EFFICIENCY
        net = replace(base.network, inter=Link(base.network.inter.alpha_s, rate),
                      per_node=max(1, math.ceil(world / SANDBOX_NODES)))
        where = f"{row['link']} x {LINK_EFFICIENCY} between {SANDBOX_NODES} nodes"
    else:
        net = replace(base.network, inter=base.network.intra, per_node=world)
        where = "this machine's link between all ranks"
    return replace(base, name=f"{base.name}, {row['link']}", network=net, workloads={w.model: w},
                   source=f"{where}; inside a node: {base.name}; compute: {w.source}")


def predict_to_target(directory: str | os.PathLike,
                      calibration: str | os.PathLike | None = None) -> pd.DataFrame:
    """The performance model beside each run of the study in ``directory``: its step time
    (``perf.predict``, from ``run_calibration``), times the steps the run took to its target
    (the model predicts time per step, not steps to a target: those are measured), against the
    seconds the run's workers spent in those steps (``train_s_to_target``: training alone; the
    measured ``time_to_target_s`` also holds the evaluations). Written to ``predictions.csv``
    beside ``runs.csv`` and returned; ``calibration`` defaults to the committed ``CALIBRATION``."""
    from ..perf import calibrate
    from ..perf.perfmodel import modelled_options, predict

    store = StudyStore(directory, TABLES)
    if not store.path("runs").is_file():
        raise ConfigError("directory", str(directory), "no runs.csv there: measure the study first")
    path = Path(calibration) if calibration is not None else CALIBRATION
    if not path.is_file():
        raise ConfigError("calibration", str(path), "a calibration.json (notebook 06 or `downpour "
                          "model calibrate` writes one)")
    base = calibrate.load(path)
    rows = []
    for row in store.read()["runs"].to_dict("records"):
        cal = run_calibration(base, row)
        p = predict(cal, row["algorithm"], int(row["workers"]), str(row["model"]),
                    modelled_options(row))
        steps = float(row.get("steps_to_target", math.nan))
        rows.append({"run_id": row["run_id"], "algorithm": row["algorithm"],
                     "network": row["network"], "link": row["link"],
                     "measured_step_s": float(row["step_s"]), "predicted_step_s": p.step_s,
                     "predicted_comm_s": p.comm_s, "steps_to_target": steps,
                     "train_s_to_target": float(row.get("train_s_to_target", math.nan)),
                     "predicted_time_to_target_s": steps * p.step_s,
                     "calibration": cal.name, "calibration_source": cal.source})
    table = pd.DataFrame(rows)
    table["error"] = table.predicted_time_to_target_s / table.train_s_to_target - 1
    table.to_csv(Path(directory) / PREDICTIONS, index=False)
    return table
