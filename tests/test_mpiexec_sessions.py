"""A killed Open MPI launcher must not break a later one that gets its pid.

prterun keeps its session in $TMPDIR/ompi.<pid>/ and leaves it behind when killed with SIGKILL; a
later prterun with the same pid then dies before any rank runs ("The PMIx server's listener thread
failed to start"). Our launches clear such leftovers first (``clear_stale_sessions``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import explain, launch_env, mpiexec_path

from downpour_lib.cluster.mpiexec import clear_stale_sessions, run_mpiexec


def test_only_sessions_whose_launcher_is_gone_are_cleared(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live, later = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                   for _ in range(2))
    try:
        time.sleep(0.2)
        for pid in (dead.pid, live.pid, later.pid):
            (tmp_path / f"ompi.{pid}" / "0").mkdir(parents=True)
        # a running process's pid, but a directory made an hour before it started: a reused pid
        reused = tmp_path / f"ompi.{later.pid}"
        os.utime(reused, (time.time() - 3600, time.time() - 3600))
        (tmp_path / "ompi.notapid").mkdir()
        removed = clear_stale_sessions(tmp_path)
    finally:
        for proc in (live, later):
            proc.kill()
            proc.wait()
    assert sorted(removed) == sorted([tmp_path / f"ompi.{dead.pid}", reused])
    assert (tmp_path / f"ompi.{live.pid}").is_dir()
    assert (tmp_path / "ompi.notapid").is_dir()


def next_pid_is(pid: int) -> None:
    """The next process started gets ``pid``, unless another process is started first (root only)."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as knob:
        knob.write(str(pid - 1))


def leave_a_session(env: dict) -> tuple[int, str]:
    """Start mpiexec, SIGKILL it once its session is there; its pid and the session it left."""
    killed = subprocess.Popen([mpiexec_path(), "-n", "1", "sleep", "60"], env=env)
    session = f"{os.environ.get('TMPDIR', '/tmp')}/ompi.{killed.pid}"
    try:
        deadline = time.monotonic() + 60
        while not os.path.isdir(session):
            assert time.monotonic() < deadline and killed.poll() is None, "mpiexec never started"
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        killed.kill()
        killed.wait()
        subprocess.run(["pkill", "-f", "^sleep 60$"])
    assert os.path.isdir(session), "prterun cleaned up after SIGKILL: nothing left to test"
    return killed.pid, session


@pytest.mark.skipif(os.geteuid() != 0, reason="choosing a process's pid needs root")
def test_a_launcher_killed_with_sigkill_does_not_break_the_next_one_with_its_pid():
    env = launch_env()
    # the failure as Open MPI gives it ...
    pid, _ = leave_a_session(env)
    for _ in range(20):
        next_pid_is(pid)
        proc = subprocess.run([mpiexec_path(), "-n", "1", sys.executable, "-c",
                               "import os; print(os.getppid())"], env=env, capture_output=True, text=True,
                              timeout=120)
        if "listener thread failed to start" in proc.stderr or proc.stdout.strip() == str(pid):
            break
    else:
        pytest.skip(f"pid {pid} was always taken by another process")
    assert proc.returncode != 0 and "listener thread failed to start" in proc.stderr, explain(proc)
    # ... and a launch of ours, which clears what is left of launchers that are gone first
    pid, session = leave_a_session(env)
    for _ in range(20):
        next_pid_is(pid)
        proc = run_mpiexec([mpiexec_path(), "-n", "2", "--oversubscribe", sys.executable, "-c",
                            "import os; print('parent', os.getppid())"],
                           env=env, capture_output=True, text=True, timeout_s=120)
        assert proc.returncode == 0 and proc.stdout.count("parent") == 2, explain(proc)
        if f"parent {pid}" in proc.stdout:
            break
    else:
        pytest.skip(f"pid {pid} was always taken by another process")
    assert not os.path.exists(session)


def test_a_timed_out_launch_is_stopped_with_sigterm_and_leaves_no_session(tmp_path):
    # a TMPDIR of its own: the session directory is made there, and another test's launch (make
    # test's other workers) cannot be taken for a leftover of this one
    env = {**launch_env(), "TMPDIR": str(tmp_path)}
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run_mpiexec([mpiexec_path(), "-n", "2", "--oversubscribe", sys.executable, "-c",
                     "import sys, time; print('rank up', file=sys.stderr, flush=True); time.sleep(120)"],
                    env=env, capture_output=True, text=True, timeout_s=5)
    left = {n for n in os.listdir(tmp_path) if n.startswith("ompi.")}
    assert not left, f"the stopped launcher left {left}"
    # the report says what was still running and where the output stood
    notes = "\n".join(expired.value.__notes__)
    assert notes.count("python") == 2 and "prterun" in notes, notes
    assert "--- stderr (end)\nrank up\nrank up" in notes, notes


# Rank 1 fails (once rank 0 is ready); the launcher reports it and sends the others SIGTERM, on
# which rank 0 stops the launcher (SIGSTOP) and leaves: the launcher is left, its report printed,
# with no process of its job, as Open MPI's sometimes leaves itself after a rank exits non-zero.
_STOPS_ITS_LAUNCHER = """
import os, signal, sys, tempfile, time
ready = os.path.join(tempfile.gettempdir(), "rank0-ready")
def stop_the_launcher(*_):
    os.kill(os.getppid(), signal.SIGSTOP)
    os._exit(0)
if os.environ["OMPI_COMM_WORLD_RANK"] == "0":
    signal.signal(signal.SIGTERM, stop_the_launcher)
    open(ready, "w").close()
    time.sleep(120)
while not os.path.exists(ready):
    time.sleep(0.01)
sys.exit(3)
"""


def test_a_launcher_that_outlives_its_job_is_stopped_and_its_reported_exit_code_returned(tmp_path):
    env = {**launch_env(), "TMPDIR": str(tmp_path)}
    proc = run_mpiexec([mpiexec_path(), "-n", "2", "--oversubscribe", sys.executable, "-c",
                        _STOPS_ITS_LAUNCHER], env=env, capture_output=True, text=True,
                       timeout_s=100, linger_s=3)  # without the watch: TimeoutExpired at 100 s
    assert proc.returncode == 3, explain(proc)
    assert proc.stderr.count("Exit code:") == 1, explain(proc)
    assert proc.stderr.endswith("was still running 3 s after the last process of its job ended; "
                                "stopped it (its report's exit code: 3)\n"), explain(proc)
    left = {n for n in os.listdir(tmp_path) if n.startswith("ompi.")}
    assert not left, f"the stopped launcher left {left}"
