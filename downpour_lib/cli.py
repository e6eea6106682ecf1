"""The ``downpour`` command: train | evaluate | models | datasets | study | plot | bench | profiles |
notebook | lab | sandbox.

``downpour train`` runs under ``mpiexec -n N``, ``srun`` or ``torchrun`` (or alone). Its flags are
generated from ``TrainConfig`` and the algorithms' option dataclasses, so the help text and the
validation live in one place. Bad input exits with status 2 and a message naming the field, the value
and what would work, before any rank waits for another.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys
import time
import typing
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError, DataError

if typing.TYPE_CHECKING:
    from . import preempt
    from .comm import runtime
    from .config import TrainConfig

USAGE_ERROR = 2


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _option_fields() -> dict[str, str]:
    """Every algorithm option, with its help text prefixed by the algorithms that take it (an
    option several algorithms share with different meanings, e.g. topology, lists each)."""
    from .options import OPTIONS

    helps: dict[str, dict[str, list[str]]] = {}  # option -> help text -> algorithms
    for name, cls in OPTIONS.items():
        for f in dataclasses.fields(cls):
            helps.setdefault(f.name, {}).setdefault(f.metadata.get("help", ""), []).append(name)
        for option, instead in cls.retired.items():  # taken, to be answered with what to give
            helps.setdefault(option, {}).setdefault(f"retired: {instead}", []).append(name)
    return {k: "; ".join(f"[{', '.join(owners)}] {text}" for text, owners in v.items())
            for k, v in helps.items()}


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from .config import TrainConfig

    p = sub.add_parser("train", help="train one configuration (run it under mpiexec/srun/torchrun)",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="YAML or JSON file of TrainConfig fields; flags override it")
    p.add_argument("--summary-json", help="rank 0 writes the run's summary row here")
    p.add_argument("--preflight", action="store_true",
                   help="check everything that can be checked before training (the flags, the "
                        "data, the output paths, the checkpoint to resume; in a Slurm job, for its "
                        "SLURM_NTASKS ranks, and its time left against DOWNPOUR_SIGNAL_LEAD "
                        "seconds), then exit: 0, or 2 with what to change. One process, before the "
                        "launcher starts any rank (the batch script runs it)")
    defaults = TrainConfig.flat_fields()  # flat flags: --batch-size sets data.batch_size
    helps = {name: f.metadata.get("help", "") for name, f in defaults.items()}
    group = p.add_argument_group("training")
    for name, text in helps.items():
        if name != "options":
            group.add_argument(_flag(name), dest=name, metavar=name.upper(),
                               help=f"{text} (default: {defaults[name].default})")
    group = p.add_argument_group("algorithm options")
    for name, text in _option_fields().items():
        group.add_argument(_flag(name), dest=f"option:{name}", metavar=name.upper(), help=text)
    p.set_defaults(func=cmd_train)


def _option_hints() -> dict[str, Any]:
    """Each algorithm option's type, to parse its flag's text. Algorithms that share an option name
    share its type (they may differ in a Literal's choices, which the options check)."""
    from .options import OPTIONS

    hints: dict[str, Any] = {}
    for cls in OPTIONS.values():
        types = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hints.setdefault(f.name, types[f.name])
        for option in cls.retired:  # its text, for build_options to answer
            hints.setdefault(option, str)
    return hints


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The flags' text parsed into each field's type, over the config file's typed values."""
    from . import user_code
    from .config import TrainConfig
    from .options import coerce

    user_code.receive_file(os.environ.get(user_code.SHIPPED_ENV))  # a study's own functions
    hints, option_hints = TrainConfig.flat_hints(), _option_hints()
    values = {k: coerce(k, hints[k], v, text=True) for k, v in vars(args).items()
              if k in hints and k != "options"}
    options = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("option:")}
    options = {k: coerce(k, option_hints[k], v, text=True) for k, v in options.items()}
    if getattr(args, "config", None):
        return TrainConfig.from_file(args.config, **values, options=options)
    return TrainConfig.from_dict({**values, "options": options})


#: the fields whose check fails only on the rank that writes there
OUTPUT_FIELDS = ("output_dir", "checkpoint_dir", "summary_json", "trace")


#: how long a rank that leaves the message to another waits before it exits with the error
QUIET_EXIT_DELAY_S = 10.0


