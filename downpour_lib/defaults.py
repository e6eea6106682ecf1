"""Defaults that layers with no common config need, each written once (a default written twice
drifts). A config field's default lives on its field; it is read from here only where a layer
below the config (comm/, the cluster's engines) needs the same value.
"""

#: Seconds a rank waits for a silent peer before its collective fails: the timeout of every
#: process group downpour creates (``System.timeout_s``, ``runtime.init``, a cluster job's world).
#: Minutes, not torch's 30: a dead rank should end a run while someone is still watching.
TIMEOUT_S = 300.0
#: Seconds a rank waits for the others to start: MPI's initialization and the rendezvous, up to
#: the process group (``Runtime.startup_timeout_s``, ``runtime.init``). Apart from ``TIMEOUT_S``:
#: a job of many nodes (or ranks on a loaded machine) can take minutes to start, where a peer that
#: goes silent in training should end the job as soon as ``--timeout-s`` says.
STARTUP_TIMEOUT_S = 300.0
#: Seconds torch gives a process group made without a timeout (``torch.distributed.
#: default_pg_timeout``, 30 minutes): the ``mpi`` backend's, and the bench's yardstick backends',
#: wherever torch hands them none, so that a script's ``init_process_group("mpi")`` waits as long
#: as with torch's own backends. Downpour's groups always get ``TIMEOUT_S``.
TORCH_TIMEOUT_S = 1800.0
#: Seconds one launched run (a study's or a benchmark's ``downpour train`` under mpiexec or on the
#: sandbox) may take before it is given up and its ranks are stopped.
RUN_TIMEOUT_S = 900.0
#: Seconds a notebook or study waits for a cluster's engines to register (``start_cluster``,
#: ``connect``, ``use_cluster``, ``ClusterSession``); a Slurm job that sits in the queue needs more.
ENGINES_TIMEOUT_S = 120.0
#: Seconds ``downpour evaluate --watch`` (``evaluator.run``) waits between looks for a new checkpoint.
EVAL_POLL_S = 2.0
