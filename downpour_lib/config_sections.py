"""The run configuration's seven sections: frozen dataclasses that validate their own fields.

Each field declares its help text and its identity rule (``_help``, ``IDENTITY_RULES``) where it is
defined; each section checks its fields on construction, naming the field, the value and what
would work. ``config.TrainConfig`` holds one of each, beside the algorithm, its options and the
model, and reads these declarations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from . import user_code
from .data import DATASETS
from .defaults import STARTUP_TIMEOUT_S, TIMEOUT_S
from .errors import ConfigError, check_choices
from .options import coerce
from .preempt import check_signal

Optimizer = Literal["sgd", "adam", "adamw", "adagrad"]
#: The learning rate when neither the run nor the algorithm's default optimizer names one.
DEFAULT_LR = 0.05
Schedule = Literal["constant", "step", "cosine"]
Precision = Literal["fp32", "bf16", "fp16"]
Augment = Literal["none", "standard"]
Backend = Literal["auto", "gloo", "nccl", "mpi"]
Device = Literal["auto", "cpu", "cuda"]


#: What a field declares about what makes two runs the same run, strictest first; each rule holds
#: a field to what every later rule asks too (a ``keep`` field is also matched and measured).
#: keep: a resumed run must keep it (``checkpoint.check_resume`` refuses a change), as the model or
#: the batch. match: ``resume auto`` continues only a checkpoint equal in it, and pruning counts
#: only those; a resume that names its checkpoint may change it (a lower lr to continue with).
#: measure: free to change on resume, but it changes what the run measures, so a study's
#: ``run_id`` keys on it (steps, backend, threads). free: where the run writes and how it is
#: stopped, in nothing.
IDENTITY_RULES = ("keep", "match", "measure", "free")
Identity = Literal["keep", "match", "measure", "free"]


def _help(text: str, identity: Identity | None = None, **kw: Any) -> Any:
    """A field with its help text and its ``identity`` rule (``IDENTITY_RULES``)."""
    metadata = {"help": text} if identity is None else {"help": text, "identity": identity}
    return field(metadata=metadata, **kw)


def _numbers(section: Any) -> None:
    """Each number or flag field of ``section`` as its type, or a ConfigError naming it: what a
    file's values get (``coerce``: 10.0 to 10, 1 to 1.0, a string refused), for Python's too.
    ``TrainConfig(steps="10")`` failed later as a TypeError naming no field, and
    ``batch_size=2.5`` on a cluster's engines."""
    for name, hint in _number_fields(type(section)):
        object.__setattr__(section, name, coerce(name, hint, getattr(section, name)))


@functools.cache
def _number_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """``cls``'s fields of int, float or bool (or Optional of one), with their types."""
    return tuple((name, hint) for name, hint in typing.get_type_hints(cls).items()
                 if {int, float, bool} & (set(typing.get_args(hint)) | {hint}))


def _at_least(name: str, value: int | None, low: int, example: str = "") -> None:
    if value is not None and value < low:
        raise ConfigError(name, value, f"must be a whole number >= {low}{example}")


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _seconds(name: str, value: float, example: float) -> None:
    if not (_finite(value) and value > 0):
        raise ConfigError(name, value, f"must be a finite number of seconds > 0, e.g. {example:g}")