def _refuse(exc: Exception, speak: bool) -> int:
    """Exit status 2 for bad input, with its message from the ranks that ``speak``. The others wait
    first: a launcher ends the job at the first rank that exits with an error, and a quiet rank that
    left before the speaking one had printed took the message with it (mpiexec killed rank 0 a
    moment before it would have said why, under load). mpiexec ends the wait once the speaking rank
    exits; where nothing does (srun), the job ends ``QUIET_EXIT_DELAY_S`` later."""
    if speak:
        print(f"downpour train: error: {exc}", file=sys.stderr, flush=True)
    else:
        time.sleep(QUIET_EXIT_DELAY_S)
    return USAGE_ERROR


def _preempted(stop: preempt.Preempted, config: TrainConfig, ctx: runtime.DistContext) -> int:
    """Every rank, once the preemption checkpoint is written: rank 0 says so and requeues the
    Slurm batch job; then all exit together with PREEMPTED (none before the requeue is made).
    Stopped by SIGTERM: exit TERMINATED, not requeued. A requeued start that made no progress:
    exit STALLED, not requeued again (it would loop)."""
    from . import preempt
    from .comm import runtime
    from .comm.collectives import Communicator

    preempt.SIGNAL.ignore()  # answered: a later one must not kill a rank on its way out
    status = (preempt.TERMINATED if stop.terminated else
              preempt.STALLED if stop.completed <= stop.started and preempt.restarts() else
              preempt.PREEMPTED)
    if ctx.rank == 0:
        preempt.say(f"{config.algorithm} {stop}")
        directory, requeue = config.outputs.checkpoint_dir, config.runtime.requeue
        again = (f"--resume auto (or --resume {directory})" if directory
                 else "a --checkpoint-dir, for the run to leave a checkpoint")
        requeue = requeue if requeue is not None else preempt.slurm_batch()
        if status == preempt.TERMINATED:
            preempt.say("not requeued: after a SIGTERM (scancel, the time limit, a preemption) a "
                        "requeue is Slurm's to make; to continue, run the same command again with "
                        f"{again} (in a Slurm job --resume auto is the default)")
        elif status == preempt.STALLED:
            preempt.say(f"not requeued: this start (restart {preempt.restarts()} of the job) began "
                        f"at step {stop.started} and was stopped before it took a step, so the "
                        "signal comes at every start: a time limit not longer than the --signal "
                        "lead (give a longer --time, or a shorter lead), or a preemption as soon "
                        f"as it starts. Submit it again to continue, with {again}")
        elif requeue and config.runtime.requeue is None and preempt.batch_requeues():
            preempt.note_preempted()
            preempt.say("the batch script requeues the job")
        elif requeue:
            preempt.requeue(preempt.say)
        else:
            preempt.say(f"to continue, run the same command again with {again}")
    Communicator.world().barrier()
    runtime.shutdown()
    return status


