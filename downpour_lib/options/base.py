"""Options plumbing below both the algorithms and the run config: the base of every algorithm's
options, and turning values typed in files, Python or on a command line into a field's type, with
errors that name the field, the value and what would work.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ..errors import ConfigError, check_choices, closest


@dataclass(frozen=True)
class Roles:
    """Who does what in a run of ``world_size`` ranks: the workers compute gradients (each reads
    its own shard of the data, by its position among them), the servers hold parameters (a rank
    may be both), and the evaluator evaluates and writes the checkpoints. The options produce it
    (``AlgorithmOptions.roles``), as a pure function, before any rank talks to another."""

    world_size: int
    workers: tuple[int, ...]
    servers: tuple[int, ...] = ()
    evaluator: int = 0

    @classmethod
    def everyone(cls, world_size: int) -> Roles:
        """Every rank a worker; rank 0 evaluates."""
        return cls(world_size, tuple(range(world_size)))

    def role(self, rank: int) -> Literal["worker", "server"]:
        """What ``rank`` runs: the training steps (a worker) or a server's loop."""
        return "worker" if rank in self.workers else "server"

    def worker_index(self, rank: int) -> int:
        """Position among the workers: which shard of the data this rank reads."""
        return self.workers.index(rank)

    @property
    def dedicated_servers(self) -> tuple[int, ...]:
        """The servers that only serve."""
        return tuple(r for r in self.servers if r not in self.workers)


@dataclass(frozen=True)
class AlgorithmOptions:
    """Base of every algorithm's options: a frozen dataclass, one help text per field.
    Subclasses that validate more call ``super().__post_init__()``; those whose algorithm places
    ranks otherwise than "every rank a worker" override ``roles`` and ``roles_for``."""

    #: The update rule when the config names none (Downpour SGD made Adagrad its default).
    default_optimizer: ClassVar[str] = "sgd"
    #: the learning rate that goes with ``default_optimizer`` when the run names neither (None:
    #: the run's default, 0.05)
    default_lr: ClassVar[float | None] = None
    #: The stop policy on a preemption signal (``lifecycle.stopper``): the fewest steps between a
    #: vote and its reading. 1 costs no waiting where ranks step together; options that let ranks
    #: drift apart give their bound (a property where it depends on a field).
    stop_lag: ClassVar[int] = 1
    #: fp16: how the ranks agree to skip a step whose gradients overflowed, read by the engine.
    #: "vote": the loss scale comes off before ``after_backward`` and every rank skips if any
    #: overflowed (a MAX allreduce of 4 bytes, ``algorithms.base.vote_overflow``); "reduced": the
    #: gradients are averaged during backward (bucketed allreduce, DDP), so the scale comes off
    #: after ``after_backward`` and every rank finds the same; "alone": no rank steps with
    #: another (asynchronous), the scale comes off before ``after_backward`` and a rank that
    #: overflowed skips alone: its ``after_backward`` and ``step`` see no gradients.
    overflow: ClassVar[Literal["vote", "reduced", "alone"]] = "vote"
    #: options the algorithm no longer takes -> what to give instead: a config that names one
    #: gets that answer, not "no such option" (easgd's ``mode``: async is ``easgd_async`` now)
    retired: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        check_choices(self)

    def roles(self, world_size: int) -> Roles:
        """Who does what with ``world_size`` ranks; a ConfigError (field, value, what would work)
        when the algorithm cannot run with that many. Checked before any rendezvous."""
        return Roles.everyone(world_size)

    def roles_for(self, workers: int) -> Roles:
        """The roles with ``workers`` workers, servers added as the options say: what to
        launch (``.world_size`` ranks) for a run of that many workers."""
        return self.roles(check_workers(workers))

    def in_effect(self, roles: Roles) -> dict[str, Any]:
        """The options a run with ``roles`` trains with where a field says "none = a default of
        the run's size" (easgd's moving rate, 0.9 / N): what its summary reports."""
        return {}

    def checkpoint_refusal(self) -> str | None:
        """Why the algorithm cannot write checkpoints with these options, or None (it can)."""
        return None

    def stop_refusal(self) -> str | None:
        """Why the ranks cannot stop early together with these options, or None (they vote,
        ``stop_lag``): the signal is then reported once and the run goes on."""
        return None


