"""Start or connect to a profile's ipyparallel cluster whose engines are MPI ranks, and run jobs on it.

``start_cluster(profile, n)`` starts a controller and ``n`` engines with the profile's launcher
(``local-mpi``: mpiexec on this machine; ``slurm-mpi``: one sbatch job), and refuses while the profile
already runs a cluster; ``connect(profile)`` attaches to a cluster that ``ipcluster start
--profile=NAME`` (or another session) already runs. Both return a ``ClusterSession``:

- ``ranks`` maps engine ids to MPI ranks, asked from every engine, never assumed equal (ipyparallel
  numbers engines by registration, and a restart renumbers them);
- ``run(fn, ...)`` calls ``fn`` on every engine and returns ``{rank: value}``. An exception on any
  engine reaches the caller as ``ClusterRunError`` naming the rank, its host and its traceback. The
  other ranks get ``grace_s`` to notice (a dead peer usually breaks their collectives at once); ranks
  still blocked after that, a run past its timeout, and a run interrupted from the notebook (Ctrl-C,
  "interrupt kernel") get the engines restarted, so the next cell runs on fresh engines and the
  notebook kernel never needs a restart. When a rank goes silent (stopped or hung), the error is
  ``ClusterTimeout`` naming it in ``.silent``, within the job's timeout and a few seconds: the other
  ranks time out waiting on it (the ``mpi`` backend names it), the controller loses its heartbeat,
  or (``train``) its engine's process here has been stopped for the config's ``timeout_s``; the
  engines restart, and the next call waits for them;
- ``train(config)`` runs a ``TrainConfig`` on the first ``world_size`` ranks and returns rank 0's
  ``RunResult``; ``launch`` is the same as a launcher for ``study.core.run_plan``;
- ``activate()`` registers ``%px`` and ``%%px`` for interactive cells on all engines.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from ..errors import ConfigError
from . import remote
from .failures import (  # noqa: F401 -- ClusterPreempted and CONTINUE: importable from here too
    CONTINUE,
    LOST,
    SILENT_REPORT_S,
    ClusterError,
    ClusterPreempted,
    ClusterRunError,
    ClusterTimeout,
    EngineFailure,
    _clean_traceback,
    _preempted,
    silent_in,
)
from .mpiexec import clear_stale_sessions
from .profiles import ensure_profile, profile_dir


def _finished_at(future) -> float:
    """When the engine finished the task (its own clock), for ordering failures."""
    completed = (getattr(future, "metadata", None) or {}).get("completed")
    return completed.timestamp() if completed is not None else float("inf")


def rank_map(seen: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """rank -> {engine_id, host, pid}, from what each engine said about itself (``remote.whoami``,
    keyed by engine id). The engines must be ranks 0..n-1 of one MPI world of n."""
    sizes = {me["size"] for me in seen.values()}
    ranks = sorted(me["rank"] for me in seen.values())
    if sizes != {len(seen)} or ranks != list(range(len(seen))):
        raise ClusterError(
            f"the {len(seen)} engines are not one MPI world (ranks {ranks}, world sizes "
            f"{sorted(sizes)}): start them with one mpiexec or srun, as the local-mpi and "
            "slurm-mpi profiles do, or start a fresh cluster")
    return {me["rank"]: {"engine_id": eid, "host": me["host"], "pid": me["pid"]}
            for eid, me in sorted(seen.items(), key=lambda item: item[1]["rank"])}


def _wait_gone(processes, timeout_s: float) -> list:
    """Wait up to ``timeout_s`` for the psutil ``processes`` to exit; returns those still alive. A
    zombie counts as gone (an orphan's zombie waits for a PID 1 that may never reap it)."""
    import psutil

    def alive(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout_s
    left = [p for p in processes if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


class ClusterSession:
    """A connected ipyparallel cluster whose engines form one MPI world (see the module docstring)."""

    def __init__(self, cluster, client, owned: bool, timeout_s: float = 120.0,
                 grace_s: float = 10.0) -> None:
        self.cluster, self.client, self.owned = cluster, client, owned
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.size = 0
        self.engines: dict[int, dict[str, Any]] = {}  # rank -> {engine_id, host, pid}
        self._view = None
        self._restarting: set[int] | None = None  # the old engines' pids, while a restart is pending
        # pid -> psutil.Process: this machine's processes of a cluster we started (controller,
        # mpiexec, engines, their nannies), all of which stop() waits for
        self._processes: dict[int, Any] = {}

    # -- the engines -----------------------------------------------------------------------------

    def _ask(self, ids: list[int], timeout_s: float) -> dict[int, dict[str, Any]]:
        futures = {eid: self.client[eid].apply_async(remote.whoami) for eid in ids}
        return {eid: f.get(timeout=timeout_s) for eid, f in futures.items()}

    def _map_ranks(self, seen: dict[int, dict[str, Any]]) -> None:
        self.engines = rank_map(seen)
        self.size = len(seen)
        if self.owned:
            self._record_processes()

    def _record_processes(self) -> None:
        """Remember the cluster's processes on this machine: the launchers' (controller, mpiexec)
        and the engines', each with its descendants. Each engine has a nanny child in a session of
        its own, which outlives the engine by 15-20 s unless stop() ends it."""
        import psutil

        launchers = [self.cluster.controller, *self.cluster.engines.values()]
        pids = [launcher.process.pid for launcher in launchers
                if isinstance(getattr(launcher, "process", None), psutil.Process)]
        here = socket.gethostname()
        pids += [e["pid"] for e in self.engines.values() if e["host"] == here]
        for pid in pids:
            try:
                process = psutil.Process(pid)
                family = [process, *process.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in family:
                if p.pid != os.getpid():
                    self._processes.setdefault(p.pid, p)

    def local_pids(self) -> list[int]:
        """The engines' process ids on this machine and the controller's, if this session
        started it: whose CPU time is a job's own, not other work's (``study.load``)."""
        here = socket.gethostname()
        pids = [e["pid"] for e in self.engines.values() if e["host"] == here]
        process = getattr(getattr(self.cluster, "controller", None), "process", None)
        return pids + ([process.pid] if getattr(process, "pid", None) else [])

    @property
    def ranks(self) -> dict[int, int]:
        """engine id -> MPI rank."""
        return {e["engine_id"]: rank for rank, e in self.engines.items()}

    def table(self) -> pd.DataFrame:
        """One row per engine: its MPI rank, engine id, host and process id."""
        return pd.DataFrame([{"rank": r, **e} for r, e in sorted(self.engines.items())])

    def wait_for_engines(self, n: int, stale_pids: set[int] = frozenset(),
                         timeout_s: float | None = None) -> None:
        """Wait until ``n`` live engines are registered, none of them one of ``stale_pids`` (the
        engines before a restart, which the hub may still list and whose ids the new ones reuse),
        then map their ranks."""
        timeout_s = timeout_s or self.timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            ids = sorted(self.client.ids)
            if len(ids) == n:
                try:  # the first call imports torch on the engines: give it the time left
                    seen = self._ask(ids, timeout_s=max(1.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 -- an engine that is going away: ask again
                    seen = {}
                if len(seen) == n and not {me["pid"] for me in seen.values()} & set(stale_pids):
                    self._map_ranks(seen)
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"{len(ids)} of {n} engines registered within {timeout_s:.0f} s; "
                                   f"see the engine logs in {self.cluster.profile_dir}/log")
            time.sleep(0.25)

    def activate(self) -> None:
        """Register %px / %%px in this IPython session, on all engines (also after a restart)."""
        from IPython import get_ipython

        if get_ipython() is None:
            return
        self._view = self.client.direct_view("all")
        self._view.block = True
        self._view.activate()

    # -- running ---------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None,
            what: str | None = None, silent_s: float | None = None, **kwargs: Any) -> dict[int, Any]:
        """Call ``fn(*args, **kwargs)`` on every engine; returns ``{rank: value}``. ``silent_s``
        (``train`` passes its config's ``timeout_s``): an engine of this machine whose process
        stays stopped (SIGSTOP, a debugger) that long is a silent rank, as one the controller
        loses or a waiting rank's CommTimeout names: the run ends at once with ClusterTimeout
        naming it, and the engines restart (the next call waits for them)."""
        what = what or getattr(fn, "__name__", "the job")
        self._await_restart()
        self._check_engines(what)
        futures = {rank: self.client[e["engine_id"]].apply_async(fn, *args, **kwargs)
                   for rank, e in self.engines.items()}
        results: dict[int, Any] = {}
        failures: list[EngineFailure] = []
        deadline = time.monotonic() + timeout_s if timeout_s else None
        first_failure = None
        stopped: dict[int, float] = {}  # rank -> since when its process is seen stopped
        silent_seen = None  # when a silent rank was first known
        try:
            while futures:
                ready = [rank for rank in futures if futures[rank].ready()]
                for rank in sorted(ready, key=lambda r: _finished_at(futures[r])):
                    failure = self._collect(rank, futures.pop(rank), results)
                    if failure is not None:
                        failures.append(failure)
                        first_failure = first_failure or time.monotonic()
                if not futures:
                    break
                now = time.monotonic()
                silent = self._silent(futures, failures, stopped, now, silent_s)
                silent_seen = (silent_seen or now) if silent else None
                # a silent rank never answers: once the ranks still running are all silent, or
                # the others had a moment to report their timeouts, waiting longer tells nothing
                if silent and (set(futures) <= set(silent) or now - silent_seen > SILENT_REPORT_S):
                    self._kill_stopped(silent)
                    self.restart_engines(wait=False)
                    raise ClusterTimeout.of_silent(what, silent, failures, True)
                if first_failure is not None and now - first_failure > self.grace_s:
                    break
                if deadline is not None and now > deadline:
                    self.restart_engines()
                    raise ClusterTimeout(f"{what} ran past {timeout_s:.0f} s on rank(s) "
                                         f"{', '.join(map(str, sorted(futures)))}; the engines "
                                         "were restarted")
                time.sleep(0.05)
        except KeyboardInterrupt:
            # Whatever the engines are blocked in (a collective, C code), a restart frees them.
            self.restart_engines()
            raise
        if failures:
            stuck = sorted(futures)
            if stuck:
                self.restart_engines()
            raise (ClusterTimeout.silent_rank(what, failures, bool(stuck))
                   or ClusterRunError(what, failures, stuck, bool(stuck)))
        return dict(sorted(results.items()))

    def _silent(self, futures, failures: list[EngineFailure], stopped: dict[int, float],
                now: float, silent_s: float | None) -> dict[int, str]:
        """rank -> how it was seen, of the ranks known to be silent now (see ``run``)."""
        silent = {rank: "" for rank in silent_in(failures)}
        for f in failures:  # lost by the controller, alive here: stopped or hung, not dead
            if f.error.startswith(LOST) and self._process_status(f.rank) not in (None, "zombie"):
                silent[f.rank] = "the controller stopped hearing its engine's heartbeat"
        if silent_s is None:
            return silent
        for rank in futures:
            if self._process_status(rank) == "stopped":
                stopped.setdefault(rank, now)
                if now - stopped[rank] >= silent_s:
                    e = self.engines[rank]
                    silent[rank] = (f"engine {e['engine_id']} on {e['host']}, pid {e['pid']}: its "
                                    f"process has been stopped for {now - stopped[rank]:.0f} s")
            else:
                stopped.pop(rank, None)
        return silent

    def _process_status(self, rank: int) -> str | None:
        """psutil's status of the rank's engine process, where it runs on this machine."""
        import psutil

        engine = self.engines[rank]
        if engine["host"] != socket.gethostname():
            return None
        try:
            status = psutil.Process(engine["pid"]).status()
        except psutil.Error:
            return None
        return "stopped" if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else status

    def _kill_stopped(self, ranks) -> None:
        """SIGKILL the silent ranks' engines that are stopped here: a stopped process defers every
        other signal, so stopping the engines would wait on it to its launcher's last resort."""
        import psutil

        for rank in ranks:
            if self._process_status(rank) == "stopped":
                try:
                    psutil.Process(self.engines[rank]["pid"]).kill()
                except psutil.Error:
                    pass

    def _check_engines(self, what: str) -> None:
        """Raise a ClusterError if an engine of the world has gone (killed, crashed, or its node
        lost; under mpiexec the other ranks go with it): the job could not run."""
        registered = set(self.client.ids)
        gone = [rank for rank, e in self.engines.items() if e["engine_id"] not in registered]
        if gone:
            ended = self.slurm_job_ended()
            raise ClusterError(
                f"cannot run {what}: the engine(s) of rank(s) {', '.join(map(str, gone))} of "
                f"{self.size} are gone (" + (ended or "killed, crashed or their node lost") +
                "); call cluster.restart_engines() to start all the engines again, then run it "
                "again (a run with a checkpoint_dir resumes from its newest checkpoint)")

    def slurm_job_ended(self) -> str | None:
        """How the engines' Slurm job ended, if it did: "the engines' Slurm job 12 is TIMEOUT (it
        reached its time limit)"; None if it runs, or there is none, or Slurm cannot say."""
        job = self.slurm_job()
        if job is None:
            return None
        try:
            out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                                 text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")
        why = {"TIMEOUT": "it reached its time limit", "PREEMPTED": "the site preempted it",
               "NODE_FAIL": "a node failed", "CANCELLED": "it was cancelled",
               "FAILED": "it failed", "COMPLETED": "it ended", "OUT_OF_MEMORY": "out of memory",
               "DEADLINE": "it reached its deadline"}
        return f"the engines' Slurm job {job} is {state} ({why[state]})" if state in why else None

    def _collect(self, rank: int, future, results: dict[int, Any]) -> EngineFailure | None:
        from ipyparallel.error import EngineError, RemoteError

        engine = self.engines[rank]
        try:
            results[rank] = future.get(0)
            return None
        except EngineError as exc:  # the controller lost the engine; the traceback is the client's
            first = str(exc).splitlines()[0] if str(exc) else ""
            return EngineFailure(rank, engine["engine_id"], engine["host"],
                                 f"{LOST} {first} (no heartbeat: stopped, hung or dead)", "")
        except RemoteError as exc:
            return EngineFailure(rank, engine["engine_id"], engine["host"],
                                 f"{exc.ename}: {exc.evalue}", _clean_traceback(exc.traceback))
        except Exception as exc:  # noqa: BLE001 -- e.g. the engine died: still name the rank
            return EngineFailure(rank, engine["engine_id"], engine["host"],
                                 f"{type(exc).__name__}: {exc}", "")

    def train(self, config, world_size: int | None = None, timeout_s: float | None = None):
        """Train ``config`` (a TrainConfig or a mapping) on ranks 0..world_size-1 (default: all);
        returns rank 0's ``RunResult``. Bad settings fail here, before any engine is busy."""
        from ..config import TrainConfig
        from ..data import load_dataset
        from ..engine import plan_run

        if isinstance(config, Mapping):
            config = TrainConfig.from_dict(dict(config))
        world_size = world_size or self.size
        if world_size > self.size:
            raise ConfigError("world_size", world_size,
                              f"this cluster has {self.size} engines; start one with at least "
                              f"{world_size} (start_cluster(profile, n={world_size}))")
        # the run's one pre-flight: the engines train on its plan
        plan = plan_run(config, world_size,
                        load_dataset(config.data.dataset, config.data.data_dir).train)
        try:
            results = self.run(remote.train, config.to_dict(), world_size, plan,
                               timeout_s=timeout_s,
                               what=f"{config.algorithm} on {world_size} rank(s)",
                               silent_s=config.system.timeout_s)
        except ClusterRunError as exc:
            preempted = _preempted(exc, self.slurm_job())
            ended = None if preempted else self.slurm_job_ended()  # killed with the job
            if ended:
                raise ClusterPreempted(f"{ended}, and the run on its engines with it. {CONTINUE}, "
                                       "if it wrote one.") from exc
            raise preempted or exc from None
        return results[0]

    def slurm_job(self) -> str | None:
        """The Slurm job id of the engines (slurm-mpi), else None."""
        for engine_set in (getattr(self.cluster, "engines", None) or {}).values():
            job = getattr(engine_set, "job_id", None)  # ipyparallel's batch launchers keep it
            if job:
                return str(job)
        return None

    def launch(self, config, world_size: int, timeout_s: float) -> dict[str, Any]:
        """A ``run_study`` launcher: the run's summary row, exactly as ``downpour train
        --summary-json`` writes it (so both launchers give the same CSV)."""
        summary = self.train(config, world_size, timeout_s).summary
        return json.loads(json.dumps(summary, default=str))

    def allreduce(self, world_size: int | None = None) -> pd.DataFrame:
        """A torch.distributed allreduce across the engines: each rank sends rank + 1."""
        rows = self.run(remote.allreduce_ranks, world_size or self.size, timeout_s=self.timeout_s)
        return pd.DataFrame([r for r in rows.values() if r is not None])

    def hello(self) -> dict[int, str]:
        return self.run(remote.hello, timeout_s=self.timeout_s)

    # -- restart and stop ------------------------------------------------------------------------

    def restart_engines(self, wait: bool = True) -> None:
        """Stop the engines (whatever they are doing, or after one died) and start as many again
        with the same launcher; with ``wait=False``, return once they are started, and the next
        job waits for them to register."""
        self._await_restart()
        stale = {e["pid"] for e in self.engines.values()}
        self.cluster.restart_engines_sync()
        self._restarting = stale
        if wait:
            self._await_restart()

    def _await_restart(self) -> None:
        """After ``restart_engines(wait=False)``: wait for the new engines and map their ranks."""
        if self._restarting is None:
            return
        stale, self._restarting = self._restarting, None
        self.wait_for_engines(self.size, stale_pids=stale)
        if self._view is not None:
            self._view = None
            self.activate()

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the cluster if this session started it; otherwise just disconnect. Returns once
        every process of the cluster on this machine (controller, mpiexec, engines and their
        nannies) has exited: those still there ``grace_s`` after the stop get SIGTERM, then SIGKILL."""
        try:
            self.client.close()
        finally:
            if self.owned:
                # mpiexec ends with status 1 when its engines are stopped, and ipyparallel then
                # logs every engine's output as a warning; a planned stop is not a failure.
                log = self.cluster.log
                level = log.level
                log.setLevel(logging.ERROR)
                try:
                    self.cluster.stop_cluster_sync()
                finally:
                    log.setLevel(level)
                    self._reap(grace_s)

    def _reap(self, grace_s: float) -> None:
        import psutil

        alive = _wait_gone(self._processes.values(), grace_s)
        for signal_them in ("terminate", "kill"):
            for process in alive:
                try:
                    getattr(process, signal_them)()
                except psutil.NoSuchProcess:
                    pass
            alive = _wait_gone(alive, 3.0)
        self._processes = {p.pid: p for p in alive}
        clear_stale_sessions()  # what a killed mpiexec left behind would stop a later one
        if alive:
            logging.getLogger(__name__).warning("cluster processes %s survived SIGKILL",
                                                sorted(p.pid for p in alive))

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"<ClusterSession {self.cluster.profile_dir} cluster_id={self.cluster.cluster_id!r} "
                f"{self.size} engines on {sorted({e['host'] for e in self.engines.values()})}>")


def running_clusters(profile: str, ipython: str | None = None) -> list:
    """The ipyparallel clusters of the profile whose controller is alive (from the cluster files in
    the profile's security directory; loading them removes the files of clusters long gone)."""
    import ipyparallel as ipp

    clusters = ipp.ClusterManager().load_clusters(profile_dirs=[str(profile_dir(profile, ipython))])
    for cluster in clusters.values():
        # a look, not a takeover: these copies watch the processes too, and must never rewrite
        # the owner's cluster file when one of them stops
        cluster.cluster_file = ""
    return [c for c in clusters.values() if c.controller is not None and c.controller.running]


def _already_running(profile: str, clusters: list) -> str:
    lines = [f"profile {profile!r} already runs {len(clusters)} cluster(s); start_cluster does not "
             "start another beside it, whose engines would compete with its engines:"]
    for c in clusters:
        engines = sum(es.n or 0 for es in c.engines.values())
        pid = getattr(getattr(c.controller, "process", None), "pid", "?")
        cid = f", cluster_id={c.cluster_id!r}" if c.cluster_id else ""
        stop = f" --cluster-id={c.cluster_id}" if c.cluster_id else ""
        lines.append(f"- cluster id {c.cluster_id!r} ({engines} engines, controller pid {pid}): "
                     f"use it with connect({profile!r}{cid}), or stop it with `ipcluster stop "
                     f"--profile={profile}{stop}` (or cluster.stop() on the session that started it)")
    if len(clusters) > 1:
        lines.append(f"`ipcluster stop --profile={profile} --all` stops them all")
    return "\n".join(lines)


def start_cluster(profile: str = "local-mpi", n: int = 2, *, engine_env: Mapping[str, str] = (),
                  engines_per_node: int = 0, timeout_s: float = 120.0, activate: bool = True,
                  **cluster_kwargs) -> ClusterSession:
    """Start a controller and ``n`` engines from the profile (installing a bundled profile first
    if needed); use as ``with start_cluster(...) as cluster:`` or call ``cluster.stop()``.

    ``engines_per_node`` (batch profiles such as ``slurm-mpi``): that many engines on each node, so
    ``n=4, engines_per_node=2`` takes two nodes; 0 leaves the placement to the profile (or Slurm).

    One cluster per profile: if the profile already runs one (``ipcluster start``, or an earlier
    ``start_cluster`` not yet stopped, e.g. a notebook cell run twice), this raises ``ClusterError``
    naming it and saying how to use it (``connect(profile)``) or stop it
    (``ipcluster stop --profile=NAME``), instead of starting a second set of engines beside it."""
    import ipyparallel as ipp

    if n < 1:
        raise ConfigError("n", n, "start at least 1 engine")
    ensure_profile(profile)
    clear_stale_sessions()
    running = running_clusters(profile)
    if running:
        raise ClusterError(_already_running(profile, running))
    cluster_kwargs.setdefault("log_level", logging.WARNING)  # ipyparallel's INFO lines drown a notebook
    cluster = ipp.Cluster(profile=profile, n=n, engine_timeout=int(timeout_s), **cluster_kwargs)
    if engines_per_node:
        launcher = cluster.engine_launcher_class
        if isinstance(engines_per_node, bool) or not isinstance(engines_per_node, int) \
                or engines_per_node < 0 or n % engines_per_node:
            raise ConfigError("engines_per_node", engines_per_node,
                              f"give a whole number that divides n={n} (or 0: as the profile places them)")
        if not launcher.class_traits().get("tasks_per_node"):
            raise ConfigError("engines_per_node", engines_per_node,
                              f"profile {profile!r} starts every engine on this machine; only a batch "
                              "profile such as slurm-mpi places engines on nodes (use 0 here)")
        cluster.config[launcher.__name__].tasks_per_node = engines_per_node
    if engine_env:
        name = cluster.engine_launcher_class.__name__
        env = dict(cluster.config[name].get("environment", {}))
        cluster.config[name].environment = {**env, **dict(engine_env)}
    client = None
    try:
        cluster.start_cluster_sync(n)
        client = cluster.connect_client_sync()
        session = ClusterSession(cluster, client, owned=True, timeout_s=timeout_s)
        session.wait_for_engines(n)
    except BaseException as exc:
        if client is not None:
            client.close()
        _stop_after_failed_start(cluster, exc)
        from .launchers import SlurmCommandError

        if isinstance(exc, SlurmCommandError):  # what sbatch said, without ipyparallel's stack
            raise ClusterError(f"the engines of profile {profile!r} did not start: {exc}") from None
        raise
    if activate:
        session.activate()
    return session


def _stop_after_failed_start(cluster, exc: BaseException) -> None:
    """Stop what a failed start left running (the controller, a job) and its files; an error in
    stopping is logged, never raised: the start's own error is the one to report."""
    try:
        cluster.stop_cluster_sync()
    except Exception as stop_exc:  # noqa: BLE001 -- exc is the error the caller must see
        logging.getLogger(__name__).warning("stopping the cluster after its failed start (%s) "
                                            "failed too: %s", exc, stop_exc)


def connect(profile: str = "local-mpi", cluster_id: str = "", *, n: int | None = None,
            timeout_s: float = 120.0, activate: bool = True) -> ClusterSession:
    """Attach to the cluster that ``ipcluster start --profile=NAME`` runs, waiting for its engines
    (a Slurm job may sit in the queue for a while: raise ``timeout_s``)."""
    import ipyparallel as ipp

    try:
        cluster = ipp.Cluster.from_file(profile_dir=str(profile_dir(profile)), cluster_id=cluster_id)
    except FileNotFoundError:
        raise ClusterError(f"no running cluster for profile {profile!r}"
                           + (f" with id {cluster_id!r}" if cluster_id else "")
                           + f": start one with `ipcluster start --profile={profile} -n N "
                             "--daemonize`, or use start_cluster()") from None
    n = n or sum(es.n for es in cluster.engines.values())
    client = cluster.connect_client_sync()
    session = ClusterSession(cluster, client, owned=False, timeout_s=timeout_s)
    try:
        session.wait_for_engines(n)
    except BaseException:
        client.close()
        raise
    if activate:
        session.activate()
    return session


def stop_clusters(profile: str, ipython: str | None = None) -> int:
    """Stop every cluster recorded in the profile (what a test's teardown calls); returns how many."""
    import ipyparallel as ipp

    stopped = 0
    for cluster in ipp.ClusterManager().load_clusters(
            profile_dirs=[str(profile_dir(profile, ipython))]).values():
        cluster.stop_cluster_sync()
        stopped += 1
    return stopped
