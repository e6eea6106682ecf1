"""A real one-node Slurm (munge, slurmctld, slurmd) started by the tests: the slurm-mpi profile's
engine job and the multi-node sbatch script (srun and mpiexec), each checked against a one-process
reference run (sync_ps with one worker is plain SGD on the same batch). srun with and without MPI
across two nodes: tests/test_slurm_nodes.py.

Needs root and the distribution's slurm-wlm and munge. Where they are missing the tests skip, except
when DOWNPOUR_REQUIRE_SLURM=1 (CI sets it): there a skip would hide a broken launch path, so it fails.
"""

import json
import os
import re
import stat
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import BIN, ROOT, downpour, explain, launch_env, read_json
from slurm_sandbox import FLAGS, TINY, running_sandbox, squeue, submit_batch, unavailable, wait_for_jobs

from downpour_lib import TrainConfig, train
from downpour_lib.cluster import connect, stop_clusters
from downpour_lib.cluster.failures import ClusterPreempted
from downpour_lib.cluster.profiles import profile_dir
from downpour_lib.errors import ClusterError


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    with running_sandbox(tmp_path_factory.mktemp("slurm")) as box:
        yield box


@pytest.fixture(scope="module")
def env(sandbox):
    return sandbox.env(launch_env())


@pytest.fixture(scope="module")
def reference():
    """One process, plain SGD on the same batch: what sync_ps with one worker must reproduce."""
    return train(TrainConfig(**{**TINY, "algorithm": "local"})).summary


def matches(summary: dict, reference: dict) -> bool:
    return (abs(summary["final_train_loss"] - reference["final_train_loss"]) < 1e-5
            and summary["test_accuracy"] == reference["test_accuracy"])


def test_up_is_idempotent_and_the_node_is_idle(sandbox):
    before = sandbox.status()
    again = sandbox.up()
    assert again.running and again.daemons == before.daemons
    assert again.node.split() == [os.uname().nodename.split(".")[0], "idle"]
    conf = sandbox.conf.read_text()
    for line in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"):
        assert line in conf.splitlines()
    status = downpour("sandbox", "slurm", "status", "--dir", str(sandbox.dir))
    assert status.returncode == 0 and f"export SLURM_CONF={sandbox.conf}" in status.stdout, explain(status)


