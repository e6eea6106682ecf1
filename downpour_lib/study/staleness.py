"""Downpour SGD against synchronous parameter-server SGD (what notebook 03 shows).

Dean et al. (NIPS 2012, "Large Scale Distributed Deep Networks") trade consistency for throughput:
Downpour's workers fetch every ``n_fetch`` steps and push every ``n_push`` steps with no barrier, so
gradients reach the servers computed from parameters that are several updates old (stale). This
study runs ``sync_ps`` and several ``downpour`` settings (``servers``, ``n_fetch``, ``n_push``) on the
same model, data, seed and number of workers, one after the other on the engines of one cluster.

It has the shape of every study (``core``): the plan (``plan_variants``) is checked in full first;
``run_study`` runs what is missing through the shared resumable loop into
``results/<host>/staleness/``: ``runs.csv``, one row per run with every config field, every summary
metric and its provenance, and two companion tables keyed by the run's ``run_id``, ``evals.csv``
(every evaluation against wall time) and ``staleness.csv`` (the staleness histogram of every
downpour run). A run already there (same config, label and target accuracy, on this host at this
commit) is skipped. ``staleness_plots`` draws the figures from those CSVs alone
(``StalenessStudy.load``).

Every run has the same number of workers (model replicas), so the global batch and the data each
worker reads are the same; its world size is what its parameter servers add (dedicated servers take
ranks of their own, colocated ones do not: the options' ``roles_for``). The plan is checked in
full, and against the cluster's size, before the first run starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..checkpoint import atomic_write_text
from ..config import TrainConfig
from ..errors import ConfigError
from ..records import RunResult
from .core import Outcome, PlannedRun, StudyStore, cluster_for, pending, run_plan, scalar_fields

#: The downpour options a variant may set (besides an optional ``label``).
VARIANT_KEYS = ("servers", "server", "n_fetch", "n_push", "warmstart")
#: The summary table (``StalenessStudy.table``) and, with what else identifies a run, its CSV.
TABLE_COLUMNS = ("label", "algorithm", "workers", "servers", "placement", "world_size", "n_fetch",
                 "n_push", "samples_per_s", "wall_s", "test_accuracy", "time_to_target_s",
                 "staleness_mean", "staleness_max")
RUN_COLUMNS = (*TABLE_COLUMNS[:2], "model", "dataset", "batch_size", "seed", "optimizer", "lr", "steps",
               *TABLE_COLUMNS[2:], "target_accuracy")
#: Where a run came from, in its row (with every other field of its summary: host, cores, CPU...).
PROVENANCE = ("backend", "device", "hosts", "git_sha", "torch_version", "mpi_version", "timestamp")


@dataclass(frozen=True)
class Variant:
    """One run of the study: a label, its validated config and the ranks it runs on."""

    label: str
    config: TrainConfig
    workers: int  # model replicas, the same for every run of a study
    world_size: int  # workers plus dedicated servers

    @property
    def algorithm(self) -> str:
        return self.config.algorithm


def variant_label(algorithm: str, options: Mapping[str, Any]) -> str:
    """``sync_ps``, or ``downpour S=2 fetch=4 push=4`` (``colocated`` added when asked for)."""
    parts = [algorithm]
    if algorithm == "downpour":
        parts.append(f"S={options.get('servers', 1)} fetch={options.get('n_fetch', 1)} "
                     f"push={options.get('n_push', 1)}")
    elif options.get("servers", 1) != 1:
        parts.append(f"S={options['servers']}")
    if options.get("server") == "colocated":
        parts.append("colocated")
    return " ".join(parts)


def _variant(base: Mapping[str, Any], algorithm: str, options: Mapping[str, Any], workers: int,
             label: str | None) -> Variant:
    from ..data import load_dataset
    from ..planning import plan_run

    config = TrainConfig.from_dict({**base, "algorithm": algorithm, "options": dict(options)})
    world_size = config.options.roles_for(workers).world_size
    # servers, shards and the data set checked now, not when this run's turn comes
    plan_run(config, world_size, load_dataset(config.data.dataset, config.data.data_dir).train)
    return Variant(label or variant_label(algorithm, options), config, workers, world_size)


def plan_variants(base: Mapping[str, Any], variants: Sequence[Mapping[str, Any]], workers: int = 2,
                  sync_ps: Mapping[str, Any] | None = None) -> list[Variant]:
    """``sync_ps`` (with the options ``sync_ps``; None leaves it out) and one ``downpour`` run per
    variant (a mapping of downpour options, ``label`` optional), all with ``base``'s TrainConfig
    fields and ``workers`` workers. Every config is validated here."""
    for name in ("algorithm", "options"):
        if name in base:
            raise ConfigError(name, base[name], "the study sets it per run: give the downpour "
                              "settings in variants and the sync_ps options in sync_ps")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers", workers, "must be a whole number of workers >= 1")
    if not variants:
        raise ConfigError("variants", variants, 'give at least one, e.g. [{"servers": 1, '
                          '"n_fetch": 1, "n_push": 1}]')
    plan = [] if sync_ps is None else [_variant(base, "sync_ps", sync_ps, workers, None)]
    for index, variant in enumerate(variants):
        options = {k: v for k, v in variant.items() if k != "label"}
        unknown = sorted(set(options) - set(VARIANT_KEYS))
        if unknown:
            raise ConfigError(f"variants[{index}]", variant,
                              f"unknown key(s) {', '.join(unknown)}; a variant takes label and "
                              + ", ".join(VARIANT_KEYS))
        plan.append(_variant(base, "downpour", options, workers, variant.get("label")))
    labels = [v.label for v in plan]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError("variants", repeated, "two runs with the same label; give each a "
                          "distinct label or distinct settings")
    return plan


def plan_table(plan: Sequence[Variant]) -> pd.DataFrame:
    """What will run, one row per run: label, algorithm, workers, servers, placement, world size."""
    rows = []
    for v in plan:
        roles = v.config.options.roles(v.world_size)
        rows.append({"label": v.label, "algorithm": v.algorithm, "workers": v.workers,
                     "servers": len(roles.servers),
                     "placement": _placement(roles.servers, roles.workers),
                     "world_size": v.world_size})
    return pd.DataFrame(rows)


def _placement(servers: Sequence[int], workers: Sequence[int]) -> str:
    return "colocated" if set(servers) <= set(workers) else "dedicated"


def cluster_size(plan: Sequence[Variant], engines: int | None = None) -> int:
    """The engines a cluster for ``plan`` needs: ``engines`` if given and enough, else the largest
    run's world size."""
    largest = max(plan, key=lambda v: v.world_size)
    if engines is None:
        return largest.world_size
    if engines < largest.world_size:
        raise ConfigError("engines", engines,
                          f"{largest.label!r} runs on {largest.world_size} ranks; start at least "
                          f"{largest.world_size} engines (engines=None sizes the cluster to the "
                          "largest run), use fewer workers or servers, or server='colocated'")
    return engines


