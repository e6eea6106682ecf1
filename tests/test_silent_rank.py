"""A silent rank ends the job under the default (``mpi``) backend, within the timeout.

A 3-rank training job under real mpiexec; once it checkpoints, rank 2 is stopped with SIGSTOP (a
hung process: alive, silent, holding its sockets). The other ranks must give it its timeout, then
name rank 2 and what they were waiting for, and end the whole job (MPI_Abort), which also takes the
stopped process down; under Downpour the live worker and the server do not wait on rank 2 at all,
and still must end. Before the fix they spun at 100% CPU for ever.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import BIN, MPI_SCRIPTS, ROOT, alive, explain, launch_env, mpi_python, mpiexec_path

# each job waits out a stopped rank's timeout: 15-50 s a test. Under make test's workers, one
# after another: each asserts how soon the job ends, which two at once on 2 cores would stretch
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("silent-rank")]

# the group's timeout, which the stopped rank meets; start-up has a deadline of its own
# (--startup-timeout-s, 300 s by default), so MPI init slowed by make test's load (it took 11 s,
# and once 21 s, when start-up had this deadline too) no longer ends the job before a rank stops
TIMEOUT_S = 20
SILENT = 2


def ranks_of(job: str) -> dict[int, int]:
    """pid of each MPI rank of the job tagged ``job`` in its environment (Linux /proc)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(v.split("=", 1) for v in
                       (entry / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in v)
        except OSError:  # gone, or not ours to read
            continue
        if env.get("DOWNPOUR_TEST_JOB") == job and "OMPI_COMM_WORLD_RANK" in env:
            ranks[int(env["OMPI_COMM_WORLD_RANK"])] = int(entry.name)
    return ranks


def cpu_s(pid: int) -> float:
    """The CPU seconds (user + system) ``pid`` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# sync_ps's server is rank 0, its workers 1 and 2: both a stopped worker and a stopped server
@pytest.mark.parametrize("algorithm, extra, silent", [
    ("sync_ps", [], SILENT), ("sync_ps", [], 0), ("allreduce", [], SILENT),
    ("downpour", ["--servers", "1"], SILENT), ("sgp", [], SILENT)])
def test_a_stopped_rank_ends_the_job_naming_it(tmp_path, algorithm, extra, silent):
    """... and the ranks left waiting sleep: their CPU time over the wait is a small share of it
    (sync_ps's spun at 50-100% of a core inside MPI's blocking reduce). Every rank that speaks
    names the same rank."""
    stopped = stop_a_rank(tmp_path, algorithm, extra, silent)
    stderr = stopped.stderr
    # e.g. "rank 0 of 3 waited 10 s in broadcast (default group): rank 2 on vm went silent"
    named = re.search(r"rank (\d) of 3 waited (\d+) s in (\w[^(]*) \((default group|group of "
                      rf"ranks [\d, ]+)\): rank {silent} on {socket.gethostname()} went silent", stderr)
    assert named, stderr[-4000:]
    assert int(named[1]) != silent, named[0]
    culprits = set(re.findall(r": (ranks? [^(]*?) went silent", stderr))
    assert culprits == {f"rank {silent} on {socket.gethostname()}"}, stderr[-4000:]
    assert "every rank is alive" not in stderr, stderr[-4000:]
    assert stopped.window >= TIMEOUT_S - 2, \
        f"the job ended {stopped.window:.1f} s after the stop: {stderr[-4000:]}"
    # a loose bound for a loaded machine: a spinning rank takes 50-100%, a sleeping one ~3%.
    # Not Downpour's: it is asynchronous, so its other worker trains on against the server
    # while rank 2 is stopped (70-80% of a core, working, not waiting)
    if algorithm != "downpour":
        assert len(stopped.cpu_share) == 2 and max(stopped.cpu_share.values()) < 0.3, \
            f"waiting ranks' CPU share over {stopped.window:.1f} s: {stopped.cpu_share}"
    # the failure comes first (after the progress lines of rank 0, which a run prints off a terminal)
    failure = re.sub(r"(?m)^downpour: \w+ x\d+: step \d+ of \d+ .*\n", "", stderr)
    assert re.match(r"downpour: rank \d of 3 failed: ", failure), stderr[-4000:]
    assert "\0" not in stderr, stderr[-4000:]
    assert TIMEOUT_S - 2 <= stopped.elapsed <= TIMEOUT_S + 15, \
        f"the job took {stopped.elapsed:.1f} s to end: {stderr[-4000:]}"
    assert not stopped.outlived, "the stopped rank outlived the job"


@pytest.mark.parametrize("algorithm", ["allreduce", "sync_ps"])
def test_a_stopped_rank_under_gloo_is_named_too(tmp_path, algorithm):
    """gloo said only "Timed out waiting 10000ms for recv operation" and a traceback; the
    heartbeat over the rendezvous store (comm/peers.py) names the rank that stopped, and where."""
    stopped = stop_a_rank(tmp_path, algorithm, ["--backend", "gloo"], SILENT)
    stderr = stopped.stderr
    named = re.search(r"rank (\d) of 3 failed: gloo backend: rank "
                      rf"{SILENT} on {socket.gethostname()} went silent \(no heartbeat", stderr)
    assert named, stderr[-4000:]
    assert int(named[1]) != SILENT, named[0]
    assert "Traceback" not in stderr, stderr[-4000:]
    assert stopped.elapsed <= TIMEOUT_S + 30, \
        f"the job took {stopped.elapsed:.1f} s to end: {stderr[-4000:]}"
    assert not stopped.outlived, "the stopped rank outlived the job"


@dataclass
class Stopped:
    stderr: str
    elapsed: float  # seconds from the stop to the job's end
    window: float  # seconds from the stop to the job's end or to just before the timeout
    cpu_share: dict[int, float]  # each waiting rank's CPU time over the window, a share of it
    outlived: bool  # the stopped rank was still there 15 s after the job ended


def stop_a_rank(tmp_path, algorithm: str, extra: list[str], silent: int) -> Stopped:
    """Train on 3 ranks under mpiexec and SIGSTOP rank ``silent`` once training is under way."""
    job = uuid.uuid4().hex
    ckpt = tmp_path / "ckpt"
    cmd = [mpiexec_path(), "-n", "3", "--oversubscribe", "--bind-to", "none", str(BIN / "downpour"),
           "train", "--algorithm", algorithm, "--steps", "5000", "--timeout-s", str(TIMEOUT_S),
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", "10", *extra]
    proc = subprocess.Popen(cmd, env={**launch_env(), "DOWNPOUR_TEST_JOB": job}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = None
    try:
        deadline = time.monotonic() + 180
        while not list(ckpt.glob("ckpt-*.pt")):  # training is under way
            if proc.poll() is not None:
                raise AssertionError(f"ended before the first checkpoint: {proc.communicate()}")
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.05)
        ranks = ranks_of(job)
        stopped = ranks[silent]
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        waiting = {r: pid for r, pid in ranks.items() if r != silent}
        cpu_before = {r: cpu_s(pid) for r, pid in waiting.items()}
        try:  # the wait window: from the stop to a second before the timeout
            proc.wait(timeout=TIMEOUT_S - 1)
        except subprocess.TimeoutExpired:
            pass
        window = time.monotonic() - start
        cpu_share = {r: (cpu_s(pid) - cpu_before[r]) / window for r, pid in waiting.items()
                     if alive(pid)}
        _, stderr = proc.communicate(timeout=TIMEOUT_S + 60)
        elapsed = time.monotonic() - start
        # the launcher's last kills: mpiexec may return before its daemon has reaped the stopped
        # rank (under make test's workers, more than the second once allowed here)
        gone_by = time.monotonic() + 15
        while (stopped_alive := alive(stopped)) and time.monotonic() < gone_by:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in ranks_of(job).values():  # whatever is left of the job
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0, stderr[-4000:]
    return Stopped(stderr, elapsed, window, cpu_share, stopped_alive)


def _ended_naming(proc: subprocess.CompletedProcess, stops: str, pattern: str) -> re.Match:
    """The job's rank printed ``stops`` and the job failed, with ``pattern`` on its stderr."""
    assert stops in proc.stdout, explain(proc)
    assert proc.returncode != 0, explain(proc)
    named = re.search(pattern, proc.stderr)
    assert named, explain(proc)
    return named


def test_a_rank_stopped_while_the_others_are_in_the_data_phase_is_named_within_the_timeout():
    """The others are in a broadcast's data phase (tests/mpi/stopped_after_gate.py). It was MPI's
    blocking broadcast after a gate, which only their watchdogs could end (before those, the
    backstop ended it at the timeout plus 10 s, each rank naming the other too); now it is a
    nonblocking one with no gate, waited on with naps and the same deadline."""
    timeout_s = 5
    start = time.monotonic()
    proc = mpi_python(3, "stopped_after_gate.py", str(timeout_s), timeout=120)
    elapsed = time.monotonic() - start
    named = _ended_naming(proc, "rank 2 stops", r"rank ([01]) of 3 waited (\d+) s in broadcast "
                          rf"\(default group\): rank 2 on {socket.gethostname()} went silent "
                          r"\(no answer to (its heartbeat|a liveness probe)")
    assert timeout_s <= int(named[2]) <= timeout_s + 3, named[0]
    assert proc.stderr.startswith("downpour: rank "), explain(proc)
    assert "\0" not in proc.stderr, explain(proc)
    assert "outlived" not in proc.stderr, explain(proc)
    assert elapsed < 60, f"took {elapsed:.0f} s"  # start-up included; a hang meets the timeout


@pytest.mark.parametrize("op, silent, n, nbytes, where", [
    ("reduce", 2, 3, 4 << 20, "before"), ("broadcast", 2, 3, 4 << 20, "before"),
    ("reduce", 0, 3, 4 << 20, "before"), ("broadcast", 0, 3, 4 << 20, "before"),
    ("all_gather", 2, 3, 4 << 20, "before"), ("broadcast", 1, 2, 4 << 20, "before"),
    ("all_gather", 1, 2, 4 << 20, "before"), ("allreduce", 2, 3, 128 << 10, "after-gate"),
    ("allreduce", 1, 2, 4 << 10, "before"),
    ("reduce_scatter", 1, 2, 4 << 20, "after-gate"), ("reduce_scatter", 2, 3, 3 << 20, "after-gate"),
    ("all_gather_uneven", 1, 2, 4 << 20, "after-gate"),
    ("all_gather_uneven", 2, 3, 4 << 20, "after-gate")])
def test_ranks_waiting_in_a_large_collective_sleep_and_name_the_stopped_rank(op, silent, n, nbytes,
                                                                              where):
    """sync_ps's reduce and broadcast (and an allgather) of 4 MB, above the 256 KB where the data
    phase was MPI's blocking call: with a peer stopped, the waiting ranks spun at 100% of a core
    until the watchdog ended the job. Now they sleep (shared memory, ``comm/mpi/shm_data.py``):
    each prints its CPU share over the wait (tests/mpi/stopped_in_large_data.py), and names the
    stopped rank after the timeout. At 2 ranks broadcast and allgather take shared memory too, its
    steps in C (``comm/mpi/native_shm.c``), whose barrier sleeps as the Python one does. A 3-rank
    allreduce of the default model's 128 KB takes the gate too, and the stopped rank passes it
    first (``after-gate``): the others wait inside the data phase, where MPI's blocking call had
    them spin at 99% (``comm/mpi/data_phase.py``). A 2-rank 4 KB allreduce, the second of its
    kind, takes the short path (``comm/mpi/routing.Route.short``), which must wait the same
    way. A reduce_scatter above 256 KB (MPI's blocking call behind the gate at 2 ranks, the path
    measured fastest) and an allgather of uneven sizes (MPI's allgatherv) are, behind the gate, the
    nonblocking call spun for about its data time and then waited on with naps (issue 61: the
    others spun at 100% of a core inside the blocking call until the watchdog ended the job)."""
    timeout_s = 8
    proc = mpi_python(n, "stopped_in_large_data.py", str(timeout_s), op, str(silent), str(nbytes),
                      where, timeout=180)
    op = {"all_gather_uneven": "all_gather"}.get(op, op)  # the name the error gives
    assert f"rank {silent} stops" in proc.stdout, explain(proc)
    assert proc.returncode != 0, explain(proc)
    waits = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert waits, explain(proc)  # the first to give up ends the job; the other may not get to say
    for wait in waits:
        assert wait["rank"] != silent, wait
        assert re.search(rf"rank {wait['rank']} of {n} waited \d+ s in {op}[\w ]* \(default group\): "
                         rf"rank {silent} on {re.escape(socket.gethostname())} went silent",
                         wait["error"]), wait
        assert wait["wall_s"] >= timeout_s - 2, wait
        # a spinning rank takes 100% of a core; one that sleeps a few %, plus the machine's load
        assert wait["cpu_share"] < 0.2, wait
    assert "\0" not in proc.stderr, explain(proc)


@pytest.mark.parametrize("op, what", [("allreduce_max", "allreduce")])
def test_a_rank_stopped_inside_a_blocking_call_is_named_by_the_watchdog_at_the_timeout(op, what):
    """At 2 ranks a 4 MB MAX allreduce is MPI's blocking call behind the gate (shared memory's C
    steps take sum and product; ``comm/mpi/paths.py``), which the data phase makes in C
    (``comm/mpi/native_calls.c``) where it could be built; its second call takes the short path,
    outside the watchdog's table (``comm/mpi/routing.Route.short``). (A 4 MB reduce_scatter was one too;
    it now waits asleep: ``test_ranks_waiting_in_a_large_collective_sleep_and_name_the_stopped_rank``.)
    Rank 1 takes its part of the gate and stops, so rank 0 is inside the blocking call, which only
    its watchdog can end: it must know the thread is there (the C data phase marks it committed,
    with what it is, its group and since when) and end the job once the heartbeat finds rank 1
    silent, naming it, not ten seconds later at the backstop ("stuck inside MPI past the timeout",
    which the C path's threads took before the watchdog read their mark)."""
    timeout_s = 5
    proc = mpi_python(2, "stopped_in_large_data.py", str(timeout_s), op, "1",
                      str(4 << 20), "after-gate", timeout=120)
    named = _ended_naming(proc, "rank 1 stops", rf"rank 0 of 2 waited (\d+) s in {what}\w* "
                          rf"\(default group\): rank 1 on {re.escape(socket.gethostname())} went silent "
                          r"\(no answer to its heartbeat")
    assert int(named[1]) <= timeout_s + 3, named[0]  # the backstop's is the timeout + 10 s
    assert "stuck inside MPI" not in proc.stderr, explain(proc)


def test_a_rank_resumed_as_it_is_probed_is_named_as_the_one_that_was_stopped():
    """The launcher resumes a stopped rank (SIGCONT) to end a job; a rank probing at that moment
    got its answer and said "every rank is alive" (tests/mpi/resumed_rank.py). The resumed rank
    now answers that it was stopped, and the prober names it, with how long."""
    proc = mpi_python(2, "resumed_rank.py", timeout=120)
    assert proc.returncode == 0 and "rank 0 stops" in proc.stdout, explain(proc)
    said = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert said["silent"] == [0], said
    assert re.search(rf"rank 1 of 2 waited 6 s in allreduce \(default group\): rank 0 on "
                     rf"{re.escape(socket.gethostname())} went silent \(stopped for [45] s, it "
                     r"answered a liveness probe once resumed\)", said["message"]), said
    assert "every rank is alive" not in said["message"], said


def job_processes(job: str) -> list[int]:
    """Every process left of the job tagged ``job``: ranks, their sentinels, the launcher."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"DOWNPOUR_TEST_JOB={job}".encode() in \
                    (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("phase, culprit", [
    ("MPI init", r"rank 2 never reached MPI init \(it is stopped in start-up\)"),
    ("the rendezvous", r"rank 2 is stopped \(in the rendezvous\)")])
def test_a_rank_stopped_during_start_up_ends_the_job_naming_it(phase, culprit):
    """Before, the others sat in MPI_Init_thread (or the rendezvous's first collectives) for ever:
    nothing had a deadline before the process group existed. Rank 2 stops itself as it reaches
    ``phase`` (tests/mpi/stalls_at_startup.py); the others' start-up deadline
    (--startup-timeout-s, not the group's --timeout-s, left at its 5 minutes) must end the job
    within it (plus their own start-up, which the load stretches), with one first line naming
    rank 2, and leave no process behind."""
    timeout_s, job = 10, uuid.uuid4().hex
    cmd = [mpiexec_path(), "-n", "3", "--oversubscribe", "--bind-to", "none", sys.executable,
           str(MPI_SCRIPTS / "stalls_at_startup.py"), "2", phase, "--algorithm", "sync_ps",
           "--steps", "20", "--startup-timeout-s", str(timeout_s)]
    proc = subprocess.Popen(cmd, env={**launch_env(), "DOWNPOUR_TEST_JOB": job}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, out = time.monotonic() + 240, ""
        while "rank 2 stops at" not in out:
            assert time.monotonic() < deadline and proc.poll() is None, \
                f"rank 2 did not reach {phase}: {out}"
            if select.select([proc.stdout], [], [], 1.0)[0]:
                out += proc.stdout.readline()
        stopped_at = time.monotonic()
        _, stderr = proc.communicate(timeout=timeout_s + 120)
        elapsed = time.monotonic() - stopped_at
        time.sleep(1)  # the launcher's last kills
        left = job_processes(job)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in job_processes(job):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0, stderr[-4000:]
    first = stderr.splitlines()[0] if stderr else ""
    assert re.fullmatch(rf"downpour: rank [01] of 3 failed: start-up: waited \d+ s in {phase} "
                        rf"\(--startup-timeout-s 10\): {culprit}; ending the job", first), \
        stderr[-4000:]
    assert "\0" not in stderr, stderr[-4000:]
    assert elapsed < timeout_s + 90, f"the job ended {elapsed:.0f} s after the stop"
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("n", [2, 3])
def test_a_stopped_store_host_is_named_at_the_timeout_and_the_others_sleep(n):
    """The rendezvous store's host (rank 0, a gloo group under MPI) stops once it has told the
    others where the store is (tests/mpi/stopped_store_host.py). The kernel still accepts their
    connections, and torch's connect waited for the server's answer past any timeout; now each
    gives up at the timeout, asleep meanwhile, naming the store's host and where it listens."""
    timeout_s = 8
    proc = mpi_python(n, "stopped_store_host.py", str(timeout_s), timeout=180)
    assert "rank 0 stops" in proc.stdout, explain(proc)
    assert proc.returncode != 0, explain(proc)
    waits = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert waits, explain(proc)  # the first to give up ends the job; another may not get to say
    for wait in waits:
        assert wait["rank"] != 0, wait
        assert re.fullmatch(rf"rank {wait['rank']} of {n} on {re.escape(socket.gethostname())} "
                            rf"waited {timeout_s} s for the rendezvous store of rank 0 on "
                            rf"{re.escape(socket.gethostname())} at 127\.0\.0\.1:\d+: it took the "
                            r"connection but never answered \(stopped, hung or overloaded\)",
                            wait["error"]), wait
        assert wait["wall_s"] >= timeout_s - 1, wait
        assert wait["cpu_share"] < 0.2, wait


_STORE_HOST = """
import os, signal, sys, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, int(sys.argv[1]), True, wait_for_workers=False)
print(store.port, flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""

_CLIENT = """
import json, sys, time
from downpour_lib.comm import runtime
cpu, wall = time.process_time(), time.perf_counter()
try:
    runtime.init(backend="gloo", device="cpu", startup_timeout_s=float(sys.argv[1]))
except RuntimeError as exc:
    wall = time.perf_counter() - wall
    print(json.dumps({"cpu_share": (time.process_time() - cpu) / wall, "wall_s": wall,
                      "error": str(exc)}), flush=True)
    sys.stdout.flush()
    import os
    os._exit(1)  # the connect's thread is still inside torch
"""


@pytest.mark.parametrize("agent", [False, True], ids=["rank-0-hosts", "torchrun-agent-hosts"])
def test_a_stopped_store_host_of_a_torchrun_launch_is_named_at_the_timeout(agent):
    """Under torchrun (its agent hosts the store: ``TORCHELASTIC_USE_AGENT_STORE``) or a
    RANK/WORLD_SIZE/MASTER_ADDR launch (rank 0 hosts it), a store host that is stopped once it
    listens left the other ranks inside torch's connect past any timeout; now rank 1 gives up at
    its start-up deadline (the group's timeout left at its default), asleep meanwhile, naming the
    store's host and where it listens. The host here is
    a process that opens the store and stops itself, as a hung agent or rank 0 would be."""
    timeout_s = 6
    host = subprocess.Popen([sys.executable, "-c", _STORE_HOST, "2"], stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(host.stdout.readline())
        env = {**launch_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if agent:
            env.update(TORCHELASTIC_RUN_ID="test", TORCHELASTIC_USE_AGENT_STORE="True")
        proc = subprocess.run([sys.executable, "-c", _CLIENT, str(timeout_s)], env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        host.kill()
        host.wait()
    assert proc.returncode == 1, explain(proc)
    wait = json.loads(proc.stdout.splitlines()[-1])
    server = "torchrun's agent" if agent else "rank 0"
    assert re.fullmatch(rf"rank 1 of 2 on {re.escape(socket.gethostname())} waited {timeout_s} s "
                        rf"for the rendezvous store of {server} on 127\.0\.0\.1 at "
                        rf"127\.0\.0\.1:{port}: it took the connection but never answered "
                        r"\(stopped, hung or overloaded\)", wait["error"]), wait
    assert wait["wall_s"] >= timeout_s - 1, wait
    assert wait["cpu_share"] < 0.2, wait