@contextmanager
def ipcluster_started(env, *flags: str, n: int = 2):
    """`ipcluster start --profile=slurm-mpi -n N --daemonize FLAGS` (the profiles installed first)
    for the block; then `ipcluster stop` and every cluster file of the profile, and, when the block
    ended well, the engines' job gone from the queue."""
    install = subprocess.run([str(BIN / "downpour"), "profiles", "install"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, explain(install)
    try:
        start = subprocess.run([str(BIN / "ipcluster"), "start", "--profile=slurm-mpi", "-n", str(n),
                                "--daemonize", *flags], env=env, capture_output=True, text=True,
                               timeout=180, cwd=ROOT)
        assert start.returncode == 0, explain(start)
        yield
    finally:
        subprocess.run([str(BIN / "ipcluster"), "stop", "--profile=slurm-mpi"], env=env,
                       capture_output=True, text=True, timeout=120)
        stop_clusters("slurm-mpi")
    deadline = time.monotonic() + 60
    while squeue(env) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert squeue(env) == []  # `ipcluster stop` cancelled the engine job


def test_slurm_mpi_profile_engines_are_one_sbatch_job_and_train(env, reference, tmp_path, monkeypatch):
    with ipcluster_started(env):
        cluster = connect("slurm-mpi", timeout_s=300, activate=False)
        try:
            assert squeue(env) == ["ipengine- RUNNING"]  # one job holds every engine
            assert sorted(cluster.engines) == [0, 1]
            result = cluster.train(TrainConfig(**TINY))
            preempted_and_resumed(cluster, env, tmp_path, monkeypatch)
        finally:
            cluster.stop()
        s = result.summary
        # backend auto under an MPI launch is the mpi backend (on the job's communicator)
        assert (s["world_size"], s["num_workers"], s["launcher"], s["backend"]) == (2, 1, "mpi", "mpi")
        assert matches(s, reference), (s, reference)

        # CurveZMQ on, connection files for the owner only
        security = profile_dir("slurm-mpi") / "security"
        assert stat.S_IMODE(security.stat().st_mode) == 0o700
        for name in ("ipcontroller-client.json", "ipcontroller-engine.json"):
            assert stat.S_IMODE((security / name).stat().st_mode) == 0o600
            assert json.loads((security / name).read_text())["curve_serverkey"]
        logs = (profile_dir("slurm-mpi") / "log").glob("ipengine-*.log")
        engine_logs = "".join(p.read_text() for p in logs)
        assert "Using CurveZMQ security" in engine_logs


def test_a_wait_on_an_engine_job_still_in_the_queue_says_so(env, monkeypatch):
    """`ipcluster start --profile=slurm-mpi --daemonize` returns before Slurm runs the engines' job,
    and on a busy cluster the job waits in the queue. A notebook that connected meanwhile ended its
    wait with "0 of 2 engines registered" and a pointer to logs that were empty; it now says the
    job is still PENDING, and why (here a start time an hour away)."""
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])  # this process's scontrol
    with ipcluster_started(env, "--SlurmMPIEngineSetLauncher.sbatch_args=['--begin=now+3600']"):
        message = connect_while_pending(env)
        assert re.search(r"^0 of 2 engines registered within 3 s \(the engines' Slurm job \d+ is "
                         r"still PENDING \(BeginTime\): Slurm has not started it; once `squeue -j "
                         r"\d+` says RUNNING, run this again", message), message
    # more engines than the sandbox's node has CPUs: a job no wait will start, which said the same
    with ipcluster_started(env, n=64):
        message = connect_while_pending(env)
        assert re.search(r"job \d+ is PENDING \(Partition\w+\) and will not start: it asks for more "
                         r"than its partition has", message), message


def connect_while_pending(env) -> str:
    """What connect() says once the engines' job is in the queue, not started."""
    deadline = time.monotonic() + 60
    while squeue(env) != ["ipengine- PENDING"]:
        assert time.monotonic() < deadline, squeue(env)
        time.sleep(0.5)
    with pytest.raises(ClusterError) as caught:
        connect("slurm-mpi", timeout_s=3, activate=False)
    return str(caught.value)


def preempted_and_resumed(cluster, env, tmp_path: Path, monkeypatch) -> None:
    """The engines' job gets USR2 mid-run (as at its time limit, --signal=B:USR2@120): train()
    says it was preempted and how to go on; restart_engines() and the same call finish the run."""
    config = TrainConfig(**{**TINY, "algorithm": "allreduce", "steps": 3000, "final_eval": False,
                            "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every": 100})
    job = cluster.slurm_job()
    assert job and squeue(env, "%i") == [job]

    def signal_after_the_first_checkpoint() -> None:
        first = tmp_path / "ckpt" / "ckpt-00000100.pt"
        deadline = time.monotonic() + 120
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        subprocess.run(["scancel", "--signal=USR2", "--batch", job], env=env, timeout=30)

    signaller = threading.Thread(target=signal_after_the_first_checkpoint, daemon=True)
    signaller.start()
    with pytest.raises(ClusterPreempted) as stopped:
        cluster.train(config)
    signaller.join()
    message = str(stopped.value)
    assert f"the engines' Slurm job {job} got the preemption signal" in message, message
    assert "cluster.restart_engines()" in message and "resume='auto'" in message
    completed = int(message.split("preempted after ", 1)[1].split()[0])
    assert 100 <= completed < 3000
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])  # ipyparallel's scancel and sbatch, here
    cluster.restart_engines()  # a new engine job
    resumed = cluster.train(config).summary
    assert resumed["start_step"] == completed and resumed["total_steps"] == 3000
    # the engine job ends under them (here cancelled; at a site, its time limit): the next call
    # says how it ended and how to go on, not only that the engines are gone
    job = cluster.slurm_job()
    subprocess.run(["scancel", job], env=env, timeout=30)
    deadline = time.monotonic() + 120
    while cluster.client.ids and time.monotonic() < deadline:
        time.sleep(0.5)
    with pytest.raises(ClusterError, match=f"the engines' Slurm job {job} is CANCELLED "
                                           r"\(it was cancelled\)\); call cluster.restart_engines"):
        cluster.train(config)


