"""`downpour profiles install`: idempotent, never overwrites the user's edits without --force, and the
installed profiles are the ones ipyparallel loads."""

import stat

import pytest
from conftest import downpour, explain

from downpour_lib.cluster.launchers import SlurmMPIEngineSetLauncher
from downpour_lib.cluster.profiles import BUNDLED, ensure_profile, install_profiles
from downpour_lib.errors import ConfigError


def actions(result):
    return {(a.profile, a.file): a.what.split(" ")[0] for a in result}


def test_install_is_idempotent_and_keeps_user_edits(tmp_path):
    first = actions(install_profiles(ipython=tmp_path))
    assert set(first) >= {("local-mpi", "ipcluster_config.py"), ("slurm-mpi", "ipcluster_config.py"),
                          ("local-mpi", "ipengine_config.py"), ("slurm-mpi", "ipengine_config.py"),
                          ("slurm-mpi", "ipcontroller_config.py")}
    assert set(first.values()) == {"installed"}
    for (profile, name) in first:
        assert (tmp_path / f"profile_{profile}" / name).read_bytes() == \
            (BUNDLED / f"profile_{profile}" / name).read_bytes()
    assert set(actions(install_profiles(ipython=tmp_path)).values()) == {"unchanged"}

    mine = tmp_path / "profile_slurm-mpi" / "ipcluster_config.py"
    mine.write_text(mine.read_text() + '\nc.SlurmMPIEngineSetLauncher.partition = "gpu"\n')
    again = actions(install_profiles(ipython=tmp_path))
    assert again[("slurm-mpi", "ipcluster_config.py")] == "kept"
    assert 'partition = "gpu"' in mine.read_text()
    forced = actions(install_profiles(["slurm-mpi"], ipython=tmp_path, force=True))
    assert forced[("slurm-mpi", "ipcluster_config.py")] == "overwritten"
    assert 'partition = "gpu"' not in mine.read_text()


def test_a_newer_bundled_file_updates_an_unedited_install(tmp_path):
    source = tmp_path / "source"
    (source / "profile_demo").mkdir(parents=True)
    bundled = source / "profile_demo" / "ipcluster_config.py"
    bundled.write_text("c = get_config()\n")
    ipython = tmp_path / "ipython"
    install_profiles(ipython=ipython, source=source)
    bundled.write_text("c = get_config()\nc.Cluster.n = 4\n")  # a new version of downpour
    assert actions(install_profiles(ipython=ipython, source=source)) == {
        ("demo", "ipcluster_config.py"): "updated"}
    assert (ipython / "profile_demo" / "ipcluster_config.py").read_text() == bundled.read_text()


def test_starting_a_cluster_brings_an_unedited_profile_up_to_date(tmp_path):
    """ensure_profile (what start_cluster calls) updates an install an older downpour left, whose
    imports may be gone, and keeps a profile the user edited."""
    source = tmp_path / "source"
    (source / "profile_demo").mkdir(parents=True)
    bundled = source / "profile_demo" / "ipcluster_config.py"
    bundled.write_text("from downpour_lib.comm.mpiexec import find_mpiexec\n")  # the old module
    ipython = tmp_path / "ipython"
    installed = ensure_profile("demo", ipython, source) / "ipcluster_config.py"
    assert installed.read_text() == bundled.read_text()
    bundled.write_text("from downpour_lib.cluster.mpiexec import find_mpiexec\n")  # an upgrade
    assert ensure_profile("demo", ipython, source) / "ipcluster_config.py" == installed
    assert installed.read_text() == bundled.read_text()
    installed.write_text(installed.read_text() + "c.Cluster.n = 4\n")  # the user's edit stays
    bundled.write_text("c = get_config()\n")
    ensure_profile("demo", ipython, source)
    assert installed.read_text().endswith("c.Cluster.n = 4\n")
    with pytest.raises(ConfigError, match="profile='nope'.*demo"):
        ensure_profile("nope", ipython, source)


def test_unknown_profile_names_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="profile='nope'.*local-mpi, slurm-mpi"):
        install_profiles(["nope"], ipython=tmp_path)


