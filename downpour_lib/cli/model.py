"""``downpour model``: calibrate the performance model on measurements, predict with it, show what
NCCL's tuner would run on a hardware file's links, read a run's spreads for a hardware file, list
the presets of published hardware and check the model against published results. The verbs about
hardware files and published results (describe, nccl, spread, presets, check) are
``model_hardware``'s."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from ..errors import ConfigError
from ..perf.calibration import Calibration
from ..perf.netmodel import COLLECTIVES
from ..perf.perfmodel import MODELLED_ALGORITHMS, option_value, readable_options
from ..study.core import reference_dir, results_dir
from ..study.model_plots import model_dir
from . import summary
from .model_hardware import add_hardware_verbs, check_figure_path, data_for, worker_counts

#: what ``model calibrate`` takes compute times from unless given --study or --summary
REFERENCE_STUDY = str(reference_dir("scaling") / "runs.csv")


def default_calibration() -> Path:
    """Where ``downpour model calibrate`` (and notebook 06) write this machine's calibration."""
    return model_dir() / "calibration.json"


def study_calibration() -> Path:
    """Where ``make study`` (notebook 02, ``model_plots.model_for_study``) writes it."""
    return results_dir("scaling") / "calibration.json"


def find_calibration() -> Path:
    """This machine's calibration for ``model predict``: the newer of ``default_calibration()``
    and ``study_calibration()``, so that right after ``make study`` predict reads what it wrote;
    a ConfigError naming both, and how to make either, when there is neither."""
    found = [p for p in (default_calibration(), study_calibration()) if p.is_file()]
    if not found:
        raise ConfigError("calibration", str(study_calibration()),
                          f"no such file, nor {default_calibration()}: run `make study` (it "
                          "calibrates the model on this machine), or `downpour model calibrate`, "
                          "or give --calibration FILE or --preset NAME")
    return max(found, key=lambda p: p.stat().st_mtime)


def check_names(model: str, algorithms: list[str], any_model: bool = False,
                measured: Iterable[str] = ()) -> None:
    """--model and --algorithm against the names that exist, before the prediction: downpour's
    models, the presets', the ``measured`` ones of the calibration it will read, and your own
    (an import path, ``package.module:function``); any model where a hardware file names its
    own."""
    from ..errors import unknown_name
    from ..models import MODELS
    from ..perf.presets import PRESETS

    models = set(MODELS) | {m for cal in PRESETS.values() for m in cal.workloads} | set(measured)
    if model not in models and ":" not in model and not any_model:
        raise unknown_name("model", model, [*sorted(models), "package.module:function"])
    if not algorithms:
        raise ConfigError("algorithm", "", "give one or more of " + ", ".join(MODELLED_ALGORITHMS))
    for name in algorithms:
        if name not in MODELLED_ALGORITHMS:
            raise unknown_name("algorithm", name, MODELLED_ALGORITHMS)


