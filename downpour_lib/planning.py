"""The pre-flight: what an entry point does before a ``Trainer`` runs, in one step (``prepare``).

``plan_run`` is a pure check of the run's shape (roles, steps per epoch, total steps, the
checkpoint a resumed run starts from) that runs before any rendezvous, so a bad setting fails on
every rank at once instead of leaving some of them waiting; its ``RunPlan`` is what ``Trainer``
takes. Each entry point plans once: ``downpour train`` on each rank, a cluster session on the
client (its engines then only re-read the checkpoint to resume, ``plan_resume``), ``engine.train``
and ``engine.make_trainer`` through ``prepare`` (the data loaded, the run planned).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import checkpoint, user_code
from .algorithms import algorithm_class
from .config import TrainConfig
from .data import ShardSampler, Splits, load_dataset
from .data.sources import ImageSource
from .errors import CheckpointError, ConfigError
from .models import build_model, build_shaped, check_fits
from .options import Roles
from .paths import check_output_dir


@dataclass(frozen=True)
class RunPlan:
    roles: Roles
    steps_per_epoch: int
    total_steps: int
    start_step: int = 0  # > 0 when resuming
    resume_path: str | None = None  # the checkpoint a resumed run starts from
    checkpoint_every: int = 0  # config's checkpoint_every, or the resumed run's when that is None

    def kept(self, config: TrainConfig) -> TrainConfig:
        """``config`` with the checkpoint cadence this run keeps (a resumed run's), so its
        checkpoints pass it on."""
        if config.outputs.checkpoint_every == self.checkpoint_every:
            return config
        with warnings.catch_warnings():  # its warnings were given when it was built
            warnings.simplefilter("ignore")
            return config.replace(checkpoint_every=self.checkpoint_every)


def warn(message: str) -> None:
    """Print a warning on stderr: what plan_run reports unless told otherwise. Standard output is
    flushed first: a notebook's kernel sends the two streams apart, and a study's "run 7 of 48"
    line, still buffered, came out after the warning of the run it announces."""
    sys.stdout.flush()
    print(f"downpour: warning: {message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """Report nothing: for the ranks other than the one that reports."""


def _built_aside(name: str, input_shape, num_classes: int) -> torch.nn.Module:
    """``name`` built on the CPU for a check, its random draws from a stream of its own: the
    run's initial parameters stay what its seed makes them."""
    with torch.random.fork_rng(devices=[]):
        return build_model(name, input_shape, num_classes)


def plan_run(config: TrainConfig, world_size: int, train: ImageSource,
             report: Callable[[str], None] = warn, rank: int | None = None) -> RunPlan:
    """Everything about the run's shape that can be wrong, checked without talking to anyone.
    ``report`` gets the warnings, e.g. a newer checkpoint skipped because it does not load. The
    output paths are checked on the rank that writes each (``rank``; None: every path, e.g. on
    the machine that submits a run to a cluster)."""
    algorithm = algorithm_class(config.algorithm)
    data, length, outputs = config.data, config.length, config.outputs
    roles = config.options.roles(world_size)  # ConfigError if the world does not fit
    if rank is None or rank == 0:  # rank 0 gathers the records (and the trace) and writes them
        check_output_dir("output_dir", outputs.output_dir)
        check_output_dir("trace", outputs.trace)
    if rank is None or rank == roles.evaluator:  # the evaluator writes the checkpoints
        check_output_dir("checkpoint_dir", outputs.checkpoint_dir)
    yours = user_code.is_user_code("model", config.model)
    # checks the model fits the data, allocating nothing
    model = build_shaped(config.model, train.input_shape, train.num_classes)
    if yours:  # its output must fit the data
        check_fits(config.model, model, train.batch(torch.arange(min(2, len(train)))),
                   train.num_classes,
                   lambda: _built_aside(config.model, train.input_shape, train.num_classes))
    spe = ShardSampler(len(train), data.batch_size, 0, len(roles.workers),
                       data.seed).steps_per_epoch
    total = length.steps if length.steps is not None else math.ceil((length.epochs or 1.0) * spe)
    if length.warmup_steps >= total:
        raise ConfigError("warmup_steps", length.warmup_steps,
                          f"must be less than the {total} steps this run trains "
                          f"({spe} steps per epoch), or throughput has no measured step")
    algorithm.check_plan(config.options, roles, model, total, report, config.optim.precision)
    if outputs.checkpoint_dir and config.options.checkpoint_refusal():
        raise ConfigError("checkpoint_dir", outputs.checkpoint_dir,
                          config.options.checkpoint_refusal())
    if config.emulation.slow_workers > len(roles.workers):
        raise ConfigError("slow_workers", config.emulation.slow_workers,
                          f"this run has {len(roles.workers)} worker(s); slow at most that many")
    if config.emulation.compute == "emulated" and config.optim.precision == "fp16":
        raise ConfigError("precision", "fp16", "emulated compute's pseudo-gradients carry no loss "
                          "scale; use fp32 or bf16 with compute=emulated")
    if data.augment == "standard" and train.augmentation is None:
        raise ConfigError("augment", data.augment,
                          f"data set {data.dataset!r} has no standard augmentation (the real "
                          "data sets have); use augment=none")
    fresh = RunPlan(roles, spe, total, checkpoint_every=outputs.checkpoint_every or 0)
    return plan_resume(config, fresh, world_size, report)


def plan_resume(config: TrainConfig, plan: RunPlan, world_size: int,
                report: Callable[[str], None] = warn) -> RunPlan:
    """``plan`` (a fresh run's) with where ``config.outputs.resume`` starts: the checkpoint, its
    step and its cadence. What a cluster's engines redo after the client's pre-flight when the
    job's resume rule (``config.slurm_resume``) changed ``resume`` there."""
    outputs = config.outputs
    fresh = dataclasses.replace(plan, start_step=0, resume_path=None,
                                checkpoint_every=outputs.checkpoint_every or 0)
    if outputs.resume in (None, "never"):
        earlier = checkpoint.scan(outputs.checkpoint_dir) if outputs.resume is None \
            and outputs.checkpoint_dir else []
        if earlier:  # a run from scratch writes over another's checkpoints of the same steps
            steps = (f"step {earlier[0][0]}" if len(earlier) == 1
                     else f"steps {earlier[0][0]} to {earlier[-1][0]}")
            report(f"{outputs.checkpoint_dir} holds checkpoints of an earlier run ({steps}); this "
                   "run starts from scratch and replaces "
                   f"those of its own steps: give --resume {outputs.checkpoint_dir} to continue it, "
                   "--resume never to say you mean this, or another --checkpoint-dir")
        return fresh
    total = plan.total_steps
    if outputs.resume == "auto":  # a requeued job: its own newest checkpoint, if it wrote one
        path = checkpoint.find_resumable(outputs.checkpoint_dir, config.held("match"), world_size,
                                         report)
        if path is None:
            report(f"resume auto: no checkpoint of this configuration in {outputs.checkpoint_dir}: "
                   "starting from scratch")
            return fresh
        report(f"resume auto: continuing from {path}")
    else:
        path = checkpoint.resolve(outputs.resume, report)
    try:
        state = checkpoint.load(path, mmap=True)
    except CheckpointError as exc:
        raise ConfigError("resume", outputs.resume, f"{exc}; give another checkpoint") from None
    if outputs.resume == "auto" and int(state["step"]) >= total:
        raise ConfigError("resume", "auto", f"{path} is this configuration's finished run "
                          f"({state['step']} of {total} steps): give more steps to continue it; "
                          "to train it again, give another checkpoint_dir (sbatch: another "
                          "--job-name or DOWNPOUR_CHECKPOINTS), or resume=never (--resume never) "
                          "to start from scratch in this one")
    start = checkpoint.check_resume(state, path, config.held("keep"), world_size, total)
    every_ = outputs.checkpoint_every
    if every_ is None:  # not given: keep the cadence of the run this one continues
        every_ = (state["config"].get("checkpoint_every") or 0) if outputs.checkpoint_dir else 0
    return dataclasses.replace(fresh, start_step=start, resume_path=str(path),
                               checkpoint_every=every_)


def flush_denormals() -> None:
    """Treat subnormal floats as zero in this process's CPU arithmetic (as TensorFlow's CPU
    kernels do, and a GPU's speed does not depend on): each operation on one is about a hundred
    times slower on x86. Optimizer state decays into that range where a gradient stays zero (a
    dead unit's moment times 0.9 a step is subnormal after ~800 steps), so a step grew with the
    run's length: DiLoCo's mlp (AdamW) on 2 ranks took 4.9 ms a step over 1,300 steps against
    3.2 ms over 180 (its update 2.9 ms against 1.4), and 3.5 ms with this set, its loss the same
    to four digits. The setting is a thread's, and the worker threads torch starts inherit it:
    set before the pool starts, a 2-thread multiply of subnormal floats flushed them all (4x
    faster); set after, only the calling thread's half. So ``prepare`` and ``Trainer`` set
    it before they load data; a pool an earlier job in the same process started (an engine's)
    keeps its own, which matters only at more than one thread a rank."""
    torch.set_flush_denormal(True)


def prepare(config: TrainConfig, world_size: int, report: Callable[[str], None] = warn,
            rank: int | None = None, cpu: bool | None = None) -> tuple[RunPlan, Splits]:
    """The run's plan and its data, what ``Trainer`` takes: the data loaded (on a CPU run, after
    ``flush_denormals``; ``cpu`` None: as the config's device says), then ``plan_run``."""
    if cpu is None:
        cpu = config.system.device == "cpu" or not torch.cuda.is_available()
    if cpu:
        flush_denormals()  # before loading the data starts torch's worker threads
    splits = load_dataset(config.data.dataset, config.data.data_dir)
    return plan_run(config, world_size, splits.train, report, rank), splits
