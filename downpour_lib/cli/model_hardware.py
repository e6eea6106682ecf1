"""``downpour model``'s verbs about hardware files and published results: a hardware file's entry
for a model (``describe``), what NCCL's tuner would run on its links (``nccl``), the presets of
published hardware (``presets``), the model against published results, the package's or yours
(``check``), and a run's spreads measured for a hardware file (``spread``). ``cli.model`` adds them
to its parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ..errors import ConfigError

#: what ``check --figure`` and ``predict --figure`` can write
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def check_figure_path(path: str | None) -> None:
    """A ``--figure`` path a figure can be written to, by its suffix (None: no figure asked)."""
    if path and Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise ConfigError("figure", path, "a file ending in " + ", ".join(FIGURE_SUFFIXES[:-1])
                          + " or " + FIGURE_SUFFIXES[-1])


def add_hardware_verbs(verbs: argparse._SubParsersAction) -> None:
    """The parsers of describe, nccl, spread, presets and check, under ``downpour model``'s
    ``verbs``."""
    # the presets by file name: loading them (perf.presets) costs every command's start
    from ..perf.hardware import preset_files

    p = verbs.add_parser("describe", help="a hardware file's entry for a model: its parameters, "
                                          "multiply-adds and gradient readiness, counted here")
    p.add_argument("--model", required=True,
                   help="downpour's, or yours: package.module:function (docs/own_model.md)")
    p.add_argument("--dataset", default=None,
                   help="samples of the shape it trains on (default for downpour's models: a "
                        "synthetic set of their input's shape; yours: required)")
    p.add_argument("--data-dir", default="data", help="where the data set's files are (default: data)")
    p.add_argument("--batch", type=int, default=32, help="samples per worker per step (default: 32)")
    p.add_argument("--images-per-s", type=float, default=None,
                   help="one device's samples/s alone, measured on it (the one number no count "
                        "gives; without it the entry says to add it)")
    p.add_argument("--source", default=None, help="where --images-per-s was measured")
    p.set_defaults(func=cmd_describe)

    p = verbs.add_parser("nccl", help="what NCCL's tuner would run for each allreduce, as the "
                                      "model prices it (auto)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--preset", choices=sorted(preset_files()), help="published hardware")
    where.add_argument("--hardware", default=None, metavar="FILE.yaml", help="your hardware")
    p.add_argument("--workers", type=worker_counts, default=[8, 64, 512], help="comma-separated counts")
    p.add_argument("--sizes", default="8,64K,1M,25M,1G",
                   help="allreduce sizes in bytes, K, M or G (binary, as nccl-tests)")
    p.add_argument("--csv", default=None, help="write the sizes' rows here")
    p.set_defaults(func=cmd_nccl, output_files=("csv",))

    p = verbs.add_parser("spread", help="a run's jitter, devices' and nodes' spread, measured: "
                                        "the lines of a hardware file that make them points")
    p.add_argument("steps", metavar="STEPS.csv",
                   help="a run's steps.csv (`downpour train --output-dir DIR`), across nodes for "
                        "the nodes' spread")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps of each rank left out first (default: 5)")
    p.set_defaults(func=cmd_spread)

    p = verbs.add_parser("presets", help="the presets of published hardware and their sources")
    p.set_defaults(func=cmd_presets)
    p = verbs.add_parser("check", help="the model against published scaling results")
    p.add_argument("--checks", default=None, metavar="FILE.csv",
                   help="your own results instead of the package's: a row each with claim, "
                        "hardware (a preset or a .yaml file), model, workers, published "
                        "(efficiency); optional source, against, accumulation, "
                        "against_accumulation (docs/perf_model.md)")
    p.add_argument("--figure", default=None,
                   help="draw each check's published value beside the point and band here "
                        "(.png, .pdf or .svg)")
    p.set_defaults(func=cmd_check, output_files=("figure",))


def data_for(model: str) -> str:
    """A data set of the shape ``model`` was made for, offline: synthetic where one has that
    shape (throughput is all a calibration needs), else a bundled one (cnn1d's MNIST-1D)."""
    from ..data.catalog import DATASETS
    from ..models import MODELS

    shape = MODELS[model].default_input
    fits = [spec for spec in DATASETS.values() if spec.input_shape == shape and spec.kind != "real"]
    fits.sort(key=lambda spec: spec.kind != "synthetic")
    return fits[0].name if fits else "synthetic-cifar"


def worker_counts(text: str) -> list[int]:
    """``--workers``: comma-separated worker counts, each >= 1."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give worker counts, e.g. 8,64,512") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give worker counts >= 1, e.g. 8,64,512")
    return values


def cmd_describe(args: argparse.Namespace) -> int:
    """Print a ``models:`` entry to paste into a hardware file (``perf.hardware.model_entry``)."""
    import yaml

    from .. import user_code
    from ..errors import unknown_name
    from ..models import MODELS
    from ..perf.hardware import model_entry

    dataset = args.dataset
    if dataset is None:
        if not user_code.is_user_code("model", args.model):
            if args.model not in MODELS:  # a misspelt built-in: its name, not the data set
                raise unknown_name("model", args.model, [*MODELS, "package.module:function"])
        else:
            raise ConfigError("dataset", None, f"the data set {args.model} trains on (its samples' "
                              "shape sets the counts): give --dataset, e.g. mymodels:blobs")
        dataset = data_for(args.model)
    entry = model_entry(args.model, dataset, args.data_dir, args.batch, args.images_per_s,
                        args.source)
    print(f"# {args.model} for a hardware file's `models:` (downpour_lib/perf/hardware.py), "
          "counted on the meta device")
    if args.images_per_s is None:
        print("# add images_per_s: one device's samples/s alone, measured on it (e.g. `downpour "
              "bench gpu`); the file is refused without it")
    text = yaml.safe_dump({args.model: entry}, sort_keys=False, default_flow_style=None, width=100)
    print(text, end="")
    return 0


def cmd_nccl(args: argparse.Namespace) -> int:
    """NCCL's table (latency and bandwidth of each algorithm and protocol) and its choice for each
    size, as ``netmodel.nccl_choices`` models them on the hardware's links."""
    from ..perf.hardware import load_hardware
    from ..perf.netmodel import NCCL_TUNING_SOURCE, nccl_choice, nccl_choices, nccl_table
    from ..perf.presets import PRESETS
    from ..traffic import parse_sizes

    sizes = parse_sizes(args.sizes)
    cal = load_hardware(args.hardware) if args.hardware else PRESETS[args.preset]
    net = cal.network

    def link(side) -> str:
        return f"{side.bandwidth_Bps / 1e9:g} GB/s and {side.alpha_s * 1e6:g} us a hop"

    print(f"NCCL's tuner as the model prices it, read from {NCCL_TUNING_SOURCE}, on {cal.name}: "
          f"{net.per_node} per node; inside {link(net.intra)}, across {link(net.inter)} (rates "
          "achieved; where a rate is a range, its middle)")
    print("allreduce Latency (us) / AlgBw (GB/s), the table NCCL_DEBUG=INFO "
          "NCCL_DEBUG_SUBSYS=TUNING prints at init (a tree only across nodes):")
    table = pd.DataFrame([{"workers": n} | {f"{a}/{p}": f"{lat * 1e6:.1f}/{bw / 1e9:.1f}"
                                            for (a, p), (lat, bw) in nccl_table(n, net).items()}
                          for n in args.workers]).fillna("-")
    print(table.to_string(index=False))
    rows = []
    for n in args.workers:
        for size in sizes:
            (algorithm, protocol), seconds = nccl_choice(n, size, net)
            rows.append({"workers": n, "bytes": size, "algorithm": algorithm, "protocol": protocol,
                         "time_us": 1e6 * seconds}
                        | {f"{a}/{p}_us": 1e6 * t for (a, p), t in nccl_choices(n, size, net).items()})
    runs = pd.DataFrame(rows)
    print("what it runs for each size (bytes), and its time:")
    print(runs[["workers", "bytes", "algorithm", "protocol", "time_us"]].to_string(
        index=False, float_format=lambda v: f"{v:.1f}"))
    if args.csv:
        runs.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0


def cmd_spread(args: argparse.Namespace) -> int:
    from ..perf.calibrate import spreads_from_steps

    if args.warmup_steps < 0:
        raise ConfigError("warmup_steps", args.warmup_steps, "a whole number >= 0, e.g. 5")
    s = spreads_from_steps(args.steps, args.warmup_steps)
    on = f"{s.hosts} host(s)" if s.hosts else "hosts it does not name"
    print(f"# from {args.steps}: {s.ranks} workers on {on}, {s.steps} steps each past the first "
          f"{args.warmup_steps}; a hardware file's lines (downpour_lib/perf/hardware.py)")
    print(f"jitter: {s.jitter:.4f}  # a step's compute about its worker's mean")
    lines = (("device_spread", s.device_spread, "the workers' means about their host's",
              "every host ran one worker: its spread is the nodes'"),
             ("node_spread", s.node_spread, "the hosts' means about the run's",
              "every worker ran on one host: run across nodes to measure it" if s.hosts else
              "the file has no host column: a run of this version writes it"))
    for name, value, what, why in lines:
        print(f"{name}: {value:.4f}  # {what}" if value is not None
              else f"# {name}: not measured ({why}); left out, it stays a range")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from ..perf.presets import PRESETS

    for cal in PRESETS.values():
        net = cal.network
        print(f"{cal.name}: {net.per_node} per node; inside {net.intra.bandwidth_Bps / 1e9:g} GB/s, "
              f"across {net.inter.bandwidth_Bps / 1e9:g} GB/s; {cal.collective} allreduce")
        print(f"  {cal.source}")
        for w in cal.workloads.values():
            print(f"  {w.model}: {w.compute_s * 1e3:.0f} ms per {w.batch_size} samples ({w.source})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ..perf.checks_file import checks_from_file
    from ..perf.presets import check_groups, check_summary, published_checks, published_table

    check_figure_path(args.figure)
    # predicted once, for the table, its summaries and the figure
    checks = checks_from_file(args.checks) if args.checks else published_checks()
    efficiency = any(c.unit == "efficiency" for c in checks)
    if args.figure and not efficiency:
        raise ConfigError("figure", args.figure, "the figure draws efficiency rows, and "
                          f"{args.checks} has only speedups (against_algorithm)")
    table = published_table(checks)
    print(table.drop(columns="source").to_string(index=False, float_format=lambda v: f"{v:.3f}",
                                                  formatters={"outside_band": _outside}))
    if efficiency:
        print("efficiency checks: " + _summary_line(check_summary(checks)))
    for kind, s in check_groups(checks).items():  # where the band holds, and where it does not
        print(f"  {kind}: " + _summary_line(s))
    speedups = [c for c in checks if c.unit == "speedup"]
    if speedups:  # one algorithm against another, or one setting against another
        inside = sum(c.outside_band == 0 for c in speedups)
        print(f"speedup checks: {len(speedups)}; inside the band: {inside} of {len(speedups)}")
    if args.figure:
        from ..study.figures import save_figure
        from ..study.model_plots import published_figure

        print(f"wrote {save_figure(published_figure(table), args.figure)}")
    return 0


def _outside(value: float) -> str:
    """How far the published value lies outside its band: three decimals, or where those would
    read 0.000 of a value a hair outside (counted outside), the value itself."""
    return f"{value:.1e}" if 0 < abs(value) < 0.0005 else f"{value:.3f}"


def _summary_line(s: dict[str, float]) -> str:
    return (f"{s['checks']}; point: mean absolute error {s['mae']:.1f} points, largest "
            f"{s['max_error']:.1f}, {s['below']} below and {s['above']} above the published value; "
            f"inside the band: {s['inside']} of {s['checks']}; band width: mean {s['band_mean']:.1f} "
            f"points, widest {s['band_max']:.1f}")
