"""Start, connect to, find and stop a profile's ipyparallel clusters (see ``session``).

``use_cluster(profile, n)`` is what a notebook calls: the profile's running cluster (``ipcluster
start --profile=NAME``), checked to have the engines asked for, or else one it starts, which only
it stops. Under it, ``start_cluster(profile, n)`` starts a controller and ``n`` engines with the
profile's launcher and refuses while the profile already runs a cluster; ``connect(profile)``
attaches to one that ``ipcluster start --profile=NAME`` (or another session) runs. All three
return a ``ClusterSession``.
"""

from __future__ import annotations

import logging
import random
import socket
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from ..defaults import ENGINES_TIMEOUT_S
from ..errors import ClusterError, ConfigError, closest
from ..launch_env import RENDEZVOUS_PORTS
from .mpiexec import clear_stale_sessions
from .processes import controller_session, end_session
from .profiles import bundled_profiles, ensure_profile, profile_dir
from .session import ClusterSession, stop_command


class _GoneProcesses(logging.Filter):
    """Drops ipyparallel's ERROR for each process of a cluster file that is gone, which it logs as
    it loads the file (and then forgets the file): housekeeping, not a failure of the cluster in
    use. In a notebook it went to the kernel's log, above the cell's own output or error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return " not running: " not in record.getMessage()


#: the log of the cluster files' scans (running_clusters, stop_clusters): as a library's, it
#: prints nothing unless the user's logging shows it (ipyparallel's own defaulted to the kernel's)
_FILES_LOG = logging.getLogger(__name__ + ".files")
_FILES_LOG.addFilter(_GoneProcesses())
_FILES_LOG.addHandler(logging.NullHandler())


def _cluster_files(profile: str, ipython: str | None = None) -> dict:
    import ipyparallel as ipp

    return ipp.ClusterManager(log=_FILES_LOG).load_clusters(
        profile_dirs=[str(profile_dir(profile, ipython))])


def running_clusters(profile: str, ipython: str | None = None) -> list:
    """The ipyparallel clusters of the profile whose controller is alive (from the cluster files in
    the profile's security directory; loading them removes the files of clusters long gone)."""
    clusters = _cluster_files(profile, ipython)
    for cluster in clusters.values():
        # a look, not a takeover: these copies watch the processes too, and must never rewrite
        # the owner's cluster file when one of them stops
        cluster.cluster_file = ""
    return [c for c in clusters.values() if c.controller is not None and c.controller.running]


def engine_count(cluster) -> int:
    """How many engines a running ipyparallel cluster's launchers started (its cluster file's)."""
    return sum(es.n or 0 for es in cluster.engines.values())


def _already_running(profile: str, clusters: list, who: str = "start_cluster") -> str:
    lines = [f"profile {profile!r} already runs {len(clusters)} cluster(s); {who} does not "
             "start another beside it, whose engines would compete with its engines:"]
    for c in clusters:
        engines = engine_count(c)
        pid = getattr(getattr(c.controller, "process", None), "pid", "?")
        cid = f", cluster_id={c.cluster_id!r}" if c.cluster_id else ""
        lines.append(f"- cluster id {c.cluster_id!r} ({engines} engines, controller pid {pid}): "
                     f"use it with connect({profile!r}{cid}), or stop it with "
                     f"`{stop_command(c, profile)}` (or cluster.stop() on the session that started it)")
    if len(clusters) > 1:
        lines.append(f"`ipcluster stop --profile={profile} --all` stops them all")
    return "\n".join(lines)


def controller_ports(count: int = 40, floor: int = 10000) -> str | None:
    """A range of ``count`` free ports below the kernel's ephemeral range, for the controller
    (``ipcontroller --ports A-B``), or None where that range leaves no room. ipyparallel picks its
    ports by binding port 0 and closing the socket, and a device process binds each later: on a
    busy machine an outgoing connection can take one in between, that queue dies ("Address
    already in use" in the controller's output), and the engines register but never answer.
    Below the ephemeral range no outgoing connection takes a port; below the ports srun steps'
    stores listen on (``launch_env.RENDEZVOUS_PORTS``), no step of a job on this node does."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    low = min(low, RENDEZVOUS_PORTS.start)

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                return False
            return True

    if low - floor <= count:
        return None
    for _ in range(20):  # at random: controllers started side by side (tests) take other ranges
        start = random.randrange(floor, low - count)
        if all(free(p) for p in range(start, start + count)):
            return f"{start}-{start + count - 1}"
    return None


def start_cluster(profile: str = "local-mpi", n: int = 2, *, engine_env: Mapping[str, str] = (),
                  engines_per_node: int = 0, timeout_s: float = ENGINES_TIMEOUT_S, activate: bool = True,
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

    from ..notebooks import show_errors_in_one_line

    show_errors_in_one_line()  # the first helper a notebook calls, often
    if n < 1:
        raise ConfigError("n", n, "start at least 1 engine")
    ensure_profile(profile)
    clear_stale_sessions()
    running = running_clusters(profile)
    if running:
        raise ClusterError(_already_running(profile, running))
    cluster_kwargs.setdefault("log_level", logging.WARNING)  # ipyparallel's INFO lines drown a notebook
    ports = controller_ports()
    if ports and "controller_args" not in cluster_kwargs:
        cluster_kwargs["controller_args"] = [f"--ports={ports}"]
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
    session = controller_session(cluster)
    try:
        cluster.stop_cluster_sync()
    except Exception as stop_exc:  # noqa: BLE001 -- exc is the error the caller must see
        logging.getLogger(__name__).warning("stopping the cluster after its failed start (%s) "
                                            "failed too: %s", exc, stop_exc)
    end_session(session)


def connect(profile: str = "local-mpi", cluster_id: str = "", *, n: int | None = None,
            timeout_s: float = ENGINES_TIMEOUT_S, activate: bool = True) -> ClusterSession:
    """Attach to the cluster that ``ipcluster start --profile=NAME`` runs, waiting for its engines
    (a Slurm job may sit in the queue for a while: raise ``timeout_s``)."""
    import ipyparallel as ipp

    try:
        cluster = ipp.Cluster.from_file(profile_dir=str(profile_dir(profile)), cluster_id=cluster_id)
    except FileNotFoundError:
        available = bundled_profiles()
        if profile not in available and not (profile_dir(profile) / "ipcluster_config.py").exists():
            # `ipcluster start --profile=slurm` would make a profile of local, non-MPI engines
            meant = closest(profile, available)
            raise ClusterError(f"no profile {profile!r}: " + (f"did you mean {meant!r}? " if meant
                               else "") + "the bundled ones are " + ", ".join(available)
                               + " (`downpour profiles list`)") from None
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
    stopped = 0
    for cluster in _cluster_files(profile, ipython).values():
        cluster.stop_cluster_sync()
        stopped += 1
    return stopped


def use_cluster(profile: str = "local-mpi", n: int = 2, *, at_least: bool = False,
                engines_per_node: int = 0, timeout_s: float = ENGINES_TIMEOUT_S, activate: bool = True,
                purpose: str = "", log: Callable[[str], None] | None = print,
                **start_kwargs) -> ClusterSession:
    """The cluster a notebook (or a study) works on: the one the profile runs, if it runs one
    (``ipcluster start --profile=NAME -n N --daemonize``, or an earlier session), else a cluster of
    ``n`` engines started here (``start_cluster``). ``cluster.stop()``, or the end of a ``with``
    block, stops only a cluster started here; a running one is left running for the next notebook.

    A running cluster must have ``n`` engines (``at_least``: ``n`` or more, as a study whose runs
    take what they need), and with ``engines_per_node`` that many on each host: otherwise
    ``ConfigError`` says how many it has and what to change, before any engine works. ``log``
    (None: quiet) says which it did, with ``purpose`` after it (e.g. " for 3 run(s)")."""
    from ..notebooks import show_errors_in_one_line

    show_errors_in_one_line()  # the first helper a notebook calls
    say = log or (lambda _line: None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("engines", n, "ask for a whole number of engines, 1 or more")
    ensure_profile(profile)
    running = running_clusters(profile)
    if len(running) > 1:
        raise ClusterError(_already_running(profile, running, "use_cluster"))
    if not running:
        say(f"starting a {profile} cluster of {n} engine{'s' if n > 1 else ''}{purpose} (none runs; "
            "stop() stops it)")
        return start_cluster(profile, n, engines_per_node=engines_per_node, timeout_s=timeout_s,
                             activate=activate, **start_kwargs)
    found = running[0]
    has, cid = engine_count(found), found.cluster_id
    if has < n or (has > n and not at_least):
        fewer = f"ask for {has}" + (" or fewer" if at_least else "")
        raise ConfigError("engines", n, f"profile {profile!r} runs a cluster of {has} engines "
                          f"(cluster id {cid!r}), which this uses rather than start another "
                          f"beside it: {fewer} (engines={has}), or stop it "
                          f"(`{stop_command(found, profile)}`) and run again to start {n}, or "
                          f"start it with "
                          f"`ipcluster start --profile={profile} -n {n} --daemonize`")
    session = connect(profile, cid, n=has, timeout_s=timeout_s, activate=False)
    per_host = Counter(e["host"] for e in session.engines.values())
    if engines_per_node and set(per_host.values()) != {engines_per_node}:
        session.stop()  # not ours: a disconnect
        placed = ", ".join(f"{count} on {host}" for host, count in sorted(per_host.items()))
        raise ConfigError("engines_per_node", engines_per_node,
                          f"the running {profile} cluster (id {cid!r}) has {placed}: use "
                          f"engines_per_node=0 (as it is placed), or restart it with that many "
                          f"on each node")
    if activate:
        session.activate()
    say(f"using the running {profile} cluster (id {cid!r}, {has} engines){purpose}; stop() "
        "leaves it running")
    return session