#: Where each frame is, in the study's directory: runs.csv and its companions, keyed by run_id.
FILES = {"runs": "runs.csv", "evals": "evals.csv", "staleness": "staleness.csv"}
TABLES = ("evals", "staleness")


def planned_run(v: Variant, target_accuracy: float) -> PlannedRun:
    """The variant as a run of the study loop: its label and the target accuracy (which its row's
    ``time_to_target_s`` depends on) are part of its identity."""
    return PlannedRun(v.config, v.world_size, 0, label=v.label,
                      columns={"label": v.label, "target_accuracy": float(target_accuracy)})


@dataclass(frozen=True, eq=False)
class StalenessStudy:
    """A study's tidy results, in plan order: what notebook 03 plots, and what ``save`` writes
    (one CSV per frame) and ``load`` reads back, so figures can be made from the CSVs alone."""

    runs: pd.DataFrame  # one row per run: RUN_COLUMNS, then PROVENANCE
    evals: pd.DataFrame  # every evaluation: label, algorithm, step, time_s, loss, accuracy
    staleness: pd.DataFrame  # every downpour run's histogram: label, staleness, updates, fraction
    #: label -> rank 0's RunResult (every step of every rank); empty for a study loaded from CSV
    results: dict[str, RunResult] = field(default_factory=dict)

    @classmethod
    def from_results(cls, runs: Sequence[tuple[Variant, RunResult]],
                     target_accuracy: float = 0.9) -> StalenessStudy:
        rows = [_run_row(v, r, target_accuracy) for v, r in runs]
        return cls(pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*RUN_COLUMNS, *PROVENANCE]),
                   _evals(runs), _staleness(runs), {v.label: r for v, r in runs})

    @classmethod
    def from_store(cls, store: StudyStore, run_ids: Sequence[str] | None = None,
                   results: dict[str, RunResult] | None = None) -> StalenessStudy:
        """The runs ``run_ids`` of the store, in that order; without them, the rows of the commit
        measured last, the last one of each label (a run measured again replaces the older)."""
        frames = store.read(run_ids)
        runs = frames["runs"]
        if run_ids is None and "label" in runs:
            runs = runs.drop_duplicates("label", keep="last").reset_index(drop=True)
        ids = set(runs.run_id) if "run_id" in runs else None
        tables = {name: frames[name] for name in TABLES}
        if ids is not None:
            tables = {name: frame[frame.run_id.isin(ids)].reset_index(drop=True)
                      if "run_id" in frame else frame for name, frame in tables.items()}
        return cls(runs, **tables, results=dict(results or {}))

    @property
    def labels(self) -> list[str]:
        return list(self.runs.label)

    @property
    def target_accuracy(self) -> float:
        return float(self.runs.target_accuracy.iloc[0])

    def table(self) -> pd.DataFrame:
        """The summary: one row per run with what ran (workers, servers, world size, n_fetch,
        n_push), its throughput, final test accuracy, seconds to the target accuracy and, for
        downpour, the staleness of its applied updates."""
        return self.runs[list(TABLE_COLUMNS)]

    def save(self, directory: str | Path) -> list[Path]:
        """Write the three frames as CSVs into ``directory`` (atomically, each replacing the last):
        a snapshot of a study held in memory. ``run_study`` writes its directory run by run."""
        paths = []
        for name, file in FILES.items():
            path = Path(directory) / file
            atomic_write_text(path, getattr(self, name).to_csv(index=False))
            paths.append(path)
        return paths

    @classmethod
    def load(cls, directory: str | Path) -> StalenessStudy:
        """A study from its CSVs alone (what ``run_study`` or ``save`` wrote), without the
        RunResults: the rows of the commit measured last, the last run of each label."""
        missing = [f for f in FILES.values() if not (Path(directory) / f).is_file()]
        if missing:
            raise ConfigError("directory", str(directory),
                              f"no {', '.join(missing)} there; run_study writes them "
                              "(notebook 03 does, into results/<host>/staleness)")
        return cls.from_store(StudyStore(directory, TABLES))


