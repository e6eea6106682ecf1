"""Placement discovery from each launcher's variables (pure functions of an environment)."""

from pathlib import Path

from downpour_lib.launch_env import (
    Placement,
    discover,
    expand_nodelist,
    slurm_local_size,
    slurm_rendezvous,
)


def test_single_process():
    assert discover({}) == Placement(0, 1, 0, 1, "single")


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert discover(env) == Placement(3, 8, 1, 2, "mpi")


def test_mpich_hydra():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert discover(env) == Placement(2, 4, 0, 2, "mpi")


def test_srun_with_pmix():
    env = {"PMIX_RANK": "5", "SLURM_STEP_NUM_TASKS": "6", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_NODEID": "2"}
    assert discover(env) == Placement(5, 6, 1, 2, "mpi")


def test_srun_without_mpi():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1", "SLURM_JOB_ID": "77"}
    assert discover(env) == Placement(3, 4, 0, 1, "slurm")


def test_sbatch_script_alone_is_one_process():
    # The batch step has SLURM_PROCID and SLURM_NTASKS but runs a single process.
    assert discover({"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1"}).world_size == 1


def test_torchrun_wins_over_surrounding_slurm():
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    assert discover(env) == Placement(5, 8, 1, 4, "torchrun")


def test_plain_env_variables():
    assert discover({"RANK": "1", "WORLD_SIZE": "2"}) == Placement(1, 2, 0, 1, "env")


def test_nodelist_expansion():
    assert expand_nodelist("gpu[01-03,07],login") == ["gpu01", "gpu02", "gpu03", "gpu07", "login"]
    assert expand_nodelist("node7") == ["node7"]
    assert expand_nodelist("a[9-11]") == ["a9", "a10", "a11"]


def test_tasks_per_node():
    assert slurm_local_size({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}) == 1
    assert slurm_local_size({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"}) == 2
    assert slurm_local_size({}) is None


def test_slurm_rendezvous_is_first_host_and_a_stable_port():
    env = {"SLURM_STEP_NODELIST": "gpu[04-05]", "SLURM_JOB_ID": "123", "SLURM_STEP_ID": "0"}
    addr, port = slurm_rendezvous(env)
    assert addr == "gpu04" and 20000 <= port < 32000
    assert slurm_rendezvous(env) == (addr, port)
    other = slurm_rendezvous({**env, "SLURM_JOB_ID": "124"})[1]
    assert other != port
    assert slurm_rendezvous({**env, "MASTER_ADDR": "h", "MASTER_PORT": "1234"}) == ("h", 1234)


def test_slurm_rendezvous_ports_are_never_ephemeral_ones():
    """A store on a port the kernel hands to outgoing connections can find it taken: job 3's
    34075 failed to listen (EADDRINUSE) under make test. No job's port is in this machine's
    ephemeral range (or in Linux's default one, 32768-60999, where /proc does not say)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except OSError:
        low, high = 32768, 60999
    ports = {slurm_rendezvous({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": str(step)})[1]
             for job in range(1, 2000) for step in range(3)}
    assert len(ports) > 4000 and not any(low <= p <= high for p in ports), (low, high)