def check_whole(name: str, value: Any, least: int, why: str = "", of: str = "") -> int:
    """``value`` if a whole number >= ``least`` (a bool is not one, though True == 1), else a
    ConfigError naming the field: "must be a whole number[ of <of>] >= <least>[ (<why>)]"."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(name, value, f"must be a whole number{f' of {of}' if of else ''} >= "
                                       f"{least}{f' ({why})' if why else ''}")
    return int(value)


def check_workers(workers: Any) -> int:
    """A number of workers, or a ConfigError."""
    return check_whole("workers", workers, 1)


def check_positive(name: str, value: Any, example: str, of: str = "") -> None:
    """A finite number > 0 (a learning rate, a bucket's MB), else a ConfigError naming the field:
    "must be a finite number[ of <of>] > 0, e.g. <example>"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(name, value, f"must be a finite number{f' of {of}' if of else ''} > 0, "
                                       f"e.g. {example}")


def check_momentum(name: str, value: Any, example: str) -> None:
    """A momentum: in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(name, value, f"must be in [0, 1), e.g. {example}")


def build_options(algorithm: str, cls: type[AlgorithmOptions], options: Any,
                  others: Mapping[str, type[AlgorithmOptions]] | None = None) -> AlgorithmOptions:
    """Validate ``options`` (None, a mapping, or the dataclass) into ``cls``, the options of
    ``algorithm`` (the name is for messages). ``others``: every algorithm's options, so that an
    option of another algorithm is named as such."""
    if isinstance(options, cls):
        return options
    if options is None:
        return cls()
    if isinstance(options, AlgorithmOptions):
        raise ConfigError("options", type(options).__name__,
                          f"give {cls.__name__} for algorithm {algorithm!r}")
    if not isinstance(options, Mapping):
        raise ConfigError("options", options, "give a mapping of option name to value")
    known = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for name in options:
        if name in cls.retired:
            raise ConfigError(name, options[name], cls.retired[name])
        if name not in known:
            valid = ", ".join(known) if known else "none"
            takes = [other for other, c in (others or {}).items()
                     if name in {f.name for f in dataclasses.fields(c)}]
            meant = closest(name, known)
            hint = (f"; did you mean {meant}?" if meant
                    else f"; it is an option of {', '.join(takes)}" if takes else "")
            raise ConfigError(name, options[name], f"algorithm {algorithm!r} has no such option"
                                                   f"{hint} (its options: {valid})")
    return cls(**{k: coerce(k, hints[k], v) for k, v in options.items()})


#: What a field of each type must be, in words.
KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def coerce(name: str, hint: Any, value: Any, text: bool = False) -> Any:
    """``value`` as the type ``hint``, or a ConfigError that says what the field needs.

    ``text``: the value is a string typed on a command line, parsed into the type ("none" for an
    optional field). Otherwise the value is typed already (a file's, Python's): a string is never
    read as a number or a bool, and only what loses nothing is converted (10.0 to 10, 1 to 1.0).
    """
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        if text and value.lower() in ("none", "null", ""):
            return None
        return coerce(name, kinds[0], value, text)
    if origin is Literal:
        choices = typing.get_args(hint)
        return coerce(name, type(choices[0]), value, text) if choices else value
    if hint not in KINDS:
        return value
    if text:
        return parse(name, hint, value)
    if hint is str:
        return str(value)  # a number where a name is wanted is refused by the name's own check
    if hint is bool and isinstance(value, bool):
        return value
    if hint in (int, float) and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if hint is float:
            return float(value)
        if isinstance(value, numbers.Integral) or float(value).is_integer():
            return int(value)
    expected = f"must be {KINDS[hint]}"
    if isinstance(value, str):
        expected += ", not a string"
        try:
            if math.isfinite(parse(name, hint, value)):
                expected += f": write {value} without quotes"
        except ConfigError:
            pass
    raise ConfigError(name, value, expected)


def parse(name: str, hint: type, text: str) -> Any:
    """The value of a flag's ``text`` as ``hint`` (int, float, bool or str)."""
    if hint is bool:
        if text.lower() in ("true", "yes", "1", "on"):
            return True
        if text.lower() in ("false", "no", "0", "off"):
            return False
    else:
        try:
            return hint(text)
        except ValueError:
            pass
    raise ConfigError(name, text, f"must be {KINDS[hint]}")


def field_help(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
