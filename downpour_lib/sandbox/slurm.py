"""A real Slurm (munge, slurmctld, slurmd) under a private directory, for tests and demos: one node,
or N nodes that are separate hosts on this machine.

``up`` writes a fresh munge key and a ``slurm.conf`` for this host into the sandbox directory
(NodeName = ``hostname -s``, state, spool, pid and log files all inside it, ports chosen free), starts
``munged``, ``slurmctld`` and ``slurmd`` as root with ``SLURM_CONF`` pointing at that file, and waits
until the node is idle. The plugins are the ones that work in a container without systemd or
cgroups (proctrack/linuxproc, task/none, no accounting). The node advertises at least
``slurm_conf.MIN_CPUS`` CPUs so that an ipyparallel engine job and a training step fit side by side on a
2-core machine: the sandbox oversubscribes the real cores on purpose, it tests launching, not speed.

``down`` cancels every job, stops the daemons and then kills, by process id, whatever is left of
their process trees (slurmstepd and job processes), so nothing keeps running, and removes the
directory (keeping only the next job id, in ``.<dir>.next-job-id`` beside it, so that job ids go
on). Both are idempotent.

Slurm's client commands (sbatch, srun, squeue) read ``SLURM_CONF``; so that a plain
``ipcluster start --profile=slurm-mpi`` finds the sandbox too, ``up`` links
``/etc/slurm/slurm.conf`` to the sandbox's file when no slurm.conf exists there (and ``down``
removes that link again, only if it is still ours).

With ``nodes=N`` (N > 1) every compute node is a host of its own (``netns.Network``): a network
namespace with its own address on a private bridge (``node1`` at 10.213.0.11, ``node2`` at .12, ...),
its own host name (a UTS namespace) and its own ``slurmd``; ``slurmctld`` and ``munged`` run on this
machine, reached from every node at the bridge's address 10.213.0.1 (munge's socket is a file, which
the namespaces share). Node names resolve on every node through ``/etc/netns/<namespace>/hosts``,
bound over ``/etc/hosts`` in the node's own mount namespace (as ``ip netns exec`` would); the
machine's own ``/etc/hosts`` is never edited. Each node has its own spool and ``TmpFS`` directory.
``bandwidth`` shapes every node's link in both directions (``up`` again with another rate changes it
on a running sandbox). ``down`` also removes the namespaces, links and those files.

Three modules: this one (the daemons: up, status, down), ``slurm_conf`` (the configuration it
writes) and ``status`` (what the machine needs, what a status reports).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ..checkpoint import atomic_write_bytes, atomic_write_text
from ..errors import ConfigError
from ..procs import alive, comm, descendants, environ_has, terminate
from .netns import Network, NetworkError, parse_rate
from .slurm_conf import free_port, host_name, hosts_file, slurm_conf, socket_dir
from .status import (  # noqa: F401 -- missing_requirements and pmix_available: importable here too
    SYSTEM_CONF,
    NodeStatus,
    SandboxError,
    SandboxStatus,
    missing_requirements,
    pmix_available,
)

DEFAULT_DIR = Path(os.environ.get("DOWNPOUR_SLURM_DIR", "/tmp/downpour-slurm"))
UP_TIMEOUT_S = 60.0  # how long ``up`` waits for the daemons and nodes (``downpour sandbox slurm``'s too)
DOWN_TIMEOUT_S = 15.0  # how long ``down`` waits for cancelled jobs to leave the queue (the command's too)
NETNS_ETC = Path("/etc/netns")  # ip netns exec shows /etc/netns/<ns>/<file> as /etc/<file>
READY_STATES = ("idle", "mixed", "allocated", "completing")
_JOB_ID = re.compile(r"\bJobId=(\d+)")
MAX_JOB_ID = 0x03FF0000  # Slurm's default MaxJobId


class SlurmSandbox:
    """Slurm under ``directory``, on one node or ``nodes`` emulated hosts; see the module docstring.
    ``nodes=None``: as many as the sandbox in ``directory`` was made with (one for a new one)."""

    def __init__(self, directory: str | os.PathLike = DEFAULT_DIR, link_system_conf: bool = True,
                 nodes: int | None = None):
        if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
            raise ConfigError("nodes", nodes, "give a whole number of nodes, 1 or more")
        self.dir = Path(directory).resolve()
        self.link_system_conf = link_system_conf
        self.conf = self.dir / "slurm.conf"
        self.layout = self.dir / "nodes"  # how many nodes the sandbox in this directory was made with
        # job ids go on across down and up: the one thing down leaves, one line beside the directory
        self.next_job_file = self.dir.parent / f".{self.dir.name}.next-job-id"
        self.nodes = nodes if nodes is not None else (self._made_with() or 1)
        # links and namespaces named after the directory, so that they are this sandbox's alone
        self.network = Network(hashlib.sha1(str(self.dir).encode()).hexdigest()[:5])
        self.munge_dir = self.dir / "munge"  # key, seed, pid, log: root only
        self.socket = socket_dir(self.dir) / "munge.socket"
        self.run_dir, self.log_dir = self.dir / "run", self.dir / "log"
        self.state_dir, self.spool_dir = self.dir / "state", self.dir / "spool"
        self.pidfiles = {"munged": self.munge_dir / "munged.pid",
                         "slurmctld": self.run_dir / "slurmctld.pid"}
        if self.nodes == 1:
            self.pidfiles["slurmd"] = self.run_dir / "slurmd.pid"
        else:
            self.pidfiles.update({f"slurmd {name}": self.run_dir / f"slurmd-{name}.pid"
                                  for name in self.node_names()})

    def _made_with(self) -> int | None:
        try:
            return int(self.layout.read_text())
        except (OSError, ValueError):
            return None

    def node_names(self) -> list[str]:
        """Slurm's names of the nodes (one node: this machine's host name)."""
        if self.nodes == 1:
            return [host_name()]
        return [f"node{i + 1}" for i in range(self.nodes)]

    def _etc(self, index: int) -> Path:
        """What ``ip netns exec`` shows the node's processes in /etc (its hosts file)."""
        return NETNS_ETC / self.network.node(index).namespace

    # -- environment and configuration -----------------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this sandbox."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def slurm_conf(self, ctld_port: int, slurmd_port: int, first_job_id: int = 1) -> str:
        return slurm_conf(self, ctld_port, slurmd_port, first_job_id)

    def hosts_file(self) -> str:
        """/etc/hosts as the nodes see it: every node and the controller by name."""
        return hosts_file(self)

    # -- status ----------------------------------------------------------------------------------

    def _pid(self, name: str) -> int | None:
        """The daemon's pid if it is running and is ours (not a recycled pid, not another Slurm)."""
        try:
            pid = int(self.pidfiles[name].read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not alive(pid):
            return None
        if name == "munged":
            try:
                ours = str(self.socket).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                return None
        else:
            ours = environ_has(pid, f"SLURM_CONF={self.conf}".encode())
        return pid if ours else None

    def _slurm(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def status(self) -> SandboxStatus:
        status = SandboxStatus(self.dir, self.conf, {n: self._pid(n) for n in self.pidfiles},
                               pmix=pmix_available(), system_link=self._linked())
        if status.daemons["slurmctld"] and status.daemons["munged"]:
            node = self._slurm("sinfo", "-h", "-N", "-o", "%N %T")
            status.node = node.stdout.strip() or node.stderr.strip()
            states = dict(line.split(None, 1) for line in node.stdout.splitlines() if " " in line)
            if self.nodes == 1:
                status.nodes = [NodeStatus(host_name(), "127.0.0.1", states.get(host_name(), ""))]
            else:
                # a node whose slurmd is gone is down, whatever the controller has noticed yet
                status.nodes = [NodeStatus(name, self.network.node(i).address,
                                           states.get(name, "") if status.daemons[f"slurmd {name}"]
                                           else "down (slurmd not running)",
                                           self.network.shaping(self.network.node(i)),
                                           self.network.tcp(self.network.node(i)))
                                for i, name in enumerate(self.node_names())]
            jobs = self._slurm("squeue", "-h", "-o", "%i %j %T %M")
            status.jobs = [j.strip() for j in jobs.stdout.splitlines() if j.strip()]
        return status

    def _linked(self) -> bool:
        return SYSTEM_CONF.is_symlink() and os.readlink(SYSTEM_CONF) == str(self.conf)

    # -- up --------------------------------------------------------------------------------------

    def up(self, timeout_s: float = UP_TIMEOUT_S, bandwidth: str | None = None) -> SandboxStatus:
        """Start the sandbox and wait until every node is idle; a running one is left running (and
        only re-shaped when ``bandwidth`` is given: e.g. ``100mbit``, ``none`` for unshaped)."""
        missing = missing_requirements()
        if missing:
            raise SandboxError("the Slurm sandbox needs " + "; ".join(missing))
        if bandwidth is not None:
            if self.nodes == 1:
                raise ConfigError("bandwidth", bandwidth, "a one-node sandbox has no link between "
                                  "nodes to shape; make one of 2 or more nodes (--nodes 2)")
            if bandwidth != "none":
                parse_rate(bandwidth)
        made = self._made_with()
        if made and made != self.nodes and SlurmSandbox(self.dir, nodes=made).status().running:
            raise SandboxError(f"the sandbox in {self.dir} runs {made} node(s), not {self.nodes}: "
                               "`downpour sandbox slurm down` first, then up with the new count")
        status = self.status()
        if not status.running and self._restartable(status):  # a node's slurmd died: just that
            restarted = [name for name in self.node_names() if not status.daemons[f"slurmd {name}"]]
            for name in restarted:
                self._start_slurmd(self.node_names().index(name), name, timeout_s)
            # what ran there died with it: down and back, so that its jobs finish completing
            nodes = f"NodeName={','.join(restarted)}"
            self._slurm("scontrol", "update", nodes, "State=DOWN", "Reason=slurmd restarted")
            self._slurm("scontrol", "update", nodes, "State=RESUME")
            self._wait_for_node(timeout_s)
            status = self.status()
        if status.running:
            # a node the controller gave up on (its link was cut, its slurmd restarted): back
            down = [n.name for n in status.nodes if n.state.startswith(("down", "drain", "fail"))]
            if down:
                self._slurm("scontrol", "update", f"NodeName={','.join(down)}", "State=RESUME")
                self._wait_for_node(timeout_s)
                status = self.status()
            if bandwidth is not None:
                self._network(lambda: self.network.shape(bandwidth))
                status = self.status()
            return status
        self.down()  # whatever a half-started sandbox left behind
        if self.nodes > 1:
            self._network(lambda: self.network.up(self.nodes))
        self._prepare()
        self._start(["munged", f"--socket={self.socket}", f"--key-file={self.munge_dir / 'munge.key'}",
                     f"--pid-file={self.pidfiles['munged']}", f"--log-file={self.munge_dir / 'munged.log'}",
                     f"--seed-file={self.munge_dir / 'munged.seed'}"], "munged", timeout_s)
        self._start(["slurmctld"], "slurmctld", timeout_s)
        if self.nodes == 1:
            self._start(["slurmd"], "slurmd", timeout_s)
        for index, name in enumerate(self.node_names() if self.nodes > 1 else []):
            self._start_slurmd(index, name, timeout_s)
        self._wait_for_node(timeout_s)
        if bandwidth not in (None, "none"):
            self._network(lambda: self.network.shape(bandwidth))
        if self.link_system_conf and not os.path.lexists(SYSTEM_CONF):
            SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
            SYSTEM_CONF.symlink_to(self.conf)
        return self.status()

    def _start_slurmd(self, index: int, name: str, timeout_s: float) -> None:
        """A node's slurmd in its own network, host name and /etc/hosts (not `ip netns exec`, whose
        fresh /sys hides the cgroup file system slurmd insists on)."""
        node = self.network.node(index)
        self._start(["nsenter", f"--net=/var/run/netns/{node.namespace}", "unshare", "--mount",
                     "--uts", "sh", "-c", f"mount --bind {self._etc(index) / 'hosts'} /etc/hosts && "
                     f"hostname {name} && exec slurmd -N {name}"], f"slurmd {name}", timeout_s)

    def _restartable(self, status: SandboxStatus) -> bool:
        """Several nodes, the controller and munge up, every node's namespace there: only slurmds
        are missing."""
        return (self.nodes > 1 and bool(status.daemons["munged"]) and bool(status.daemons["slurmctld"])
                and len(self.network.nodes()) == self.nodes)

    def _network(self, step) -> None:
        try:
            step()
        except NetworkError as exc:
            self.down()
            raise SandboxError(f"{self.nodes} nodes need separate hosts on this machine: {exc}") from None

    def _prepare(self) -> None:
        for path in (self.dir, self.socket.parent):
            if path.exists() and path.stat().st_uid != os.geteuid():
                raise SandboxError(f"{path} belongs to another user; choose another --dir")
        first_job_id = self._next_job_id()
        for path in (self.state_dir, self.spool_dir):  # a fresh cluster: no stale nodes or jobs
            shutil.rmtree(path, ignore_errors=True)
        # munged refuses a socket whose directories are not traversable by all, and a key that is
        for path, mode in ((self.dir, 0o755), (self.socket.parent, 0o755), (self.munge_dir, 0o700),
                           (self.run_dir, 0o755), (self.log_dir, 0o755), (self.state_dir, 0o700),
                           (self.spool_dir, 0o755)):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
        key = self.munge_dir / "munge.key"
        if key.exists():
            key.chmod(0o600)
        atomic_write_bytes(key, secrets.token_bytes(1024))
        key.chmod(0o400)
        atomic_write_text(self.conf, self.slurm_conf(free_port(), free_port(), first_job_id))
        atomic_write_text(self.layout, f"{self.nodes}\n")
        if self.nodes > 1 and not NETNS_ETC.exists():
            (self.dir / "made-etc-netns").touch()  # so that down removes it again
        for index, name in enumerate(self.node_names() if self.nodes > 1 else []):
            # spool and TmpFS (srun --mpi=pmix's per-step directories) of its own, as on a cluster
            (self.spool_dir / name).mkdir(mode=0o755)
            tmp = self.dir / "tmp" / name
            tmp.mkdir(parents=True, exist_ok=True)
            tmp.chmod(0o1777)
            self._etc(index).mkdir(parents=True, exist_ok=True)
            atomic_write_text(self._etc(index) / "hosts", self.hosts_file())

    def _next_job_id(self) -> int:
        """The id after the last one this directory's sandboxes gave: as ``down`` saved it, or as
        the controller's log shows it (a sandbox that was never taken down)."""
        ids = [1]
        try:
            ids.append(int(self.next_job_file.read_text()))
        except (OSError, ValueError):
            pass
        try:
            with open(self.log_dir / "slurmctld.log", errors="replace") as log:
                ids += [int(m) + 1 for line in log for m in _JOB_ID.findall(line)
                        if int(m) < MAX_JOB_ID]  # not Slurm's NO_VAL ids
        except OSError:
            pass
        return max(ids)

    def _save_next_job_id(self) -> None:
        """What the running controller will give next, for the next ``up`` (its state goes)."""
        out = self._slurm("scontrol", "show", "config").stdout
        found = re.search(r"^NEXT_JOB_ID\s*=\s*(\d+)", out, re.MULTILINE)
        if found:
            atomic_write_text(self.next_job_file, f"{max(int(found[1]), self._next_job_id())}\n")

    def _start(self, cmd: list[str], name: str, timeout_s: float) -> None:
        """Run a daemon (it forks into the background) and wait for its pid file."""
        err = self.log_dir / f"{name}.stderr"
        with open(err, "w") as stderr:
            proc = subprocess.run(cmd, env=self.env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=stderr, timeout=timeout_s,
                                  start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while proc.returncode == 0 and time.monotonic() < deadline:
            if self._pid(name):
                return
            time.sleep(0.1)
        self._fail(f"{name} did not start (exit {proc.returncode})")

    def _wait_for_node(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            out = self._slurm("sinfo", "-h", "-N", "-o", "%T")
            state = out.stdout.strip()
            states = state.split()
            if out.returncode == 0 and len(states) == self.nodes and set(states) <= set(READY_STATES):
                return
            time.sleep(0.3)
        self._fail(f"the nodes did not become idle within {timeout_s:.0f} s (state {state!r})")

    def _fail(self, message: str) -> None:
        tails = []
        for log in (self.munge_dir / "munged.log", self.log_dir / "slurmctld.log",
                    *sorted(self.log_dir.glob("slurmd*.log")), *sorted(self.log_dir.glob("*.stderr"))):
            if log.exists() and log.stat().st_size:
                tails.append(f"--- {log}\n" + "\n".join(log.read_text().splitlines()[-8:]))
        self.down()
        raise SandboxError(message + "\n" + "\n".join(tails))

    # -- down ------------------------------------------------------------------------------------

    def down(self, timeout_s: float = DOWN_TIMEOUT_S) -> SandboxStatus:
        """Cancel every job, stop the daemons, kill what is left of their process trees."""
        if self._pid("slurmctld"):
            self._save_next_job_id()
            jobs = self._slurm("squeue", "-h", "-o", "%i").stdout.split()
            if jobs:
                self._slurm("scancel", *jobs)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline and self._slurm("squeue", "-h").stdout.strip():
                    time.sleep(0.2)
        marker = f"SLURM_CONF={self.conf}".encode()
        # slurmd, slurmctld and every slurmstepd they started carry our SLURM_CONF; job processes
        # descend from a slurmstepd. Collect the trees before anything exits and re-parents.
        roots = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                 if environ_has(pid, marker) and comm(pid) in ("slurmd", "slurmctld", "slurmstepd")]
        tree = descendants(roots)
        terminate([p for p in roots if comm(p) in ("slurmd", "slurmctld")], timeout_s)
        terminate(tree, 2.0)
        munged = self._pid("munged")
        if munged:
            terminate([munged], timeout_s)
        shutil.rmtree(self.socket.parent, ignore_errors=True)  # inside the directory (the
        # default, whose removal below needs it gone) or beside it (a long --dir's short path)
        if self._linked():
            SYSTEM_CONF.unlink()
        self._remove_network()
        self._remove_files()
        return self.status()

    def _remove_files(self) -> None:
        """What ``up`` made in the sandbox's directory, then the directory if nothing else is
        there (a --dir that held the user's own files keeps them). The next job id stays, beside
        it, also after a crash (no controller to ask: its log tells)."""
        next_id = self._next_job_id()
        if next_id > 1:
            atomic_write_text(self.next_job_file, f"{next_id}\n")
        for path in (self.munge_dir, self.run_dir, self.log_dir, self.state_dir, self.spool_dir,
                     self.dir / "tmp"):
            shutil.rmtree(path, ignore_errors=True)
        for path in (self.conf, self.layout, self.dir / "made-etc-netns"):
            path.unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:  # missing, or holding what is not ours
            pass

    def _remove_network(self) -> None:
        """The namespaces, links and hosts files of the nodes, whatever node count made them."""
        made = [p for p in NETNS_ETC.glob(f"{self.network.node(0).namespace[:-1]}*")
                if p.name.removeprefix(self.network.node(0).namespace[:-1]).isdigit()]
        if shutil.which("ip") is None:
            return  # nothing can have been made
        try:
            if self.network.nodes() or self.network.exists():
                self.network.down()
        except NetworkError as exc:
            raise SandboxError(f"could not remove the nodes' network: {exc}") from None
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        marker = self.dir / "made-etc-netns"
        if marker.exists():
            try:
                NETNS_ETC.rmdir()  # only if no one else put anything there since
            except OSError:
                pass
            marker.unlink()
