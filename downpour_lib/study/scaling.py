"""The scaling study: algorithms x worker counts, each run a real multi-process launch, one tidy CSV.

The plan (``StudySpec``) is every algorithm at every worker count, ``repeats`` times; it runs through
the shared study loop (``core.run_plan``): one row per run holding every config field, every summary
metric, and where it came from (git SHA, versions, host, cores, CPU), in this machine's
``results/<host>/scaling/runs.csv``, resumable by run id (config, world size, repeat, host,
commit). The figures (``scaling_plots``) are made from that CSV alone; the committed reference is
``results/reference/scaling/``.

How a run is launched is pluggable: ``measure_spec(spec, launch=...)`` takes any callable
``(config, world_size, timeout_s) -> summary row``. ``mpiexec_launch`` (the default, what
``downpour study`` uses) starts ``mpiexec -n N downpour train`` per run; ``ClusterSession.launch``
(notebook 02) runs it on the engines of an ipyparallel cluster. Both return the row exactly as
``downpour train --summary-json`` writes it, so the CSV and its resumption do not depend on the launcher.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..cluster.mpiexec import mpiexec_launch
from ..config import TrainConfig
from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from ..options import OPTIONS
from .core import (
    Outcome,
    PlannedRun,
    StudyError,
    StudyStore,
    cluster_for,
    read_runs_csv,
    reference_dir,
    results_dir,
    run_id,
    run_plan,
)

__all__ = ["DEFAULT_ALGORITHMS", "DEFAULT_REPEATS", "EMULATED_LINKS", "EMULATED_OPTIONS",
           "EMULATED_STEPS", "EMULATED_SWEEP", "LEFT_OUT", "REFERENCE_DIR",
           "SCALING_BASE", "SCALING_OPTIONS", "StudyError", "StudySpec", "default_workers",
           "left_out", "measure_spec", "measure_spec_on_cluster", "mpiexec_launch", "run_id",
           "study_dir", "study_spec"]

#: ``(config, world_size, timeout_s) -> summary row``; raises a DownpourError when the run fails.
Launch = Callable[[TrainConfig, int, float], dict[str, Any]]

#: The algorithms the study compares unless told otherwise: 8 of the 14, those that communicate
#: every step, whose throughput in an 8-step run measures what they cost. ``LEFT_OUT`` says why
#: the other 6 are not here (a notebook's ``algorithms`` parameter can still add them).
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "sync_ps", "ddp", "allreduce", "downpour", "sgp", "osgp", "dpsgd", "adpsgd")
#: The algorithms the study leaves out by default, and why (notebook 02 and ``make study`` say so).
#: Adding the four periodic ones would add 24 runs, ~4 minutes on 2 cores, past `make study`'s
#: 15-minute budget, to measure mostly how many of 8 steps fell between two meetings.
LEFT_OUT: dict[str, str] = {
    "local": "one process, no communication: the 1-worker baseline itself, not a way to scale",
    "localsgd": "meets every 4 steps (period): in 8 steps its throughput is mostly the period's; "
                "notebook 05 compares it on time and bytes to a test accuracy",
    "easgd": "meets the centre every few steps (period): as localsgd; notebook 05",
    "easgd_async": "meets the centre on a server rank every few steps of each worker's own "
                   "clock (period): as easgd",
    "diloco": "meets every 20 steps, more than the study's 8: it would not communicate at all; "
              "notebook 05",
    "slowmo": "averages every few steps (period): as localsgd; notebook 05",
}

#: The main job's fixed settings: the same model, data, batch and seed for every algorithm. No
#: evaluation: the study measures throughput, and evaluating would cost a third of each run. A
#: run's first step is slow (allocation, and at 2 ranks the first messages); the 6 measured steps
#: after the 2 left out put a run's own standard error at 2-3% here (a step's spread is 6% on
#: this shared 2-core machine), about the spread between runs, so repeats, not longer runs, are
#: what narrow a point. 8 steps, not 12, keep `make study` within 15 minutes on a fresh clone of
#: a 2-core machine whose step is 1.1 s (12 steps took 18.4 minutes in all; 20 took 14 when a
#: step was 0.75 s). The emulated sweep keeps 12 (``EMULATED_STEPS``): its steps cost little.
SCALING_BASE: dict[str, Any] = {
    "model": "inception_small", "dataset": "synthetic-cifar", "batch_size": 32, "steps": 8,
    "warmup_steps": 2, "eval_every": 0, "final_eval": False, "threads": 1, "lr": 0.05, "seed": 0,
}
#: Per-algorithm options the study sets under the user's. Downpour's warmstart holds the other
#: workers back until the first has pushed 20 times: in a 12-step run they would never overlap,
#: and the summed per-worker rates would count a lone worker twice (a "speedup" of 2.04x).
SCALING_OPTIONS: dict[str, dict[str, Any]] = {"downpour": {"warmstart": 0}}
#: Notebook 02's full emulated sweep (issue 34), a parameter away from its small default: every
#: algorithm whose communication the sweep measures, sync_ps also sharded over two servers
#: (``studies.emulated_variant``), 1 to 32 workers, this machine's own compute (None: timed) and a
#: GPU's (50 ms a step), three repeats.
EMULATED_SWEEP: dict[str, Any] = {
    "algorithms": ["allreduce", "ddp", "sync_ps", "sync_ps:servers=2", "downpour", "sgp",
                   "localsgd", "diloco"],
    "workers": [1, 2, 4, 8, 16, 32], "step_s": [None, 0.05], "repeats": 3,
    "links": ["10gbit", "1gbit"],
}
#: The emulated sweep's two link rates on the multi-node sandbox (4 ranks a host): at 50 ms a step,
#: inception_small's 6.6 MB of gradients cross a host's link in a ring's 2(N-1)/N x 6.6 MB = 13 MB
#: a step, 10 ms at 10 Gbit/s (a fifth of the compute: cheap) and 105 ms at 1 Gbit/s (twice the
#: compute: it dominates); resnet20's 1.1 MB, 2 ms and 18 ms. Slower links would only make the
#: servers' runs longer (sync_ps's one server moves 32 x 6.6 MB each way: 1.7 s a step at 1gbit).
EMULATED_LINKS: tuple[str, ...] = ("10gbit", "1gbit")
#: Steps of an emulated run (under the user's overrides): a 50 ms step makes the 4 more than the
#: real study's 8 cost 0.2 s a run, and 10 measured steps keep the sweep's points as they were.
EMULATED_STEPS = 12
#: Options under the user's for the emulated sweep: the periodic algorithms meet every 4 steps,
#: so a 12-step run communicates (DiLoCo's default 20 would not once).
EMULATED_OPTIONS: dict[str, dict[str, Any]] = {"localsgd": {"period": 4}, "diloco": {"period": 4}}
#: Runs per point: enough for an error bar, few enough that `make study` fits 15 min on 2 cores.
DEFAULT_REPEATS = 3


def left_out(algorithms) -> str:
    """Which algorithms a study of ``algorithms`` leaves out, and why (``LEFT_OUT``)."""
    missing = [a for a in OPTIONS if a not in algorithms]
    if not missing:
        return f"all {len(OPTIONS)} algorithms are in this study"
    lines = [f"{len(algorithms)} of the {len(OPTIONS)} algorithms are in this study; left out:"]
    lines += [f"  {a}: {LEFT_OUT.get(a, 'not in the algorithms parameter')}" for a in missing]
    return "\n".join(lines)


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
    timeout_s: float = RUN_TIMEOUT_S  # per run
    #: per-algorithm options, e.g. {"sync_ps": {"server": "colocated"}}, over SCALING_OPTIONS
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: columns every run's row starts with, part of its identity: where an emulated sweep's runs
    #: ran (``{"where": "sandbox 1gbit"}``), so one config at two link rates is two runs
    columns: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for a in self.algorithms:
            if ":" in a and a.partition(":")[0] in OPTIONS:  # "sync_ps:servers=2"
                raise ConfigError("algorithms", a, "an entry with options of its own is for an "
                                  "emulated sweep (--compute emulated --links ...); here give "
                                  f"{a.partition(':')[0]} and its options in the spec's options")
            if a not in OPTIONS:
                raise ConfigError("algorithms", a, "choose from " + ", ".join(OPTIONS))
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
                # e.g. adpsgd on an odd number of ranks: refused before launching anything
                points.append((config, config.options.roles_for(workers).world_size))
        return [(config, size, r) for r in range(self.repeats) for config, size in points]

    def workload(self) -> dict[str, Any]:
        """``workload(base)``: what its table and figures draw."""
        return workload(self.base)

    def planned(self) -> list[PlannedRun]:
        """``runs()`` as the study loop's planned runs, labelled for the log."""
        at = f" ({self.columns['where']})" if "where" in self.columns else ""
        return [PlannedRun(config, size, r, columns=dict(self.columns),
                           label=f"{config.algorithm:<8} {size} rank(s) repeat {r}{at}")
                for config, size, r in self.runs()]

    def max_world_size(self) -> int:
        """The most ranks any run needs: the size of a cluster that runs the whole study."""
        return max(size for _, size, _ in self.runs())

    def plan(self) -> pd.DataFrame:
        """One row per run: what will be launched, and its run id (here, at this commit)."""
        return pd.DataFrame([{**run.columns, "algorithm": run.algorithm,
                              "world_size": run.world_size, "repeat": run.repeat,
                              "run_id": run.run_id} for run in self.planned()])


