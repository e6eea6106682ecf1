"""The run configuration: one frozen, validated dataclass, built from Python, CLI flags or a file.

Every field carries its help text (the CLI is generated from it). Validation happens on construction
and names the field, the value and what would work, so a bad run fails before any process blocks.
Checks that need the world size (an algorithm that needs more ranks than it has) are the options'
``roles(world_size)``, which the pre-flight (``engine.plan_run``) calls after reading the
launcher's variables and before rendezvous.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .algorithms import ALGORITHMS
from .data import DATASETS
from .errors import ConfigError, check_choices, unknown_name
from .models import MODELS
from .options import build_options, coerce
from .preempt import check_signal

Optimizer = Literal["sgd", "adam", "adamw", "adagrad"]
#: The learning rate when neither the run nor the algorithm's default optimizer names one.
DEFAULT_LR = 0.05
Schedule = Literal["constant", "step", "cosine"]
Precision = Literal["fp32", "bf16", "fp16"]
Augment = Literal["none", "standard"]
Backend = Literal["auto", "gloo", "nccl", "mpi"]
Device = Literal["auto", "cpu", "cuda"]


def _help(text: str, **kw: Any) -> Any:
    return field(metadata={"help": text}, **kw)


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Two runs with the same seed, model, data and global batch see the same
    samples in the same order, whatever the algorithm, so their results are directly comparable."""

    algorithm: str = _help("training algorithm", default="sync_ps")
    options: Any = _help("the algorithm's own options (a mapping or its options dataclass)",
                         default=None)
    model: str = _help("model name (see `downpour models`)", default="mlp")
    dataset: str = _help("data set name (see `downpour datasets`)", default="digits")
    data_dir: str = _help("directory holding the real data sets' files", default="data")
    batch_size: int = _help("samples per worker per step; the global batch is this times the "
                            "number of workers", default=32)
    lr: float | None = _help("learning rate; none = the algorithm's default recipe: 0.003 for "
                             "diloco's AdamW inner steps, 0.05 otherwise", default=None)
    momentum: float | None = _help("SGD momentum (sgd only); none = 0.9 for sgd, 0 otherwise",
                                   default=None)
    weight_decay: float = _help("L2 weight decay", default=0.0)
    optimizer: Optimizer | None = _help("the update rule (the servers' rule for sync_ps and "
                                        "downpour); none = the algorithm's default: adagrad for "
                                        "downpour, as in Dean et al. 2012, sgd otherwise",
                                        default=None)
    lr_schedule: Schedule = _help("learning rate after warm-up: constant, step (times lr_decay at "
                                  "each of lr_milestones) or cosine (to 0 at the last step)",
                                  default="constant")
    lr_warmup_epochs: float = _help("linear warm-up over this many epochs (may be fractional; "
                                    "Goyal et al. 2017: 5)", default=0.0)
    lr_milestones: tuple[float, ...] = _help("epochs at which a step schedule multiplies the "
                                             "learning rate by lr_decay, e.g. 30,60,80",
                                             default=())
    lr_decay: float = _help("the step schedule's factor at each milestone", default=0.1)
    lr_scaling: Literal["none", "linear"] = _help(
        "linear: the linear scaling rule, lr x global batch / lr_reference_batch", default="none")
    lr_reference_batch: int = _help("the global batch lr is given for, under lr_scaling=linear",
                                    default=256)
    precision: Precision = _help("fp32, or mixed precision through torch.autocast: bf16, or fp16 "
                                 "with a dynamic loss scale every algorithm agrees on",
                                 default="fp32")
    augment: Augment | None = _help("training-set augmentation, drawn from (seed, epoch, sample): "
                                    "standard = pad-4 random crop + flip (32x32; MNIST: pad-2 crop, "
                                    "no flip), random-resized-crop 224 + flip (ImageFolder); none = "
                                    "standard for real data sets, none for synthetic and digits",
                                    default=None)
    data_workers: int | None = _help("DataLoader worker processes per rank for the real data sets "
                                     "(mnist, cifar, imagefolder); 0 reads in the training process; "
                                     "none = the rank's share of the node's cores", default=None)
    channels_last: bool = _help("keep the model and its inputs in channels-last memory format "
                                "(faster convolutions on GPUs with tensor cores)", default=False)
    slow_workers: int = _help("stragglers: this many workers (the last ones) take slowdown times "
                              "their compute time every step, sleeping the difference", default=0)
    slowdown: float = _help("the stragglers' factor on their compute time (>= 1)", default=1.0)
    steps: int | None = _help("steps to train (give this or epochs)", default=None)
    epochs: float | None = _help("epochs to train, may be fractional (give this or steps); "
                                 "1 epoch when neither is given", default=None)
    eval_every: int = _help("evaluate every this many steps; 0 evaluates only at the end",
                            default=0)
    eval_batch_size: int = _help("batch size for evaluation", default=512)
    final_eval: bool = _help("evaluate after the last step; false leaves it out (a throughput "
                             "study, whose test accuracy nobody reads)", default=True)
    seed: int = _help("seed for model initialization and data order", default=0)
    backend: Backend = _help("torch.distributed backend; auto = nccl on CUDA, else mpi under an "
                             "MPI launch (mpiexec, srun --mpi=pmix), else gloo", default="auto")
    device: Device = _help("device; auto = cuda:<local rank> when CUDA is there, else cpu",
                           default="auto")
    threads: int = _help("torch threads per rank; 0 = the node's cores divided by its ranks",
                         default=0)
    warmup_steps: int = _help("first steps left out of throughput", default=2)
    timeout_s: float = _help("process-group timeout: how long a rank waits for a dead peer",
                             default=300.0)
    output_dir: str | None = _help("write steps.csv, evals.csv and summary.json here", default=None)
    checkpoint_dir: str | None = _help("write checkpoints here (ckpt-<step>.pt, atomically) at the "
                                       "end of the run and every checkpoint_every steps",
                                       default=None)
    checkpoint_every: int | None = _help("also checkpoint every this many steps; 0 = only at the "
                                         "end; none = 0, or when resuming, the cadence of the run "
                                         "it continues", default=None)
    keep_checkpoints: int = _help("keep this configuration's newest this many periodic (and "
                                  "preemption) checkpoints in checkpoint_dir, deleting older ones "
                                  "once a newer one is written; the final checkpoint and the one "
                                  "a run resumed from are always kept", default=3)
    resume: str | None = _help("continue the run whose checkpoints are in this directory (from its "
                               "latest complete checkpoint) or in this checkpoint file; "
                               "checkpoint_dir defaults to that directory; auto = the newest "
                               "checkpoint of this configuration in checkpoint_dir, else from "
                               "scratch (the default of `downpour train` in a Slurm job); "
                               "never = from scratch even in a Slurm job, its checkpoints "
                               "replacing those of the same steps in checkpoint_dir",
                               default=None)
    trace: str | None = _help("write a timeline of every rank's steps here (trace.json: data, "
                              "forward and backward, each bucket's allreduce, waits, updates, "
                              "server updates, gossip; open it at https://ui.perfetto.dev)",
                              default=None)
    preempt_signal: str = _help("this signal stops the run at the next step: the ranks agree, write "
                                "one checkpoint and exit with status 75 (Slurm: sbatch "
                                "--signal=USR2@120); USR2, USR1, TERM, INT, HUP, or none",
                                default="USR2")
    requeue: bool | None = _help("after a preemption checkpoint, rank 0 runs `scontrol requeue "
                                 "$SLURM_JOB_ID`; none = yes inside a Slurm batch job",
                                 default=None)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise unknown_name("algorithm", self.algorithm, ALGORITHMS)
        if self.model not in MODELS:
            raise unknown_name("model", self.model, MODELS)
        if self.dataset not in DATASETS:
            raise unknown_name("dataset", self.dataset, DATASETS)
        options = build_options(self.algorithm, ALGORITHMS[self.algorithm].Options, self.options)
        object.__setattr__(self, "options", options)
        explicit_momentum = self.momentum is not None
        if self.lr is None:  # the algorithm's recipe only goes with its own optimizer
            recipe = self.optimizer is None and self.options.default_lr is not None
            object.__setattr__(self, "lr", self.options.default_lr if recipe else DEFAULT_LR)
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", self.options.default_optimizer)
        if self.momentum is None:
            object.__setattr__(self, "momentum", 0.9 if self.optimizer == "sgd" else 0.0)
        if self.optimizer not in typing.get_args(Optimizer):
            raise ConfigError("optimizer", self.optimizer,
                              "choose one of " + ", ".join(typing.get_args(Optimizer)))
        if self.resume == "auto" and self.checkpoint_dir is None:
            raise ConfigError("resume", "auto", "looks for checkpoints in checkpoint_dir: give "
                                                "checkpoint_dir too")
        check_signal(self.preempt_signal)
        if self.resume not in (None, "never") and self.checkpoint_dir is None \
                and not self.resume.endswith(".pt"):
            object.__setattr__(self, "checkpoint_dir", self.resume)  # a run continues where it was
        if self.checkpoint_every is None and self.resume in (None, "never"):
            object.__setattr__(self, "checkpoint_every", 0)  # a resumed run's is read by plan_run
        if self.augment is None:
            object.__setattr__(self, "augment",
                               "standard" if DATASETS[self.dataset].kind == "real" else "none")
        if self.augment not in typing.get_args(Augment):
            raise ConfigError("augment", self.augment,
                              "choose one of " + ", ".join(typing.get_args(Augment)))
        object.__setattr__(self, "lr_milestones", _milestones(self.lr_milestones))
        check_choices(self)
        positive = {"batch_size": self.batch_size, "eval_batch_size": self.eval_batch_size}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(name, value, "must be a whole number >= 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError("lr", self.lr, "must be a finite number > 0, e.g. 0.05")
        if not 0 <= self.momentum < 1:
            raise ConfigError("momentum", self.momentum, "must be in [0, 1), e.g. 0.9")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError("weight_decay", self.weight_decay,
                              "must be a finite number >= 0, e.g. 0 or 1e-4")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("steps", self.steps,
                              f"give steps or epochs, not both (epochs={self.epochs})")
        if self.steps is not None and self.steps < 1:
            raise ConfigError("steps", self.steps, "must be a whole number >= 1")
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ConfigError("epochs", self.epochs, "must be a finite number > 0, e.g. 1 or 0.5")
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every", self.checkpoint_every,
                              "checkpoints need a place: give checkpoint_dir too")
        for name in ("eval_every", "threads", "warmup_steps", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), "must be a whole number >= 0")
        if self.steps is not None and self.warmup_steps >= self.steps:
            raise ConfigError("warmup_steps", self.warmup_steps,
                              f"must be less than steps={self.steps}, or throughput has no "
                              "measured step")
        if not (math.isfinite(self.lr_warmup_epochs) and self.lr_warmup_epochs >= 0):
            raise ConfigError("lr_warmup_epochs", self.lr_warmup_epochs,
                              "must be a finite number of epochs >= 0, e.g. 5")
        if not (math.isfinite(self.lr_decay) and 0 < self.lr_decay <= 1):
            raise ConfigError("lr_decay", self.lr_decay, "must be in (0, 1], e.g. 0.1")
        if self.lr_schedule == "step" and not self.lr_milestones:
            raise ConfigError("lr_milestones", self.lr_milestones,
                              "a step schedule needs milestones (epochs), e.g. 30,60,80")
        if self.lr_milestones and self.lr_schedule != "step":
            raise ConfigError("lr_milestones", ",".join(map(str, self.lr_milestones)),
                              f"milestones belong to lr_schedule=step, not {self.lr_schedule!r}")
        if self.lr_reference_batch < 1:
            raise ConfigError("lr_reference_batch", self.lr_reference_batch,
                              "must be a whole number >= 1, e.g. 256")
        if self.slow_workers < 0:
            raise ConfigError("slow_workers", self.slow_workers, "must be a whole number >= 0")
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1):
            raise ConfigError("slowdown", self.slowdown, "must be a finite factor >= 1, e.g. 2")
        if self.keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints", self.keep_checkpoints,
                              "must be a whole number >= 1 (the newest checkpoint is always kept; "
                              "e.g. 3)")
        if self.data_workers is not None and self.data_workers < 0:
            raise ConfigError("data_workers", self.data_workers,
                              "must be a whole number >= 0 (0 = in the training process)")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("timeout_s", self.timeout_s,
                              "must be a finite number of seconds > 0, e.g. 300")
        if explicit_momentum and self.optimizer != "sgd" and self.momentum not in (0, 0.0):
            warnings.warn(f"momentum={self.momentum} has no effect with optimizer="
                          f"{self.optimizer!r}; it applies to 'sgd' only", stacklevel=3)

    # -- conversions -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["lr_milestones"] = list(self.lr_milestones)  # plain data, as a file would hold it
        out["options"] = dataclasses.asdict(self.options)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from typed values, a file's or Python's: a string is never read as a number
        (``coerce``); the CLI parses its flags' text before it calls this."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise unknown_name("config field", name, known)
            kwargs[name] = value if name == "options" else coerce(name, hints[name], value)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON file; ``overrides`` (e.g. parsed CLI flags) win over the file."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError("config", str(path), "no such file; give a .yaml, .yml or .json file")
        if path.suffix not in (".yaml", ".yml", ".json"):
            raise ConfigError("config", str(path), "use a .yaml, .yml or .json file")
        text = path.read_text()
        if path.suffix == ".json":
            try:
                values = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError("config", str(path), f"line {exc.lineno}, column {exc.colno}: "
                                  f"{exc.msg}") from None
        else:
            values = read_yaml(text, str(path)) or {}
        if not isinstance(values, dict):
            raise ConfigError("config", str(path), "the file must hold a mapping of field: value")
        options = {**(values.get("options") or {}), **(overrides.pop("options", None) or {})}
        return cls.from_dict({**values, **overrides, "options": options})


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


def read_yaml(text: str, name: str = "<text>") -> Any:
    """YAML, with numbers such as 1e-3 read as numbers (YAML 1.2 does; PyYAML's YAML 1.1 wants
    1.0e-3 and reads 1e-3 as a string, which a number field here refuses). A syntax error is a
    ConfigError naming ``name`` (the file), the line and the column, counted from 1."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                 list("-+.0123456789"))
    try:
        return yaml.load(text, Loader=Loader)  # a SafeLoader: plain data only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(str(x) for x in (getattr(exc, "context", None),
                                         getattr(exc, "problem", None)) if x) or str(exc)
        raise ConfigError("config", name, where + what) from None
