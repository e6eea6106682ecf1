"""The processes a cluster's controller started.

A controller stopped while it is still starting its schedulers leaves them running, orphans: seven
processes each time ``sbatch`` failed in under two seconds, and a tree read before the stop missed
one forked after it. ipyparallel starts the controller in a session of its own
(``start_new_session``), which every process it starts joins: whoever stops a cluster after a failed
start (``start.start_cluster``, the slurm-mpi launcher under ``ipcluster``) notes the session
first and ends what is still in it after the stop.
"""

from __future__ import annotations

from ..procs import in_session, terminate


def controller_session(cluster) -> int | None:
    """The session of the cluster's controller (its process id), None if it has none."""
    return getattr(cluster.controller, "pid", None) if cluster.controller is not None else None


def end_session(sid: int | None, timeout_s: float = 10.0) -> None:
    """TERM, then KILL, whatever is left in session ``sid`` once its leader was stopped."""
    if sid:
        terminate(in_session(sid), timeout_s)
