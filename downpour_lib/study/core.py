"""The shape every study has: plan -> run (resumable, one tidy CSV) -> figures from the CSV alone.

A study is three small pieces on top of this module:

- a **plan**: the list of ``PlannedRun``s (a validated ``TrainConfig``, the ranks it runs on, a repeat
  number and the study's own columns, e.g. a label), all checked before anything is launched;
- a **measure**: how one planned run becomes an ``Outcome`` (its row and, optionally, rows of
  companion tables such as every evaluation), on an ipyparallel cluster or under ``mpiexec``;
- a **plots** module that reads the study's CSVs (``StudyStore.read``) and nothing else.

``run_plan`` is the loop all studies share: a run whose ``run_id`` (a hash of its config, world size,
repeat and study columns, on this host at this commit) is already in the study's ``runs.csv`` is
skipped, so an interrupted study resumes where it stopped and a new commit measures again; each new
run appends one row, every config field, every summary metric and where it came from (git SHA,
torch and MPI versions, host, cores, CPU model), written atomically.

Where a study's files go: ``results/<host>/<study>/`` on the machine that measured them
(``results_dir``), ``results/reference/<study>/`` for the committed reference, which no study run
ever writes. Each directory holds ``runs.csv``, the companion CSVs and ``figures/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from .. import provenance
from ..checkpoint import atomic_write_text
from ..errors import DownpourError, refusal
from .load import LoadProbe, describe

if TYPE_CHECKING:  # annotations only: `downpour model` and `plot` read this module without torch
    from ..config import TrainConfig

#: The studies, each a directory of results/<host>/ and of results/reference/.
STUDIES = ("scaling", "staleness", "gossip", "accuracy", "lm")
#: Where this machine's results go (``<root>/<host>/<study>/``), relative to the working directory.
RESULTS_ROOT = "results"
#: The committed references, one directory per study, measured on the machine their rows name;
#: a study run never writes here.
REFERENCE_ROOT = f"{RESULTS_ROOT}/reference"


class StudyError(DownpourError):
    pass


class StudyRefused(StudyError):
    """Runs of different settings refused with the same error about their input: every other
    run would be too, so the study stops (bad input: ``downpour study`` exits 2)."""


def host_dirname() -> str:
    """This machine's directory name under results/: its host name, made safe for a path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", provenance.machine()["host"]) or "localhost"


def results_dir(study: str, out: str | os.PathLike | None = None,
                root: str | os.PathLike = RESULTS_ROOT) -> Path:
    """Where this machine's ``study`` goes: ``out`` if given, else ``<root>/<host>/<study>/``."""
    if study not in STUDIES:
        raise ValueError(f"study={study!r}: choose one of {', '.join(STUDIES)}")
    return Path(out) if out else Path(root) / host_dirname() / study


def reference_dir(study: str, root: str | os.PathLike = REFERENCE_ROOT) -> Path:
    """The committed reference of ``study``."""
    if study not in STUDIES:
        raise ValueError(f"study={study!r}: choose one of {', '.join(STUDIES)}")
    return Path(root) / study


def run_id(config: TrainConfig, world_size: int, repeat: int,
           extra: Mapping[str, Any] | None = None) -> str:
    """The run's identity: its config, world size, repeat (and the study's own columns, ``extra``),
    on this host at this commit (a run measured elsewhere, or with other code, is not this run).
    The config's part is ``TrainConfig.identity()``: every field but those whose declared rule
    is ``free`` (where the run writes, how it is stopped; ``config.IDENTITY_RULES``)."""
    values = config.identity()
    here = [provenance.machine()["host"], provenance.git_sha()]
    key: list[Any] = [values, world_size, repeat, here]
    if extra:
        key.append(dict(extra))
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study's plan: what is launched, and the columns the study adds to its row."""

    config: TrainConfig
    world_size: int
    repeat: int = 0
    #: the study's own columns, first in the row and part of the run's identity (e.g. a label)
    columns: Mapping[str, Any] = field(default_factory=dict)
    #: how the logs name the run
    label: str = ""

    @property
    def run_id(self) -> str:
        return run_id(self.config, self.world_size, self.repeat, self.columns)

    @property
    def algorithm(self) -> str:
        return self.config.algorithm


@dataclass(frozen=True)
class Outcome:
    """What measuring a run gave: its row (summary fields), rows of the companion tables, a note
    for the log."""

    row: Mapping[str, Any]
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    note: str = ""


