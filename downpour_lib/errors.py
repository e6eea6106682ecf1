"""Errors that tell the user what to do.

Every message names the field, the value that was given, and what would work, so a bad run fails
before any process blocks and the user can fix it without reading the source.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
import typing
from collections.abc import Iterable
from typing import Any, Literal

#: the exit status of a command refused for its input (argparse's own)
USAGE_ERROR = 2


#: how long a rank that leaves the message to another waits before it exits with the error
QUIET_EXIT_DELAY_S = 10.0


def refuse(text: str, speak: bool) -> int:
    """Exit status 2 for bad input, with ``text`` from the ranks that ``speak``. The others wait
    first: a launcher ends the job at the first rank that exits with an error, and a quiet rank that
    left before the speaking one had printed took the message with it (mpiexec killed rank 0 a
    moment before it would have said why, under load). mpiexec ends the wait once the speaking rank
    exits; where nothing does (srun), the job ends ``QUIET_EXIT_DELAY_S`` later."""
    if speak:
        print(text, file=sys.stderr, flush=True)
    else:
        time.sleep(QUIET_EXIT_DELAY_S)
    return USAGE_ERROR


class DownpourError(Exception):
    """Base class for errors raised by downpour_lib."""


class ConfigError(DownpourError, ValueError):
    """A setting is unknown, impossible, or does not fit the world it runs in."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r} is not valid: {expected}")

    @classmethod
    def missing(cls, field: str, expected: str) -> ConfigError:
        """A required field not given at all: "FIELD is missing: give EXPECTED"."""
        error = cls(field, None, expected)
        error.args = (f"{field} is missing: give {expected}",)
        return error


def refusal(output: str) -> str | None:
    """The first line of ``output`` (a launched command's) that says a ConfigError, in either of
    its forms ("F=V is not valid: ...", "F is missing: give ..."): the input it refused. None: it
    refused none."""
    return next((line.strip() for line in output.splitlines()
                 if " is not valid: " in line or " is missing: give " in line), None)


class DataError(DownpourError, FileNotFoundError):
    """A data set's files are missing or unreadable."""


class ClusterError(DownpourError):
    """The cluster did not start, or its engines are not one MPI world (``downpour_lib.cluster``;
    here, below it, so that a notebook's one-line errors name it without importing the cluster)."""


class CheckpointError(DownpourError):
    """A checkpoint file is unreadable, incomplete, or not a downpour checkpoint."""


class Diverged(DownpourError, FloatingPointError):
    """Training diverged: a worker's loss is not finite (or, in fp16, its gradients overflow even
    at the smallest loss scale). ``step`` and ``rank`` say where it was seen first."""

    def __init__(self, step: int, rank: int, why: str) -> None:
        self.step, self.rank = step, rank
        super().__init__(f"training diverged at step {step} on rank {rank}: {why}; lower the "
                         "learning rate (lr) or warm it up (lr_warmup_epochs)")


class UsageError(Exception):
    """A command line argparse refused; ``downpour``'s ``main`` says it once (rank 0 under a
    launcher), a study's batch as a ``ConfigError``."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class UsageErrorParser(argparse.ArgumentParser):
    """argparse, whose errors come to its caller (``UsageError``) instead of being printed here and
    now: under ``mpiexec -n 4`` every rank printed the same usage and error."""

    def error(self, message: str):  # noqa: D102 -- argparse's hook
        raise UsageError(self, message)


def closest(value: Any, choices: Iterable[str]) -> str | None:
    """The choice ``value`` most likely misspells (difflib), or None."""
    if not isinstance(value, str):
        return None
    close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
    return close[0] if close else None


def unknown_name(field: str, value: Any, choices: Iterable[str]) -> ConfigError:
    """The error for a name that is not in a registry: the one it likely misspells, then every
    valid name."""
    choices = sorted(choices)
    meant = closest(value, choices)
    return ConfigError(field, value, (f"did you mean {meant}? " if meant else "")
                       + "choose one of " + ", ".join(choices))


def check_choices(obj: Any) -> None:
    """Every ``Literal``-typed field of the dataclass ``obj`` must hold one of its values."""
    for name, hint in typing.get_type_hints(type(obj)).items():
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            if getattr(obj, name) not in choices:
                raise ConfigError(name, getattr(obj, name),
                                  "choose one of " + ", ".join(map(str, choices)))
