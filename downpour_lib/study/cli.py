"""``downpour study`` (run the sweep, then plot) and ``downpour plot`` (figures from a CSV)."""

from __future__ import annotations

import argparse

from .sweep import DEFAULT_ALGORITHMS, SCALING_BASE, StudyError, StudySpec, default_workers


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
    p.add_argument("--repeats", type=int, default=1, help="runs per point (default: 1)")
    p.add_argument("--csv", default="results/scaling/runs.csv", help="the study's tidy CSV")
    p.add_argument("--figures", default="results/figures", help="where the figures go")
    p.add_argument("--fresh", action="store_true", help="start a new CSV instead of resuming")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("plot", help="make the scaling figures from a study CSV")
    p.add_argument("--csv", default="results/scaling/runs.csv")
    p.add_argument("--figures", default="results/figures")
    p.set_defaults(func=cmd_plot)


def cmd_study(args: argparse.Namespace) -> int:
    from .plots import make_figures, scaling_table
    from .sweep import run_study

    base = {**SCALING_BASE, **{k: getattr(args, k) for k in
                               ("model", "dataset", "batch_size", "steps", "warmup_steps",
                                "threads")}}
    spec = StudySpec(algorithms=args.algorithms, workers=args.workers, base=base, csv=args.csv,
                     repeats=args.repeats)
    try:
        runs = run_study(spec, fresh=args.fresh)
    except StudyError as exc:
        print(f"downpour study: {exc}")
        return 1
    print(scaling_table(runs).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for path in make_figures(args.csv, args.figures):
        print(f"wrote {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .plots import make_figures

    for path in make_figures(args.csv, args.figures):
        print(f"wrote {path}")
    return 0
