"""The processes a cluster's controller started, and how to end them.

A controller stopped while it is still starting its schedulers leaves them running, orphans: seven
processes each time ``sbatch`` failed in under two seconds. Whoever stops a cluster after a failed
start (``start.start_cluster``, the slurm-mpi launcher under ``ipcluster``) collects the tree first
and ends what outlives the stop.
"""

from __future__ import annotations


def controller_processes(cluster) -> list:
    """The controller's process and those it started (its schedulers, hub); none if it has none."""
    import psutil

    pid = getattr(cluster.controller, "pid", None) if cluster.controller is not None else None
    try:
        parent = psutil.Process(pid) if pid else None
        return [parent, *parent.children(recursive=True)] if parent else []
    except psutil.Error:
        return []


def end_processes(processes: list, timeout_s: float = 10.0) -> None:
    """Terminate each of ``processes`` still running, and kill what outlives ``timeout_s``."""
    import psutil

    alive = [p for p in processes if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(alive, timeout=timeout_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