def cmd_train(args: argparse.Namespace) -> int:
    from . import preempt
    from .launch_env import discover
    from .paths import check_new_file

    placement = discover(os.environ)
    preflight = getattr(args, "preflight", False)
    if preflight and os.environ.get("SLURM_NTASKS", "").isdigit():  # the job's ranks, not this one
        placement = dataclasses.replace(placement, rank=0, world_size=int(os.environ["SLURM_NTASKS"]))

    def warn(message: str) -> None:
        if placement.rank == 0:  # every rank sees the same; one message is enough
            print(f"downpour train: warning: {message}", file=sys.stderr, flush=True)

    try:
        config = config_from_args(args)
        config = config.slurm_resume(named="resume" in vars(args))  # a requeued job continues
        # torch and the engine only once the flags hold: a typo is answered before `import torch`
        from ._torch_import import import_torch

        import_torch(training=not preflight)

        from .comm import runtime
        from .engine import Trainer
        from .planning import prepare, quiet

        say = quiet if preflight and preempt.in_slurm_job() else warn  # the ranks say it again
        plan, splits = prepare(config, placement.world_size, say,
                               rank=None if preflight else placement.rank)  # None: every rank's
        if placement.rank == 0:  # rank 0 writes the summary
            check_new_file("summary_json", getattr(args, "summary_json", None))
        if preflight:
            lead = os.environ.get("DOWNPOUR_SIGNAL_LEAD", "")
            if lead.isdigit() and config.runtime.preempt_signal != "none":
                preempt.check_time_limit(int(lead))
            return 0
    except (ConfigError, DataError) as exc:
        # a bad setting fails every rank alike, one message is enough; an output path fails the
        # rank that writes it, and the launcher ends the others (before any rendezvous)
        return _refuse(exc, placement.rank == 0 or getattr(exc, "field", None) in OUTPUT_FIELDS)
    try:
        runtime.check_device(config.system.backend, config.system.device, placement.local_rank,
                             placement.local_world_size)
    except ConfigError as exc:  # a node's devices: its first rank speaks for it
        return _refuse(exc, placement.local_rank == 0)
    # scancel, the time limit: SIGTERM stops the run at a step too, with its checkpoint
    with preempt.SIGNAL.stopping_on_term(), runtime.abort_on_error():
        ctx = runtime.init(config.system.backend, config.system.device, config.system.timeout_s)
        try:
            result = Trainer(config, ctx, plan, splits, log_progress=True).run()
        except preempt.Preempted as stop:
            return _preempted(stop, config, ctx)
        preempt.SIGNAL.ignore()  # the run is over: a signal now has nothing to stop
        if result is not None:
            if getattr(args, "summary_json", None):
                result.write_summary_json(args.summary_json)
            s = result.summary
            scored = (f"validation loss {s['test_loss']:.4f}, perplexity {s['test_perplexity']:.2f}"
                      if "test_perplexity" in s else f"test accuracy {s['test_accuracy']:.4f}")
            rate = (f"{s['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in s
                    else f"{s['samples_per_s']:.1f} samples/s")
            print(f"{config.algorithm}: {s['num_workers']} worker(s), {s['world_size']} rank(s), "
                  f"{rate}, final train loss {s['final_train_loss']:.4f}, {scored}, "
                  f"{s['wall_s']:.1f} s", flush=True)
        runtime.shutdown()
    return 0


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    from .config import Length  # no torch
    from .defaults import EVAL_POLL_S

    p = sub.add_parser("evaluate", help="score a run's checkpoints on the test split into a CSV, "
                                        "once or watching while it trains")
    p.add_argument("--checkpoint-dir", required=True, help="the run's checkpoint_dir")
    p.add_argument("--csv", help="append one row per checkpoint here (default: DIR/evals.csv)")
    p.add_argument("--watch", action="store_true",
                   help="keep polling until the run's final checkpoint is scored")
    p.add_argument("--poll-s", type=float, default=EVAL_POLL_S,
                   help="seconds between polls (default: %(default)g)")
    p.add_argument("--until-step", type=int, help="with --watch: stop once a checkpoint of this "
                                                   "step or later is scored")
    p.add_argument("--timeout-s", type=float, help="with --watch: stop after this many seconds")
    p.add_argument("--device", default="cpu", help="device to evaluate on (default: cpu)")
    p.add_argument("--batch-size", type=int, default=Length.eval_batch_size,
                   help="(default: %(default)s, a run's eval_batch_size)")
    p.add_argument("--data-dir", help="where the data set's files are (default: the run's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluator import run

    checks = {"poll_s": math.isfinite(args.poll_s) and args.poll_s > 0,
              "batch_size": args.batch_size >= 1, "threads": args.threads >= 1,
              "until_step": args.until_step is None or args.until_step >= 1,
              "timeout_s": args.timeout_s is None or (math.isfinite(args.timeout_s)
                                                      and args.timeout_s > 0)}
    for name, ok in checks.items():
        if not ok:
            raise ConfigError(name, getattr(args, name), "must be a finite number > 0")
    if not args.watch and not os.path.isdir(args.checkpoint_dir):
        raise ConfigError("checkpoint_dir", args.checkpoint_dir,
                          "no such directory; give a run's checkpoint_dir (or --watch to wait "
                          "for a run that has not written one yet)")
    if not args.watch and (args.until_step or args.timeout_s):
        raise ConfigError("watch", False, "--until-step and --timeout-s only apply with --watch")
    from .checkpoint import scan

    if not args.watch and not scan(args.checkpoint_dir):
        raise ConfigError("checkpoint_dir", args.checkpoint_dir,
                          "holds no checkpoint: expected files named ckpt-<step>.pt, which "
                          "`downpour train --checkpoint-dir DIR` writes; give a run's "
                          "checkpoint_dir (or --watch to wait for a run that has not written one)")
    import torch

    torch.set_num_threads(args.threads)  # few: the cores belong to the training it watches
    stopped = run(args.checkpoint_dir, args.csv, args.watch, args.poll_s, args.until_step,
                  args.timeout_s, args.device, args.batch_size, args.data_dir)
    if stopped == "timeout":
        print(f"downpour evaluate: stopped after {args.timeout_s} s without the final checkpoint",
              flush=True)
    csv = args.csv or os.path.join(args.checkpoint_dir, "evals.csv")
    if stopped == "scored before":
        print(f"downpour evaluate: nothing new: the checkpoints in {args.checkpoint_dir} are "
              f"scored in {csv} already", flush=True)
    if stopped == "unreadable":
        print(f"downpour evaluate: error: no checkpoint in {args.checkpoint_dir} could be read "
              "(each is named above)", file=sys.stderr, flush=True)
        return 1
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .models import MODELS, build_model, parameter_count

    rows = []
    for spec in MODELS.values():
        model = build_model(spec.name, spec.default_input, spec.default_classes)
        shape = "x".join(map(str, spec.default_input))
        rows.append((spec.name, f"{parameter_count(model):,}", f"{shape}/{spec.default_classes}",
                     spec.description))
    _table(("model", "parameters", "input/classes", "description"), rows)
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from .data import DATASETS

    rows = [(s.name, s.kind, "x".join(map(str, s.input_shape)), s.num_classes or "from files",
             s.train_size or "-", s.test_size or "-", s.description) for s in DATASETS.values()]
    _table(("dataset", "kind", "input", "classes", "train", "test", "description"), rows)
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def _add_models_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("models", help="list the models with parameter counts").set_defaults(
        func=cmd_models)


def _add_datasets_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("datasets", help="list the data sets").set_defaults(func=cmd_datasets)


#: each command and the function that adds its parser ("module:function", a module of this
#: package). A command line builds only the parser of the command it names: the train parser's
#: flags come from the algorithms, which import torch (seconds), and `downpour model predict`,
#: `sandbox` or `plot` should not wait for that.
COMMANDS = {
    "train": ".cli:add_train_parser", "evaluate": ".cli:add_evaluate_parser",
    "models": ".cli:_add_models_parser", "datasets": ".cli:_add_datasets_parser",
    "study": ".study.cli:add_study_parsers", "plot": ".study.cli:add_study_parsers",
    "model": ".study.model_cli:add_model_parser", "bench": ".bench.cli:add_bench_parser",
    "profiles": ".cluster.cli:add_cluster_parsers", "notebook": ".cluster.cli:add_cluster_parsers",
    "lab": ".cluster.cli:add_lab_parser", "sandbox": ".sandbox.cli:add_sandbox_parser",
}


class UsageError(Exception):
    """A command line argparse refused; ``main`` says it once (rank 0 under a launcher)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors come to ``main`` instead of being printed here and now: under
    ``mpiexec -n 4`` every rank printed the same usage and error."""

    def error(self, message: str):  # noqa: D102 -- argparse's hook
        raise UsageError(self, message)


#: a usage line longer than this many lines (train's, of every field) is named, not printed
USAGE_LINES = 3


def _usage_error(exc: UsageError, argv: Sequence[str]) -> int:
    """argparse's refusal as one message: the usage of the command it is about (a long one
    shortened to its help), the error, and for an unknown flag the closest known one (difflib).
    Under a launcher only rank 0 says it; the others wait, as ``_refuse``'s do."""
    import difflib

    from .launch_env import discover

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
    return _refuse_usage(f"{usage}\n{parser.prog}: error: {message}",
                         discover(os.environ).rank == 0)


def _refuse_usage(text: str, speak: bool) -> int:
    if speak:
        print(text, file=sys.stderr, flush=True)
    else:
        time.sleep(QUIET_EXIT_DELAY_S)
    return USAGE_ERROR


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (``command``) of that one alone."""
    parser = _Parser(prog="downpour", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    adders = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for where in dict.fromkeys(adders):  # in order, each once (one adds two commands)
        module, name = where.split(":")
        getattr(importlib.import_module(module, __package__), name)(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


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


def _run(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    parser = build_parser(command)
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "passes_unknown_args", False):
            # the command's own parser says it: its usage, not the top level's (which, built for
            # this one command alone, listed `{train}` of the twelve)
            sub = _subparser(parser, args.command)
            sub.error("unrecognized arguments: " + " ".join(unknown))
    except UsageError as exc:
        return _usage_error(exc, argv)
    args.unknown_args = unknown
    try:
        return args.func(args)
    except (ConfigError, DataError) as exc:
        print(f"downpour {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def _reader_gone() -> int:
    """The reader of our output left (``downpour ... | head``): end quietly, as a Unix tool that
    dies of SIGPIPE does (status 128 + 13), with no traceback. Python ignores SIGPIPE, so a write
    raises instead; stdout goes to /dev/null so that the flush at exit cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13
