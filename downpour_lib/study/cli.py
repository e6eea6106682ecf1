"""``downpour study`` (run the sweep, then plot) and ``downpour plot`` (figures from a CSV)."""

from __future__ import annotations

import argparse

from .sweep import (
    DEFAULT_ALGORITHMS,
    DEFAULT_REPEATS,
    SCALING_BASE,
    StudyError,
    StudySpec,
    default_workers,
    study_dir,
)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give comma-separated integers, e.g. 1,2,4") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_study_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="run the scaling study (each run under mpiexec), then plot")
    from ..algorithms import ALGORITHMS

    p.add_argument("--algorithms", type=_names, default=DEFAULT_ALGORITHMS,
                   help=f"comma-separated, of {', '.join(ALGORITHMS)} "
                        f"(default: {','.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--workers", type=_ints, default=default_workers(),
                   help="comma-separated worker counts (default: 1,2,... up to the cores here)")
    for key in ("model", "dataset", "batch_size", "steps", "warmup_steps", "threads"):
        p.add_argument("--" + key.replace("_", "-"), dest=key, default=SCALING_BASE[key],
                       type=type(SCALING_BASE[key]), help=f"(default: {SCALING_BASE[key]})")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                   help=f"runs per point, their spread the error bars (default: {DEFAULT_REPEATS})")
    p.add_argument("--out", default=None,
                   help=f"where runs.csv and figures/ go (default: {study_dir()}, this machine's)")
    p.add_argument("--fresh", action="store_true", help="start a new CSV instead of resuming")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("plot", help="make the scaling figures from a study CSV")
    p.add_argument("--csv", default=None, help=f"(default: {study_dir() / 'runs.csv'})")
    p.add_argument("--figures", default=None, help="(default: figures/ beside the CSV)")
    p.set_defaults(func=cmd_plot)


def cmd_study(args: argparse.Namespace) -> int:
    from .plots import load_runs, make_figures, scaling_table
    from .sweep import run_study

    base = {**SCALING_BASE, **{k: getattr(args, k) for k in
                               ("model", "dataset", "batch_size", "steps", "warmup_steps",
                                "threads")}}
    out = study_dir(args.out)
    spec = StudySpec(algorithms=args.algorithms, workers=args.workers, base=base,
                     csv=str(out / "runs.csv"), repeats=args.repeats)
    try:
        run_study(spec, fresh=args.fresh)
    except StudyError as exc:
        print(f"downpour study: {exc}")
        return 1
    print(scaling_table(load_runs(spec.csv)).to_string(index=False,
                                                       float_format=lambda v: f"{v:.3f}"))
    for path in make_figures(spec.csv, out / "figures"):
        print(f"wrote {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .plots import make_figures

    csv = Path(args.csv) if args.csv else study_dir() / "runs.csv"
    for path in make_figures(csv, args.figures or csv.parent / "figures"):
        print(f"wrote {path}")
    return 0