def workload(base: dict[str, Any]) -> dict[str, Any]:
    """The model, data set and batch a worker of every run of ``base`` has, as a study's rows
    record them (``scaling_runs.WORKLOAD``)."""
    config = TrainConfig.from_dict(dict(base))
    return {"model": config.model, "dataset": config.data.dataset, "batch_size": config.data.batch_size}


#: The committed study, measured on the machine its rows and figures name; a study never writes here.
REFERENCE_DIR = str(reference_dir("scaling"))


def study_dir(out: str | os.PathLike | None = None, root: str | os.PathLike = "results"):
    """Where this machine's scaling study goes: ``out`` if given, else ``<root>/<host>/scaling/``
    (its ``runs.csv`` and ``figures/``)."""
    return results_dir("scaling", out, root)


def study_spec(algorithms=DEFAULT_ALGORITHMS, workers=None, overrides=None, options=None,
               csv: str | os.PathLike | None = None, repeats: int = DEFAULT_REPEATS,
               columns: dict[str, Any] | None = None) -> StudySpec:
    """A StudySpec from plain values (a notebook's parameters): ``workers`` None means 1, 2, 4, ...
    up to the cores here; ``overrides`` change SCALING_BASE's fields; ``csv`` None means
    ``results/<host>/scaling/runs.csv``."""
    return StudySpec(algorithms=tuple(algorithms),
                     workers=tuple(workers) if workers else default_workers(),
                     base={**SCALING_BASE, **(overrides or {})},
                     csv=str(csv or study_dir() / "runs.csv"), repeats=repeats,
                     options=dict(options or {}), columns=dict(columns or {}))


