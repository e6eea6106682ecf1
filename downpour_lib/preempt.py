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
  step, and its servers tell the others in their replies (``Algorithm.points``).

Then one checkpoint is written the usual way (atomically, by the evaluator), every rank learns that
the run stopped early from one last vote, rank 0 runs ``scontrol requeue $SLURM_JOB_ID``, and every
rank exits with status ``PREEMPTED``. The requeued job starts the same script again; ``--resume
auto`` (the default in a Slurm job) continues from the newest checkpoint of the same configuration.
(cluster_profiles/launch_multinode.sbatch requeues the job itself, once the ranks have exited and
their last words are in the log: ``DOWNPOUR_BATCH_REQUEUES=1``.)

SIGTERM, as torchrun and Lightning treat it: ``scancel``, the hard time limit and a preemption
without ``send_user_signal`` send it, then SIGKILL after KillWait. ``downpour train`` stops at the
next step boundary the same way, writes the checkpoint (atomically: one the KILL cuts short leaves
the previous one), and exits with ``TERMINATED`` (128 + 15, what the signal's default action gives)
without requeueing: after a TERM, a requeue is Slurm's to make.

A requeued start that made no progress (stopped at the step it began at) is not requeued again: the
signal comes at every start (a time limit not longer than the lead, or a preemption at once), and
requeueing would loop forever; it exits with ``STALLED``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from ._early import EARLY_SIGNALS, HELD  # `downpour train` holds the signal while it starts
from .errors import ConfigError

if TYPE_CHECKING:  # torch and comm only where a run votes: config's checks import this module
    import torch

    from .comm.runtime import DistContext
    from .comm.vote import Control

#: The exit status of a rank that stopped for a preemption signal, with its checkpoint written
#: (sysexits' EX_TEMPFAIL: "a temporary failure; the user is invited to retry").
PREEMPTED = 75
#: The exit status of a rank that stopped for SIGTERM (after its checkpoint), as if killed by it.
TERMINATED = 128 + signal.SIGTERM
#: The exit status of a requeued start that was preempted before it took a step: not requeued.
STALLED = 1
#: ``preempt_signal``'s choices; none: no handler and no vote (the signal's default action).
SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP", "none")


def check_signal(name: str) -> str:
    if name not in SIGNALS:
        raise ConfigError("preempt_signal", name,
                          f"choose one of {', '.join(SIGNALS)} (USR2 is Slurm's and submitit's "
                          "convention: sbatch --signal=USR2@120)")
    return name


class Preempted(Exception):  # noqa: N818 -- an outcome, not an error: the job is to be requeued
    """The run stopped early for a preemption signal (``terminated``: for SIGTERM), after
    ``completed`` steps, having started at step ``started``; ``checkpoint`` is the one it wrote
    (None if it stopped before its first step, or has no checkpoint_dir)."""

    def __init__(self, completed: int, total: int, checkpoint: str | None, started: int = 0,
                 terminated: bool = False) -> None:
        self.completed, self.total, self.checkpoint = completed, total, checkpoint
        self.started, self.terminated = started, terminated
        where = (f"checkpoint {checkpoint}" if checkpoint else
                 "no checkpoint (it stopped before its first step: a resumed run starts from "
                 "scratch)" if completed == 0 else "no checkpoint (no checkpoint_dir was given)")
        what = "stopped by SIGTERM" if terminated else "preempted"
        super().__init__(f"{what} after {completed} of {total} steps; {where}")


class StopSignal:
    """The process's preemption flag, set by the signal handler (and by nothing else in a run)."""

    def __init__(self) -> None:
        # plain attributes, not threading.Event: a handler that takes a lock can be interrupted
        # by the next signal inside it, whose handler then waits for that lock forever, running
        # each further signal's handler inside its wait, one stack level more each time, to a
        # RecursionError (a storm of USR2 every 5 ms did that to a rank in CI)
        self._stop = self._term = False
        self.installed: str | None = None
        #: SIGTERM stops the run too (``downpour train`` sets it; a notebook's engine, which
        #: ``ipcluster stop`` ends with TERM, does not)
        self.term_stops = False
        self._term_before: object = None  # TERM's handler before ours, while ours is installed

    def install(self, name: str) -> bool:
        """Handle signal ``name`` (one of ``SIGNALS``) by setting the flag; False if it cannot be
        done here (not the main thread, e.g. a worker thread of a notebook kernel)."""
        check_signal(name)
        if name == "none":
            self._release_early_hold()
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        if self.term_stops and name != "TERM" and self._term_before is None:
            self._term_before = signal.signal(signal.SIGTERM, self._handle_term)
        if name == self.installed:
            return True
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
        # only a flag, set without a lock: the rank may be inside a collective, a push or a
        # checkpoint write, or inside this handler for the signal before
        self._stop = True

    def _handle_term(self, signum: int, frame) -> None:
        self._term = True
        self._stop = True

    def requested(self) -> bool:
        return self._stop

    def ignore(self) -> None:
        """The run is over: its signal is ignored from now on (Python's exit would give it back its
        default action, and a late one, e.g. the second of two, would kill the rank mid-exit,
        with another status than the one the run chose). ``install`` takes it again."""
        if self.installed is not None and threading.current_thread() is threading.main_thread():
            signal.signal(getattr(signal, f"SIG{self.installed}"), signal.SIG_IGN)
            self.installed = None

    def terminated(self) -> bool:
        """Whether the stop was asked by SIGTERM (no requeue) rather than the preemption signal."""
        return self._term

    def clear(self) -> None:
        """Forget a signal (a run that was stopped by it is over; the next one starts clean)."""
        self._stop = self._term = False

    @contextlib.contextmanager
    def stopping_on_term(self) -> Iterator[None]:
        """SIGTERM stops a run in the block too (``downpour train``); after it, TERM has its
        handler from before again (a process that calls ``cli.main`` goes on)."""
        self.term_stops = True
        try:
            yield
        finally:
            self.term_stops = False
            if self._term_before is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._term_before)
                self._term_before = None