def test_multinode_sbatch_script(env, reference, tmp_path):
    jobs = {launcher: submit_batch(env, tmp_path / f"{launcher}.out", 1, 2, DOWNPOUR_LAUNCHER=launcher,
                                   DOWNPOUR_ARGS=" ".join(FLAGS),
                                   DOWNPOUR_SUMMARY=str(tmp_path / f"{launcher}.json"))
            for launcher in ("srun", "mpiexec")}  # both at once: the node has room for two 2-task jobs
    states = wait_for_jobs(env, jobs, 300)
    for launcher in jobs:
        log = (tmp_path / f"{launcher}.out").read_text()
        assert states[launcher] == "COMPLETED", log
        assert f"2 ranks on {os.uname().nodename.split('.')[0]}, launcher {launcher}" in log
        assert "downpour: each rank runs: downpour train --checkpoint-dir " in log, log  # and args
        s = read_json(tmp_path / f"{launcher}.json")
        assert (s["launcher"], s["world_size"]) == ({"srun": "slurm", "mpiexec": "mpi"}[launcher], 2)
        assert matches(s, reference), (launcher, s, reference)


def test_down_leaves_nothing_running(sandbox, env):
    status = sandbox.down()
    assert status.stopped
    marker = f"SLURM_CONF={sandbox.conf}".encode()
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        name = Path(f"/proc/{pid}/comm").read_text().strip() if state != "Z" else ""
        if marker in environ and name in ("slurmd", "slurmctld", "slurmstepd"):
            left.append((pid, name))
    assert left == []
    assert not sandbox.socket.parent.exists()  # munged's socket directory, in the directory or not
    assert sandbox.down().stopped  # and again: idempotent


