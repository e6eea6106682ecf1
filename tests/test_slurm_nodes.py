"""A Slurm cluster of two nodes on one machine (``downpour sandbox slurm up --nodes 2``): each node a
separate host (network namespace, host name, address, slurmd), jobs that span both through every
launcher, links shaped to a rate that a collective then runs at, and nothing left after ``down``.

Needs root, network namespaces, slurm-wlm and munge; skips without them, except under
DOWNPOUR_REQUIRE_SLURM=1 (CI), where a skip fails.
"""

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, ROOT, downpour, explain, launch_env, read_json

from downpour_lib import TrainConfig, train
from downpour_lib.sandbox import SandboxError, SlurmSandbox, missing_requirements
from downpour_lib.sandbox.netns import Network, NetworkError
from downpour_lib.sandbox.slurm import NETNS_ETC, pmix_available

REQUIRED = os.environ.get("DOWNPOUR_REQUIRE_SLURM") == "1"
TINY = {"algorithm": "sync_ps", "model": "mlp", "dataset": "digits", "steps": 12, "batch_size": 16,
        "threads": 1, "warmup_steps": 2}
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
MB = 2**20
ADDRESSES = {"node1": "10.213.0.11", "node2": "10.213.0.12"}


def unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"DOWNPOUR_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def etc_hosts() -> str:
    return hashlib.sha256(Path("/etc/hosts").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    missing = missing_requirements()
    if missing:
        unavailable("the Slurm sandbox needs " + "; ".join(missing))
    try:
        Network.check()
    except NetworkError as exc:
        unavailable(str(exc))
    box = SlurmSandbox(tmp_path_factory.mktemp("slurm2"), link_system_conf=False, nodes=2)
    try:
        box.up()
        yield box
    finally:
        box.down()


@pytest.fixture(scope="module")
def env(sandbox):
    return sandbox.env(launch_env())


def srun(env, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_each_node_is_a_host_of_its_own(sandbox, env):
    status = sandbox.status()
    assert status.running
    assert [(n.name, n.address, n.state) for n in status.nodes] == \
        [("node1", ADDRESSES["node1"], "idle"), ("node2", ADDRESSES["node2"], "idle")]
    shown = downpour("sandbox", "slurm", "status", "--dir", str(sandbox.dir))
    assert shown.returncode == 0 and "node2    10.213.0.12" in shown.stdout, explain(shown)
    again = sandbox.up()  # idempotent: the same daemons
    assert again.daemons == status.daemons

    # its own host name and address; every node (and the controller) by name
    proc = srun(env, "sh", "-c", 'echo "$(hostname) $(hostname -I | tr -d " ") '
                                 '$(getent hosts node1 node2 | tr -s " \\n" "  ")"')
    assert proc.returncode == 0, explain(proc)
    lines = sorted(proc.stdout.split("\n")[:-1])
    names = "10.213.0.11 node1 10.213.0.12 node2"
    assert [line.strip() for line in lines] == [f"node1 10.213.0.11 {names}", f"node2 10.213.0.12 {names}"]


LAUNCHERS = ["srun", "srun-pmix", "mpiexec"]


def launchers() -> list[str]:
    if pmix_available():
        return LAUNCHERS
    unavailable("Slurm's mpi/pmix plugin cannot load libpmix (apt-get install libpmix-dev)")


def job_state(env, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


def test_the_batch_script_trains_across_both_nodes_with_every_launcher(env, tmp_path):
    """allreduce on 2 nodes x 2 ranks, through cluster_profiles/launch_multinode.sbatch, ends where
    one process on the 4-times batch ends."""
    reference = train(TrainConfig(**{**TINY, "algorithm": "local", "batch_size": 4 * TINY["batch_size"]}))
    flags = " ".join(f for f in FLAGS if not f.startswith("--algorithm")) + " --algorithm=allreduce"
    jobs = {}
    for launcher in launchers():  # all at once: the two nodes have room for three 4-task jobs
        job_env = {**env, "DOWNPOUR_LAUNCHER": launcher, "DOWNPOUR_ARGS": flags,
                   "DOWNPOUR_SUMMARY": str(tmp_path / f"{launcher}.json")}
        submit = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2",
                                 f"--output={tmp_path}/{launcher}.out",
                                 str(ROOT / "cluster_profiles" / "launch_multinode.sbatch")],
                                env=job_env, capture_output=True, text=True, timeout=60)
        assert submit.returncode == 0, explain(submit)
        jobs[launcher] = submit.stdout.strip().split(";")[0]
    deadline, states = time.monotonic() + 300, {}
    while time.monotonic() < deadline:
        states = {launcher: job_state(env, job) for launcher, job in jobs.items()}
        if all(state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") for state in states.values()):
            break
        time.sleep(0.5)
    for launcher in jobs:
        log = (tmp_path / f"{launcher}.out").read_text()
        assert states[launcher] == "COMPLETED", f"{launcher}: {states[launcher]}\n{log}"
        assert f"4 ranks on node[1-2], launcher {launcher}" in log
        assert "cannot be retrieved" not in log  # every peer's name resolves on every node
        s = read_json(tmp_path / f"{launcher}.json")
        assert s["hosts"] == "node1,node2", (launcher, s["hosts"])
        assert (s["launcher"], s["backend"], s["num_workers"]) == \
            ({"srun": ("slurm", "gloo", 4)}.get(launcher, ("mpi", "mpi", 4))), launcher
        assert abs(s["final_train_loss"] - reference.summary["final_train_loss"]) < 1e-5, launcher
        assert s["test_accuracy"] == reference.summary["test_accuracy"], launcher


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_algorithm_across_nodes(env, launcher):
    """tests/mpi/across_nodes.py on 2 nodes x 2 ranks: exact collectives, the node hierarchy, the
    synchronous algorithms equal to one process on the N-times batch, the others exchanging."""
    script = [str(BIN / "python"), str(ROOT / "tests" / "mpi" / "across_nodes.py")]
    if launcher == "mpiexec":  # inside an allocation, as in a batch job
        cmd = ["salloc", "--nodes=2", "--ntasks-per-node=2", str(BIN / "mpiexec"), "--bind-to", "none",
               *script]
    else:
        cmd = ["srun", "--nodes=2", "--ntasks-per-node=2", *(["--mpi=pmix"] if launcher == "srun-pmix"
                                                               else []), *script]
    if launcher == "srun-pmix" and not pmix_available():
        unavailable("Slurm's mpi/pmix plugin cannot load libpmix (apt-get install libpmix-dev)")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, explain(proc)
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert report["hosts"] == ["node1", "node1", "node2", "node2"], report["hosts"]
    assert report["backend"] == ("gloo" if launcher == "srun" else "mpi")
    assert report["collectives"]["ok"], report["collectives"]
    if report["backend"] == "mpi":  # large allreduces: shared memory in each node, MPI between
        assert report["collectives"]["passes"]["nodes"] >= 3, report["collectives"]
        assert report["collectives"]["passes"]["node"] == 0, report["collectives"]
    assert report["hierarchy"] == {"ok": True, "local": [0, 1], "leader": True}
    for name, case in report["sync"].items():
        assert case["max_abs_diff"] < 1e-5 and case["reference_moved"] > 1e-2, (name, case)
    assert sorted(report["async"]) == ["adpsgd", "downpour", "dpsgd", "osgp", "sgp"]
    for name, case in report["async"].items():
        assert case["every_worker_exchanged"], (name, case)
        assert isinstance(case["final_train_loss"], float) and case["final_train_loss"] < 2.4, (name, case)


def allreduce_rate(env, tmp_path: Path) -> float:
    """Bytes per second one rank sends (and receives) in a 64 MB gloo allreduce between the nodes."""
    out = tmp_path / f"bench-{time.monotonic_ns()}.json"
    proc = srun(env, str(BIN / "downpour"), "bench", "collectives", "--backends", "gloo", "--ops",
                "allreduce", "--sizes", "64M", "--warmup", "0", "--min-reps", "1", "--max-reps", "1",
                "--min-time", "0", "--json", str(out), timeout=240)
    assert proc.returncode == 0, explain(proc)
    row = next(r for r in json.loads(out.read_text()) if r["op"] == "allreduce")
    # two ranks: each sends half of the buffer twice (reduce-scatter, all-gather), i.e. all of it
    return 64 * MB / row["p50_s"]


def test_links_run_at_the_rate_they_are_shaped_to(sandbox, env, tmp_path):
    unshaped = allreduce_rate(env, tmp_path)
    shape = downpour("sandbox", "slurm", "up", "--dir", str(sandbox.dir), "--bandwidth", "100mbit")
    try:
        assert shape.returncode == 0, explain(shape)
        assert [n.shaping for n in sandbox.status().nodes] == ["100Mbit", "100Mbit"]
        shaped = allreduce_rate(env, tmp_path)
    finally:
        sandbox.up(bandwidth="none")
    assert [n.shaping for n in sandbox.status().nodes] == ["none", "none"]
    rate = 100e6 / 8
    assert 0.75 * rate <= shaped <= 1.25 * rate, f"{shaped / 1e6:.2f} MB/s at 100mbit (12.5 MB/s)"
    assert unshaped > 5 * shaped, f"unshaped {unshaped / 1e6:.1f} MB/s, shaped {shaped / 1e6:.1f} MB/s"


def test_bad_requests_are_refused_with_the_reason(sandbox, monkeypatch):
    wrong_count = SlurmSandbox(sandbox.dir, link_system_conf=False, nodes=3)
    with pytest.raises(SandboxError, match="runs 2 node"):
        wrong_count.up()
    bad = downpour("sandbox", "slurm", "up", "--dir", str(sandbox.dir), "--bandwidth", "fast")
    assert bad.returncode == 2 and "bandwidth='fast'" in bad.stdout, explain(bad)
    one = downpour("sandbox", "slurm", "up", "--dir", str(sandbox.dir / "one"), "--bandwidth", "1gbit")
    assert one.returncode == 2 and "one-node sandbox has no link" in one.stdout, explain(one)
    with pytest.raises(SandboxError, match="subnet 10.213.0.0/24 is already in use"):
        SlurmSandbox(sandbox.dir / "second", link_system_conf=False, nodes=2).up()
    assert sandbox.status().running  # the first one is untouched
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="root"):
        SlurmSandbox(sandbox.dir / "user", nodes=2).up()


def test_down_removes_every_namespace_link_and_file(sandbox):
    hosts = etc_hosts()
    namespaces = [sandbox.network.node(i).namespace for i in range(2)]
    assert all((NETNS_ETC / ns / "hosts").exists() for ns in namespaces)
    status = sandbox.down()
    assert status.stopped
    assert sandbox.network.nodes() == [] and not sandbox.network.exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"dp{sandbox.network.tag}" not in links
    assert not any((NETNS_ETC / ns).exists() for ns in namespaces)
    assert etc_hosts() == hosts
    marker = f"SLURM_CONF={sandbox.conf}".encode()
    left = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
            if marker in _environ(pid) and _comm(pid) in ("slurmd", "slurmctld", "slurmstepd")]
    assert left == []
    assert sandbox.down().stopped  # and again


def _environ(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