def no_compute(cal: Calibration, model: str, path: Path | str | None, preset: str | None = None,
               hardware: bool = False) -> ConfigError:
    """The error for a model the calibration (measured, at ``path``; the hardware file at ``path``
    with ``hardware``; or the preset ``preset``) has no compute time for: how to measure or add
    it, and the presets that have it. No guess stands in for it (a FLOP count misses the memory
    traffic a CPU step is bound by)."""
    from ..errors import closest
    from ..models import MODELS
    from ..perf.presets import PRESETS

    has = f"has compute for {', '.join(sorted(cal.workloads))} only."
    if ":" in model:  # yours: a name that does not import is a typo, not a model to measure
        from .. import user_code

        try:
            user_code.resolve("model", model)
        except ConfigError as exc:
            meant = closest(model, cal.workloads)
            return ConfigError("model", model, f"did you mean {meant}? It {has}") if meant else exc
    holders = sorted(name for name, other in PRESETS.items() if model in other.workloads)
    elsewhere = f" Presets with {model}: {', '.join(holders)} (--preset NAME)." if holders else ""
    counted = (f"`downpour model describe --model {model}` counts all but images_per_s"
               if model in MODELS or ":" in model else "the fields: downpour_lib/perf/hardware.py")
    add = (f"add {model} under `models:` (batch, images_per_s: one device's samples/s alone, "
           f"parameters, source; {counted})")
    if preset:
        return ConfigError("model", model, f"preset {preset!r} {has}{elsewhere} Or copy "
                           f"downpour_lib/perf/hardware/{preset}.yaml, {add}, and give "
                           "--hardware FILE.yaml")
    if hardware:
        return ConfigError("model", model, f"hardware file {cal.name!r} ({path}) {has} To predict "
                           f"it, {add}.{elsewhere}")
    where = f" ({path})" if path else ""
    if model not in MODELS and ":" not in model:  # a published model, not one downpour trains
        return ConfigError("model", model, f"calibration {cal.name!r}{where} {has} downpour does "
                           f"not train {model}, so it cannot be measured here.{elsewhere}")
    # downpour's on a data set of its shape; yours (an import path) on yours
    dataset = data_for(model) if model in MODELS else "YOURS"
    summary = model.replace(":", "-") + ".json"
    return ConfigError("model", model, f"calibration {cal.name!r}{where} {has} Measure {model} on "
                       f"this machine: `downpour train --model {model} --dataset {dataset} "
                       f"--algorithm allreduce --steps 30 --warmup-steps 10 --eval-every 0 "
                       f"--summary-json {summary}`, then `downpour model calibrate --collectives "
                       f"FILE --summary {summary}` (FILE: `downpour bench collectives --json FILE` "
                       "under mpiexec across your nodes; docs/perf_model.md, \"Your model, your "
                       "links\")." + elsewhere)


def _option(text: str) -> tuple[str, str, object]:
    """``ALG.KEY=VALUE`` -> (algorithm, key, value as int, float or text)."""
    head, sep, raw = text.partition("=")
    algorithm, dot, key = head.partition(".")
    if not (sep and dot and algorithm and key and raw):
        raise argparse.ArgumentTypeError(f"{text!r}: give ALG.KEY=VALUE, e.g. downpour.servers=16")
    return algorithm, key, option_value(raw)


def _unit(unit: str, example: str):
    """A flag's number in ``unit``: "100Gbit" or "14ms" is refused saying the unit it is in."""
    def number(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number in {unit}, without the unit, "
                                             f"e.g. {example}") from None
    return number


def _overlap(text: str) -> float | None:
    if text.strip().lower() in ("none", "null", "band"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a share in [0, 1], or none (a band)")
    return value


def _node_compute(text: str) -> str | dict[str, float]:
    """A pipeline's name, none, or the shares measured at FP32 and AMP: ``0.01,0.1``."""
    if "," not in text:
        return text.strip()
    try:
        fp32, amp = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give two shares, FP32,AMP (e.g. 0.01,0.1), "
                                         "or a pipeline: pytorch, dali-cpu, none") from None
    return {"fp32": fp32, "amp": amp}


