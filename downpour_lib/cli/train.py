"""``downpour train``: one configuration, run under ``mpiexec -n N``, ``srun`` or ``torchrun`` (or alone).

Its flags are generated from ``TrainConfig`` and the algorithms' option dataclasses, so the help text
and the validation live in one place. Bad input exits with status 2 and a message naming the field,
the value and what would work, before any rank waits for another.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
import warnings
from typing import Any

from ..errors import ConfigError, DataError
from . import refuse, summary

if typing.TYPE_CHECKING:
    from .. import preempt
    from ..comm import runtime
    from ..config import TrainConfig


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _option_fields() -> dict[str, str]:
    """Every algorithm option, with its help text prefixed by the algorithms that take it (an
    option several algorithms share with different meanings, e.g. topology, lists each)."""
    from ..options import OPTIONS

    helps: dict[str, dict[str, list[str]]] = {}  # option -> help text -> algorithms
    for name, cls in OPTIONS.items():
        for f in dataclasses.fields(cls):
            helps.setdefault(f.name, {}).setdefault(f.metadata.get("help", ""), []).append(name)
        for option, instead in cls.retired.items():  # taken, to be answered with what to give
            helps.setdefault(option, {}).setdefault(f"retired: {instead}", []).append(name)
    return {k: "; ".join(f"[{', '.join(owners)}] {text}" for text, owners in v.items())
            for k, v in helps.items()}


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from ..config import TrainConfig

    p = sub.add_parser("train", help=summary("train"),
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
    from ..options import OPTIONS

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
    from .. import user_code
    from ..config import TrainConfig
    from ..options import coerce

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


def _refuse(exc: Exception, speak: bool) -> int:
    """Exit status 2 for bad input, with its message from the ranks that ``speak`` (``refuse``)."""
    return refuse(f"downpour train: error: {exc}", speak)


def _preempted(stop: preempt.Preempted, config: TrainConfig, ctx: runtime.DistContext) -> int:
    """Every rank, once the preemption checkpoint is written: rank 0 says so and requeues the
    Slurm batch job; then all exit together with PREEMPTED (none before the requeue is made).
    Stopped by SIGTERM: exit TERMINATED, not requeued. A requeued start that made no progress:
    exit STALLED, not requeued again (it would loop)."""
    from .. import preempt
    from ..comm import runtime
    from ..comm.collectives import Communicator

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
    from .. import preempt
    from ..launch_env import discover
    from ..paths import check_new_file

    placement = discover(os.environ)
    preflight = getattr(args, "preflight", False)
    if preflight and os.environ.get("SLURM_NTASKS", "").isdigit():  # the job's ranks, not this one
        placement = dataclasses.replace(placement, rank=0, world_size=int(os.environ["SLURM_NTASKS"]))

    def warn(message: str) -> None:
        if placement.rank == 0:  # every rank sees the same; one message is enough
            print(f"downpour train: warning: {message}", file=sys.stderr, flush=True)

    try:
        with warnings.catch_warnings(record=True) as caught:  # the config's, said as ours
            warnings.simplefilter("always", UserWarning)
            config = config_from_args(args)
        for said in caught:
            if said.category is UserWarning:
                warn(str(said.message))
            else:
                warnings.showwarning(said.message, said.category, said.filename, said.lineno)
        config = config.slurm_resume(named="resume" in vars(args))  # a requeued job continues
        # torch and the engine only once the flags hold: a typo is answered before `import torch`
        from .._torch_import import import_torch

        import_torch(training=not preflight)

        from ..comm import runtime
        from ..engine import Trainer
        from ..planning import prepare, quiet

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
        ctx = runtime.init(config.system.backend, config.system.device, config.system.timeout_s,
                           startup_timeout_s=config.runtime.startup_timeout_s)
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

