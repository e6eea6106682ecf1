"""A run's life around its loop: resuming, preemption, checkpoints, the trace, and the gather.

``engine.Trainer`` runs the steps; a ``Lifecycle`` does what happens before, between and after
them, at the moments the trainer names:

- on construction: restore the checkpoint the plan resumes from, install the preemption signal and
  build the vote's control group (collective: every rank builds it at the same moment);
- ``vote_to_start``: the ranks agree whether a signal came while they set up (then nothing new
  is saved and every rank raises ``Preempted``);
- ``at_point``: after a step every rank takes, stop at the step the ranks agreed on (writing the
  preemption checkpoint) or write a periodic/final checkpoint when due;
- ``end``: after the steps, the evaluator's stop is told to every rank, and they raise together;
- ``gather``: every rank's records (and trace) on rank 0, written out as the run's ``RunResult``.

How the ranks stop together is the options' declaration (``stopper``: a vote read ``stop_lag``
steps later, or ``stop_refusal``), and a checkpoint is written by the evaluator with every rank's
state, gathered collectively (``gather_states``), since every rank reaches the same points. An
algorithm whose ranks take no common steps does both by its own messages (``Algorithm.points``:
Downpour's workers hear the stop from the servers, and its evaluator fetches their shards).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import checkpoint, preempt, provenance, trace
from .checkpoint import atomic_write_text
from .comm.collectives import Comm
from .comm.runtime import DistContext
from .config import TrainConfig
from .options import AlgorithmOptions, Roles
from .precision import LossScaler
from .records import EvalRecord, RunResult, StepRecord, frames, summarize


class Stopped(Exception):  # noqa: N818 -- control flow: the loop ends at an agreed step
    """Raised out of a worker's steps or a server's loop after the preemption checkpoint."""

    def __init__(self, completed: int) -> None:
        super().__init__(completed)
        self.completed = completed


class Lifecycle:
    """One rank's resume, preemption, checkpoints and gather (module docstring). ``plan`` is
    ``planning.RunPlan``; ``model``, ``optimizer``, ``algorithm`` and ``scaler`` are what a
    checkpoint saves and a resumed run restores."""

    def __init__(self, config: TrainConfig, ctx: DistContext, plan: Any, comm: Comm,
                 algorithm: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: LossScaler | None, tracer: trace.Tracer | None) -> None:
        self.config, self.ctx, self.plan, self.comm = config, ctx, plan, comm
        self.algorithm, self.model, self.optimizer, self.scaler = algorithm, model, optimizer, scaler
        self.tracer, self.t_start = tracer, 0.0
        self.evaluating = ctx.rank == plan.roles.evaluator
        #: the training time of the runs this one continues: a checkpoint's time_s sums them, so
        #: that the evaluator's time-to-accuracy goes on across a resume instead of restarting
        self.time_before = 0.0
        if plan.resume_path is not None:
            state = checkpoint.load(plan.resume_path)
            checkpoint.restore(state, ctx.rank, model, optimizer, algorithm, scaler)
            self.time_before = float(state.get("time_s", 0.0))
            if ctx.rank == 0:
                print(f"downpour: resumed from {plan.resume_path}: {plan.start_step} of "
                      f"{plan.total_steps} steps done, continuing at step {plan.start_step}"
                      + ("" if config.outputs.checkpoint_dir else
                         "; writing no checkpoints (a run resumed from a file writes them only "
                         "to a checkpoint_dir given)"), file=sys.stderr, flush=True)
        # preemption: a signal sets a flag; the ranks agree to stop at a step (``preempt``)
        self.signal, self.control, self.stopper = preempt.SIGNAL, None, None
        if config.runtime.preempt_signal != "none":
            self.signal.install(config.runtime.preempt_signal)
            self.control = preempt.control_group(ctx)  # collective, the same on every rank
            points = self.algorithm.points
            self.stopper = (points.stopper(self.signal) if points is not None
                            else stopper(config.options, self.control, self.signal))

    # -- preemption --------------------------------------------------------------------------

    def vote_to_start(self) -> None:
        """Every rank, before the first step: raise ``Preempted`` on all if any was signalled
        while setting up (nothing new to save)."""
        stop, term = (preempt.vote_stop(self.control, self.signal) if self.stopper is not None
                      else (False, False))
        if stop:
            if self.control is not None:
                self.control.close()
            self.signal.clear()  # answered: a later run in this process starts clean
            plan = self.plan
            raise preempt.Preempted(plan.start_step, plan.total_steps, plan.resume_path,
                                    plan.start_step, term)

    def begin(self, t_start: float) -> None:
        """The steps start now (after the common barrier): every rank's clock starts here."""
        self.t_start = t_start
        if self.tracer is not None:
            self.tracer.t0 = t_start

    def at_point(self, step: int, last: bool) -> None:
        """After ``step``, on every rank that takes it: stop there if the ranks agreed to (the
        preemption checkpoint, then ``Stopped``), else checkpoint when due."""
        outputs = self.config.outputs
        if self.stopper is not None and not last and self.stopper.at_point(step):
            if outputs.checkpoint_dir:
                self.checkpoint(step + 1, final=False, over=True)
            raise Stopped(step + 1)
        if outputs.checkpoint_dir and (last or every(step, outputs.checkpoint_every)):
            self.checkpoint(step + 1, final=last)

    def end(self, stopped: Stopped | None) -> None:
        """After the steps, on every rank: whether the evaluator stopped early (its checkpoint is
        the run's), told to all; if it did, every rank raises ``Preempted``."""
        if self.stopper is None:
            return
        self.stopper.close()
        mine = stopped if self.evaluating else None
        verdict = [float(mine is not None), float(mine.completed if mine else 0),
                   float(self.signal.terminated())]  # any rank's TERM: no requeue
        if self.control is not None:
            verdict = self.control.vote(verdict).tolist()
            self.control.close()
        if verdict[0] > 0:
            completed = int(verdict[1])
            directory = self.config.outputs.checkpoint_dir
            path = str(checkpoint.checkpoint_path(directory, completed)) if directory else None
            self.signal.clear()
            raise preempt.Preempted(completed, self.plan.total_steps, path, self.plan.start_step,
                                    verdict[2] > 0)

    # -- checkpoints -------------------------------------------------------------------------

    def checkpoint(self, completed: int, final: bool, over: bool | None = None) -> None:
        """Save the state after ``completed`` steps: the evaluator writes its model and every
        rank's state, as the algorithm collects them. ``over``: no rank trains after this
        checkpoint (the last step, or a preemption): ``final`` unless told."""
        model = None
        if self.evaluating:
            with self.algorithm.eval_parameters(self.model) as evaluated:
                model = {k: v.detach().cpu().clone() for k, v in evaluated.state_dict().items()}
        def local() -> dict[str, Any]:
            return checkpoint.rank_state(self.model, self.optimizer, self.algorithm.state_dict(),
                                         self.scaler)

        points = self.algorithm.points
        ranks = (points.collect_states(local, final if over is None else over)
                 if points is not None else gather_states(self.comm, self.plan.roles, local))
        if ranks is None:
            return
        start = time.perf_counter()
        config, outputs = self.config.to_dict(), self.config.outputs
        checkpoint.save(outputs.checkpoint_dir, checkpoint.assemble(
            completed, final, self.time_before + time.perf_counter() - self.t_start, config,
            self.ctx.world_size, model, ranks))
        resumed = [self.plan.resume_path] if self.plan.resume_path else []
        checkpoint.prune(outputs.checkpoint_dir, outputs.keep_checkpoints,
                         self.config.held("match"), self.ctx.world_size, resumed)
        if self.tracer is not None:
            self.tracer.span(f"checkpoint {completed}", start, time.perf_counter())

    # -- results -----------------------------------------------------------------------------

    def gather(self, wall_s: float, step_records: list[StepRecord],
               eval_records: list[EvalRecord], extra: dict[str, Any] | None = None,
               derived: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> RunResult | None:
        """Every rank's records (and trace) on rank 0, which returns the run's result and writes
        its files; None elsewhere. ``extra``: more of the summary (emulated compute's times);
        ``derived``: fields computed from the summary (a language model's perplexity), added
        before ``summary.json`` is written."""
        events = self.tracer.export() if self.tracer is not None else None
        gathered = self.comm.gather_object((step_records, eval_records, events), root=0)
        if gathered is None:
            return None
        ctx, roles, outputs = self.ctx, self.plan.roles, self.config.outputs
        if outputs.trace:
            trace.write(Path(outputs.trace) / "trace.json",
                        [(r, f"rank {r} ({roles.role(r)})" + (
                            f" on {ctx.hosts[r]}" if r < len(ctx.hosts) else ""), part[2])
                         for r, part in enumerate(gathered)])
        steps, evals = frames([s for part in gathered for s in part[0]],
                              [e for part in gathered for e in part[1]])
        config = self.config.to_dict()
        summary = {
            **{k: v for k, v in config.items() if k != "options"},
            **{f"options.{k}": v for k, v in {**config["options"],
                                               **self.config.options.in_effect(roles)}.items()},
            "world_size": ctx.world_size,
            "num_servers": len(roles.dedicated_servers),
            **summarize(steps, evals, self.config.length.warmup_steps),
            "wall_s": wall_s,
            "total_steps": self.plan.total_steps,
            "start_step": self.plan.start_step,
            "backend": ctx.backend or "none",
            "device": str(ctx.device),
            "launcher": ctx.launcher,
            "torch_threads": torch.get_num_threads(),
            "hosts": ",".join(sorted(set(ctx.hosts))),
            **provenance.environment(),
            **(extra or {}),
        }
        if derived is not None:
            summary.update(derived(summary))
        result = RunResult(config, steps, evals, summary)
        if outputs.output_dir:
            out = Path(outputs.output_dir)
            if ctx.hosts and "rank" in steps:  # whose node: `downpour model spread` reads it
                steps = steps.assign(host=steps["rank"].map(dict(enumerate(ctx.hosts))))
            atomic_write_text(out / "steps.csv", steps.to_csv(index=False))
            atomic_write_text(out / "evals.csv", evals.to_csv(index=False))
            result.write_summary_json(str(out / "summary.json"))
        return result


def stopper(options: AlgorithmOptions, control: preempt.Control | None,
            signal: preempt.StopSignal) -> preempt.Stopper:
    """How ranks that take the same steps agree to stop early when ``signal`` arrives
    (preemption; ``control`` is a group of every rank for the purpose), as their options declare
    it: votes a fraction of a second apart, each read at least ``stop_lag`` steps later, so every
    rank stops after the same step; or, where the options give a ``stop_refusal``, never."""
    why = options.stop_refusal()
    if why is not None:
        return preempt.Unstoppable(signal, why)
    return preempt.StepVote(control, signal, lag=options.stop_lag)


def gather_states(comm: Comm, roles: Roles, local: Callable[[], dict[str, Any]]
                  ) -> dict[int, dict[str, Any]] | None:
    """At a checkpoint point, which every rank reaches: every rank's state (``local()`` on
    each), by rank, on the evaluator, which writes the checkpoint; None on the others."""
    parts = comm.gather_object(local(), root=roles.evaluator)
    return None if parts is None else dict(enumerate(parts))


def every(step: int, period: int | None) -> bool:
    """Whether ``step`` (from 0) ends a period of ``period`` steps (0 or None: never)."""
    return bool(period) and (step + 1) % period == 0