def add_model_parser(sub: argparse._SubParsersAction) -> None:
    # the presets by file name: loading them (perf.presets) took about 0.05 s of every command's start,
    # every training rank's included
    from ..perf.hardware import preset_files

    model = sub.add_parser("model", help=summary("model"),
                           description=__doc__.split("\n\n")[0])
    verbs = model.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("calibrate", help="fit links and compute from this machine's measurements")
    p.add_argument("--collectives", required=True,
                   help="`downpour bench collectives --json` output (run under mpiexec -n 2 or more)")
    compute = p.add_mutually_exclusive_group()
    compute.add_argument("--study", default=None,
                         help=f"compute from a scaling study's runs.csv (default: {REFERENCE_STUDY})")
    compute.add_argument("--summary", action="append", default=[], metavar="JSON",
                         help="compute from a run's summary, `downpour train --summary-json JSON` "
                              "(repeat for more models)")
    p.add_argument("--backend", default=None,
                   help="whose link to fit (default: the runs'; a one-process run's is the one a "
                        "launch of several would use, or the one the collectives file measured)")
    p.add_argument("--steps", default=None, metavar="CSV",
                   help="a run's steps.csv (`downpour train --output-dir`): the spread of its step "
                        "times, for the slowest-of-N wait of synchronous steps (default: none)")
    p.add_argument("--out", default=None, help=f"where the calibration goes "
                                               f"(default: {default_calibration()})")
    p.set_defaults(func=cmd_calibrate, output_files=("out",))

    p = verbs.add_parser("predict", help="step time, throughput and efficiency at N workers")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--preset", choices=sorted(preset_files()), help="published hardware")
    where.add_argument("--hardware", default=None, metavar="FILE.yaml",
                       help="your hardware: devices, nodes, links, models with their sources "
                            "(the fields: downpour_lib/perf/hardware.py; the presets are such files "
                            "in downpour_lib/perf/hardware/)")
    where.add_argument("--calibration", default=None,
                       help=f"a calibration file (default: the newer of {study_calibration()}, "
                            f"which `make study` writes, and {default_calibration()}, which "
                            "`downpour model calibrate` writes)")
    p.add_argument("--model", required=True, help="a model the calibration has compute for")
    p.add_argument("--algorithm", "--algorithms", default="allreduce",  # as study's and validate's
                   help=f"comma-separated, of {', '.join(MODELLED_ALGORITHMS)}")
    p.add_argument("--workers", type=worker_counts, default=[8, 64, 512], help="comma-separated counts")
    p.add_argument("--against", default=None, metavar="ALGORITHM",
                   help="each row's speedup over this algorithm at its workers, with the band "
                        "of it (default: the first of several --algorithm)")
    p.add_argument("--collective", choices=COLLECTIVES, default=None,
                   help="the allreduce algorithm (default: the calibration's; auto: what NCCL's "
                        "tuner would run per bucket, ring or tree under LL, LL128 or Simple)")
    hw = p.add_argument_group("hardware fields (override the calibration's, preset's or file's)")
    hw.add_argument("--devices-per-node", type=int, default=None, help="workers (GPUs) per node")
    for side, what in (("intra", "between devices of a node"), ("inter", "a node's network card")):
        hw.add_argument(f"--{side}-gbit", type=_unit("Gbit/s", "100"), default=None,
                        help=f"line rate {what}, Gbit/s per direction")
        hw.add_argument(f"--{side}-latency-us", type=_unit("microseconds", "14"), default=None,
                        help=f"latency of one message {what}, microseconds")
    hw.add_argument("--link-efficiency", type=float, default=None,
                    help="achieved / line rate for the rates given here (default: the fitted one)")
    hw.add_argument("--overlap", type=_overlap, default=argparse.SUPPRESS,
                    help="share of the bucket pipeline achieved, 0 to 1; none: not measured (a band)")
    hw.add_argument("--inter-transport", choices=("rdma", "tcp"), default=None,
                    help="with --inter-gbit and no --link-efficiency: the published range of that "
                         "transport's achieved rate across nodes (terms.TRANSPORT_RATE; tcp's "
                         "depends on the ranks sharing the card, --devices-per-node; default: the "
                         "file's or preset's own transport, if it gives one)")
    hw.add_argument("--accumulation", type=int, default=None,
                    help="gradient accumulation: forward+backward passes per allreduce")
    hw.add_argument("--jitter", type=float, default=None,
                    help="coefficient of variation of a step's time (a run's steps.csv): a "
                         "synchronous step waits for the slowest of N")
    hw.add_argument("--device-spread", type=float, default=None,
                    help="coefficient of variation of the devices' own speeds: the slowest of N "
                         "sets a synchronous step (measured: a point; default: "
                         "terms.DEVICE_SPREAD_RANGE)")
    hw.add_argument("--node-spread", type=float, default=None,
                    help="coefficient of variation of the nodes' own speeds, which a node's "
                         "devices share: across nodes the slowest node sets a synchronous step "
                         "(measured: a point; default: terms.NODE_SPREAD_RANGE)")
    hw.add_argument("--framework", type=float, default=None,
                    help="the framework's own work a round of communication, in samples' "
                         "compute (measured: a point; default: terms.FRAMEWORK_RANGE)")
    hw.add_argument("--node-compute", type=_node_compute, default=None, metavar="PIPELINE|FP32,AMP",
                    help="a busy node's loss: an input pipeline's fitted term (pytorch, dali-cpu), "
                         "none, or the shares of a step measured at FP32 and AMP, e.g. 0.01,0.1 "
                         "(a point; default: the file's, for pytorch a range)")
    p.add_argument("--option", action="append", default=[], type=_option, metavar="ALG.KEY=VALUE",
                   help="an algorithm's option, e.g. downpour.servers=16, easgd.moving_rate=0.1, "
                        "localsgd.period=8, downpour.slow_workers=1 (repeat for more)")
    p.add_argument("--json", default=None, help="write the rows here (a JSON list)")
    p.add_argument("--csv", default=None, help="write the rows here")
    p.add_argument("--figure", default=None,
                   help="draw each algorithm's efficiency and its band over the workers here, and "
                        "its speedup over --against's (.png, .pdf or .svg)")
    p.set_defaults(func=cmd_predict, output_files=("json", "csv", "figure"))

    p = verbs.add_parser("validate", help="measure and predict across the multi-node Slurm sandbox's "
                                          "shaped links (root)")
    p.add_argument("--nodes", type=int, default=2,
                   help="workers, one per sandbox node (2 or more; a running sandbox of more nodes "
                        "lends that many)")
    from ..study.model_validate import BASE, DEFAULT_ALGORITHMS, LINKS  # their one home

    p.add_argument("--model", default=None, help=f"any registered model (default: {BASE['model']}, "
                                                 "whose step is mostly communication on these links)")
    p.add_argument("--dataset", default=None, help=f"its data set (default: {BASE['dataset']})")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"per worker (default: {BASE['batch_size']})")
    p.add_argument("--links", default=",".join(LINKS), help="link rates, comma-separated")
    p.add_argument("--algorithms", default=None,
                   help=f"comma-separated (default: {','.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--out", default=None,
                   help="where validation.csv goes (default: results/<host>/model/sandbox-<N>nodes)")
    p.add_argument("--sandbox-dir", default=None,
                   help="a running sandbox to borrow (default: the usual one, started if needed)")
    p.set_defaults(func=cmd_validate, output_dirs=("out",))
    add_hardware_verbs(verbs)



