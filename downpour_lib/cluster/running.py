"""Running a job on every engine of a ``ClusterSession`` and telling how it failed.

``run(fn, ...)`` calls ``fn`` on every engine and returns ``{rank: value}``; an exception on any
engine reaches the caller as ``ClusterRunError`` naming the rank, its host and its traceback, and
a silent rank (stopped, hung, or lost by the controller) as ``ClusterTimeout`` naming it (see
``session``'s module docstring for the whole contract). A mixin of ``ClusterSession``: it uses the
session's ``engines``, ``client``, ``grace_s``, ``_check_open`` and ``restart_engines``.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ClusterError
from .failures import (
    LOST,
    SILENT_REPORT_S,
    ClusterRunError,
    ClusterTimeout,
    EngineFailure,
    _clean_traceback,
    cause_first,
    silent_in,
)

#: a rank seen running again at most this long before a run's first failure, after a stop of half
#: its ``silent_s``, was stopped when its job ended (``run``): the launcher's SIGCONT came first
WOKEN_AT_END_S = 10.0
#: how long a stopped engine that was sent SIGKILL may take to exit (a moment, even on a busy machine)
KILLED_GONE_S = 10.0


def _finished_at(future) -> float:
    """When the engine finished the task (its own clock), for ordering failures."""
    completed = (getattr(future, "metadata", None) or {}).get("completed")
    return completed.timestamp() if completed is not None else float("inf")


def wait_gone(processes, timeout_s: float) -> list:
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


def _slurm_job_fields(job: str) -> dict[str, str]:
    """``scontrol show job``'s fields of ``job`` (JobState, Reason, ...); {} if Slurm cannot say."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


_ENDED = {"TIMEOUT": "it reached its time limit", "PREEMPTED": "the site preempted it",
          "NODE_FAIL": "a node failed", "CANCELLED": "it was cancelled", "FAILED": "it failed",
          "COMPLETED": "it ended", "OUT_OF_MEMORY": "out of memory",
          "DEADLINE": "it reached its deadline"}


def _ended(job: str, state: str) -> str | None:
    """How the engines' Slurm job in ``state`` ended ("... job 12 is TIMEOUT (it reached its time
    limit)"); None while it has not."""
    return f"the engines' Slurm job {job} is {state} ({_ENDED[state]})" if state in _ENDED else None


#: a Python exception's last line ("zmq.error.ZMQError: Address already in use ...")
EXCEPTION_LINE = re.compile(r"^([\w.]+(?:Error|Exception): .+)$")
#: an ipyparallel log line's complaint ("... [IPEngine.1] CRITICAL | Registration timed out after
#: 5.0 seconds"), or a Python exception's last line in an engine's output
_COMPLAINT = re.compile(r"\] (?:CRITICAL|ERROR) \| (\S.*)$|" + EXCEPTION_LINE.pattern)


def engine_log_complaint(logs, since: float = 0.0, pattern: re.Pattern = _COMPLAINT) -> str:
    """The last complaint in the output files ``logs`` (an ipyparallel CRITICAL or ERROR line, or
    an exception's last line; or what else ``pattern`` finds, in its first group that matched),
    the newest file first, of those written since ``since`` (wall-clock seconds); "" if none says
    anything."""
    def written(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    stamped = [(written(log), log) for log in map(Path, logs)]  # one stat a file
    for _, log in sorted((s for s in stamped if s[0] >= since), key=lambda s: s[0], reverse=True):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            found = pattern.search(line)
            if found:
                return next(g for g in found.groups() if g is not None).strip()[:300]
    return ""


def controller_started(cluster) -> float:
    """When the cluster's controller process started (wall-clock seconds), if it runs on this
    machine; else 0.0."""
    import psutil

    pid = getattr(getattr(getattr(cluster, "controller", None), "process", None), "pid", None)
    try:
        return psutil.Process(pid).create_time() if pid else 0.0
    except psutil.Error:
        return 0.0


#: the reasons Slurm gives a pending job that no wait will start: it asks for more than its
#: partition has or allows (squeue(1), JOB REASON CODES)
NEVER_RUNS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit",
                        "BadConstraints", "InvalidAccount", "InvalidQOS",
                        "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "AssocMaxNodesPerJobLimit",
                        "AssocMaxCpuPerJobLimit"})


