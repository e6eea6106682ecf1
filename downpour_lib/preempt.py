"""Preemption and time limits: a signal asks the run to stop, the ranks agree on a step, checkpoint
together and exit with ``PREEMPTED``; in a Slurm batch job rank 0 first requeues it.

The conventions of submitit and Lightning's ``SLURMEnvironment(auto_requeue=True)``: Slurm sends
``SIGUSR2`` (``--signal=USR2@120``, sent that many seconds before the time limit; ``USR1`` is left
alone, as NCCL may catch it) and the handler does nothing but set a flag. Acting in the handler
would mean checkpointing from inside whatever the rank was doing (a collective, a push), on one rank
while the others go on. Instead the ranks agree at a step boundary:

* ranks that take the same steps (every algorithm but Downpour) vote: about every quarter second
  of steps every rank starts a MAX allreduce of its flag on a group of its own and reads the
  previous vote, which has long completed, so voting costs no waiting (``StepVote``). Every rank
  reads the same vote at the same step, so they stop together, within about half a second;
* Downpour's workers never wait for each other: a worker that has the signal stops at its next
  step, and its servers tell the others in their replies (``Algorithm.stopper``).

Then one checkpoint is written the usual way (atomically, by the evaluator), every rank learns that
the run stopped early from one last vote, rank 0 runs ``scontrol requeue $SLURM_JOB_ID``, and every
rank exits with status ``PREEMPTED``. The requeued job starts the same script again; ``--resume
auto`` (the default in a Slurm job) continues from the newest checkpoint of the same configuration.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import torch

from ._early import EARLY_SIGNALS, HELD  # `downpour train` holds the signal while it starts
from .comm.collectives import Communicator
from .comm.runtime import DistContext
from .errors import ConfigError

#: The exit status of a rank that stopped for a preemption signal, with its checkpoint written
#: (sysexits' EX_TEMPFAIL: "a temporary failure; the user is invited to retry").
PREEMPTED = 75
#: ``preempt_signal``'s choices; none: no handler and no vote (the signal's default action).
SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP", "none")


def check_signal(name: str) -> str:
    if name not in SIGNALS:
        raise ConfigError("preempt_signal", name,
                          f"choose one of {', '.join(SIGNALS)} (USR2 is Slurm's and submitit's "
                          "convention: sbatch --signal=USR2@120)")
    return name


class Preempted(Exception):  # noqa: N818 -- an outcome, not an error: the job is to be requeued
    """The run stopped early for a preemption signal, after ``completed`` steps; ``checkpoint`` is
    the one it wrote (None if it stopped before its first step, or has no checkpoint_dir)."""

    def __init__(self, completed: int, total: int, checkpoint: str | None) -> None:
        self.completed, self.total, self.checkpoint = completed, total, checkpoint
        where = (f"checkpoint {checkpoint}" if checkpoint else
                 "no checkpoint (it stopped before its first step: a resumed run starts from "
                 "scratch)" if completed == 0 else "no checkpoint (no checkpoint_dir was given)")
        super().__init__(f"preempted after {completed} of {total} steps; {where}")


class StopSignal:
    """The process's preemption flag, set by the signal handler (and by nothing else in a run)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.installed: str | None = None

    def install(self, name: str) -> bool:
        """Handle signal ``name`` (one of ``SIGNALS``) by setting the flag; False if it cannot be
        done here (not the main thread, e.g. a worker thread of a notebook kernel)."""
        check_signal(name)
        if name == "none":
            self._release_early_hold()
            return False
        if name == self.installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        signum = getattr(signal, f"SIG{name}")
        signal.signal(signum, self._handle)
        self.installed = name
        if HELD and HELD[0] != signum:  # held another (the flag's), given another by a config file
            self._release_early_hold()
        if signum in EARLY_SIGNALS:
            self._handle(signum, None)
        EARLY_SIGNALS.clear()
        HELD.clear()
        return True

    @staticmethod
    def _release_early_hold() -> None:
        """preempt_signal=none (from a config file; the flag is seen at once): the signal
        ``downpour train`` held while starting gets its default action back, and one that came
        meanwhile is delivered again."""
        if HELD and threading.current_thread() is threading.main_thread():
            signal.signal(HELD[0], signal.SIG_DFL)
            if HELD[0] in EARLY_SIGNALS:
                os.kill(os.getpid(), HELD[0])
            HELD.clear()

    def _handle(self, signum: int, frame) -> None:
        # only a flag: the rank may be inside a collective, a push or a checkpoint write
        self._event.set()

    def requested(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        """Forget a signal (a run that was stopped by it is over; the next one starts clean)."""
        self._event.clear()


#: The flag of this process; ``Trainer`` installs its handler, the agreement reads it.
SIGNAL = StopSignal()


class Control:
    """Every rank, for the votes alone, so they never interleave with an algorithm's own
    collectives (threads, DDP's hooks): a gloo group (its own thread completes a vote while the
    rank computes), or under the ``mpi`` backend a duplicate of its MPI communicator, on which a
    vote is MPI's nonblocking allreduce (the backend's queued collectives would keep its one thread
    spinning in a blocking allreduce for a whole step: half the throughput of a small model)."""

    def __init__(self, ctx: DistContext) -> None:
        self.group: Communicator | None = None
        self.mpi, self.timeout_s = None, ctx.timeout_s
        if ctx.backend == "mpi":
            from .comm.mpi import backend

            self.mpi = backend.world().Dup()  # collective: every rank, same order
        else:  # torch cannot add a gloo group to an MPI world, but can to any other
            from .comm.groups import new_group

            self.group = new_group(range(ctx.world_size), backend="gloo")

    def start(self, values: list[float]) -> Callable[[], torch.Tensor]:
        """A MAX allreduce of ``values`` started now; call the result to wait for it."""
        flags = torch.tensor(values, dtype=torch.float64)
        if self.mpi is not None:
            from mpi4py import MPI

            from .comm.mpi.liveness import wait_request

            out = torch.empty_like(flags)
            request = self.mpi.Iallreduce(flags.numpy(), out.numpy(), op=MPI.MAX)
            # the job's timeout, and the heartbeat's word on a silent rank, as every MPI wait here;
            # the closure holds both buffers until MPI is done with them
            return lambda: (wait_request(request, self.timeout_s, "the preemption vote"),
                            flags, out)[2]
        work = self.group.allreduce(flags, op="max", async_op=True, account=None)
        return lambda: (work.wait(), flags)[1]

    def vote(self, values: list[float]) -> torch.Tensor:
        return self.start(values)()

    def close(self) -> None:
        if self.mpi is not None:
            self.mpi.Free()
            self.mpi = None


def control_group(ctx: DistContext) -> Control | None:
    """The votes' ``Control``, None in a world of one. Collective: every rank, same order."""
    return Control(ctx) if ctx.world_size > 1 else None


def vote(control: Control | None, mine: bool) -> bool:
    """Whether any rank says yes; blocking, on every rank."""
    return mine if control is None else bool(control.vote([float(mine)])[0])


class Stopper:
    """When a rank stops early, decided at its step boundaries (``at_point``, after each step)."""

    def at_point(self, step: int) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """The run's steps are over: finish whatever is in flight (collective on every rank)."""


class Unstoppable(Stopper):
    """An algorithm whose ranks cannot stop together, and that writes no checkpoint to resume from
    (asynchronous EASGD: its server takes no steps): the signal is reported once, and the run goes
    on until the job ends."""

    def __init__(self, signal_: StopSignal, why: str) -> None:
        self.signal, self.why, self.told = signal_, why, False

    def at_point(self, step: int) -> bool:
        if self.signal.requested() and not self.told:
            say(f"preemption signal received, but {self.why}: the run goes on")
            self.told = True
        return False


class StepVote(Stopper):
    """Ranks that take the same steps stop at the same one. A vote is started at a step and read
    at the next vote's step, at least ``lag`` steps later, when it has long completed; votes are
    about ``interval_s`` apart (a tiny model's steps take a millisecond, and a vote on gloo a
    tenth of one). Each vote also carries the slowest rank's seconds per step, from which every
    rank computes the same step for the next vote, so they all read the same result at the same
    step, and stop after it: within about two intervals and two steps of the signal."""

    def __init__(self, control: Control | None, signal_: StopSignal, lag: int = 1,
                 interval_s: float = 0.25) -> None:
        self.control, self.signal = control, signal_
        self.lag, self.interval_s = max(1, lag), interval_s
        self.next: int | None = None  # the step of the next vote; None: the first point
        self.pending: Callable[[], torch.Tensor] | None = None
        self.since: tuple[int, float] | None = None  # the last vote's step and time

    def at_point(self, step: int) -> bool:
        if self.control is None:
            return self.signal.requested()
        if self.next is not None and step < self.next:
            return False
        gap = self.lag
        if self.pending is not None:
            stop, step_s = self.pending().tolist()
            if stop:
                self.pending = None
                return True
            if step_s > 0:  # every rank computes the same gap from the same result
                gap = max(self.lag, min(10_000, math.ceil(self.interval_s / step_s)))
        now = time.perf_counter()
        step_s = (now - self.since[1]) / (step - self.since[0]) if self.since else 0.0
        self.pending = self.control.start([float(self.signal.requested()), step_s])
        self.since, self.next = (step, now), step + gap
        return False

    def close(self) -> None:
        if self.pending is not None:  # started on every rank alike: none is left behind
            self.pending()
            self.pending = None


# -- Slurm ---------------------------------------------------------------------------------------

def in_slurm_job(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("SLURM_JOB_ID"))


def slurm_batch(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs inside a Slurm batch job (sbatch sets ENVIRONMENT=BATCH there;
    srun and salloc alone do not), where requeueing is what a preempted run wants."""
    return bool(env.get("SLURM_JOB_ID")) and env.get("ENVIRONMENT") == "BATCH"


def requeue(report: Callable[[str], None], env: Mapping[str, str] = os.environ) -> bool:
    """``scontrol requeue $SLURM_JOB_ID``: the job goes back to the queue and starts again (Slurm
    ends this allocation). Whether it worked; what went wrong is reported, not raised: the
    checkpoint is written, and resubmitting the script by hand resumes it just as well."""
    job = env.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if not job or scontrol is None:
        report("not requeued: " + ("no SLURM_JOB_ID" if not job else "no scontrol on PATH") +
               "; submit the same job again to resume")
        return False
    try:
        proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        report(f"scontrol requeue {job} failed ({exc}); submit the same job again to resume")
        return False
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        report(f"scontrol requeue {job} failed ({detail[-1] if detail else proc.returncode}): "
               "was the job submitted with --no-requeue? Submit it again to resume")
        return False
    report(f"requeued Slurm job {job} (scontrol requeue); it resumes from its checkpoint")
    return True


def say(message: str) -> None:
    print(f"downpour: {message}", file=sys.stderr, flush=True)
