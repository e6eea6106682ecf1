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
  or (``train``) its engine's process here has been stopped for the config's ``timeout_s`` (or
  half of it when the job ended itself first); the engines restart, and the next call waits;
- ``train(config)`` runs a ``TrainConfig`` on the first ``world_size`` ranks and returns rank 0's
  ``RunResult``; ``launch`` is the same as a launcher for ``study.core.run_plan``;
- ``activate()`` registers ``%px`` and ``%%px`` for interactive cells on all engines.

Three modules: this one (the session: its engines, ``train``, restart and stop), ``running``
(``run`` and how a job failed) and ``start`` (start, connect, find and stop a profile's clusters).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .. import user_code
from ..defaults import ENGINES_TIMEOUT_S
from ..errors import ClusterError, ConfigError
from . import remote
from .failures import CONTINUE, ClusterPreempted, ClusterRunError, _preempted
from .mpiexec import clear_stale_sessions
from .running import EXCEPTION_LINE, Running, controller_started, engine_log_complaint, wait_gone


def _mend_stream_replay() -> None:
    """Mend ipyparallel 9.2's streamed ``%px``, once per process. ``AsyncResult.stream_output``
    first replays the output that came in before it began, as messages without a parent header;
    its callback names each engine's display by the parent's message id, so every replayed engine
    got the one id ``"-stdout"`` and the last one's output replaced the others' (CI, a kernel that
    read its replies late: rank 1's hello alone). A replayed message is given its own request's id,
    the one the engine's live messages carry: each engine keeps its own display, and a message
    both replayed and streamed (the race ipyparallel's FIXME names) updates that display with
    the same full text. Turning streaming off instead left an interrupted cell waiting for the
    output of an engine that ignores the interrupt. An ipyparallel without that callback (another
    release than the 9.x this mends) is left as it is."""
    from ipyparallel.client.asyncresult import AsyncResult

    streamed = getattr(AsyncResult, "_iopub_streaming_output_callback", None)
    if streamed is None or getattr(streamed, "downpour_mended", False):
        return

    def callback(self, eid, msg_future, msg):
        if "parent_header" not in msg:
            msg = {**msg, "parent_header": {"msg_id": msg_future.msg_id}}
        return streamed(self, eid, msg_future, msg)

    callback.downpour_mended = True
    AsyncResult._iopub_streaming_output_callback = callback


def rank_map(seen: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """rank -> {engine_id, host, pid}, from what each engine said about itself (``remote.introduce``,
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


def stop_command(cluster, profile: str) -> str:
    """The shell command that stops ``cluster`` (an ipyparallel Cluster) of ``profile``: a cluster
    downpour started has an id, and ``ipcluster stop`` without it looks for the unnamed one."""
    cid = getattr(cluster, "cluster_id", "")
    return f"ipcluster stop --profile={profile}" + (f" --cluster-id={cid}" if cid else "")


class ClusterSession(Running):
    """A connected ipyparallel cluster whose engines form one MPI world (see the module docstring)."""

    def __init__(self, cluster, client, owned: bool, timeout_s: float = ENGINES_TIMEOUT_S,
                 grace_s: float = 10.0) -> None:
        self.cluster, self.client, self.owned = cluster, client, owned
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.size = 0
        self.engines: dict[int, dict[str, Any]] = {}  # rank -> {engine_id, host, pid}
        self.local_ranks: set[int] = set()  # the ranks whose engines run on this machine
        self._view = None
        self.stopped = False  # stop() was called (the with block ended): nothing runs any more
        self._restarting: set[int] | None = None  # the old engines' pids, while a restart is pending
        self._restarted_at = 0.0  # when the engines were last restarted (wall clock): older logs are theirs
        # pid -> psutil.Process: this machine's processes of a cluster we started (controller,
        # mpiexec, engines, their nannies), all of which stop() waits for
        self._processes: dict[int, Any] = {}

    # -- the engines -----------------------------------------------------------------------------

    def _ask(self, ids: list[int], timeout_s: float) -> dict[int, dict[str, Any]]:
        futures = {eid: self.client[eid].apply_async(remote.introduce) for eid in ids}
        return {eid: f.get(timeout=timeout_s) for eid, f in futures.items()}

    def _map_ranks(self, seen: dict[int, dict[str, Any]]) -> None:
        self.engines = rank_map(seen)
        self.size = len(seen)
        here = remote.machine_id()
        # the ranks whose processes are this machine's, whatever their host name (the sandbox's
        # nodes are this machine's namespaces): their pids mean something here
        self.local_ranks = {me["rank"] for me in seen.values()
                            if (me["machine"] == here if "machine" in me
                                else me["host"] == socket.gethostname())}
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
        """The engines' process ids on this machine (the Slurm sandbox's nodes included, whose
        host names are not this machine's) and the controller's, if this session started it:
        whose CPU time is a job's own, not other work's (``study.load``)."""
        pids = [e["pid"] for rank, e in self.engines.items() if rank in self.local_ranks]
        process = getattr(getattr(self.cluster, "controller", None), "process", None)
        return pids + ([process.pid] if getattr(process, "pid", None) else [])

    @property
    def profile(self) -> str:
        """The ipyparallel profile's name (a connected cluster knows its directory alone)."""
        return self.cluster.profile or os.path.basename(self.cluster.profile_dir).removeprefix("profile_")

    @property
    def ranks(self) -> dict[int, int]:
        """engine id -> MPI rank."""
        return {e["engine_id"]: rank for rank, e in self.engines.items()}

    def table(self) -> pd.DataFrame:
        """One row per engine: its MPI rank, engine id, host and process id. After a restart (a
        ``ClusterTimeout`` restarts the engines) it waits for the new engines: the old ones' rows
        would name processes that are gone."""
        self._check_open()
        self._await_restart()
        return pd.DataFrame([{"rank": r, **e} for r, e in sorted(self.engines.items())])

    def wait_for_engines(self, n: int, stale_pids: set[int] = frozenset(),
                         timeout_s: float | None = None) -> None:
        """Wait until ``n`` live engines are registered, none of them one of ``stale_pids`` (the
        engines before a restart, which the hub may still list and whose ids the new ones reuse),
        then map their ranks."""
        timeout_s = timeout_s or self.timeout_s
        deadline, began = time.monotonic() + timeout_s, time.time()
        fresh = answered = 0  # engines that answered (and are not the old ones)
        while True:
            ids = sorted(self.client.ids)
            if len(ids) == n:
                try:  # the first call imports torch on the engines: give it the time left
                    seen = self._ask(ids, timeout_s=max(1.0, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 -- an engine that is going away: ask again
                    seen = {}
                answered = len(seen)
                fresh = sum(me["pid"] not in stale_pids for me in seen.values())
                if len(seen) == n and fresh == n:
                    self._map_ranks(seen)
                    return
            if time.monotonic() > deadline:
                raise ClusterError(self._unanswered(n, ids, answered, fresh, stale_pids, began,
                                                    timeout_s))
            time.sleep(0.25)

    def _unanswered(self, n: int, ids: list[int], answered: int, fresh: int,
                    stale_pids: set[int], began: float, timeout_s: float) -> str:
        """What ``wait_for_engines`` says when its time is up: how many engines registered and
        answered, and why, as far as the logs tell."""
        logs = f"; see the engine logs in {self.cluster.profile_dir}/log"
        if stale_pids:
            count = (f"{fresh} of {n} restarted engines answered (the controller lists {len(ids)}, "
                     "the old ones among them until it sees they are gone)")
        elif len(ids) == n:
            # registered with the hub, but a question sent through the controller's queues went
            # unanswered: the engines are busy, or a queue process of the controller is gone
            # (ipyparallel binds their ports after choosing them: on a busy machine an outgoing
            # connection can take one in between, and the queue dies with "Address already in use")
            output = getattr(getattr(self.cluster, "controller", None), "output_file", "") or ""
            said = engine_log_complaint([output], pattern=EXCEPTION_LINE) if output else ""
            where = (f" (its output, {output}, says: {said})" if said
                     else f" (its output: {output})" if output else "")
            why = ("they are still busy (a job still running, or importing slowly on a loaded "
                   f"machine), or a queue of the controller is gone{where}: stop the cluster and "
                   "start it again")
            return (f"all {n} engines registered but {answered} answered within {timeout_s:.0f} s "
                    f"({why}){logs}")
        else:
            count = f"{len(ids)} of {n} engines registered"
        # the engine logs written since the controller started or the engines were last
        # restarted, whichever is later (else since this wait): not the old engines'
        why = self.unregistered_why(
            since=max(controller_started(self.cluster) or began, self._restarted_at))
        return f"{count} within {timeout_s:.0f} s" + (f" ({why})" if why else "") + logs

    def activate(self) -> None:
        """Register %px / %%px in this IPython session, on all engines (also after a restart).
        A ``%px`` cell streams each engine's printed output as it comes (ipyparallel's default),
        with ipyparallel's replay of early output mended (``_mend_stream_replay``)."""
        from ipyparallel.client.magics import ParallelMagics
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return
        _mend_stream_replay()
        self._view = self.client.direct_view("all")
        self._view.block = True
        shell.magics_manager.register(ParallelMagics(shell, self._view))  # ``view.activate()``'s

    def train(self, config, world_size: int | None = None, timeout_s: float | None = None):
        """Train ``config`` (a TrainConfig or a mapping) on ranks 0..world_size-1 (default: all);
        returns rank 0's ``RunResult``. Bad settings fail here, before any engine is busy."""
        from ..config import TrainConfig
        from ..data import load_dataset
        from ..planning import plan_run

        if isinstance(config, Mapping):
            config = TrainConfig.from_dict(dict(config))
        if not isinstance(config, TrainConfig):
            raise ConfigError("config", config, "a TrainConfig, or a mapping of its fields, e.g. "
                                                "TrainConfig(algorithm='sync_ps')")
        world_size = self.size if world_size is None else world_size
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError("world_size", world_size, f"ranks to train on, 1 to {self.size} (the "
                                                        "cluster's engines); None: all of them")
        if world_size > self.size:
            profile = self.profile
            raise ConfigError("world_size", world_size,
                              f"this cluster has {self.size} engines: train on at most {self.size}, "
                              f"or stop it (cluster.stop(), or {stop_command(self.cluster, profile)}) "
                              f"and start one of {world_size}: use_cluster({profile!r}, n={world_size})")
        # the run's one pre-flight: the engines train on its plan
        plan = plan_run(config, world_size,
                        load_dataset(config.data.dataset, config.data.data_dir).train)
        try:
            results = self.run(remote.train, config.to_dict(), world_size, plan,
                               user_code.shipped(config.model, config.data.dataset),
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
        self._restarted_at = time.time()
        self.cluster.restart_engines_sync()
        self._restarting = stale
        if wait:
            self._await_restart()

    def _await_restart(self) -> None:
        """After ``restart_engines(wait=False)``: wait for the new engines and map their ranks."""
        if self._restarting is None:
            return
        # cleared once the engines are mapped: interrupted (Ctrl-C) or timed out, the next call
        # waits again rather than run on the old engines' map
        self.wait_for_engines(self.size, stale_pids=self._restarting)
        self._restarting = None
        if self._view is not None:
            self._view = None
            self.activate()

    def _check_open(self) -> None:
        """ClusterError once ``stop`` was called: ipyparallel's own ('Client cannot be used after
        its sockets have been closed') said nothing of the stop, and ``table`` named gone engines."""
        if self.stopped:
            profile = self.profile
            raise ClusterError(f"this session of the {profile!r} cluster is stopped (its with block "
                               f"ended, or stop() was called): use_cluster({profile!r}) or "
                               f"connect({profile!r}) gives a new one")

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the cluster if this session started it; otherwise just disconnect. Returns once
        every process of the cluster on this machine (controller, mpiexec, engines and their
        nannies) has exited: those still there ``grace_s`` after the stop get SIGTERM, then SIGKILL."""
        self.stopped = True
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

        alive = wait_gone(self._processes.values(), grace_s)
        for signal_them in ("terminate", "kill"):
            for process in alive:
                try:
                    getattr(process, signal_them)()
                except psutil.NoSuchProcess:
                    pass
            alive = wait_gone(alive, 3.0)
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