def _run_row(v: Variant, result: RunResult, target: float) -> dict[str, Any]:
    s, c, options = result.summary, v.config, v.config.options
    roles = options.roles(v.world_size)
    row = {
        "label": v.label, "algorithm": v.algorithm, "model": c.model, "dataset": c.data.dataset,
        "batch_size": c.data.batch_size, "seed": c.data.seed, "optimizer": c.optim.optimizer,
        "lr": c.optim.lr, "steps": int(s.get("total_steps", c.length.steps or 0)),
        "workers": v.workers,
        "servers": len(roles.servers), "placement": _placement(roles.servers, roles.workers),
        "world_size": v.world_size,
        # sync_ps exchanges every step: n_fetch = n_push = 1, with a barrier
        "n_fetch": getattr(options, "n_fetch", 1), "n_push": getattr(options, "n_push", 1),
        "samples_per_s": float(s["samples_per_s"]), "wall_s": float(s["wall_s"]),
        "test_accuracy": float(s["test_accuracy"]), "target_accuracy": float(target),
        "time_to_target_s": time_to_accuracy(result.evals, target),
        "staleness_mean": _number(s.get("staleness_mean")),
        "staleness_max": _number(s.get("staleness_max")),
        **{k: s.get(k, "") for k in PROVENANCE},
    }
    # then every other field of the summary (config, metrics, host, cores, CPU, versions)
    return {**row, **{k: v for k, v in scalar_fields(s).items() if k not in row}}


