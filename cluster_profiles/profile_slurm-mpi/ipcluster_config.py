# ipyparallel profile "slurm-mpi": the controller runs where you start it (a login node, or the node
# your notebook runs on); the engines are ONE sbatch job whose single step runs
# `mpiexec -n N ipengine --mpi` (or `srun --mpi=pmix ...`), so engine rank = MPI rank = torch rank.
#
#   downpour profiles install
#   ipcluster start --profile=slurm-mpi -n 16 --daemonize
#   ipcluster start --profile=slurm-mpi -n 8 --SlurmMPIEngineSetLauncher.partition=gpu \
#       --SlurmMPIEngineSetLauncher.gpus_per_node=4 --SlurmMPIEngineSetLauncher.timelimit=02:00:00
#
# Edit the SITE SETTINGS below once for your cluster; every one of them can also be overridden on the
# command line as --SlurmMPIEngineSetLauncher.NAME=VALUE. The generated job script is written to
# $IPYTHONDIR/profile_slurm-mpi/slurm_engine.sbatch (read it to see exactly what is submitted) and
# the engines' output to $IPYTHONDIR/profile_slurm-mpi/log/.
import socket

from downpour_lib.cluster.mpiexec import root_env

c = get_config()  # noqa: F821 -- ipyparallel provides get_config() when it loads this file

c.Cluster.engine_launcher_class = "slurm-mpi"  # downpour_lib.cluster.launchers.SlurmMPIEngineSetLauncher
# The engines register from compute nodes, so the controller listens on every interface of this
# machine and tells the engines to connect to this host's name. Traffic is encrypted and
# authenticated with CurveZMQ (see ipcontroller_config.py). If compute nodes reach this machine under
# another name or address (an InfiniBand or cluster-internal interface), put it in controller_location,
# and to listen on that interface only, put its address in controller_ip.
c.Cluster.controller_ip = "0.0.0.0"
c.Cluster.controller_location = socket.gethostname()
c.Cluster.engine_timeout = 600  # a job may wait in the queue; seconds to wait for the engines

# ---- SITE SETTINGS -----------------------------------------------------------------------------
L = c.SlurmMPIEngineSetLauncher
L.partition = ""          # e.g. "gpu"; "" = the cluster's default partition
L.account = ""            # e.g. "proj123"; "" = your default account
L.timelimit = "01:00:00"  # the job's wall-clock limit (sbatch --time)
L.gpus_per_node = 0       # e.g. 4: --gpus-per-node=4 and, unless tasks_per_node says otherwise,
L.tasks_per_node = 0      #   4 engines per node (one per GPU, cuda:<local rank>)
L.sbatch_args = []        # more #SBATCH lines, e.g. ["--constraint=a100", "--exclusive"]
L.mpi_launcher = "mpiexec"  # or "srun" (needs Slurm's PMIx plugin: srun --mpi=list)
L.srun_args = ["--mpi=pmix"]
L.mpiexec_args = ["--bind-to", "none"]
# Seconds before the time limit at which Slurm sends USR2: a run on the engines checkpoints (give
# TrainConfig a checkpoint_dir) and stops; cluster.restart_engines() and the same train() call resume.
L.preempt_lead = 120
# Shell lines run in the job before the engines start. The engines run this same Python
# (sys.executable), so on a shared file system nothing is needed; on most sites you load the MPI
# that mpi4py was built against, e.g.:
L.setup = [
    # "module load openmpi/5.0",
    # "source ~/miniforge3/etc/profile.d/conda.sh && conda activate downpour",
]
# -----------------------------------------------------------------------------------------------

# Open MPI refuses to run as root unless told (the test sandbox runs as root); empty otherwise.
L.environment = root_env()
