"""What a job on the cluster's engines can end in: the errors ``ClusterSession`` raises, and how it
reads the ranks that went silent from what the engines and the controller report."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import DownpourError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# how comm.mpi.liveness.CommTimeout names the ranks that stopped answering
# ("rank 2 on node2 went silent", "ranks 1 on a, 3 on b went silent")
SILENT = re.compile(r"\branks? ((?:\d+(?: on [^\s,]+)?)(?:, \d+(?: on [^\s,]+)?)*) went silent")


#: once a rank is known to be silent, how long the others get to report their timeouts
SILENT_REPORT_S = 2.0

# what a rank says when a peer left or stopped answering (gloo, NCCL, our mpi backend): the
# symptom of another rank's failure, not a cause
PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|went silent|Broken pipe|"
                       r"NCCL communicator was aborted")


def cause_first(failures: list[EngineFailure]) -> list[EngineFailure]:
    """``failures`` in the order they failed, but a rank's own error before the peers' reports of
    losing it: on a loaded machine the peer's report can reach the client first, since the
    failed rank tells its peers (closing its connections) before it tells the client."""
    return sorted(failures, key=lambda f: PEER_LOST.search(f.error) is not None)


@dataclass(frozen=True)
class EngineFailure:
    rank: int
    engine_id: int
    host: str
    error: str  # "RuntimeError: what went wrong"
    traceback: str

    def __str__(self) -> str:
        return f"rank {self.rank} (engine {self.engine_id} on {self.host}) failed: {self.error}\n" \
               f"{self.traceback}"


class ClusterRunError(DownpourError):
    """A job failed on one or more engines; ``failures`` holds each one's rank and traceback, in
    the order they failed, a rank's own error before its peers' reports of losing it
    (``cause_first``: the first is usually the cause)."""

    def __init__(self, what: str, failures: list[EngineFailure], stuck: list[int], restarted: bool):
        self.failures, self.stuck, self.restarted = failures, stuck, restarted
        lines = [f"{what} failed on rank(s) {', '.join(str(f.rank) for f in failures)} "
                 f"(first: rank {failures[0].rank}):"]
        lines += [str(f) for f in failures]
        if stuck:
            lines.append(f"rank(s) {', '.join(map(str, stuck))} were still waiting on the failed "
                         "rank(s)" + ("; the engines were restarted" if restarted else ""))
        super().__init__("\n".join(lines))


class ClusterPreempted(DownpourError):
    """A run on the engines stopped for a preemption signal (the engines' Slurm job is near its
    time limit, or the site preempts it), after writing its checkpoint."""


#: What a notebook does after a preemption (or the engine job's end), said by both errors.
CONTINUE = ("To continue: cluster.restart_engines() (a new engine job for slurm-mpi), then call "
            "train() with the same config: on Slurm engines it resumes from the newest checkpoint "
            "of that configuration in its checkpoint_dir (resume='auto')")


def _preempted(exc: ClusterRunError, job: str | None) -> ClusterPreempted | None:
    """The ``ClusterPreempted`` a failed run is, if its ranks stopped for a preemption signal."""
    stopped = [f for f in exc.failures if f.error.startswith("Preempted: ")]
    if not stopped:
        return None
    what = stopped[0].error.removeprefix("Preempted: ")
    where = f"the engines' Slurm job {job}" if job else "the engines"
    return ClusterPreempted(
        f"{where} got the preemption signal (its time limit is near, or the site preempts it), so "
        f"the run stopped: {what}. {CONTINUE}.")


class ClusterTimeout(DownpourError):
    """A job ran past its time limit, or a rank went silent (stopped, hung or gone) and the others
    timed out waiting for it; the engines were restarted. ``silent``: the ranks that went silent
    (empty when the job just ran too long); ``failures``: the timeouts of the ranks that waited."""

    def __init__(self, message: str, silent: list[int] = (), failures: list[EngineFailure] = ()):
        super().__init__(message)
        self.silent, self.failures = list(silent), list(failures)

    @classmethod
    def silent_rank(cls, what: str, failures: list[EngineFailure],
                    restarted: bool) -> ClusterTimeout | None:
        """The timeout to raise when every failure is a rank timing out on a silent one, or the
        silent rank itself lost by the controller; else None."""
        silent = silent_in(failures)
        if not failures or not silent or not all(
                f.rank in silent or SILENT.search(f.error) for f in failures):
            return None
        return cls.of_silent(what, {rank: "" for rank in silent}, failures, restarted)

    @classmethod
    def of_silent(cls, what: str, silent: Mapping[int, str], failures: list[EngineFailure],
                  restarted: bool) -> ClusterTimeout:
        """The timeout naming the ``silent`` ranks (rank -> how it was seen, e.g. 'its process
        stopped for 20 s'); ``failures``: what the other ranks, and the controller, reported."""
        waited = [f for f in failures if f.rank not in silent]
        seen = [f"rank {rank}: {how}" for rank, how in sorted(silent.items()) if how]
        lines = [f"{what}: rank(s) {', '.join(map(str, sorted(silent)))} went silent (stopped, "
                 "hung or gone)" + (f" ({'; '.join(seen)})" if seen else "")
                 + (f"; rank(s) {', '.join(str(f.rank) for f in waited)} timed out waiting:"
                    if waited else "")]
        lines += [f"rank {f.rank} (engine {f.engine_id} on {f.host}): {f.error}" for f in failures]
        if restarted:
            lines.append("the engines were restarted (the next call waits for them to register)")
        return cls("\n".join(lines), sorted(silent), failures)


#: how ipyparallel says the controller stopped hearing an engine's heartbeat while it ran a task
LOST = "EngineError:"


def silent_in(failures: list[EngineFailure]) -> set[int]:
    """The ranks the failures name as silent: those a waiting rank's CommTimeout names. (An engine
    the controller lost may be dead instead, e.g. with its Slurm job: ``ClusterSession`` counts it
    silent only where it sees its process alive.)"""
    silent: set[int] = set()
    for f in failures:
        found = SILENT.search(f.error)
        if found:
            silent |= {int(r.split()[0]) for r in found[1].split(", ")}
    return silent


def _clean_traceback(text: str) -> str:
    """The engine's traceback without colour codes and without ipyparallel's own frames (the
    ``do_apply`` frame and the ``<string>`` call it executes): it starts at the job's function."""
    lines = ANSI.sub("", text or "").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("File <string>:")]
    if starts:
        rest = lines[starts[0] + 1:]
        first = next((i for i, line in enumerate(rest) if line.startswith("File ")), None)
        if first is not None:
            lines = lines[:2] + rest[first:]  # keep the "----" rule and the exception header
    return "\n".join(lines)