class Running:
    """``run`` and the failure detection around it, for ``ClusterSession``."""

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None,
            what: str | None = None, silent_s: float | None = None, **kwargs: Any) -> dict[int, Any]:
        """Call ``fn(*args, **kwargs)`` on every engine; returns ``{rank: value}``. ``silent_s``
        (``train`` passes its config's ``timeout_s``): an engine of this machine whose process
        stays stopped (SIGSTOP, a debugger) that long is a silent rank, as one the controller
        loses or a waiting rank's CommTimeout names: the run ends at once with ClusterTimeout
        naming it, and the engines restart (the next call waits for them). So does a job that
        ends itself (the mpi backend's watchdog) while a rank was stopped half of ``silent_s``."""
        what = what or getattr(fn, "__name__", "the job")
        self._check_open()
        self._await_restart()
        self._check_engines(what)
        futures = {rank: self.client[e["engine_id"]].apply_async(fn, *args, **kwargs)
                   for rank, e in self.engines.items()}
        results: dict[int, Any] = {}
        failures: list[EngineFailure] = []
        deadline = time.monotonic() + timeout_s if timeout_s else None
        first_failure = None
        stopped: dict[int, float] = {}  # rank -> since when its process is seen stopped
        woken: dict[int, tuple[float, float]] = {}  # rank -> (stopped since, seen running again at)
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
                silent = self._silent(futures, failures, stopped, woken, now, silent_s)
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
        if failures and silent_s is not None:
            # the job ended itself while a rank was stopped: a waiting rank stuck inside MPI on a
            # silent peer ends the whole MPI job (the mpi backend's watchdog, ``job_end``), which
            # can come before the stop above counts as silence; the stopped rank is still the cause
            # (the launcher wakes a stopped rank with SIGCONT before its SIGTERM as the job ends,
            # so one seen running again just before the first failure was stopped when it ended)
            now = time.monotonic()
            spans = {**{rank: (since, at) for rank, (since, at) in woken.items()
                        if at >= first_failure - WOKEN_AT_END_S},
                     **{rank: (since, now) for rank, since in stopped.items()}}
            ended = {rank: self._stopped_how(rank, until - since, ended=True)
                     for rank, (since, until) in spans.items() if until - since >= silent_s / 2}
            if ended:
                self._kill_stopped(ended, running_too=True)
                self.restart_engines(wait=False)
                raise ClusterTimeout.of_silent(what, ended, cause_first(failures), True)
        if failures:
            failures = cause_first(failures)
            stuck = sorted(futures)
            if stuck:
                self.restart_engines()
            raise (ClusterTimeout.silent_rank(what, failures, bool(stuck))
                   or ClusterRunError(what, failures, stuck, bool(stuck)))
        return dict(sorted(results.items()))

    def _silent(self, futures, failures: list[EngineFailure], stopped: dict[int, float],
                woken: dict[int, tuple[float, float]], now: float,
                silent_s: float | None) -> dict[int, str]:
        """rank -> how it was seen, of the ranks known to be silent now (see ``run``)."""
        silent = {rank: "" for rank in silent_in(failures)}
        for f in failures:  # lost by the controller, alive here: stopped or hung, not dead
            if f.error.startswith(LOST) and self._process_status(f.rank) not in (None, "zombie"):
                silent[f.rank] = "the controller stopped hearing its engine's heartbeat"
        if silent_s is None:
            return silent
        for rank in futures:
            status = self._process_status(rank)
            if status == "stopped":
                stopped.setdefault(rank, now)
                if now - stopped[rank] >= silent_s:
                    silent[rank] = self._stopped_how(rank, now - stopped[rank])
            elif status not in (None, "zombie") and rank in stopped:
                woken[rank] = (stopped.pop(rank), now)  # running again (a killed one stays stopped)
        return silent

    def _stopped_how(self, rank: int, seconds: float, ended: bool = False) -> str:
        """How a rank whose process was seen stopped for ``seconds`` is named in the timeout."""
        e = self.engines[rank]
        return (f"engine {e['engine_id']} on {e['host']}, pid {e['pid']}: its process "
                + (f"was stopped for {seconds:.0f} s when the job ended" if ended
                   else f"has been stopped for {seconds:.0f} s"))

    def _process_status(self, rank: int) -> str | None:
        """psutil's status of the rank's engine process, where it runs on this machine."""
        import psutil

        engine = self.engines[rank]
        if rank not in self.local_ranks:
            return None
        try:
            status = psutil.Process(engine["pid"]).status()
        except psutil.Error:
            return None
        return "stopped" if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else status

    def _kill_stopped(self, ranks, running_too: bool = False) -> None:
        """SIGKILL the silent ranks' engines that are stopped here: a stopped process defers every
        other signal, so stopping the engines would wait on it to its launcher's last resort.
        ``running_too`` (the job ended): also those running again, which the launcher woke with
        SIGCONT before its SIGTERM and which may still be shutting down (seen in CI)."""
        import psutil

        killed = []
        for rank in ranks:
            status = self._process_status(rank)
            if status == "stopped" or (running_too and status not in (None, "zombie")):
                try:
                    process = psutil.Process(self.engines[rank]["pid"])
                    process.kill()
                    killed.append(process)
                except psutil.Error:
                    pass
        # gone before the ClusterTimeout says the engines were restarted: on a busy machine a
        # killed process took longer to exit than the restart took to return
        wait_gone(killed, KILLED_GONE_S)

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
        return _ended(job, _slurm_job_fields(job).get("JobState", "")) if job else None

    def unregistered_why(self, since: float = 0.0) -> str:
        """Why engines have not registered, as far as this machine can tell: the Slurm job still
        in the queue (and why), or ended; the last complaint in the engines' logs: their launchers'
        output files, or else the profile's engine logs written since ``since`` (wall-clock
        seconds: the controller's start; engines that gave up are gone from the launchers). ""
        if neither."""
        said = []
        job = self.slurm_job()
        fields = _slurm_job_fields(job) if job else {}
        reason = fields.get("Reason", "?")
        if fields.get("JobState") == "PENDING" and reason in NEVER_RUNS:
            said.append(f"the engines' Slurm job {job} is PENDING ({reason}) and will not start: it "
                        "asks for more than its partition has (nodes, tasks a node, GPUs, time); "
                        f"`scontrol show job {job}` and `sinfo` say what; `ipcluster stop` it and "
                        "start fewer engines (-n) or other limits in the profile")
        elif fields.get("JobState") == "PENDING":
            said.append(f"the engines' Slurm job {job} is still PENDING ({reason}): "
                        f"Slurm has not started it; once `squeue -j {job}` says RUNNING, run this "
                        "again, or give a longer timeout_s")
        elif fields:
            state = fields.get("JobState", "?")
            said.append(_ended(job, state) or f"the engines' Slurm job {job} is {state}")
        complaint = engine_log_complaint(getattr(es, "output_file", "") for es in
                                         (getattr(self.cluster, "engines", None) or {}).values()
                                         if getattr(es, "output_file", ""))
        if not complaint and since:
            complaint = engine_log_complaint(Path(self.cluster.profile_dir, "log").glob("ipengine-*.log"),
                                             since)
        if complaint:
            said.append(f"an engine's log says: {complaint}")
        return "; ".join(said)

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

    def slurm_job(self) -> str | None:
        """The Slurm job id of the engines (slurm-mpi), else None."""
        for engine_set in (getattr(self.cluster, "engines", None) or {}).values():
            job = getattr(engine_set, "job_id", None)  # ipyparallel's batch launchers keep it
            if job:
                return str(job)
        return None
