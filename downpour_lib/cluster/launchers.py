"""The ipyparallel engine launcher of the ``slurm-mpi`` profile: all engines in ONE sbatch job.

ipyparallel's own ``SlurmEngineSetLauncher`` runs ``srun ipengine`` without MPI, so engines would not
be MPI ranks. Here the job's one step is ``mpiexec -n N ipengine --mpi`` (or ``srun --mpi=pmix``), so
engine rank = MPI rank = torch rank, and the runtime's rendezvous goes over that MPI world.

Every site setting is a configurable trait, set in the profile's ``ipcluster_config.py`` and
overridable on the command line, e.g.
``ipcluster start --profile=slurm-mpi -n 16 --SlurmMPIEngineSetLauncher.partition=gpu
--SlurmMPIEngineSetLauncher.gpus_per_node=4 --SlurmMPIEngineSetLauncher.mpi_launcher=srun``.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from ipyparallel.cluster.launcher import SlurmEngineSetLauncher
from traitlets import Enum, Integer, List, Unicode, default, observe

from ..errors import DownpourError
from .mpiexec import MPIExecNotFound, find_mpiexec

TEMPLATE = """#!/bin/bash
# ipyparallel engines for downpour: one job of {n} MPI ranks (engine rank = MPI rank = torch rank).
#SBATCH --job-name=ipengine-{cluster_id}
#SBATCH --ntasks={n}
#SBATCH --output={output_file}
#SBATCH --export=ALL
{sbatch_lines}
{setup_lines}
# In the background, so that this shell can pass a USR2 (--signal=B:USR2@T: the time limit is near,
# or a preemption where the site sets PreemptParameters=send_user_signal) on to the engines: a run on
# them checkpoints and stops.
{launch} {program_and_args} &
engines=$!
trap 'kill -USR2 "$engines" 2>/dev/null' USR2
while :; do
    wait "$engines" && status=0 || status=$?
    kill -0 "$engines" 2>/dev/null || exit "$status"   # still running: the trap only ended wait