def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..perf.calibrate import (
        calibrate,
        compare_with_study,
        pick_backend,
        read_collectives,
        read_study,
        read_summaries,
        save,
    )

    study = read_summaries(args.summary) if args.summary else read_study(args.study or REFERENCE_STUDY)
    backend, why = args.backend, "--backend"
    if backend is None:
        backend, why = pick_backend(study, read_collectives(args.collectives), args.collectives)
    cal = calibrate(args.collectives, study, backend=backend)
    if args.steps:
        from dataclasses import replace

        from ..perf.calibrate import jitter_from_steps

        cal = replace(cal, jitter=jitter_from_steps(args.steps))
        print(f"step-time spread (coefficient of variation) {cal.jitter:.3f}, from {args.steps}")
    path = save(cal, args.out or default_calibration())
    link = cal.network.intra
    print(f"backend {backend} ({why})")
    net = cal.network
    print(f"link: alpha {link.alpha_s * 1e6:.1f} us, beta {link.bandwidth_Bps / 1e9:.2f} GB/s, "
          f"gamma {net.gamma_s_per_byte * 1e9:.3f} ns/byte; node memory "
          + (f"{net.node_Bps / 1e9:.1f} GB/s" if net.node_Bps else "not measured")
          + f", {net.cores or '?'} cores; overlap {cal.overlap:.2f}")
    if not ((study["num_workers"] > 1) & study["algorithm"].isin(("allreduce", "ddp"))).any():
        print("overlap: no allreduce run of 2 or more workers to measure it from; predictions hide "
              "none of the allreduce behind backward (an upper bound on the step)")
    for w in cal.workloads.values():
        print(f"{w.model}: {w.compute_s * 1e3:.1f} ms per step of {w.batch_size} (its update "
              f"{w.optimizer_s[0] * 1e3:.1f} ms of it, once a step at any --accumulation), "
              f"{w.param_bytes / 1e6:.2f} MB per model")
    table = compare_with_study(cal, study)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {path}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..perf.calibrate import load
    from ..perf.hardware import load_hardware, with_fields
    from ..perf.perfmodel import predict_rows
    from ..perf.presets import PRESETS

    algorithms = [a.strip() for a in args.algorithm.split(",") if a.strip()]
    check_figure_path(args.figure)
    if args.hardware or args.preset:
        check_names(args.model, algorithms, any_model=bool(args.hardware))
        path = Path(args.hardware) if args.hardware else None
        cal = load_hardware(args.hardware) if args.hardware else PRESETS[args.preset]
    else:  # read first: the models it measured are names too; a name is checked without one
        try:
            path = args.calibration or find_calibration()
            cal, unread = load(path), None
        except ConfigError as exc:
            cal, unread = None, exc
        check_names(args.model, algorithms, measured=cal.workloads if cal else ())
        if unread is not None:
            raise unread
    if args.model not in cal.workloads:  # named before predicting, with the way to measure it
        raise no_compute(cal, args.model, path, args.preset, hardware=bool(args.hardware))
    if args.collective:
        cal = replace(cal, collective=args.collective)
    cal = with_fields(cal, devices_per_node=args.devices_per_node, intra_gbit=args.intra_gbit,
                      intra_latency_us=args.intra_latency_us, inter_gbit=args.inter_gbit,
                      inter_latency_us=args.inter_latency_us, link_efficiency=args.link_efficiency,
                      jitter=args.jitter, device_spread=args.device_spread,
                      node_spread=args.node_spread,
                      framework=args.framework,
                      inter_transport=args.inter_transport, node_compute=args.node_compute,
                      **({"overlap": args.overlap} if "overlap" in args else {}))
    if args.accumulation is not None:
        try:
            w = replace(cal.workloads[args.model], accumulation=args.accumulation)
        except ConfigError as exc:
            raise ConfigError("accumulation", exc.value, exc.expected) from None
        cal = replace(cal, workloads={**cal.workloads, args.model: w})
    options: dict[str, dict] = {}
    for algorithm, key, value in args.option:
        if algorithm not in algorithms:
            raise ConfigError("option", f"{algorithm}.{key}={value}",
                              f"an option of one of the --algorithm list ({', '.join(algorithms)})")
        if key not in readable_options(algorithm):
            raise ConfigError("option", f"{algorithm}.{key}={value}",
                              f"the model reads {', '.join(readable_options(algorithm))} of "
                              f"{algorithm}")
        options.setdefault(algorithm, {})[key] = value
    against = args.against if args.against is not None else \
        algorithms[0] if len(algorithms) > 1 else None
    if against is not None and against not in MODELLED_ALGORITHMS:
        from ..errors import unknown_name

        raise unknown_name("against", against, MODELLED_ALGORITHMS)
    rows = predict_rows(cal, algorithms, args.workers, args.model, options, against)
    table = pd.DataFrame(rows)
    # --workers counts workers (GPUs): the nodes they fill, devices_per_node a node
    table.insert(table.columns.get_loc("workers") + 1, "nodes", -(-table.workers // cal.network.per_node))
    print(f"calibration {cal.name}" + (f" ({path})" if path else "") + f": {cal.source}")
    columns = ["algorithm", "workers", "nodes", "step_s", "samples_per_s", "efficiency", "comm_s"]
    from ..perf.perfmodel import unknown_ends
    from ..perf.terms import MEASUREMENT_SPREAD

    spread = f"{100 * MEASUREMENT_SPREAD:.2f} %"
    if unknown_ends(cal) is not None:
        print("not measured: " + ", ".join(unmeasured(cal, args.model)) + ". efficiency is the middle of the "
              "band they give together (efficiency_low, efficiency_high; band: its width in points), "
              f"each end moved out {spread} more: how far two runs of one setting were measured "
              "apart")
        _say_framework_unit(cal, args.model)
        table["band"] = 100 * (table.efficiency_high - table.efficiency_low)
        columns[6:6] = ["efficiency_low", "efficiency_high", "band"]
    if against is not None:
        print(f"speedup: samples/s over {against}'s at the same workers, on the same hardware: what "
              f"it does not measure at the same end for both (speedup_low, speedup_high, each end "
              f"moved out {spread}); verdict: faster or slower where the whole band says so, "
              "else either")
        columns += ["speedup", "speedup_low", "speedup_high", "verdict"]
    print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if "band" in table:  # what to measure first: where the widest band narrows most
        _say_band_parts(cal, table, args.model, options)
    if args.json:
        from ..checkpoint import atomic_write_text

        # the table's rows, as the CSV's (the band and nodes too); NaN, not JSON, as null
        records = json.loads(table.to_json(orient="records", double_precision=15))
        atomic_write_text(args.json, json.dumps(records, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.figure:
        from ..study.figures import save_figure
        from ..study.model_plots import prediction_figure

        print(f"wrote {save_figure(prediction_figure(table), args.figure)}")
    return 0


def _say_framework_unit(cal: Calibration, model: str) -> None:
    """A note where the framework's work, not measured, is counted in a unit its range was not
    measured in: parameters' worth of a model that does far fewer multiply-adds a parameter than
    those it was measured on (a small model's samples are mostly fixed costs, not its math)."""
    from ..perf.terms import FRAMEWORK_MACS_PER_PARAMETER

    per = cal.workload(model).macs_per_parameter
    if cal.framework is None and per is not None and per < FRAMEWORK_MACS_PER_PARAMETER / 4:
        print(f"note: {model} does {per:.3g} multiply-adds a parameter in a sample, the framework's "
              f"work was measured on models of 160 to 440, and it is counted in parameters' worth "
              f"of {model}'s compute: here it may be many times too large. Measure it "
              "(`downpour model calibrate` on runs of yours) or give --framework")


def _say_band_parts(cal: Calibration, table, model: str, options: dict[str, dict]) -> None:
    """One line: the widest band, and its width were each unmeasured quantity measured. Of the
    algorithms priced in closed form: a simulated one (Downpour's) takes seconds a prediction, and
    this runs two for each unknown (3.4 minutes for one row of downpour at 64 workers)."""
    from ..perf.perfmodel import band_parts
    from ..perf.perfsim import SIMULATED_ALGORITHMS

    closed = table[~table.algorithm.isin(SIMULATED_ALGORITHMS)]
    if closed.empty:
        return
    row = closed.loc[closed.band.idxmax()]
    algorithm, workers = row.algorithm, int(row.workers)
    parts = band_parts(cal, algorithm, workers, model, options.get(algorithm))
    left_out = len(closed) < len(table)
    print(f"measure first: the widest band{' not simulated' if left_out else ''}, {algorithm} at "
          f"{workers} workers, {row.band:.1f} points, would be, were one quantity measured at its "
          "range's middle: " + ", ".join(f"{name} {width:.1f}" for name, width in parts.items()))


def unmeasured(cal: Calibration, model: str) -> list[str]:
    """What ``cal`` did not measure for ``model``, each with its range (``perf.terms``)."""
    from ..perf.netmodel import GBIT
    from ..perf.terms import FRAMEWORK_RANGE, OVERLAP_RANGE

    out = []
    if cal.overlap is None:
        out.append(f"overlap {OVERLAP_RANGE[0]:g}-{OVERLAP_RANGE[1]:g}")
    if cal.inter_rate != (1.0, 1.0):  # in Gbit/s, as nccl-tests' bus bandwidth is read
        gbit = cal.network.inter.bandwidth_Bps / GBIT
        out.append(f"a node's cross-node rate {gbit * cal.inter_rate[1]:.3g}-"
                   f"{gbit * cal.inter_rate[0]:.3g} Gbit/s")
    if cal.jitter_high is not None:
        out.append(f"jitter {cal.jitter:.2g}-{cal.jitter_high:.2g}")
    if cal.device_spread_high is not None:
        out.append(f"the devices' spread {cal.device_spread:.2g}-{cal.device_spread_high:.2g}")
    if cal.node_spread_high is not None:
        out.append(f"the nodes' spread {cal.node_spread:.2g}-{cal.node_spread_high:.2g}")
    mine = cal.workload(model)
    if cal.framework is None:  # counted in another model's samples, or in multiply-adds
        unit = " (the sample full_precision or multiply_adds gives)" if mine.framework_sample_s else ""
        out.append(f"the framework's own work {FRAMEWORK_RANGE[0]:g}-{FRAMEWORK_RANGE[1]:g} "
                   f"samples' compute a step{unit}")
    low, high = mine.optimizer_s
    if low != high:
        out.append(f"the optimizer's update {1000 * low:.3g}-{1000 * high:.3g} ms a step (its rate "
                   f"holds it over {mine.measured_accumulation} passes)")
    nodes = {cal.node_compute, *(w.node_compute for w in cal.workloads.values() if w.node_compute)}
    for node in sorted((n for n in nodes if not n.measured), key=lambda n: n.amp):
        out.append(f"a busy node's share of a step {100 * node.fp32:.1f}-{100 * node.fp32_high:.1f} % "
                   f"at FP32, {100 * node.amp:.1f}-{100 * node.amp_high:.1f} % at AMP (two containers)")
    return out


def cmd_validate(args: argparse.Namespace) -> int:
    from ..sandbox.status import SandboxError
    from ..study.core import StudyError
    from ..study.model_validate import DEFAULT_ALGORITHMS, TOLERANCE, validate_on_sandbox

    algorithms = (tuple(a.strip() for a in args.algorithms.split(",") if a.strip())
                  if args.algorithms else DEFAULT_ALGORITHMS)
    base = {key: value for key, value in (("model", args.model), ("dataset", args.dataset),
                                          ("batch_size", args.batch_size)) if value is not None}
    name = f"sandbox-{args.nodes}nodes" + (f"-{args.model}" if args.model else "")
    out = args.out or default_calibration().parent / name
    try:
        table = validate_on_sandbox(out, nodes=args.nodes, algorithms=algorithms,
                                    links=[r.strip() for r in args.links.split(",") if r.strip()],
                                    sandbox_dir=args.sandbox_dir, base=base)
    except (StudyError, SandboxError) as exc:
        print(f"downpour model validate: {exc}", file=sys.stderr)
        return 1
    print(table[["link", "algorithm", "workers", "measured_step_s", "measured_mean_step_s",
                 "predicted_step_s", "error", "rtos", "drops", "steal"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {Path(out) / 'validation.csv'}")
    return verdict(table, TOLERANCE)


def verdict(table: pd.DataFrame, tolerance: float) -> int:
    """0 when every prediction is within ``tolerance`` of its measurement; else 1, naming the
    rows outside it (a check that prints a failure and exits 0 passes in every script and CI)."""
    worst = table.error.abs().max()
    outside = table[table.error.abs() > tolerance]
    if outside.empty:
        print(f"worst error {worst:.1%}: within the tolerance of {tolerance:.0%}")
        return 0
    rows = "; ".join(f"{r.algorithm} at {r.link} {r.error:+.1%}" for r in outside.itertuples())
    print(f"downpour model validate: worst error {worst:.1%}, outside the tolerance of "
          f"{tolerance:.0%}: {rows}", file=sys.stderr)
    return 1