def test_connect_to_a_profile_that_is_none_names_the_bundled_ones(tmp_path, monkeypatch):
    """connect("slurm") told the user to `ipcluster start --profile=slurm`, which makes a profile
    of local, non-MPI engines; an unknown name now gets the bundled ones, the closest first."""
    from downpour_lib.cluster import connect
    from downpour_lib.errors import ClusterError

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    with pytest.raises(ClusterError, match=r"^no profile 'slurm': did you mean 'slurm-mpi'\? the "
                                           r"bundled ones are local-mpi, slurm-mpi"):
        connect("slurm")
    with pytest.raises(ClusterError, match=r"^no running cluster for profile 'slurm-mpi': start one "
                                           r"with `ipcluster start --profile=slurm-mpi"):
        connect("slurm-mpi")


def test_cli_installs_where_ipcluster_looks(tmp_path):
    proc = downpour("profiles", "install", "--ipython-dir", str(tmp_path))
    assert proc.returncode == 0 and "installed" in proc.stdout, explain(proc)
    assert "unchanged" in downpour("profiles", "install", "--ipython-dir", str(tmp_path)).stdout

    from ipyparallel import Cluster

    # what `ipcluster start --profile=slurm-mpi` loads: our launcher, CurveZMQ, all interfaces
    cluster = Cluster(profile_dir=str(tmp_path / "profile_slurm-mpi"))
    assert cluster.engine_launcher_class is SlurmMPIEngineSetLauncher
    assert cluster.controller_ip == "0.0.0.0"
    controller = (tmp_path / "profile_slurm-mpi" / "ipcontroller_config.py").read_text()
    assert "c.IPController.enable_curve = True" in controller
    local = Cluster(profile_dir=str(tmp_path / "profile_local-mpi"))
    assert local.engine_launcher_class.__name__ == "MPIEngineSetLauncher"
    assert local.controller_ip == "127.0.0.1"


def test_the_engine_job_script_carries_the_site_settings(tmp_path):
    launcher = SlurmMPIEngineSetLauncher(profile_dir=str(tmp_path), cluster_id="t")
    launcher.partition, launcher.account, launcher.timelimit = "gpu", "proj1", "02:00:00"
    launcher.gpus_per_node = 4
    launcher.setup = ["module load openmpi/5"]
    launcher.engine_cmd = ["python", "-m", "ipyparallel.engine"]
    launcher.write_batch_script(8)
    script = (tmp_path / "slurm_engine-t.sbatch").read_text()
    for line in ("#SBATCH --ntasks=8", "#SBATCH --partition=gpu", "#SBATCH --account=proj1",
                 "#SBATCH --time=02:00:00", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --signal=B:USR2@120", "module load openmpi/5",
                 """trap 'kill -USR2 "$engines" 2>/dev/null' USR2"""):  # preemption reaches the engines
        assert line in script.splitlines(), script
    launch = next(line for line in script.splitlines() if "ipyparallel.engine" in line).split()
    assert launch[1:5] == ["-n", "8", "--bind-to", "none"] and launch[-5:] == [
        "python", "-m", "ipyparallel.engine", "--mpi", "&"]
    assert stat.S_IMODE((tmp_path / "slurm_engine-t.sbatch").stat().st_mode) == 0o700

    launcher.mpi_launcher = "srun"
    launcher.write_batch_script(8)
    script = (tmp_path / "slurm_engine-t.sbatch").read_text()
    assert "srun --mpi=pmix python -m ipyparallel.engine --mpi &" in script.splitlines()
    launcher.preempt_lead = 0
    launcher.write_batch_script(8)
    assert "#SBATCH --signal" not in (tmp_path / "slurm_engine-t.sbatch").read_text()


def test_engines_per_node_is_for_batch_profiles_and_must_divide_the_engines():
    from downpour_lib.cluster import start_cluster

    with pytest.raises(ConfigError, match="engines_per_node=1 .* starts every engine on this machine"):
        start_cluster("local-mpi", 2, engines_per_node=1)
    with pytest.raises(ConfigError, match="engines_per_node=2 .* divides n=3"):
        start_cluster("slurm-mpi", 3, engines_per_node=2)