done
"""


class SlurmCommandError(DownpourError):
    """sbatch (or scancel) failed: the message is what it said."""


class SlurmMPIEngineSetLauncher(SlurmEngineSetLauncher):
    """Engines submitted as one sbatch job whose tasks are the ranks of one MPI world."""

    entrypoint_name = "slurm-mpi"

    partition = Unicode("", config=True, help="Slurm partition (sbatch --partition); '' = the default")
    gpus_per_node = Integer(0, config=True, help="GPUs per node (sbatch --gpus-per-node); 0 = none")
    tasks_per_node = Integer(0, config=True,
                             help="engines per node (sbatch --ntasks-per-node); 0 = gpus_per_node "
                                  "when GPUs are asked for, else Slurm's choice")
    cpus_per_task = Integer(0, config=True, help="cores per engine (sbatch --cpus-per-task); 0 = 1")
    sbatch_args = List(Unicode(), config=True,
                       help="more sbatch options, one per #SBATCH line, e.g. ['--constraint=a100']")
    setup = List(Unicode(), config=True,
                 help="shell lines run in the job before the engines start: module loads, "
                      "conda or venv activation, exports")
    mpi_launcher = Enum(["mpiexec", "srun"], "mpiexec", config=True,
                        help="start the engines with mpiexec (any MPI) or srun (needs Slurm's PMIx "
                             "plugin and an MPI built with PMIx)")
    mpiexec = List(Unicode(), config=True, help="the mpiexec command (default: the one next to this "
                                                "Python, else mpiexec on PATH in the job)")
    mpiexec_args = List(Unicode(), ["--bind-to", "none"], config=True,
                        help="mpiexec options (the count comes from -n)")
    srun_args = List(Unicode(), ["--mpi=pmix"], config=True, help="srun options")
    preempt_lead = Integer(120, config=True,
                           help="seconds before the time limit at which Slurm sends USR2 (sbatch "
                                "--signal=B:USR2@T), on which a run on the engines checkpoints and "
                                "stops; one step plus one checkpoint write, with a margin; 0 = none")

    @default("mpiexec")
    def _default_mpiexec(self):
        try:
            return [find_mpiexec()]
        except MPIExecNotFound:
            return ["mpiexec"]

    @default("batch_template")
    def _default_batch_template(self):
        return TEMPLATE

    @observe("partition")
    def _partition_changed(self, change):
        self.queue = change["new"]  # ipyparallel calls it queue

    @default("program")
    def _default_program(self):
        return self.engine_cmd + ["--mpi"]  # the engine takes its id from its MPI rank

    @observe("engine_cmd")
    def _engine_cmd_changed(self, change):
        self.program = self._default_program()

    def sbatch_lines(self) -> list[str]:
        options = []
        for flag, value in (("--partition", self.partition or self.queue), ("--account", self.account),
                            ("--qos", self.qos), ("--time", self.timelimit)):
            if value:
                options.append(f"{flag}={value}")
        tasks_per_node = self.tasks_per_node or self.gpus_per_node
        if self.gpus_per_node:
            options.append(f"--gpus-per-node={self.gpus_per_node}")
        if tasks_per_node:
            options.append(f"--ntasks-per-node={tasks_per_node}")
        if self.cpus_per_task:
            options.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.preempt_lead:
            options.append(f"--signal=B:USR2@{self.preempt_lead}")
        return [f"#SBATCH {o}" for o in options + list(self.sbatch_args)]

    def launch_command(self, n: int) -> str:
        if self.mpi_launcher == "srun":
            return shlex.join(["srun", *self.srun_args])
        return shlex.join([*self.mpiexec, "-n", str(n), *self.mpiexec_args])

    def _run_command(self, command, **kwargs):
        """ipyparallel's, with the command's own words kept: its ``check_output`` lets stderr
        through to the terminal and raises a bare ``CalledProcessError`` ("returned non-zero exit
        status 1"), which is all a notebook shows of "Unable to contact slurm controller"."""
        self.log.debug("Running command: %s", shlex.join(command))
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, **kwargs)
        if proc.returncode != 0:
            said = (proc.stderr + proc.stdout).decode("utf8", "replace").strip()
            conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
            hint = ("; is Slurm running, and is this its configuration "
                    f"(SLURM_CONF={conf})? `sinfo` says whether its controller answers"
                    if "contact slurm controller" in said else
                    f"; this host has no Slurm configuration (SLURM_CONF={conf}): run it on the "
                    "cluster's login node, or try the profile on `downpour sandbox slurm up`, a "
                    "one-node Slurm (as root)"
                    if "configuration source" in said or "cannot stat file" in said else "")
            raise SlurmCommandError(f"{command[0]} failed (exit {proc.returncode}): "
                                    f"{said or 'no message'}{hint}")
        return proc.stdout.decode("utf8", "replace")

    def start(self, n=1):
        try:
            return super().start(n)
        except SlurmCommandError as exc:
            _end_ipcluster(exc)
            raise

    def stop(self):
        """scancel the job; when none was submitted (sbatch failed) there is nothing to cancel,
        and the batch script, never submitted, goes too (ipyparallel ran ``scancel ''``, whose
        failure hid sbatch's and left the cluster's files behind)."""
        if self.job_id:
            return super().stop()
        if getattr(self, "batch_file", None) and os.path.exists(self.batch_file):
            os.remove(self.batch_file)
        output = "no job was submitted"
        self.notify_stop({"job_id": "", "output": output})
        return output

    def write_batch_script(self, n=1):
        # Next to the profile (not in the working directory), one per cluster: read it to see
        # exactly what was submitted.
        suffix = f"-{self.cluster_id}" if self.cluster_id else ""
        self.batch_file = os.path.join(self.profile_dir, f"slurm_engine{suffix}.sbatch")
        self.context.update(sbatch_lines="\n".join(self.sbatch_lines()),
                            setup_lines="\n".join(self.setup), launch=self.launch_command(n))
        return super().write_batch_script(n)


def _end_ipcluster(exc: SlurmCommandError) -> None:
    """Under ``ipcluster start`` (a Python caller gets the error instead), stop the controller and
    exit 1 with what sbatch said: ipyparallel's app logs a failed start inside its event loop and
    goes on waiting for engines that will never come, ``--daemonize`` too, which should return
    (it waited until killed, with no slurm.conf or an impossible --gpus-per-node)."""
    from ipyparallel.cluster.app import IPClusterStart

    from .processes import controller_session, end_session

    if not IPClusterStart.initialized():
        return
    app = IPClusterStart.instance()

    async def end() -> None:
        import asyncio

        await asyncio.sleep(0)  # after ipyparallel has logged the failed start: ours is the last word
        session = controller_session(app.cluster)
        try:
            await app.cluster.stop_cluster()
        finally:
            end_session(session)
        app.log.critical("the engines' job was not submitted, so ipcluster stops: %s", exc)
        raise SystemExit(1)

    app.loop.add_callback(end)
