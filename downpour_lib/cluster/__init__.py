"""ipyparallel clusters whose engines are MPI ranks: profiles, start/connect, run a config on all engines.

For example::

    from downpour_lib.cluster import use_cluster
    with use_cluster("local-mpi", n=3) as cluster:  # the running cluster of the profile, or a new one
        result = cluster.train(TrainConfig(algorithm="sync_ps", steps=50))   # rank 0's RunResult
"""

from ..errors import ClusterError
from .failures import ClusterRunError, ClusterTimeout, EngineFailure
from .profiles import ensure_profile, install_profiles
from .session import ClusterSession
from .start import connect, running_clusters, start_cluster, stop_clusters, use_cluster

__all__ = ["ClusterError", "ClusterRunError", "ClusterSession", "ClusterTimeout", "EngineFailure",
           "connect", "ensure_profile", "install_profiles", "running_clusters", "start_cluster",
           "stop_clusters", "use_cluster"]