def test_start_cluster_with_slurm_unreachable_says_what_sbatch_said_and_leaves_nothing(tmp_path,
                                                                                       monkeypatch):
    """The slurm-mpi profile against a sandbox that is down (its slurm.conf there, no controller):
    a real sbatch fails, and start_cluster says what it said. It raised ipyparallel's
    ``CalledProcessError: Command '['scancel', '']'`` (a cancel of the job never submitted), printed
    stop tracebacks, and left the cluster file and the batch script behind."""
    import shutil
    import uuid

    from downpour_lib.cluster import start_cluster
    from downpour_lib.sandbox import SlurmSandbox
    from downpour_lib.sandbox.slurm_conf import free_port

    if shutil.which("sbatch") is None:
        unavailable("sbatch is not installed (apt-get install slurm-wlm)")
    down = SlurmSandbox(tmp_path / "slurm", link_system_conf=False)
    down.dir.mkdir()
    down.conf.write_text(down.slurm_conf(free_port(), free_port()))
    monkeypatch.setenv("SLURM_CONF", str(down.conf))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # this test's profile, no one else's
    monkeypatch.setenv("DOWNPOUR_TEST_MARK", mark := uuid.uuid4().hex)  # what it starts inherits it
    before = set(psutil_children())
    with pytest.raises(ClusterError) as failed:
        start_cluster("slurm-mpi", n=2, timeout_s=60)
    message = str(failed.value)
    assert "sbatch failed (exit 1): sbatch: error: Batch job submission failed: Unable to contact " \
           "slurm controller" in message, message
    assert f"SLURM_CONF={down.conf}" in message and "scancel" not in message
    profile = profile_dir("slurm-mpi", tmp_path / "ipython")
    assert list((profile / "security").glob("cluster-*.json")) == []
    assert list(profile.glob("*.sbatch")) == []
    deadline = time.monotonic() + 30  # the controller it started is stopped
    while set(psutil_children()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(psutil_children()) - before == set()
    assert marked_processes(f"DOWNPOUR_TEST_MARK={mark}".encode()) == []  # no orphan either


def test_ipcluster_start_ends_when_sbatch_fails_and_leaves_no_controller(tmp_path):
    """`ipcluster start --profile=slurm-mpi --daemonize` against a Slurm that is down: sbatch's
    error, then exit 1 with nothing left running. ipyparallel logged the failed start inside its
    event loop and waited for engines until killed (the docs say --daemonize returns); and a
    controller stopped within two seconds of its start left its schedulers running, orphans."""
    import shutil
    import uuid

    from downpour_lib.sandbox import SlurmSandbox
    from downpour_lib.sandbox.slurm_conf import free_port

    if shutil.which("sbatch") is None:
        unavailable("sbatch is not installed (apt-get install slurm-wlm)")
    down = SlurmSandbox(tmp_path / "slurm", link_system_conf=False)
    down.dir.mkdir()
    down.conf.write_text(down.slurm_conf(free_port(), free_port()))
    marker = f"DOWNPOUR_TEST_MARK={uuid.uuid4().hex}"
    env = {**launch_env(), "SLURM_CONF": str(down.conf), "IPYTHONDIR": str(tmp_path / "ipython"),
           marker.split("=")[0]: marker.split("=")[1]}
    assert downpour("profiles", "install", "slurm-mpi", "--ipython-dir",
                    str(tmp_path / "ipython")).returncode == 0
    proc = subprocess.run([str(BIN / "ipcluster"), "start", "--profile=slurm-mpi", "-n", "2",
                           "--daemonize"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, explain(proc)
    assert "ipcluster stops: sbatch failed (exit 1)" in proc.stderr, explain(proc)
    assert "Unable to contact slurm controller" in proc.stderr, explain(proc)
    assert list((profile_dir("slurm-mpi", tmp_path / "ipython") / "security").glob("*.json")) == []
    assert marked_processes(marker.encode()) == []


def marked_processes(marker: bytes) -> list[tuple[str, str]]:
    """Every live process whose environment holds ``marker``: (pid, command)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z" and marker in environ:
            found.append((pid, command))
    return found


def psutil_children() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True) if p.status() != "zombie"]


def test_job_ids_go_on_across_down_and_up(tmp_path):
    """Job ids restarted at 1 after every down/up, so a new job appended to an earlier job's
    downpour-1.out and wrote over its downpour-1.json. Each up goes on from the last id."""
    def submit(box) -> int:
        proc = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/%j.out", "--wrap",
                               "true"], env=box.env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, explain(proc)
        return int(proc.stdout.strip().split(";")[0])

    with running_sandbox(tmp_path / "slurm") as box:
        first = [submit(box), submit(box)]
        assert box.dir.is_dir()
    # down leaves nothing of it (the README says so) but its next job id, beside its directory
    assert not (tmp_path / "slurm").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".slurm.next-job-id"]
    with running_sandbox(tmp_path / "slurm") as box:  # down, then up again
        again = submit(box)
        box._slurm("scontrol", "shutdown")  # as after a crash: down saves no id, the log still tells
        deadline = time.monotonic() + 30
        while box.status().daemons["slurmctld"] and time.monotonic() < deadline:
            time.sleep(0.2)
        box.up()
        last = submit(box)
    assert first[1] == first[0] + 1 and again == first[1] + 1 and last == again + 1, \
        (first, again, last)


@pytest.mark.parametrize("venv", [None, "/nonexistent/venv"])
def test_the_batch_script_without_downpour_says_to_name_the_environment(tmp_path, venv):
    """The script, run as Slurm would run it on a node whose PATH has no `downpour` (submitted
    from a directory without .venv): exit 2 before any launcher, saying to set DOWNPOUR_VENV or
    activate it (it was `downpour: command not found` from every rank)."""
    from slurm_sandbox import BATCH

    env = {"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path),
           **({"DOWNPOUR_VENV": venv} if venv else {})}
    proc = subprocess.run(["bash", str(BATCH)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, explain(proc)
    if venv:
        assert f"DOWNPOUR_VENV={venv} has no bin/activate" in proc.stderr, explain(proc)
    else:
        assert "no `downpour` command on" in proc.stderr and "DOWNPOUR_VENV=" in proc.stderr, \
            explain(proc)
