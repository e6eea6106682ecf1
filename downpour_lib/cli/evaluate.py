"""``downpour evaluate``: score a run's checkpoints on the test split, once or while it trains."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..errors import USAGE_ERROR, ConfigError
from . import summary


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    from ..config import Length  # no torch
    from ..defaults import EVAL_POLL_S

    p = sub.add_parser("evaluate", help=summary("evaluate"))
    p.add_argument("--checkpoint-dir", required=True, help="the run's checkpoint_dir")
    p.add_argument("--csv", help="append one row per checkpoint here (default: DIR/evals.csv)")
    p.add_argument("--watch", action="store_true",
                   help="keep polling until the run's final checkpoint is scored")
    p.add_argument("--poll-s", type=float, default=EVAL_POLL_S,
                   help="seconds between polls (default: %(default)g)")
    p.add_argument("--until-step", type=int, help="with --watch: stop once a checkpoint of this "
                                                   "step or later is scored")
    p.add_argument("--timeout-s", type=float, help="with --watch: stop after this many seconds")
    p.add_argument("--device", default="cpu",
                   help="device to evaluate on: cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--batch-size", type=int, default=Length.eval_batch_size,
                   help="(default: %(default)s, a run's eval_batch_size)")
    p.add_argument("--samples", type=int, default=0,
                   help="score this many samples of the test split, spread evenly over it, as a "
                        "run's eval_samples (default: 0, all of it)")
    p.add_argument("--data-dir", help="where the data set's files are (default: the run's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.set_defaults(func=cmd_evaluate, output_files=("csv",))


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..evaluator import run

    checks = {"poll_s": math.isfinite(args.poll_s) and args.poll_s > 0,
              "batch_size": args.batch_size >= 1, "threads": args.threads >= 1,
              "until_step": args.until_step is None or args.until_step >= 1,
              "timeout_s": args.timeout_s is None or (math.isfinite(args.timeout_s)
                                                      and args.timeout_s > 0)}
    for name, ok in checks.items():
        if not ok:
            raise ConfigError(name, getattr(args, name), "must be a finite number > 0")
    if args.samples < 0:
        raise ConfigError("samples", args.samples, "a whole number >= 0 (0: all of the test split)")
    _device_named(args.device)
    if os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
        # watched, it would poll a file for checkpoints until its timeout
        raise ConfigError("checkpoint_dir", args.checkpoint_dir,
                          "is a file, and a directory is wanted: give a run's checkpoint_dir")
    if not args.watch and not os.path.isdir(args.checkpoint_dir):
        raise ConfigError("checkpoint_dir", args.checkpoint_dir,
                          "no such directory; give a run's checkpoint_dir (or --watch to wait "
                          "for a run that has not written one yet)")
    if not args.watch and (args.until_step or args.timeout_s):
        raise ConfigError("watch", False, "--until-step and --timeout-s only apply with --watch")
    from ..checkpoint import scan

    if not args.watch and not scan(args.checkpoint_dir):
        raise ConfigError("checkpoint_dir", args.checkpoint_dir,
                          "holds no checkpoint: expected files named ckpt-<step>.pt, which "
                          "`downpour train --checkpoint-dir DIR` writes; give a run's "
                          "checkpoint_dir (or --watch to wait for a run that has not written one)")
    import torch

    device = _evaluation_device(args.device)
    torch.set_num_threads(args.threads)  # few: the cores belong to the training it watches
    stopped = run(args.checkpoint_dir, args.csv, args.watch, args.poll_s, args.until_step,
                  args.timeout_s, device, args.batch_size, args.data_dir, args.samples)
    if stopped == "timeout":
        print(f"downpour evaluate: stopped after {args.timeout_s} s without the final checkpoint",
              flush=True)
    csv = args.csv or os.path.join(args.checkpoint_dir, "evals.csv")
    if stopped == "scored before":
        print(f"downpour evaluate: nothing new: the checkpoints in {args.checkpoint_dir} are "
              f"scored in {csv} already", flush=True)
    if stopped == "final before":
        print(f"downpour evaluate: stopped: the newest checkpoint in {args.checkpoint_dir} was its "
              "run's final one before the watch began; to watch a run resumed from it, give "
              "--until-step with the resumed run's --steps", flush=True)
    if stopped == "unreadable":
        print(f"downpour evaluate: error: no checkpoint in {args.checkpoint_dir} could be read "
              "(each is named above)", file=sys.stderr, flush=True)
        return USAGE_ERROR
    return 0


def _device_named(text: str) -> tuple[str, int | None]:
    """``--device``'s kind and GPU index: auto, cpu, cuda or cuda:N (no torch: said first)."""
    kind, colon, index = text.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (colon and (kind != "cuda" or not index.isdigit())):
        raise ConfigError("device", text, "choose one of cpu, cuda, cuda:N (N a GPU's index) or auto")
    return kind, int(index) if colon else None


def _evaluation_device(text: str) -> str:
    """``--device`` as torch names it, checked before any checkpoint is read: a GPU that is not
    there is said once, not as each checkpoint's failure to load."""
    import torch

    from ..comm.runtime import pick_device

    kind, index = _device_named(text)
    try:
        device = pick_device(kind, index or 0)
    except ConfigError as exc:  # CUDA is not there: said of the value given
        raise ConfigError("device", text, exc.expected) from None
    if index is not None and index >= torch.cuda.device_count():
        raise ConfigError("device", text, f"this node has {torch.cuda.device_count()} GPU(s): give "
                                          f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return str(device)