#: The flag of this process; ``Trainer`` installs its handler, the agreement reads it.
SIGNAL = StopSignal()


def control_group(ctx: DistContext) -> Control | None:
    """The vote's side channel (``comm.vote``): collective, the same on every rank."""
    from .comm.vote import control_group

    return control_group(ctx)


def vote(control: Control | None, mine: bool) -> bool:
    """Whether any rank says yes; blocking, on every rank."""
    return mine if control is None else bool(control.vote([float(mine)])[0])


def vote_stop(control: Control | None, signal_: StopSignal) -> tuple[bool, bool]:
    """Whether any rank has a stop signal, and whether any has SIGTERM; blocking, on every rank."""
    mine = [float(signal_.requested()), float(signal_.terminated())]
    stop, term = mine if control is None else control.vote(mine).tolist()
    return bool(stop), bool(term)


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


def restarts(env: Mapping[str, str] = os.environ) -> int:
    """How many times this Slurm job was requeued before this start (0: its first start)."""
    try:
        return int(env.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def note_preempted(env: Mapping[str, str] = os.environ) -> None:
    """Rank 0, before any rank exits: tell the batch script the run was preempted, in the file it
    names (``DOWNPOUR_PREEMPTED_FILE``). The ranks' exit status alone does not survive srun: the
    first rank to exit 75 makes ``srun --kill-on-bad-exit`` kill the others mid-exit."""
    path = env.get("DOWNPOUR_PREEMPTED_FILE")
    if path:
        from .checkpoint import atomic_write_text

        try:
            atomic_write_text(path, f"{PREEMPTED}\n")
        except OSError as exc:
            say(f"could not write {path} ({exc}): the batch script may not requeue the job")


def batch_requeues(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the batch script requeues the job once the ranks exit with PREEMPTED
    (cluster_profiles/launch_multinode.sbatch does, so the ranks' last words reach the log first:
    a requeue ends the job's steps at once, with what srun had not yet written)."""
    return env.get("DOWNPOUR_BATCH_REQUEUES") == "1"


def _clock(text: str) -> int | None:
    """Seconds in a Slurm duration ([days-]hours:minutes:seconds, minutes:seconds)."""
    days, _, rest = text.rpartition("-")
    try:
        parts = [int(p) for p in rest.split(":")]
        seconds = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
        return seconds + 86400 * int(days or 0)
    except ValueError:
        return None


def time_left(env: Mapping[str, str] = os.environ) -> tuple[int, str] | None:
    """Seconds until this Slurm job's end time, and its time limit as Slurm shows it; None outside
    a job, without scontrol, or with no limit."""
    job, scontrol = env.get("SLURM_JOB_ID"), shutil.which("scontrol")
    if not job or scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True, text=True,
                             timeout=60, env=dict(env)).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    limit, end = fields.get("TimeLimit", ""), fields.get("EndTime", "")
    if limit in ("", "UNLIMITED", "Partition_Limit") or _clock(limit) is None:
        return None
    try:  # scontrol shows the controller's local time; this node's clock is the same one
        ends = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return int(ends - time.time()), limit


def check_time_limit(lead_s: int, env: Mapping[str, str] = os.environ) -> None:
    """Refuse a job whose time left is not longer than the lead of its time-limit signal
    (``--signal=USR2@lead_s``): the signal would come at start-up, and every requeued start would
    stop at once. ConfigError says what to set; nothing outside a Slurm job with a time limit."""
    found = time_left(env)
    if found is None or lead_s <= 0:
        return
    left, limit = found
    if left > lead_s:
        return
    raise ConfigError("time limit", limit,
                      f"this job has {max(left, 0)} s left, not more than the {lead_s} s lead of its "
                      f"time-limit signal (--signal=USR2@{lead_s}): the signal would come as it "
                      f"starts, and each requeued start would stop before it trains. Give sbatch "
                      f"a --time well past the lead (e.g. --time={_hms(lead_s + 600)}: 10 minutes "
                      f"of training per start), or a shorter lead (--signal=USR2@N, N a little "
                      f"more than one step and one checkpoint write, and less than {max(left, 0)})")


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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