def measure_spec(spec: StudySpec, fresh: bool = False, log: Callable[[str], None] = print,
                 launch: Launch = mpiexec_launch,
                 own_pids: Callable[[], Iterable[int]] | None = None) -> pd.DataFrame:
    """Run every run of ``spec`` not yet in its CSV (all of them if ``fresh``), one row each, with
    the machine's load while it ran (``own_pids``: the launcher's processes outside this one's
    descendants, whose CPU is the run's, not other work's)."""
    def measure(run: PlannedRun) -> Outcome:
        summary = launch(run.config, run.world_size, spec.timeout_s)
        return Outcome(summary, note=f"{summary['samples_per_s']:.1f} samples/s")

    run_plan(spec.planned(), StudyStore.of_csv(spec.csv), measure, fresh=fresh, log=log,
             own_pids=own_pids, announce=True)
    return read_runs_csv(spec.csv)


def measure_spec_on_cluster(spec: StudySpec, profile: str = "local-mpi", engines: int | None = None,
                            fresh: bool = False, log: Callable[[str], None] = print) -> pd.DataFrame:
    """``measure_spec`` on the engines of one ipyparallel cluster of the profile, started for the runs
    still missing from the CSV and sized to the largest of them (or ``engines``); no cluster is
    started when every run is already there. If the profile already runs one cluster (``ipcluster
    start --profile=NAME``), the runs use it and leave it running."""
    with cluster_for(spec.planned(), StudyStore.of_csv(spec.csv), profile=profile,
                     engines=engines, fresh=fresh, log=log) as cluster:
        if cluster is None:
            return read_runs_csv(spec.csv)
        return measure_spec(spec, fresh=fresh, log=log, launch=cluster.launch,
                            own_pids=cluster.local_pids)
