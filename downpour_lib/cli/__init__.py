"""The ``downpour`` command: train | evaluate | models | datasets | study | plot | model | bench |
profiles | notebook | lab | sandbox.

One module of this package for each command (``train``, ``evaluate``, ``listings``, ``study``,
``model``, ``bench``, ``cluster``, ``sandbox``): each adds its parser and holds what the command line
does; what a command runs lives in its own package (``study/``, ``bench/``, ``cluster/``...), which
imports nothing from here. This module builds the parser of the command named (``COMMANDS``), or
where none is named the list of commands alone, and says a usage error once. The console script
(``console.py``) holds the stop signal before it imports this.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import USAGE_ERROR, ConfigError, DataError, UsageError, UsageErrorParser, refuse

#: each command: the function that adds its parser ("module:function", a module of this package),
#: and the line ``downpour --help`` lists it with (its parser's ``help``). A command line builds
#: only the parser of the command it names: the train parser's flags come from the algorithms, the
#: benchmarks import torch (seconds), and `downpour model predict`, `sandbox` or `plot` should not
#: wait for that. A command line that names none (``downpour --help``) builds none: the list alone.
COMMANDS = {
    "train": (".train:add_train_parser", "train one configuration (run it under mpiexec/srun/torchrun)"),
    "evaluate": (".evaluate:add_evaluate_parser",
                 "score a run's checkpoints on the test split into a CSV, once or watching while it "
                 "trains"),
    "models": (".listings:add_models_parser", "list the models with parameter counts"),
    "datasets": (".listings:add_datasets_parser", "list the data sets"),
    "study": (".study:add_study_parsers", "run the scaling study (each run under mpiexec), then plot"),
    "plot": (".study:add_study_parsers", "redraw every study's figures from its CSVs"),
    "model": (".model:add_model_parser",
              "the performance model: calibrate, predict, validate, describe, nccl, spread, presets, "
              "check"),
    "bench": (".bench:add_bench_parser", "benchmarks: print a table, write JSON rows"),
    "profiles": (".cluster:add_cluster_parsers", "install the ipyparallel profiles (local-mpi, slurm-mpi)"),
    "notebook": (".cluster:add_cluster_parsers", "execute a notebook headless (what `make study` does)"),
    "lab": (".cluster:add_lab_parser",
            "open the notebooks in JupyterLab on this environment's kernel (what `make lab` does)"),
    "sandbox": (".sandbox:add_sandbox_parser",
                "a real Slurm for tests and demos, one node or several (as root)"),
}


def summary(command: str) -> str:
    """The line ``downpour --help`` lists ``command`` with."""
    return COMMANDS[command][1]


#: a usage line longer than this many lines (train's, of every field) is named, not printed
USAGE_LINES = 3


def _usage_error(exc: UsageError, argv: Sequence[str]) -> int:
    """argparse's refusal as one message: the usage of the command it is about (a long one
    shortened to its help), the error, and for an unknown flag the closest known one (difflib).
    Under a launcher only rank 0 says it; the others wait (``refuse``)."""
    import difflib

    from ..launch_env import discover

    parser, message = exc.parser, str(exc)
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    unknown = [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0]
               not in known] if message.startswith("unrecognized arguments") else []
    hints = [(flag, close[0]) for flag in unknown
             if (close := difflib.get_close_matches(flag, known, n=1, cutoff=0.6))]
    command = _command(argv)
    if "invalid choice" in message and command and command not in COMMANDS:
        hints = [(command, close[0]) for close in [difflib.get_close_matches(command, COMMANDS, n=1)]
                 if close]
    if len(hints) == 1:
        message += f"; did you mean {hints[0][1]}?"
    elif hints:
        message += "; did you mean " + ", ".join(f"{close} (for {flag})" for flag, close in hints) + "?"
    usage = parser.format_usage().rstrip()
    if usage.count("\n") >= USAGE_LINES:
        usage = f"usage: {parser.prog} [options] (`{parser.prog} --help` lists them)"
    return refuse(f"{usage}\n{parser.prog}: error: {message}", discover(os.environ).rank == 0)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``command``) of that one alone."""
    parser, sub = _top_parser()
    adders = [COMMANDS[command][0]] if command in COMMANDS else [a for a, _ in COMMANDS.values()]
    for where in dict.fromkeys(adders):  # in order, each once (one adds two commands)
        module, name = where.split(":")
        getattr(importlib.import_module(module, __package__), name)(sub)
    return parser


def listing_parser() -> argparse.ArgumentParser:
    """The top level alone, each command a name and its line (``summary``) with no parser behind
    it: what ``downpour --help``, a bare ``downpour`` and a misspelt command need, in a tenth of a
    second where every parser takes seconds (they import torch and pandas)."""
    parser, sub = _top_parser()
    for command in COMMANDS:
        sub.add_parser(command, help=summary(command), add_help=False)
    return parser


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = UsageErrorParser(prog="downpour", description=__doc__.split("\n\n")[0].replace("``", ""))
    return parser, parser.add_subparsers(dest="command", required=True)


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the deepest command ``args`` chose: ``model predict``'s, not ``model``'s."""
    while True:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if action is None or getattr(args, action.dest, None) not in action.choices:
            return parser
        parser = action.choices[getattr(args, action.dest)]


def _command(argv: Sequence[str]) -> str | None:
    """The command an argument list names: its first argument, unless that is an option (--help)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:  # here, not at exit (also after --help), where a closed pipe prints a traceback
            sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()


def check_outputs(args: argparse.Namespace) -> None:
    """Every path the command will write (its parser's ``output_files`` and ``output_dirs``
    defaults name the flags' dests) can be written, before it runs: a study or a calibration
    that ends in a traceback at its last line has lost its work."""
    from ..paths import check_output_dir, check_output_file

    for dest in getattr(args, "output_files", ()):
        check_output_file(dest, getattr(args, dest, None))
    for dest in getattr(args, "output_dirs", ()):
        check_output_dir(dest, getattr(args, dest, None))


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    parser = build_parser(command) if command in COMMANDS else listing_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if command not in COMMANDS:  # the list parsed a command after an option: parse it for real
            parser = build_parser(args.command)
            args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "passes_unknown_args", False):
            # the command's own parser says it: its usage, not the top level's (which, built for
            # this one command alone, listed `{train}` of the twelve), and its flags to suggest
            _chosen(parser, args).error("unrecognized arguments: " + " ".join(unknown))
    except UsageError as exc:
        return _usage_error(exc, argv)
    args.unknown_args = unknown
    try:
        check_outputs(args)
        return args.func(args)
    except (ConfigError, DataError) as exc:  # said by the verb it is about (downpour model predict)
        print(f"{_chosen(parser, args).prog}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def _reader_gone() -> int:
    """The reader of our output left (``downpour ... | head``): end quietly, as a Unix tool that
    dies of SIGPIPE does (status 128 + 13), with no traceback. Python ignores SIGPIPE, so a write
    raises instead; stdout goes to /dev/null so that the flush at exit cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13