@dataclass(frozen=True)
class Data:
    """What a worker reads: two runs with the same seed, model, data and global batch see the same
    samples in the same order, whatever the algorithm."""

    dataset: str = _help("data set name (see `downpour datasets`), or your own: "
                         "package.module:function", identity="keep", default="digits")
    data_dir: str = _help("directory holding the real data sets' files", identity="measure", default="data")
    batch_size: int = _help("samples per worker per step; the global batch is this times the "
                            "number of workers", identity="keep", default=32)
    augment: Augment | None = _help("training-set augmentation, drawn from (seed, epoch, sample): "
                                    "standard = pad-4 random crop + flip (32x32; MNIST: pad-2 crop, "
                                    "no flip), random-resized-crop 224 + flip (ImageFolder); none = "
                                    "standard for real data sets, none for synthetic and digits",
                                    identity="keep", default=None)
    data_workers: int | None = _help("DataLoader worker processes per rank for the real data sets "
                                     "(mnist, cifar, imagefolder); 0 reads in the training process; "
                                     "none = the rank's share of the node's cores",
                                     identity="measure", default=None)
    seed: int = _help("seed for model initialization and data order", identity="keep", default=0)

    def __post_init__(self) -> None:
        _numbers(self)
        if callable(self.dataset):  # a function of yours, e.g. from a notebook cell
            object.__setattr__(self, "dataset", user_code.register(
                "dataset", self.dataset.__name__, self.dataset, DATASETS))
        yours = user_code.is_user_code("dataset", self.dataset)
        if self.dataset not in DATASETS and not yours:
            raise user_code.unknown("dataset", self.dataset, DATASETS)
        if self.augment is None:
            spec = DATASETS.get(self.dataset)
            object.__setattr__(self, "augment", "standard" if spec is not None and spec.kind == "real"
                               and spec.task == "classify" else "none")
        if self.augment not in typing.get_args(Augment):  # Optional: check_choices skips it
            raise ConfigError("augment", self.augment,
                              "choose one of " + ", ".join(typing.get_args(Augment)))
        check_choices(self)
        _at_least("batch_size", self.batch_size, 1)
        if self.data_workers is not None and self.data_workers < 0:
            raise ConfigError("data_workers", self.data_workers,
                              "must be a whole number >= 0 (0 = in the training process)")


