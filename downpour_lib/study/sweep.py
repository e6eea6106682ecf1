"""The scaling study: algorithms x worker counts, each run a real multi-process launch, one tidy CSV.

One row per run holds every config field, every summary metric, and where it came from (git SHA,
versions, host, cores, CPU). Each machine's study has its own directory, ``results/<host>/`` (its
``runs.csv`` and ``figures/``), so measuring here never touches another machine's results, such as the
committed reference in ``results/reference/``. The sweep is resumable: a run whose ``run_id`` (a hash of
its config, world size, repeat number, host and commit) is already in the CSV is skipped, so an
interrupted study picks up where it stopped, and a new commit is measured again.

How a run is launched is pluggable: ``run_study(spec, launch=...)`` takes any callable
``(config, world_size, timeout_s) -> summary row``. ``mpiexec_launch`` (the default, what
``downpour study`` uses) starts ``mpiexec -n N downpour train`` per run; ``ClusterSession.launch``
(notebook 02) runs it on the engines of an ipyparallel cluster. Both return the row exactly as
``downpour train --summary-json`` writes it, so the CSV and its resumption do not depend on the launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .. import provenance
from ..algorithms import ALGORITHMS
from ..checkpoint import atomic_write_text
from ..cluster.mpiexec import MPIExecNotFound, find_mpiexec, mpi_env
from ..config import TrainConfig
from ..errors import ConfigError, DownpourError

#: ``(config, world_size, timeout_s) -> summary row``; raises a DownpourError when the run fails.
Launch = Callable[[TrainConfig, int, float], dict[str, Any]]

#: The algorithms the study compares unless told otherwise.
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "sync_ps", "ddp", "allreduce", "downpour", "sgp", "osgp", "dpsgd", "adpsgd")

#: The main job's fixed settings: the same model, data, batch and seed for every algorithm. No
#: evaluation: the study measures throughput, and evaluating would cost a third of each run. Only a
#: run's first step is slow (allocation); after it, 17 measured steps put the standard error of a
#: run's mean step at about 0.5% on 2 cores, so the spread between runs (other work on the machine)
#: is what limits a point, and repeats, not longer runs, are what narrow it.
SCALING_BASE: dict[str, Any] = {
    "model": "inception_small", "dataset": "synthetic-cifar", "batch_size": 32, "steps": 20,
    "warmup_steps": 3, "eval_every": 0, "final_eval": False, "threads": 1, "lr": 0.05, "seed": 0,
}
#: Per-algorithm options the study sets under the user's. Downpour's warmstart holds the other
#: workers back until the first has pushed 20 times: in a 20-step run they would barely overlap,
#: and the summed per-worker rates would count a lone worker twice (a "speedup" of 2.04x).
SCALING_OPTIONS: dict[str, dict[str, Any]] = {"downpour": {"warmstart": 0}}
#: Runs per point: enough for an error bar, few enough that `make study` fits ~10 min on 2 cores.
DEFAULT_REPEATS = 3


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
    csv: str = field(default_factory=lambda: str(study_dir() / "runs.csv"))
    repeats: int = DEFAULT_REPEATS  # runs per point: their spread is the error bar
    timeout_s: float = 900.0  # per run
    #: per-algorithm options, e.g. {"sync_ps": {"server": "colocated"}}, over SCALING_OPTIONS
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for a in self.algorithms:
            if a not in ALGORITHMS:
                raise ConfigError("algorithms", a, "choose from " + ", ".join(ALGORITHMS))
        for a in self.options:
            if a not in self.algorithms:
                raise ConfigError("options", a, "give options only for the study's algorithms: "
                                  + ", ".join(self.algorithms))
        if not self.workers or min(self.workers) < 1:
            raise ConfigError("workers", self.workers, "give worker counts >= 1, e.g. 1,2")
        if self.repeats < 1:
            raise ConfigError("repeats", self.repeats, "must be >= 1")

    def runs(self) -> list[tuple[TrainConfig, int, int]]:
        """(config, world size, repeat) of every run, validated before anything is launched.
        Repeat r of every point runs before repeat r + 1 of any, so a slow spell on a shared
        machine spreads over the points as noise instead of biasing one of them."""
        points = []
        for algorithm in self.algorithms:
            for workers in self.workers:
                options = {**SCALING_OPTIONS.get(algorithm, {}), **self.options.get(algorithm, {})}
                config = TrainConfig.from_dict({**self.base, "algorithm": algorithm,
                                                "options": options})
                size = ALGORITHMS[algorithm].world_size_for(config.options, workers)
                # e.g. adpsgd on an odd number of ranks: refuse before launching anything
                ALGORITHMS[algorithm].check_world(config.options, size)
                points.append((config, size))
        return [(config, size, r) for r in range(self.repeats) for config, size in points]

    def max_world_size(self) -> int:
        """The most ranks any run needs: the size of a cluster that runs the whole study."""
        return max(size for _, size, _ in self.runs())

    def plan(self) -> pd.DataFrame:
        """One row per run: what will be launched, and its run id (here, at this commit)."""
        return pd.DataFrame([{"algorithm": c.algorithm, "world_size": size, "repeat": r,
                              "run_id": run_id(c, size, r)} for c, size, r in self.runs()])


class StudyError(DownpourError):
    pass


#: Where a run writes or starts from, not what it computes: left out of its identity.
NOT_IDENTITY = ("output_dir", "checkpoint_dir", "checkpoint_every", "resume")


#: The committed study, measured on the machine its rows and figures name; a study never writes here.
REFERENCE_DIR = "results/reference"


def study_dir(out: str | os.PathLike | None = None, root: str | os.PathLike = "results") -> Path:
    """Where this machine's study goes: ``out`` if given, else ``<root>/<host name>/`` (its
    ``runs.csv`` and ``figures/``)."""
    if out:
        return Path(out)
    host = re.sub(r"[^A-Za-z0-9._-]+", "_", provenance.machine()["host"]) or "localhost"
    return Path(root) / host


def study_spec(algorithms=DEFAULT_ALGORITHMS, workers=None, overrides=None, options=None,
               csv: str | os.PathLike | None = None, repeats: int = DEFAULT_REPEATS) -> StudySpec:
    """A StudySpec from plain values (a notebook's parameters): ``workers`` None means 1, 2, 4, ...
    up to the cores here; ``overrides`` change SCALING_BASE's fields; ``csv`` None means
    ``results/<host>/runs.csv``."""
    return StudySpec(algorithms=tuple(algorithms),
                     workers=tuple(workers) if workers else default_workers(),
                     base={**SCALING_BASE, **(overrides or {})},
                     csv=str(csv or study_dir() / "runs.csv"), repeats=repeats,
                     options=dict(options or {}))


def run_id(config: TrainConfig, world_size: int, repeat: int) -> str:
    """The run's identity: its config, world size and repeat, on this host at this commit (a run
    measured elsewhere, or with other code, is not this run)."""
    values = {k: v for k, v in config.to_dict().items() if k not in NOT_IDENTITY}
    here = [provenance.machine()["host"], provenance.git_sha()]
    blob = json.dumps([values, world_size, repeat, here], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def mpiexec_launch(config: TrainConfig, world_size: int, timeout_s: float) -> dict[str, Any]:
    """Run one configuration under ``mpiexec -n world_size``; return its summary row."""
    try:
        mpiexec = find_mpiexec()
    except MPIExecNotFound as exc:
        raise StudyError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "summary.json"
        cfg.write_text(json.dumps(config.to_dict(), default=str))
        cmd = [mpiexec, "-n", str(world_size), "--oversubscribe", "--bind-to", "none",
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


def done_run_ids(csv: str | Path) -> set[str]:
    csv = Path(csv)
    return set(pd.read_csv(csv).run_id) if csv.exists() else set()


def run_study(spec: StudySpec, fresh: bool = False, log: Callable[[str], None] = print,
              launch: Launch = mpiexec_launch) -> pd.DataFrame:
    """Run every run of ``spec`` not yet in its CSV (all of them if ``fresh``), one row each."""
    csv = Path(spec.csv)
    if fresh and csv.exists():
        csv.unlink()
    done = done_run_ids(csv)
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
        except DownpourError as exc:  # this run failed (a rank, a timeout): record it, go on
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


def run_study_on_cluster(spec: StudySpec, profile: str = "local-mpi", engines: int | None = None,
                         fresh: bool = False, log: Callable[[str], None] = print) -> pd.DataFrame:
    """``run_study`` on the engines of one ipyparallel cluster of the profile, started for the runs
    still missing from the CSV and sized to the largest of them (or ``engines``); no cluster is
    started when every run is already there. If the profile already runs one cluster (``ipcluster
    start --profile=NAME``), the runs use it and leave it running."""
    from ..cluster import connect, running_clusters, start_cluster

    done = set() if fresh else done_run_ids(spec.csv)
    pending = [size for config, size, r in spec.runs() if run_id(config, size, r) not in done]
    if not pending:
        log(f"all {len(spec.runs())} runs are already in {spec.csv}; nothing to run "
            "(fresh=True starts over)")
        return pd.read_csv(spec.csv)
    running = running_clusters(profile)
    if len(running) == 1:
        log(f"using the running {profile} cluster (id {running[0].cluster_id!r}) for "
            f"{len(pending)} run(s)")
        session = connect(profile, running[0].cluster_id, activate=False)
    else:  # none (or several: start_cluster says which)
        n = engines or max(pending)
        log(f"starting a {profile} cluster of {n} engines for {len(pending)} run(s)")
        session = start_cluster(profile, n=n, activate=False)
    with session as cluster:  # stops only a cluster it started
        return run_study(spec, fresh=fresh, log=log, launch=cluster.launch)
