"""The training loop, one for every algorithm: data -> forward -> backward -> algorithm hooks -> records.

``Trainer`` takes a run's plan (``planning.plan_run``, made once by the entry point before any
rendezvous: ``downpour train`` on each rank, a cluster session on the client, ``train`` and
``make_trainer`` here through ``planning.prepare``) and runs the workers' loop, or on a server
rank the ``Server`` the algorithm's ``setup`` made there, and evaluates on the algorithm's
evaluator rank; the run's life around the loop (resume, preemption, checkpoints, trace, gather)
is ``lifecycle.Lifecycle``'s, the step an emulated worker sleeps is ``emulate``'s. The engine
names no option: what it needs of them is declared (``AlgorithmOptions.overflow``, the fp16
ranks' agreement to skip).

One path for every algorithm. A worker's step is a *point*; so is a server's update when it
completes the workers' step (a synchronous server says so from its loop, ``Server.serve``), not
when it applies one asynchronous push (Downpour's). At a point that is due, every rank there calls
``Algorithm.metrics(model)`` and the evaluator evaluates, then the lifecycle checkpoints or stops.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import preempt, trace, user_code
from .algorithms import algorithm_class
from .algorithms.base import Server, vote_overflow
from .comm.collectives import Comm
from .comm.runtime import DistContext
from .config import TrainConfig
from .data import ShardSampler, Splits, load_dataset
from .data.loader import TrainBatches, eval_batches, eval_indices, loader_batches
from .data.sources import ImageSource, is_language_model
from .emulate import EmulatedCompute, emulated_profile
from .errors import Diverged
from .lifecycle import Lifecycle, Stopped, every
from .models import build_model
from .planning import RunPlan, flush_denormals, prepare, quiet, warn
from .precision import LossScaler, autocast
from .progress import progress
from .records import (
    EvalRecord,
    Meter,
    RunResult,
    StepClock,
    StepRecord,
    device_sync,
)
from .schedule import LRSchedule, set_lr

StepCallback = Callable[[StepRecord], None]


def build_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    optim = config.optim
    if optim.optimizer == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum,
                               weight_decay=optim.weight_decay)
    if optim.optimizer == "adam":
        return torch.optim.Adam(params, lr=optim.lr, weight_decay=optim.weight_decay)
    if optim.optimizer == "adamw":  # decoupled weight decay (Loshchilov & Hutter 2019)
        return torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
    # TensorFlow's initial accumulator (0.1), not PyTorch's 0: with 0 the first update of every
    # weight is lr * sign(gradient), which asynchronous workers then repeat with stale gradients.
    return torch.optim.Adagrad(params, lr=optim.lr, weight_decay=optim.weight_decay,
                               initial_accumulator_value=0.1)


def default_threads(ctx: DistContext) -> int:
    """The node's cores shared among its ranks, so ranks do not fight over cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // ctx.local_world_size)


