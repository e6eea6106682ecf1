"""``downpour study`` (run the scaling sweep under mpiexec, then plot) and ``downpour plot`` (every
study's figures from its CSVs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import USAGE_ERROR
from ..study.core import REFERENCE_ROOT, STUDIES, StudyRefused, reference_dir, results_dir
from ..study.scaling import (
    DEFAULT_ALGORITHMS,
    DEFAULT_REPEATS,
    EMULATED_STEPS,
    SCALING_BASE,
    StudyError,
    StudySpec,
    default_workers,
    study_dir,
)
from ..study.scaling import workload as scaling_workload  # cmd_study's own `workload` is its value
from . import summary


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give comma-separated integers, e.g. 1,2,4") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_study_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help=summary("study"))
    from ..options import OPTIONS

    p.add_argument("--algorithms", type=_names, default=DEFAULT_ALGORITHMS,
                   help=f"comma-separated, of {', '.join(OPTIONS)}; with --links an entry may "
                        "carry options, e.g. sync_ps:servers=2, a series of its own "
                        f"(default: {','.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--workers", type=_ints, default=default_workers(),
                   help="comma-separated worker counts (default: 1,2,... up to the cores here)")
    for key in ("model", "dataset", "batch_size", "warmup_steps", "threads"):
        yours = "a name, or your own package.module:function " if key in ("model", "dataset") else ""
        p.add_argument("--" + key.replace("_", "-"), dest=key, default=SCALING_BASE[key],
                       type=type(SCALING_BASE[key]), help=f"{yours}(default: {SCALING_BASE[key]})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps a run (default: {SCALING_BASE['steps']}; {EMULATED_STEPS} with "
                        "--compute emulated, as notebook 02's emulated sweep)")
    p.add_argument("--compute", choices=("real", "emulated"), default="real",
                   help="emulated: every worker sleeps its compute while its gradients and all "
                        "communication stay real, to measure more workers than cores (default: real)")
    p.add_argument("--emulated-step-s", type=float, default=None,
                   help="with --compute emulated: seconds of compute per step, e.g. 0.05 for a "
                        "GPU's (default: timed here on the same model and batch)")
    p.add_argument("--links", type=_names, default=(),
                   help="with --compute emulated: link rates of the multi-node Slurm sandbox, e.g. "
                        "10gbit,1gbit: as root with Slurm every run goes across its hosts (4 ranks "
                        "a host) once per rate, else on this machine's ranks (default: none)")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                   help=f"runs per point, their spread the error bars (default: {DEFAULT_REPEATS})")
    p.add_argument("--out", default=None,
                   help=f"where runs.csv and figures/ go (default: {study_dir()}, this machine's; "
                        "give a study of another model its own)")
    p.add_argument("--fresh", action="store_true", help="start a new CSV instead of resuming")
    p.set_defaults(func=cmd_study, output_dirs=("out",))

    p = sub.add_parser("plot", help=summary("plot"),
                       description="Redraw figures from study CSVs alone: by default every study of "
                                   f"this machine ({results_dir('scaling').parent}/<study>/), each "
                                   "into figures/ beside its runs.csv.")
    p.add_argument("dirs", nargs="*", metavar="DIR",
                   help="study directories (holding runs.csv), e.g. results/reference/gossip; the "
                        f"study is the directory's name ({', '.join(STUDIES)}) unless --study says")
    p.add_argument("--reference", action="store_true",
                   help=f"the committed references instead ({REFERENCE_ROOT}/<study>/)")
    p.add_argument("--study", choices=STUDIES, default=None,
                   help="which study the DIRs hold (default: each DIR's name)")
    p.add_argument("--csv", default=None,
                   help="a scaling study's CSV (same as its directory with --study scaling)")
    p.add_argument("--figures", default=None,
                   help="where the PNGs go, for one study (default: figures/ beside its CSVs)")
    p.set_defaults(func=cmd_plot, output_dirs=("figures",))


def study_base(args: argparse.Namespace) -> dict:
    """The runs' settings from ``downpour study``'s flags: SCALING_BASE's, with notebook 02's
    EMULATED_STEPS under ``--compute emulated``, the flags' over both."""
    base = {**SCALING_BASE, **{k: getattr(args, k) for k in
                               ("model", "dataset", "batch_size", "warmup_steps", "threads")}}
    if args.compute == "emulated":  # only then: a real study's rows keep their identity
        base.update(compute="emulated", emulated_step_s=args.emulated_step_s,
                    steps=EMULATED_STEPS)
    if args.steps is not None:
        base["steps"] = args.steps
    return base