def scalar_fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run summary's fields that fit a CSV cell (a histogram or a nested config does not; the
    study keeps those in a table of their own)."""
    return {k: v for k, v in summary.items() if not isinstance(v, (dict, list, tuple, set))}


def latest_commit(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of the commit measured last: a machine's CSV keeps its earlier commits' rows, and a
    figure must not mix code versions. Rows are appended, so the last row's is the newest."""
    if "git_sha" in runs and len(runs):
        runs = runs[runs.git_sha == runs.git_sha.iloc[-1]]
    return runs.reset_index(drop=True)


#: columns that are names, never numbers: a run id of digits and one "e" ("7499e7174429", about 1
#: in 230 of them) would read as a float (inf), one of digits alone lose its leading zeros
TEXT_COLUMNS = {"run_id": str, "git_sha": str}


def read_runs_csv(path: str | os.PathLike) -> pd.DataFrame:
    """A study table from its CSV, its ``TEXT_COLUMNS`` read as text."""
    return pd.read_csv(path, dtype=TEXT_COLUMNS)


class StudyStore:
    """A study's tidy tables: ``runs`` (one row per run, keyed by ``run_id``) and its companion
    tables (one row per evaluation, for example), keyed by the same ``run_id``.

    With a directory, each table is a CSV there (``runs.csv``, ``<table>.csv``), rewritten
    atomically as each run is added: the companions first, the run's row last, so a run counts as
    done only once everything it measured is on disk. Without one, the tables live in memory (a
    study nobody asked to keep)."""

    def __init__(self, directory: str | os.PathLike | None = None, tables: Sequence[str] = (),
                 runs_file: str = "runs.csv"):
        self.directory = Path(directory) if directory is not None else None
        self.tables = tuple(tables)
        self.runs_file = runs_file
        self._memory: dict[str, pd.DataFrame] = {}

    @classmethod
    def of_csv(cls, csv: str | os.PathLike, tables: Sequence[str] = ()) -> StudyStore:
        """The store whose runs table is the file ``csv`` (its companions beside it)."""
        csv = Path(csv)
        return cls(csv.parent, tables, runs_file=csv.name)

    def __repr__(self) -> str:
        return f"StudyStore({str(self.directory) if self.directory else 'memory'!r})"

    def __str__(self) -> str:
        return str(self.path("runs")) if self.directory else "memory"

    def path(self, table: str) -> Path:
        if self.directory is None:
            raise ValueError("an in-memory study has no files")
        return self.directory / (self.runs_file if table == "runs" else f"{table}.csv")

    @property
    def figures(self) -> Path:
        if self.directory is None:
            raise ValueError("an in-memory study has no files")
        return self.directory / "figures"

    def frame(self, table: str = "runs") -> pd.DataFrame:
        """Every row of ``table`` (all commits), or an empty frame."""
        if self.directory is None:
            return self._memory.get(table, pd.DataFrame())
        path = self.path(table)
        try:
            return read_runs_csv(path)
        except (FileNotFoundError, pd.errors.EmptyDataError):  # none yet; no rows nor columns
            return pd.DataFrame()

    def _write(self, table: str, frame: pd.DataFrame) -> None:
        if self.directory is None:
            self._memory[table] = frame.reset_index(drop=True)
        else:
            atomic_write_text(self.path(table), frame.to_csv(index=False))

    def done(self) -> set[str]:
        runs = self.frame("runs")
        return set(runs.run_id) if "run_id" in runs else set()

    def add(self, run: PlannedRun, outcome: Outcome) -> None:
        """Append the run's row and its companion rows (replacing companions a run interrupted
        between the two writes may have left)."""
        rid = run.run_id
        for table in self.tables:
            old = self.frame(table)
            if "run_id" in old:
                old = old[old.run_id != rid]
            new = outcome.tables.get(table)
            new = pd.DataFrame() if new is None else new.assign(run_id=rid)
            self._write(table, _concat(old, new))
        row = {"run_id": rid, "repeat": run.repeat, **run.columns, **outcome.row}
        self._write("runs", _concat(self.frame("runs"), pd.DataFrame([row])))

    def clear(self) -> None:
        """Forget every run (``fresh``): the CSVs go, the figures stay until redrawn."""
        if self.directory is None:
            self._memory.clear()
            return
        for table in ("runs", *self.tables):
            self.path(table).unlink(missing_ok=True)

    def read(self, run_ids: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
        """The runs to show, by table: those of ``run_ids`` (in that order) if given, else the rows
        of the commit measured last; the companion tables' rows of those runs."""
        runs = self.frame("runs")
        if run_ids is not None:
            order = {rid: i for i, rid in enumerate(run_ids)}
            runs = runs[runs.run_id.isin(order)] if "run_id" in runs else runs.iloc[:0]
            runs = runs.sort_values("run_id", key=lambda s: s.map(order), kind="stable")
            runs = runs.reset_index(drop=True)
        else:
            runs = latest_commit(runs)
        frames = {"runs": runs}
        for table in self.tables:
            frame = self.frame(table)
            if "run_id" in frame and "run_id" in runs:
                frame = frame[frame.run_id.isin(set(runs.run_id))].reset_index(drop=True)
            frames[table] = frame
        return frames


def _concat(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Rows appended; columns may grow between versions of the library."""
    if old.empty:
        return new.reset_index(drop=True)
    if new.empty:
        return old.reset_index(drop=True)
    return pd.concat([old, new], ignore_index=True)


#: ``(planned run) -> Outcome``; raises a DownpourError when the run fails.
Measure = Callable[[PlannedRun], Outcome]


def pending(plan: Sequence[PlannedRun], store: StudyStore, fresh: bool = False) -> list[PlannedRun]:
    """The planned runs not yet in the store (all of them if ``fresh``)."""
    done = set() if fresh else store.done()
    return [run for run in plan if run.run_id not in done]


def run_plan(plan: Sequence[PlannedRun], store: StudyStore, measure: Measure, *, fresh: bool = False,
             log: Callable[[str], None] = print,
             before_first: Callable[[], None] | None = None,
             own_pids: Callable[[], Iterable[int]] | None = None,
             announce: bool = False) -> list[str]:
    """Measure every run of ``plan`` not yet in ``store`` (all of them if ``fresh``), adding one row
    each; ``before_first`` is called once before the first run that is measured (e.g. to warm up
    fresh engines). Each row also records how busy the machine was while the run ran
    (``load.LoadProbe``; ``own_pids``: the run's processes that are not this process's
    descendants, e.g. the engines of a cluster started elsewhere), and the log counts the runs
    ("done  3 of 48: ...", and with ``announce`` "run   3 of 48: ..." as each starts, for studies
    whose measure says nothing before its run). A run that fails is logged and the others go on;
    then StudyError says each error once, with the runs it failed. Returns the run ids of the
    plan, in plan order."""
    if fresh:
        store.clear()
    done = store.done()
    todo = list({run.run_id: run for run in plan if run.run_id not in done}.values())  # plan order
    failures: list[tuple[str, str]] = []
    refusals: dict[str, set[tuple[str, int]]] = {}  # an input's refusal -> the runs it refused
    warmed = before_first is None
    for run in plan:
        rid = run.run_id
        if rid in done:
            log(f"skip  {run.label} (run {rid} already in {store})")
    for k, run in enumerate(todo, 1):
        rid = run.run_id
        count = f"{k} of {len(todo)}"
        if not warmed:
            before_first()
            warmed = True
        if announce:
            log(f"run   {count}: {run.label} ...")
        try:
            with LoadProbe(own_pids) as probe:
                outcome = measure(run)
        except DownpourError as exc:  # this run failed (a rank, a timeout): record it, go on
            failures.append((run.label, str(exc)))
            log(f"FAIL  {count}: {run.label}: {exc}")
            _stop_if_refused_alike(refusals, run, exc, len(todo) - k, store)
            continue
        load = probe.columns()
        outcome = Outcome({**outcome.row, **load}, outcome.tables, outcome.note)
        store.add(run, outcome)
        done.add(rid)
        notes = [n for n in (outcome.note, describe(load) if load.get("under_load") else "") if n]
        log(f"done  {count}: {run.label}" + (": " + "; ".join(notes) if notes else ""))
    if failures:
        kept = f"; the others are in {store}" if len(failures) < len(todo) else ""
        raise StudyError(f"{len(failures)} of {len(todo)} run(s) failed{kept}:\n" + _grouped(failures))
    return [run.run_id for run in plan]


def _stop_if_refused_alike(refusals: dict[str, set[tuple[str, int]]], run: PlannedRun,
                           exc: Exception, left: int, store: StudyStore) -> None:
    """StudyRefused once one refusal of the runs' input (a ConfigError's line, word for word) has
    refused runs of two algorithms: it depends on neither, so the ``left`` runs would most
    likely meet it too (a model that does not fit the data: 18 identical failures before). Runs
    of one algorithm refused alike go on: the refusal may be that algorithm's, or of a setting
    the plan varies (its steps)."""
    line = refusal(str(exc))
    if line is None or not left:
        return
    refused = refusals.setdefault(line, set())
    refused.add((run.config.algorithm, run.world_size))
    algorithms = {algorithm for algorithm, _ in refused}
    if len(algorithms) > 1:
        raise StudyRefused(f"{len(refused)} runs of {', '.join(sorted(algorithms))} were refused "
                           f"alike, and the other {left} would be: stopping. Fix it and run again "
                           f"(runs measured are kept in {store}):\n{line}")


def _grouped(failures: Sequence[tuple[str, str]]) -> str:
    """One line for each error (``(run label, error)`` pairs): the runs it failed, then the error."""
    runs: dict[str, list[str]] = {}
    for label, error in failures:
        runs.setdefault(error, []).append(" ".join(label.split()))
    return "\n".join(f"{labels[0]}: {error}" if len(labels) == 1 else
                     f"{len(labels)} runs ({labels[0]}, ...): {error}" for error, labels in runs.items())


@contextmanager
def cluster_for(plan: Sequence[PlannedRun], store: StudyStore, *, profile: str = "local-mpi",
                engines: int | None = None, fresh: bool = False,
                log: Callable[[str], None] = print) -> Iterator[Any]:
    """An ipyparallel cluster of the profile for the runs of ``plan`` still missing from ``store``,
    sized to the largest of them (or ``engines``); None when every run is already there (nothing
    is started). As ``cluster.use_cluster``: if the profile already runs one cluster (``ipcluster
    start --profile=NAME``) with enough engines, the runs use it and leave it running; a cluster
    started here is stopped on the way out."""
    todo = pending(plan, store, fresh)
    if not todo:
        log(f"all {len(plan)} runs are already in {store}; nothing to run (fresh=True starts over)")
        yield None
        return
    from ..cluster import use_cluster

    n = engines or max(run.world_size for run in todo)
    session = use_cluster(profile, n, at_least=True, activate=False, log=log,
                          purpose=f" for {len(todo)} run(s)")
    with session as cluster:  # stops only a cluster it started
        yield cluster


def with_series(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with two columns more, ``compute`` and ``series``.

    ``compute`` is ``real`` where a CSV predates emulation; ``series`` is the
    algorithm, and for emulated compute its step and, off this machine's ranks, where it ran,
    for example ``allreduce (emulated, 50 ms a step)``, ``... 50 ms a step, sandbox 1gbit)``. A
    series is a line of its own with its own 1-worker base, so emulated points are never mixed
    with real ones, and are labelled as such in every legend and table."""
    if "algorithm" not in runs:  # not a scaling study's rows
        return runs
    runs = runs.copy()
    compute = runs["compute"] if "compute" in runs else pd.Series("real", index=runs.index)
    runs["compute"] = compute.fillna("real")
    step = runs["emulated_step_s"] if "emulated_step_s" in runs else pd.Series(float("nan"),
                                                                                index=runs.index)
    label = step.map(lambda s: "auto" if pd.isna(s) else f"{float(s) * 1e3:g} ms a step")
    emulated = runs["compute"] == "emulated"
    name = runs["algorithm"]
    if "options.servers" in runs:  # sharded servers: a series apart from the one-server runs
        servers = pd.to_numeric(runs["options.servers"], errors="coerce")
        name = name.where(~(servers > 1), name + " " + servers.map(
            lambda s: f"{s:.0f}" if pd.notna(s) else "") + " servers")
    # where an emulated run ran: a sandbox link rate is a series of its own ("local": as before)
    where = runs["where"] if "where" in runs else pd.Series("local", index=runs.index)
    # a CSV whose runs are all local reads this column as floats (all NaN), which fillna("local")
    # warned on (a future pandas refuses it): NaN is local
    at = where.map(lambda w: "" if pd.isna(w) or w == "local" else f", {w}")
    runs["series"] = name.where(~emulated, name + " (emulated, " + label + at + ")")
    return runs