@dataclass(frozen=True)
class Optim:
    """The update rule and its learning rate over the run. ``lr``, ``optimizer`` and ``momentum``
    left as None take the algorithm's recipe (``Optim.of``), so a built section holds no None."""

    optimizer: Optimizer | None = _help("the update rule (the servers' rule for sync_ps and "
                                        "downpour); none = the algorithm's default: adagrad for "
                                        "downpour, as in Dean et al. 2012, sgd otherwise",
                                        identity="keep", default=None)
    lr: float | None = _help("learning rate; none = the algorithm's default recipe: 0.003 for "
                             "diloco's AdamW inner steps, 0.05 otherwise", identity="match", default=None)
    momentum: float | None = _help("SGD momentum (sgd only); none = 0.9 for sgd, 0 otherwise",
                                   identity="match", default=None)
    weight_decay: float = _help("L2 weight decay", identity="match", default=0.0)
    lr_schedule: Schedule = _help("learning rate after warm-up: constant, step (times lr_decay at "
                                  "each of lr_milestones) or cosine (to 0 at the last step)",
                                  identity="keep", default="constant")
    lr_warmup_epochs: float = _help("linear warm-up over this many epochs (may be fractional; "
                                    "Goyal et al. 2017: 5)", identity="keep", default=0.0)
    lr_milestones: tuple[float, ...] = _help("epochs at which a step schedule multiplies the "
                                             "learning rate by lr_decay, e.g. 30,60,80",
                                             identity="keep", default=())
    lr_decay: float = _help("the step schedule's factor at each milestone", identity="keep", default=0.1)
    lr_scaling: Literal["none", "linear"] = _help(
        "linear: the linear scaling rule, lr x global batch / lr_reference_batch",
        identity="keep", default="none")
    lr_reference_batch: int = _help("the global batch lr is given for, under lr_scaling=linear",
                                    identity="match", default=256)
    precision: Precision = _help("fp32, or mixed precision through torch.autocast: bf16, or fp16 "
                                 "with a dynamic loss scale every algorithm agrees on",
                                 identity="keep", default="fp32")

    @classmethod
    def of(cls, options: Any, **values: Any) -> Optim:
        """The section with the algorithm's recipe (its ``options``) for what ``values`` leave
        None; warns of a momentum given to an optimizer that ignores it."""
        lr, optimizer, momentum = (values.get(k) for k in ("lr", "optimizer", "momentum"))
        if lr is None:  # the algorithm's recipe only goes with its own optimizer
            recipe = optimizer is None and options.default_lr is not None
            lr = options.default_lr if recipe else DEFAULT_LR
        optimizer = options.default_optimizer if optimizer is None else optimizer
        if momentum is None:
            momentum = 0.9 if optimizer == "sgd" else 0.0
        elif optimizer != "sgd" and momentum not in (0, 0.0):
            warnings.warn(f"momentum={momentum} has no effect with optimizer={optimizer!r}; it "
                          "applies to 'sgd' only", stacklevel=3)
        return cls(**{**values, "lr": lr, "optimizer": optimizer, "momentum": momentum})

    def __post_init__(self) -> None:
        _numbers(self)
        if self.optimizer not in typing.get_args(Optimizer):
            raise ConfigError("optimizer", self.optimizer,
                              "choose one of " + ", ".join(typing.get_args(Optimizer)))
        object.__setattr__(self, "lr_milestones", _milestones(self.lr_milestones))
        check_choices(self)
        if not (self.lr is not None and _finite(self.lr) and self.lr > 0):
            raise ConfigError("lr", self.lr, "must be a finite number > 0, e.g. 0.05")
        if not (self.momentum is not None and 0 <= self.momentum < 1):
            raise ConfigError("momentum", self.momentum, "must be in [0, 1), e.g. 0.9")
        if not (_finite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError("weight_decay", self.weight_decay,
                              "must be a finite number >= 0, e.g. 0 or 1e-4")
        if not (_finite(self.lr_warmup_epochs) and self.lr_warmup_epochs >= 0):
            raise ConfigError("lr_warmup_epochs", self.lr_warmup_epochs,
                              "must be a finite number of epochs >= 0, e.g. 5")
        if not (_finite(self.lr_decay) and 0 < self.lr_decay <= 1):
            raise ConfigError("lr_decay", self.lr_decay, "must be in (0, 1], e.g. 0.1")
        if self.lr_schedule == "step" and not self.lr_milestones:
            raise ConfigError("lr_milestones", self.lr_milestones,
                              "a step schedule needs milestones (epochs), e.g. 30,60,80")
        if self.lr_milestones and self.lr_schedule != "step":
            raise ConfigError("lr_milestones", ",".join(map(str, self.lr_milestones)),
                              f"milestones belong to lr_schedule=step, not {self.lr_schedule!r}")
        _at_least("lr_reference_batch", self.lr_reference_batch, 1, ", e.g. 256")


@dataclass(frozen=True)
class Length:
    """How long the run trains, and how it is measured on the way."""

    steps: int | None = _help("steps to train (give this or epochs)", identity="measure", default=None)
    epochs: float | None = _help("epochs to train, may be fractional (give this or steps); "
                                 "1 epoch when neither is given", identity="measure", default=None)
    warmup_steps: int = _help("first steps left out of throughput", identity="measure", default=2)
    eval_every: int = _help("evaluate every this many steps; 0 evaluates only at the end",
                            identity="measure", default=0)
    eval_batch_size: int = _help("batch size for evaluation", identity="measure", default=512)
    eval_samples: int = _help("evaluate on this many samples of the test split, spread evenly over "
                              "it; 0 evaluates on all of it", identity="measure", default=0)
    final_eval: bool = _help("evaluate after the last step; false leaves it out (a throughput "
                             "study, whose test accuracy nobody reads)", identity="measure", default=True)

    def __post_init__(self) -> None:
        _numbers(self)
        check_choices(self)
        _at_least("eval_batch_size", self.eval_batch_size, 1)
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("steps", self.steps,
                              f"give steps or epochs, not both (epochs={self.epochs})")
        _at_least("steps", self.steps, 1)
        if self.epochs is not None and not (_finite(self.epochs) and self.epochs > 0):
            raise ConfigError("epochs", self.epochs, "must be a finite number > 0, e.g. 1 or 0.5")
        _at_least("eval_every", self.eval_every, 0)
        _at_least("eval_samples", self.eval_samples, 0)
        _at_least("warmup_steps", self.warmup_steps, 0)
        if self.steps is not None and self.warmup_steps >= self.steps:
            default = next(f.default for f in dataclasses.fields(self) if f.name == "warmup_steps")
            raise ConfigError("warmup_steps", self.warmup_steps,
                              f"must be less than steps={self.steps}, or throughput has no "
                              "measured step: give more steps, or "
                              + ("a warmup_steps of your own (the first steps left out of "
                                 "throughput; this is its default): e.g. --warmup-steps 0"
                                 if self.warmup_steps == default else "fewer warmup_steps"))


@dataclass(frozen=True)
class System:
    """Where and how the ranks compute and talk. Part of the identity: it changes throughput."""

    backend: Backend = _help("torch.distributed backend; auto = nccl on CUDA, else mpi under an "
                             "MPI launch (mpiexec, srun --mpi=pmix), else gloo",
                             identity="measure", default="auto")
    device: Device = _help("device; auto = cuda:<local rank> when CUDA is there, else cpu",
                           identity="measure", default="auto")
    threads: int = _help("torch threads per rank; 0 = the node's cores divided by its ranks",
                         identity="measure", default=0)
    timeout_s: float = _help("process-group timeout: how long a rank waits for a dead peer",
                             identity="measure", default=TIMEOUT_S)
    channels_last: bool = _help("keep the model and its inputs in channels-last memory format "
                                "(faster convolutions on GPUs with tensor cores)",
                                identity="match", default=False)

    def __post_init__(self) -> None:
        _numbers(self)
        check_choices(self)
        _at_least("threads", self.threads, 0)
        _seconds("timeout_s", self.timeout_s, TIMEOUT_S)


@dataclass(frozen=True)
class Emulation:
    """What is emulated rather than computed: slow workers (the last ``slow_workers`` take
    ``slowdown`` times their compute), and the compute itself (``compute="emulated"``: sleeps of
    the real step's length while real-sized gradients appear when the real backward makes them,
    ``emulate.py``), so communication can be measured at more ranks than the machine has cores."""

    slow_workers: int = _help("stragglers: this many workers (the last ones) take slowdown times "
                              "their compute time every step, sleeping the difference",
                              identity="match", default=0)
    slowdown: float = _help("the stragglers' factor on their compute time (>= 1)",
                            identity="match", default=1.0)
    compute: Literal["real", "emulated"] = _help(
        "real: forward and backward computed; emulated: each worker sleeps their time "
        "(emulated_step_s) while its real-sized gradients become ready at the real backward's "
        "moments, so communication is real and loss and accuracy are absent (named apart from "
        "the records' compute_s, the compute each step took)", identity="match", default="real")
    emulated_step_s: float | None = _help(
        "emulated compute: seconds of forward+backward per step (e.g. 0.05 for a GPU's step); "
        "none = auto, timed on this machine on the same model and batch first",
        identity="match", default=None)

    def __post_init__(self) -> None:
        _numbers(self)
        check_choices(self)
        _at_least("slow_workers", self.slow_workers, 0)
        if not (_finite(self.slowdown) and self.slowdown >= 1):
            raise ConfigError("slowdown", self.slowdown, "must be a finite factor >= 1, e.g. 2")
        if self.emulated_step_s is not None:
            if not (_finite(self.emulated_step_s) and self.emulated_step_s > 0):
                raise ConfigError("emulated_step_s", self.emulated_step_s,
                                  "seconds per step > 0, e.g. 0.05, or none for auto")
            if self.compute != "emulated":
                raise ConfigError("emulated_step_s", self.emulated_step_s,
                                  "applies to compute=emulated only (--compute emulated); a real "
                                  "run computes its own step")


@dataclass(frozen=True)
class Outputs:
    """Where the run writes, and the checkpoint it continues: not what it computes."""

    output_dir: str | None = _help("write steps.csv, evals.csv and summary.json here",
                                   identity="free", default=None)
    trace: str | None = _help("write a timeline of every rank's steps here (trace.json: data, "
                              "forward and backward, each bucket's allreduce, waits, updates, "
                              "server updates, gossip; open it at https://ui.perfetto.dev)",
                              identity="free", default=None)
    checkpoint_dir: str | None = _help("write checkpoints here (ckpt-<step>.pt, atomically) at the "
                                       "end of the run and every checkpoint_every steps",
                                       identity="free", default=None)
    checkpoint_every: int | None = _help("also checkpoint every this many steps; 0 = only at the "
                                         "end; none = 0, or when resuming, the cadence of the run "
                                         "it continues", identity="free", default=None)
    keep_checkpoints: int = _help("keep this configuration's newest this many periodic (and "
                                  "preemption) checkpoints in checkpoint_dir, deleting older ones "
                                  "once a newer one is written; the final checkpoint and the one "
                                  "a run resumed from are always kept", identity="free", default=3)
    resume: str | None = _help("continue the run whose checkpoints are in this directory (from its "
                               "latest complete checkpoint) or in this checkpoint file; "
                               "checkpoint_dir defaults to that directory (not a file's, whose later "
                               "checkpoints it would replace: without checkpoint_dir a run resumed "
                               "from a file writes none); auto = the newest "
                               "checkpoint of this configuration in checkpoint_dir, else from "
                               "scratch (the default of `downpour train` in a Slurm job); "
                               "never = from scratch even in a Slurm job, its checkpoints "
                               "replacing those of the same steps in checkpoint_dir",
                               identity="free", default=None)

    def __post_init__(self) -> None:
        _numbers(self)
        if self.resume == "auto" and self.checkpoint_dir is None:
            raise ConfigError("resume", "auto", "looks for checkpoints in checkpoint_dir: give "
                                                "checkpoint_dir too")
        if self.resume not in (None, "never", "auto") and not self.resume.endswith(".pt") \
                and os.path.isfile(self.resume):  # not the checkpoint_dir it would default
            raise ConfigError("resume", self.resume, "is a file and not a checkpoint: give a run's "
                                                     "checkpoint_dir or one of its ckpt-<step>.pt")
        if self.resume not in (None, "never") and self.checkpoint_dir is None \
                and not self.resume.endswith(".pt"):
            object.__setattr__(self, "checkpoint_dir", self.resume)  # a run continues where it was
        if self.checkpoint_every is None and self.resume in (None, "never"):
            object.__setattr__(self, "checkpoint_every", 0)  # a resumed run's is read by plan_run
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every", self.checkpoint_every,
                              "checkpoints need a place: give checkpoint_dir too")
        _at_least("checkpoint_every", self.checkpoint_every, 0)
        _at_least("keep_checkpoints", self.keep_checkpoints, 1,
                  " (the newest checkpoint is always kept; e.g. 3)")