def task_loss(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of a classifier's logits (B, classes) against labels (B,), or of a language
    model's (B, T, vocabulary) against the next tokens (B, T): one rule, every position a term."""
    return F.cross_entropy(out.flatten(0, -2), y.flatten(), reduction=reduction)


def language_model_summary(summary: dict, context: int) -> dict[str, float]:
    """What a language model's run reports beside a classifier's: tokens/s and perplexity."""
    return {"tokens_per_s": summary["samples_per_s"] * context,
            "test_perplexity": math.exp(summary["test_loss"])
            if math.isfinite(summary["test_loss"]) else math.nan}


@torch.no_grad()
def evaluate(model: nn.Module, source: ImageSource, batch_size: int,
             device: torch.device, workers: int = 0, samples: int = 0) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over the whole split, or ``samples`` of it spread evenly
    over it (read by ``workers`` DataLoader workers where the source is read in workers); for a
    language model, per token (its perplexity is exp of the loss)."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in eval_batches(source, batch_size, workers, samples):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(x)
        loss_sum += task_loss(out, y, reduction="sum").item()
        correct += int((out.argmax(-1) == y).sum())
        count += y.numel()
    model.train(was_training)
    return loss_sum / count, correct / count


class Trainer:
    """One rank's part of a run. ``run()`` returns the full ``RunResult`` on rank 0, None elsewhere.
    The run's life around the steps (resume, preemption, checkpoints, trace, gather) is its
    ``Lifecycle``'s."""

    def __init__(self, config: TrainConfig, ctx: DistContext, plan: RunPlan,
                 splits: Splits | None = None, callbacks: Sequence[StepCallback] = (),
                 log_progress: bool = False) -> None:
        """``plan``: the entry point's pre-flight (``planning.plan_run``; ``make_trainer`` makes
        one). ``splits``: the data it was planned on, loaded here when not given (a cluster's
        engines, given the client's plan). ``log_progress``: where the reporting rank's stderr is
        not a terminal, print a progress line now and then (``progress.ProgressLines``; the
        command line's batch logs)."""
        if not isinstance(plan, RunPlan):  # e.g. the data first, as the signature once had it
            raise TypeError(f"Trainer takes the run's plan (planning.plan_run), not "
                            f"{type(plan).__name__}: make_trainer(config, ctx) plans the run and "
                            "makes its Trainer")
        self.ctx, self.callbacks, self.log_progress = ctx, list(callbacks), log_progress
        if ctx.device.type == "cpu":
            flush_denormals()  # first: before loading the data can start torch's worker threads
        self.splits = splits or load_dataset(config.data.dataset, config.data.data_dir)
        self.plan = plan
        self.config = config = plan.kept(config)
        torch.set_num_threads(config.system.threads or default_threads(ctx))
        self.meter = Meter(ctx.device)
        self.tracer = trace.Tracer(ctx.rank) if config.outputs.trace else None
        self.meter.tracer = self.tracer
        self.comm = Comm(ctx, self.meter)
        self.roles = self.plan.roles
        self.lr_at = LRSchedule.of(config, self.plan.steps_per_epoch, self.plan.total_steps,
                                   len(self.roles.workers))
        self.scaler = LossScaler() if config.optim.precision == "fp16" else None
        self.algorithm = algorithm_class(config.algorithm)(
            config.options, self.comm, self.lr_at, self.scaler is not None)
        self.role = self.roles.role(ctx.rank)
        torch.manual_seed(config.data.seed)  # identical initial weights on every rank
        train = self.splits.train
        self.model = build_model(config.model, train.input_shape, train.num_classes).to(ctx.device)
        if config.system.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.optimizer = build_optimizer(config, self.model.parameters())
        self.compute = emulated_profile(config, ctx, self.comm, self.roles, self.model, train,
                                        task_loss)
        made = self.algorithm.setup(self.model, self.optimizer)
        if isinstance(made, Server) != (self.role == "server"):
            raise TypeError(f"{config.algorithm}: setup on rank {ctx.rank}, a {self.role}, "
                            f"returned {type(made).__name__}; a server rank needs a Server, a "
                            "worker the module to run forward on")
        self.forward_model = made if self.role == "worker" else self.model
        self.server = made if isinstance(made, Server) else None
        self.emulator = None
        if self.compute is not None and self.role == "worker":
            self.emulator = EmulatedCompute(self.model, self.compute,
                                            seed=config.data.seed + 1000 * ctx.rank).install()
        self.life = Lifecycle(config, ctx, self.plan, self.comm, self.algorithm, self.model,
                              self.optimizer, self.scaler, self.tracer)
        self.sampler = None
        if self.role == "worker":
            self.sampler = ShardSampler(len(train), config.data.batch_size,
                                        self.roles.worker_index(ctx.rank),
                                        len(self.roles.workers), config.data.seed)
        self.step_records: list[StepRecord] = []
        self.eval_records: list[EvalRecord] = []

    @property
    def start_step(self) -> int:
        return self.plan.start_step

    # -- the loops ---------------------------------------------------------------------------

    def run(self) -> RunResult | None:
        workers = len(self.roles.workers)
        self.progress = progress(self.plan.total_steps, self.start_step,
                                 f"{self.config.algorithm} x{workers}",
                                 self.config.data.batch_size * workers,
                                 self.ctx.rank == self.roles.evaluator, self.log_progress)
        steps = range(self.start_step, self.plan.total_steps)
        self.comm.barrier()  # a common start, so time_s is comparable across ranks
        try:
            self.life.vote_to_start()
        except preempt.Preempted:
            self.progress.close()  # signalled while setting up: nothing new to save
            raise
        self.t_start = time.perf_counter()
        self.progress.start()
        self.life.begin(self.t_start)
        stopped: Stopped | None = None
        try:
            self.algorithm.start(steps)
            if self.server is None:
                self._work(steps)
            else:
                self.server.serve(steps, self._served)
        except Stopped as stop:  # preempted: this rank stopped at a step the ranks agreed on
            stopped = stop
        except BaseException:
            self.progress.close()
            self.algorithm.abort()  # the algorithm is told how the run ended, never left to guess
            raise
        self.progress.close()
        self.algorithm.close()
        wall_s = time.perf_counter() - self.t_start
        self.life.end(stopped)
        extra = {} if self.compute is None else {  # what each worker slept a step
            "emulated_forward_s": self.compute.forward_s,
            "emulated_backward_s": self.compute.backward_s,
            "emulated_compute": self.compute.source}
        context = self.splits.train.input_shape[0] if is_language_model(self.splits.train) else None
        config = self.config

        def derived(summary: dict) -> dict:
            """What the summary (and its summary.json) says beyond the records: your code's source
            hash, a language model's tokens/s and perplexity."""
            extra = user_code.provenance(config.model, config.data.dataset)
            if context is not None:
                extra.update(language_model_summary(summary, context))
            return extra

        return self.life.gather(wall_s, self.step_records, self.eval_records, extra, derived=derived)

    def batches(self, steps: range) -> TrainBatches:
        """This worker's training batches for ``steps``: (epoch, sample indices, x, y), x and y
        on the device. The same for every algorithm with the same seed and global batch."""
        config, device = self.config, self.ctx.device
        return loader_batches(self.splits.train, self.sampler, steps, config.data.augment,
                              config.data.seed, self._data_workers(), device,
                              torch.channels_last if config.system.channels_last else None)

    def _data_workers(self) -> int:
        if self.config.data.data_workers is None:  # the rank's share of the node's cores
            return default_threads(self.ctx)
        return self.config.data.data_workers

    def _work(self, steps: range) -> None:
        forward = autocast(self.config.optim.precision, self.ctx.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        loader = self.batches(steps)
        try:
            self._steps(steps, iter(loader), forward, params)
        finally:
            loader.close()

    def _steps(self, steps: range, batches, forward, params: list[torch.nn.Parameter]) -> None:
        meter, clock = self.meter, StepClock(self.ctx.device)
        scaler, algorithm = self.scaler, self.algorithm
        overflow = self.config.options.overflow  # how ranks agree to skip an fp16 step
        straggling = self.config.emulation.slow_workers
        slow = self.ctx.rank in self.roles.workers[len(self.roles.workers) - straggling:]
        slowed = 0.0
        for step in steps:
            meter.reset()
            clock.start()
            epoch, indices, x, y = next(batches)
            clock.data_ready()
            set_lr(self.optimizer, self.lr_at(step))
            self.optimizer.zero_grad(set_to_none=True)
            with forward:
                out = self.forward_model(x)
                loss = out if self.emulator is not None else task_loss(out, y)
            clock.forward_done()
            (loss if scaler is None else loss * scaler.scale).backward()
            if slow and straggling:  # a straggler: F x its compute time
                slowed = self._straggle(clock)
            clock.backward_done()
            skip = False
            if scaler is not None and overflow != "reduced":
                skip = self._unscale(params)  # before the gradients are pushed or gossiped
                if skip and overflow == "alone":
                    for p in params:  # skipped here alone: nothing of it is pushed or gossiped
                        p.grad = None
            algorithm.after_backward(self.model)
            if scaler is not None and overflow == "reduced":
                skip = self._unscale(params)  # averaged already: the same on every rank
            if skip:
                for p in params:  # an optimizer leaves a parameter without a gradient alone
                    p.grad = None
            algorithm.step(self.optimizer)
            algorithm.after_step(self.model)
            t0, t1, t2, t3 = clock.end()
            exposed = meter.exposed_backward_comm_s
            if self.tracer is not None:
                self._trace_step(step, (t0, t1, clock.forward_end, t2, t3), exposed)
                if origin := clock.device_origin():  # the buckets' launches, as the device reached them
                    self.tracer.on_device_clock(*origin)
            extras = algorithm.metrics()
            extras["lr"] = self.optimizer.param_groups[0]["lr"]
            if straggling:
                extras["slowed_s"] = slowed
            floor = False  # fp16: overflowed at the smallest scale, which no halving can fix
            if scaler is not None:
                extras.update(loss_scale=scaler.scale, skipped=float(skip))
                floor = skip and scaler.scale <= 1.0
                scaler.update(skip)
            record = StepRecord(
                rank=self.ctx.rank, role="worker", step=step, epoch=epoch, samples=len(indices),
                loss=math.nan if self.emulator else loss.item(), data_s=t1 - t0,
                compute_s=max(0.0, t2 - t1 - exposed),
                comm_s=meter.comm_s + exposed, wait_s=meter.wait_s,
                update_s=max(0.0, t3 - t2 - meter.comm_s - meter.wait_s), step_s=t3 - t0,
                bytes_sent=meter.bytes_sent, bytes_received=meter.bytes_received,
                time_s=t3 - self.t_start, extras=extras)
            if self.emulator is None:  # emulated: no loss to check
                _check_finite(record, skip, floor)  # before a diverged model is evaluated or saved
            self._finish_step(record, point=True)

    def _trace_step(self, step: int, marks: tuple[float, float, float, float, float],
                    exposed: float) -> None:
        """The step's spans, from the marks its record is made of (start, data ready, forward
        done, backward done, end)."""
        t0, t1, tf, t2, t3 = marks
        span = self.tracer.span
        span(f"step {step}", t0, t3)
        span("data", t0, t1)
        span("forward+backward", t1, t2)
        span("forward", t1, tf)  # inside forward+backward: where the backward's buckets begin
        span("backward", tf, t2)
        span("update", t2, t3)  # the algorithm's hooks and the optimizer
        if exposed:  # DDP's buckets: the part backward did not hide (its record counts it)
            span("buckets: exposed wait", t2 - exposed, t2, "comm", account="comm")

    def _straggle(self, clock: StepClock) -> float:
        """Sleep (slowdown - 1) x the forward and backward just done; the seconds slept."""
        device_sync(self.ctx.device)
        extra = (self.config.emulation.slowdown - 1) * (time.perf_counter() - clock.host_data_ready)
        time.sleep(extra)
        return extra

    def _unscale(self, params: list[torch.nn.Parameter]) -> bool:
        """fp16: take the loss scale off the gradients; whether the step is skipped, as every
        rank that steps with this one agrees (``AlgorithmOptions.overflow``)."""
        found = self.scaler.unscale_(params)
        return vote_overflow(self.comm, found) if self.config.options.overflow == "vote" else found

    def _served(self, update: int, step: int | None, metrics: dict[str, float]) -> None:
        """Called by a server's loop after each update it applies: the workers' ``step`` it
        completes (a point, as a worker's step is), or None (an asynchronous server's update,
        recorded by its count from 0 in this run); ``metrics``, the update's numbers."""
        meter, now = self.meter, time.perf_counter()
        last = self.step_records[-1].time_s if self.step_records else 0.0
        step_s = (now - self.t_start) - last
        index = update if step is None else step
        if self.tracer is not None:
            self.tracer.span(f"update {index}", now - step_s, now, "server")
        self._finish_step(StepRecord(
            rank=self.ctx.rank, role="server", step=index,
            epoch=index // self.plan.steps_per_epoch, samples=0, loss=float("nan"), data_s=0.0,
            compute_s=0.0, comm_s=meter.comm_s, wait_s=meter.wait_s,
            update_s=max(0.0, step_s - meter.comm_s - meter.wait_s), step_s=step_s,
            bytes_sent=meter.bytes_sent, bytes_received=meter.bytes_received,
            time_s=now - self.t_start, extras=dict(metrics)), point=step is not None)
        meter.reset()

    def _finish_step(self, record: StepRecord, point: bool) -> None:
        """Record a step (or a server's update); at a ``point`` (a step, on every rank that
        takes it) evaluate and checkpoint when due. The lifecycle decides what a checkpoint
        point means for the algorithm (``Lifecycle.checkpoint``), and the evaluator evaluates."""
        self.step_records.append(record)
        for callback in self.callbacks:
            callback(record)
        if not point:
            return
        step, last = record.step, record.step + 1 == self.plan.total_steps
        if record.role == "worker" and self.emulator is None:
            self.progress.set_loss(record.loss)
        evaluates = self.compute is None  # emulated compute: accuracy means nothing
        if evaluates and ((last and self.config.length.final_eval)
                          or every(step, self.config.length.eval_every)):
            extras = self.algorithm.metrics(self.model)
            if self.ctx.rank == self.roles.evaluator:
                with self.tracer.timed("evaluate") if self.tracer else contextlib.nullcontext():
                    self._evaluate(step, extras)
        try:
            self.life.at_point(step, last)  # a checkpoint when due; Stopped where preempted
        finally:
            self.progress.update(1)

    def _evaluate(self, step: int, extras: dict[str, float]) -> None:
        length = self.config.length
        with self.algorithm.eval_parameters(self.model) as model:
            loss, accuracy = evaluate(model, self.splits.test, length.eval_batch_size,
                                      self.ctx.device, self._data_workers(), length.eval_samples)
        samples = len(eval_indices(len(self.splits.test), length.eval_samples))
        self.eval_records.append(EvalRecord(self.ctx.rank, step, time.perf_counter() - self.t_start,
                                            loss, accuracy, samples, extras))


def _check_finite(record: StepRecord, skipped: bool, floor: bool) -> None:
    """Raise ``Diverged`` at a worker's first non-finite loss. Under fp16 a step skipped for
    overflow is the loss scale's business, not divergence, unless the scale is already at its
    floor: then no halving can help, and the run would skip every step to its end.

    No rank asks another: the loss is read here anyway, so the check costs nothing per step, and
    the rank that raises ends the job (``runtime.abort_on_error``: MPI_Abort, or the launcher and
    the process group's timeout) as any rank's failure does, so none is left waiting. Where the
    ranks average gradients or parameters, a NaN reaches every worker within a step, so their
    errors name the same step (seen with sync_ps and allreduce on 3 ranks)."""
    if floor:
        raise Diverged(record.step, record.rank, "fp16 gradients overflow even at the smallest "
                                                 f"loss scale, 1 (train loss {record.loss})")
    if not skipped and not math.isfinite(record.loss):
        raise Diverged(record.step, record.rank, f"the train loss is {record.loss}")


def make_trainer(config: TrainConfig, ctx: DistContext | None = None,
                 callbacks: Sequence[StepCallback] = ()) -> Trainer:
    """``config``'s Trainer in ``ctx`` (a world of one if none is given), its run planned first
    (``planning.prepare``; rank 0 reports the warnings)."""
    ctx = ctx or DistContext.single()
    plan, splits = prepare(config, ctx.world_size, warn if ctx.rank == 0 else quiet,
                           cpu=ctx.device.type == "cpu")
    return Trainer(config, ctx, plan, splits, callbacks)


def train(config: TrainConfig, ctx: DistContext | None = None,
          callbacks: Sequence[StepCallback] = ()) -> RunResult | None:
    """Train ``config`` in the given context (a world of one if none is given)."""
    return make_trainer(config, ctx, callbacks).run()