def cmd_study(args: argparse.Namespace) -> int:
    from ..study.scaling_plots import make_figures
    from ..study.scaling_runs import load_runs, one_workload, other_workloads, scaling_table
    from ..study.studies import Scaling, run_study

    base = study_base(args)
    out = study_dir(args.out)
    csv = out / "runs.csv"
    try:
        if args.links:  # its entries may carry options ("sync_ps:servers=2"), checked there
            _sandbox_sweep(args, base, out)
        else:
            run_study(Scaling(StudySpec(algorithms=args.algorithms, workers=args.workers,
                                        base=base, csv=str(csv), repeats=args.repeats)),
                      fresh=args.fresh)
    except StudyRefused as exc:  # its input, refused by every run: said as bad input is
        print(f"downpour study: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except StudyError as exc:
        print(f"downpour study: {exc}")
        return 1
    workload, runs = scaling_workload(base), load_runs(csv)
    print(scaling_table(one_workload(runs, workload)).to_string(index=False,
                                                                float_format=lambda v: f"{v:.3f}"))
    for path in make_figures(csv, out / "figures", workload):
        print(f"wrote {path}")
    for other in other_workloads(runs, workload):
        print(f"{csv} also holds runs of {other}, left out of this table and its figures "
              "(give each study its own --out)")
    return 0


def _sandbox_sweep(args: argparse.Namespace, base: dict, out: Path) -> None:
    """``--links``: notebook 02's emulated sweep, on the sandbox's hosts once per rate."""
    from ..errors import ConfigError
    from ..study.studies import run_emulated_sweep

    if args.compute != "emulated":
        raise ConfigError("links", ",".join(args.links), "sandbox links go with --compute emulated")
    csv = out / "runs.csv"
    if args.fresh:
        csv.unlink(missing_ok=True)
    emulated = {k: v for k, v in base.items() if k not in ("compute", "emulated_step_s")}
    run_emulated_sweep(args.algorithms, args.workers, [args.emulated_step_s], emulated, csv=csv,
                       repeats=args.repeats, profile=None, links=args.links)


def figure_makers() -> dict:
    """study name -> its ``make_figures(directory, out_dir=None)``."""
    from ..study import accuracy_plots, gossip_plots, scaling_plots, staleness_plots

    return {"scaling": scaling_plots.make_figures, "staleness": staleness_plots.make_figures,
            "gossip": gossip_plots.make_figures, "accuracy": accuracy_plots.make_figures,
            "lm": accuracy_plots.make_figures}


def cmd_plot(args: argparse.Namespace) -> int:
    from ..errors import ConfigError

    if args.csv:
        targets = [(Path(args.csv), "scaling")]
    elif args.dirs:
        targets = []
        for d in map(Path, args.dirs):
            study = args.study or d.name
            if study not in STUDIES:
                raise ConfigError("dir", str(d), f"its name is not a study ({', '.join(STUDIES)}): "
                                  "give --study")
            targets.append((d, study))
    else:  # every study of this machine (or of the reference) that has a CSV
        where = reference_dir if args.reference else results_dir
        targets = []
        for study in STUDIES:
            d = where(study)
            if (d / "runs.csv").is_file():
                targets.append((d, study))
            else:
                print(f"no {d / 'runs.csv'} yet: `make studies` (or its notebook) measures it")
        if not targets:
            return 1
    if args.figures and len(targets) > 1:
        raise ConfigError("figures", args.figures, "give it for one study at a time")
    makers = figure_makers()
    for source, study in targets:
        if not source.exists():
            raise ConfigError("dir", str(source), "no such study directory or CSV")
        for path in makers[study](source, args.figures):
            print(f"wrote {path}")
        if study == "scaling":
            _say_workloads_left_out(source / "runs.csv" if source.is_dir() else source)
    return 0


def _say_workloads_left_out(csv: Path) -> None:
    """The workloads of a scaling CSV that its figures, of the one measured last, leave out."""
    from ..study.scaling_runs import WORKLOAD, load_runs, one_workload, other_workloads

    runs = load_runs(csv)
    drawn = one_workload(runs)
    if len(drawn):
        for other in other_workloads(runs, drawn.iloc[0][WORKLOAD]):
            print(f"{csv} also holds runs of {other}; the figures are of the workload measured "
                  f"last, {drawn.model.iloc[0]}")