@dataclass(frozen=True)
class Runtime:
    """How a launcher starts, stops and restarts the run: not what it computes."""

    startup_timeout_s: float = _help("how long a rank waits for the others to start (MPI init, the "
                                     "rendezvous), apart from --timeout-s: a job of many nodes can "
                                     "take minutes to start", identity="free",
                                     default=STARTUP_TIMEOUT_S)

    preempt_signal: str = _help("this signal stops the run at the next step: the ranks agree, write "
                                "one checkpoint and exit with status 75 (Slurm: sbatch "
                                "--signal=USR2@120); USR2, USR1, TERM, INT, HUP, or none",
                                identity="free", default="USR2")
    requeue: bool | None = _help("after a preemption checkpoint, rank 0 runs `scontrol requeue "
                                 "$SLURM_JOB_ID`; none = yes inside a Slurm batch job",
                                 identity="free", default=None)

    def __post_init__(self) -> None:
        _numbers(self)
        _seconds("startup_timeout_s", self.startup_timeout_s, STARTUP_TIMEOUT_S)
        check_signal(self.preempt_signal)


#: The sections in order, by attribute name. A field's flat name is unique across them.
SECTIONS: dict[str, type] = {"data": Data, "optim": Optim, "length": Length, "system": System,
                             "emulation": Emulation, "outputs": Outputs, "runtime": Runtime}
#: flat field name -> its section's attribute name
SECTION_OF = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
#: The fields outside any section: what is trained.
TOP = ("algorithm", "options", "model")


def _milestones(value: Any) -> tuple[float, ...]:
    """Epochs from a list of numbers, or from text such as "30,60,80" (a flag's)."""
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError("lr_milestones", value, "give a list of epochs, e.g. 30,60,80")
    out = []
    for item in items:
        try:
            epoch = coerce("lr_milestones", float, item, text=isinstance(item, str))
        except ConfigError:
            raise ConfigError("lr_milestones", value, "give a list of epochs, e.g. 30,60,80") from None
        if not (math.isfinite(epoch) and epoch > 0):
            raise ConfigError("lr_milestones", value, "every milestone must be an epoch > 0")
        out.append(epoch)
    if out != sorted(set(out)):
        raise ConfigError("lr_milestones", value, "milestones must increase, e.g. 30,60,80")
    return tuple(out)