def _evals(runs: Sequence[tuple[Variant, RunResult]]) -> pd.DataFrame:
    columns = ["label", "algorithm", "step", "time_s", "loss", "accuracy"]
    parts = [r.evals.sort_values(["time_s", "step"]).assign(label=v.label, algorithm=v.algorithm)
             for v, r in runs if len(r.evals)]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def _staleness(runs: Sequence[tuple[Variant, RunResult]]) -> pd.DataFrame:
    """From each run's summary ``staleness_hist`` ({staleness: updates}, string keys after JSON)."""
    rows = []
    for v, result in runs:
        hist = result.summary.get("staleness_hist") or {}
        total = sum(hist.values())
        rows += [{"label": v.label, "staleness": k, "updates": n, "fraction": n / total}
                 for k, n in sorted((int(k), int(n)) for k, n in hist.items())]
    return pd.DataFrame(rows, columns=["label", "staleness", "updates", "fraction"])


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def time_to_accuracy(evals: pd.DataFrame, target: float) -> float:
    """Seconds since the run's start of its first evaluation at or above ``target``; NaN if none."""
    reached = evals[evals.accuracy >= target]
    return float(reached.time_s.min()) if len(reached) else math.nan


def _outcome(v: Variant, result: RunResult, target: float) -> Outcome:
    one = StalenessStudy.from_results([(v, result)], target)
    s = result.summary
    return Outcome(one.runs.iloc[0].to_dict(), {"evals": one.evals, "staleness": one.staleness},
                   note=f"{s['samples_per_s']:.0f} samples/s, test accuracy {s['test_accuracy']:.3f}")


def run_variants(cluster, plan: Sequence[Variant], target_accuracy: float = 0.9,
                 timeout_s: float | None = None, log: Callable[[str], None] = print,
                 store: StudyStore | None = None, fresh: bool = False) -> StalenessStudy:
    """Run every variant of ``plan`` not yet in ``store`` (in memory if None) on ``cluster`` (a
    ``ClusterSession``), one after the other, on the first ``world_size`` engines each; returns the
    plan's runs as the store holds them. Runs that need more engines than the cluster has fail
    before the first run."""
    store = store if store is not None else StudyStore(tables=TABLES)
    by_id = {planned_run(v, target_accuracy).run_id: v for v in plan}
    todo = [by_id[run.run_id] for run in pending([planned_run(v, target_accuracy) for v in plan],
                                                  store, fresh)]
    if todo:
        cluster_size(todo, cluster.size)
    results: dict[str, RunResult] = {}

    def measure(run: PlannedRun) -> Outcome:
        v = by_id[run.run_id]
        log(f"run   {v.label:<32} {v.workers} worker(s) on {v.world_size} rank(s) ...")
        result = cluster.train(v.config, v.world_size, timeout_s=timeout_s)
        results[v.label] = result
        return _outcome(v, result, target_accuracy)

    ids = run_plan([planned_run(v, target_accuracy) for v in plan], store, measure, fresh=fresh,
                   log=log)
    return StalenessStudy.from_store(store, ids, results)


def measure_plan(plan: Sequence[Variant], out: str | Path, target_accuracy: float = 0.9, *,
                 profile: str = "local-mpi", engines: int | None = None, fresh: bool = False,
                 timeout_s: float | None = None, log: Callable[[str], None] = print) -> StalenessStudy:
    """The runs of ``plan`` missing from the study in ``out`` (all of them if ``fresh``) on a
    cluster of the profile, started only if some are missing and sized to the largest of them (or
    ``engines``); returns the plan's runs as the CSVs in ``out`` hold them."""
    cluster_size(plan, engines)
    store = StudyStore(out, TABLES)
    planned = [planned_run(v, target_accuracy) for v in plan]
    with cluster_for(planned, store, profile=profile, engines=engines, fresh=fresh,
                     log=log) as cluster:
        if cluster is None:
            return StalenessStudy.from_store(store, [run.run_id for run in planned])
        return run_variants(cluster, plan, target_accuracy, timeout_s, log, store=store,
                            fresh=fresh)
