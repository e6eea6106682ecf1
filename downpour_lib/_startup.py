"""A deadline for the start-up of ``downpour train``: MPI's initialization and the rendezvous.

Until the process group exists, nothing of ours has a deadline: a rank stopped before MPI's
initialization left the others inside ``MPI_Init_thread`` (reached from ``import mpi4py.MPI``)
for ever, and one stopped during the rendezvous left them spinning in its first collectives. No
thread of the waiting process can help: ``MPI_Init_thread`` holds the GIL. So at its first line
(``_early``, while it is still one thread) a rank forks a **sentinel**, a small process that only
reads a pipe. The rank tells it where it waits (``waiting``: "MPI init", "the rendezvous") and
for how long (``--startup-timeout-s``, apart from the group's ``--timeout-s``), and that start-up
is over (``done``: the process group exists; from there the backends' own deadlines hold). A wait
past its deadline makes the sentinel write the one line
``downpour: rank R of N failed: start-up: ...`` and kill its rank, which makes the launcher end the
job (mpiexec ends every rank once one exits abnormally; a stopped one too).

The line names the rank that never arrived where that can be known: each rank records its phase
and process id in a marker file in a directory of the job on this node, so a waiting rank's
sentinel sees which ranks of its node have not reached its phase and which are stopped (SIGSTOP,
``T`` in /proc) or gone. A sentinel whose own rank is the stopped one says nothing, and the
sentinels of the waiting ranks speak in rank order, so the job prints one line, not one per rank.
Stdlib only: it runs before the rest of the library is imported.
"""

from __future__ import annotations

import os
import re
import select
import signal
import tempfile
import time

PHASES = ("start-up", "MPI init", "the rendezvous")
_STAGGER_S = 0.5  # how much later than rank r's sentinel rank r+1's speaks (the first ends the job)
_sentinel: dict = {}  # "pid", "pipe" of this rank's sentinel, while start-up lasts


def _env_rank() -> int | None:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _marker_dir() -> str | None:
    """This job's directory of markers on this node (None: the launcher names no job)."""
    env = os.environ
    job = env.get("PMIX_NAMESPACE") or (
        f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}" if "SLURM_JOB_ID" in env else
        env.get("TORCHELASTIC_RUN_ID"))
    if not job:
        return None
    return os.path.join(tempfile.gettempdir(),
                        f"downpour-start-{os.getuid()}-{re.sub(r'[^A-Za-z0-9_.-]', '_', job)}")


def _mark(phase: str) -> None:
    """Record that this rank reached ``phase`` (atomically: a reader never sees half a line)."""
    where, rank = _marker_dir(), _env_rank()
    if where is None or rank is None:
        return
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        tmp = os.path.join(where, f".{rank}.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(f"{PHASES.index(phase)} {os.getpid()}\n")
        os.replace(tmp, os.path.join(where, str(rank)))
    except OSError:
        pass  # the markers only improve the message


def start() -> None:
    """At the first line of ``downpour train``: mark the start and fork the sentinel."""
    if _sentinel or _env_rank() is None:
        return
    _mark("start-up")
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        try:
            _watch(read, parent)
            _unmark(parent)  # the rank is gone or started: its marker goes (a killed job's too)
        finally:
            os._exit(0)
    os.close(read)
    _sentinel.update(pid=pid, pipe=write)


def _tell(line: str) -> None:
    try:
        os.write(_sentinel["pipe"], line.encode() + b"\n")
    except OSError:  # the sentinel is gone: start-up goes on without its deadline
        pass


def waiting(phase: str, timeout_s: float, rank: int, size: int) -> None:
    """This rank now waits at ``phase`` for at most ``timeout_s``."""
    if not _sentinel:
        return
    _mark(phase)
    _tell(f"wait\t{phase}\t{timeout_s}\t{rank}\t{size}")


def done() -> None:
    """Start-up is over (the process group exists): the sentinel leaves, the marker goes."""
    if not _sentinel:
        return
    _tell("done")
    os.close(_sentinel["pipe"])
    try:
        os.waitpid(_sentinel["pid"], 0)
    except ChildProcessError:
        pass
    _sentinel.clear()


def _unmark(pid: int) -> None:
    """Remove the marker of the rank whose process is ``pid``, and the directory after the last."""
    where, rank = _marker_dir(), _env_rank()
    if where is None or rank is None:
        return
    path = os.path.join(where, str(rank))
    try:
        with open(path) as f:
            if int(f.read().split()[1]) == pid:
                os.unlink(path)
        os.rmdir(where)  # the last rank out removes it
    except (OSError, ValueError, IndexError):
        pass


# -- the sentinel process --------------------------------------------------------------------------
def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``T``: stopped), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X") else state


def _watch(pipe: int, parent: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # the job's signals are for the rank, not for this
    wait = None  # (phase, timeout_s, rank, size, since)
    pending = b""
    while True:
        ready, _, _ = select.select([pipe], [], [], 0.2)
        if ready:
            data = os.read(pipe, 4096)
            if not data:
                return  # the rank is gone
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                fields = line.decode().split("\t")
                if fields[0] == "done":
                    return
                phase, timeout_s, rank, size = fields[1:]
                wait = (phase, float(timeout_s), int(rank), int(size), time.monotonic())
        if os.getppid() != parent:
            return
        if wait is None:
            continue
        phase, timeout_s, rank, size, since = wait
        waited = time.monotonic() - since
        if waited < timeout_s + _STAGGER_S * min(rank, 8):
            continue
        if _state(parent) == "T":  # this rank is the stopped one: the others speak
            wait = wait[:4] + (time.monotonic(),)
            continue
        line = (f"downpour: rank {rank} of {size} failed: start-up: waited {waited:.0f} s in "
                f"{phase} (--startup-timeout-s {timeout_s:g}): {_missing(phase, rank, size)}; "
                "ending the job")
        os.write(2, line.encode() + b"\n")
        os.kill(parent, signal.SIGKILL)
        return


def _missing(phase: str, me: int, size: int) -> str:
    """Which ranks of this node have not reached ``phase``, or are stopped or gone."""
    where = _marker_dir()
    seen: dict[int, tuple[int, int]] = {}  # rank -> (phase index, pid)
    if where is not None:
        for name in os.listdir(where) if os.path.isdir(where) else ():
            try:
                with open(os.path.join(where, name)) as f:
                    index, pid = map(int, f.read().split())
                seen[int(name)] = (index, pid)
            except (OSError, ValueError):
                continue
    mine = PHASES.index(phase)
    notes = []
    for rank, (index, pid) in sorted(seen.items()):
        if rank == me:
            continue
        state = _state(pid)
        how = {"T": "stopped", None: "gone"}.get(state, "")
        if index < mine:
            notes.append(f"rank {rank} never reached {phase} (it is {how} in {PHASES[index]})"
                         if how else f"rank {rank} never reached {phase} (it is still in "
                         f"{PHASES[index]}: slower than the deadline allows? raise "
                         "--startup-timeout-s)")
        elif how:
            notes.append(f"rank {rank} is {how} (in {PHASES[index]})")
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE")
    everyone_here = local is not None and local.isdigit() and int(local) == size
    if everyone_here:
        notes += [f"rank {r} never started" for r in range(size) if r != me and r not in seen]
    if notes:
        return "; ".join(notes)
    if where is None:
        return "the launcher names no job, so which rank did not arrive is not known here"
    return ("every rank of this node arrived and none is stopped: a rank " +
            ("is hung, or slower than the deadline allows (raise --startup-timeout-s)"
             if everyone_here else "of another node did not arrive, or is slower than the "
             "deadline allows (raise --startup-timeout-s)"))
