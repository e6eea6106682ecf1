"""``downpour bench emulated``: does emulated compute behave like the real compute it stands for?

Issue 34's two checks of ``--compute emulated``, each a real launch of ``downpour train`` under
mpiexec, real and emulated on the same model, batch and buckets:

- **Bucket launches.** With ``--trace``, every gradient bucket's allreduce is a span from its
  launch (our bucketed ``allreduce`` and ``ddp`` both trace theirs). Each launch is placed as a
  fraction of its step's backward; the median per bucket, real against emulated, should agree
  within ``--tolerance`` (0.10: a tenth of the backward). The trace marks each step's ``backward``
  span (its start is the forward's end, marked on the step's clock); a trace without one (from
  before the mark) is read with the backward starting at the forward's share of
  ``forward+backward``, the share ``auto`` measured (``emulated_forward_s / (forward + backward)``).
- **Throughput.** At 1 and 2 workers, the emulated run's samples/s against the real run's; the
  ratio should be within ``--tolerance`` of 1. Where it is not, the table says so: on a machine
  whose cores the ranks share, 2 real workers slow each other's compute, which ``auto`` (timed on
  one rank while the others wait) does not see.

One JSON row per bucket and per throughput point; a table of the ratios and whether each is
within the tolerance. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from .. import trace
from ..cluster.mpiexec import mpiexec_launch
from ..config import Data, TrainConfig
from ..defaults import RUN_TIMEOUT_S
from ..errors import ConfigError
from ..provenance import environment
from .report import DATASET, THREADS, WARMUP_STEPS, print_columns, run_command

#: the algorithms whose buckets are traced from their launch
BUCKETED = ("allreduce", "ddp")


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emulated", help="emulated vs real compute: bucket launch moments and "
                                        "throughput at 1 and 2 workers")
    p.add_argument("--model", default="resnet20", help="(default: resnet20)")
    p.add_argument("--dataset", default=DATASET, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=Data.batch_size,
                   help="per worker (default: %(default)s)")
    p.add_argument("--bucket-cap-mb", type=float, default=0.25,
                   help="bucket size, small enough for several buckets (default: 0.25)")
    p.add_argument("--algorithms", type=_names, default=BUCKETED,
                   help="comma-separated, of " + ", ".join(BUCKETED) + " (default: both)")
    p.add_argument("--backend", default="gloo", help="(default: gloo)")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default: 30)")
    p.add_argument("--warmup-steps", type=int, default=WARMUP_STEPS,
                   help="first steps left out of throughput and fractions (default: %(default)s)")
    p.add_argument("--threads", type=int, default=THREADS,
                   help="torch threads per rank (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every run; throughput is their median (default: 1)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="agreement asked for: fraction of backward, and throughput ratio - 1 "
                        "(default: 0.10)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S,
                   help="seconds per run (default: %(default)g)")
    p.add_argument("--json", help="write the rows here (a JSON list)")
    p.set_defaults(func=cmd_bench_emulated, output_files=("json",))


def _config(args: argparse.Namespace, algorithm: str, compute: str, trace_dir: str | None
            ) -> TrainConfig:
    return TrainConfig.from_dict({
        "algorithm": algorithm, "backend": args.backend, "model": args.model,
        "dataset": args.dataset, "batch_size": args.batch_size, "steps": args.steps,
        "warmup_steps": args.warmup_steps, "threads": args.threads, "device": "cpu",
        "eval_every": 0, "eval_batch_size": 64, "seed": 0, "compute": compute,
        "trace": trace_dir, "options": {"bucket_cap_mb": args.bucket_cap_mb}})


def check_args(args: argparse.Namespace) -> None:
    """Every check before the first launch."""
    for algorithm in args.algorithms:
        if algorithm not in BUCKETED:
            raise ConfigError("algorithms", algorithm, "the bucketed ones, whose launches are "
                              "traced: " + ", ".join(BUCKETED))
    if not args.algorithms:
        raise ConfigError("algorithms", "", "one or more of " + ", ".join(BUCKETED))
    if args.repeats < 1:
        raise ConfigError("repeats", args.repeats, "must be >= 1")
    if not 0 < args.tolerance < 1:
        raise ConfigError("tolerance", args.tolerance, "a fraction in (0, 1), e.g. 0.1")
    if args.steps <= args.warmup_steps:
        raise ConfigError("steps", args.steps, f"more than warmup_steps ({args.warmup_steps}), "
                          "or no step is measured")
    for algorithm in args.algorithms:  # the configuration's own checks, before anything starts
        _config(args, algorithm, "emulated", None)


def launch_fractions(events: list[dict[str, Any]], forward_share: float, warmup: int
                     ) -> dict[int, list[float]]:
    """Each bucket's launches after ``warmup`` steps, as fractions of their step's backward, from
    a trace's complete events (every worker rank's). The backward is the step's ``backward`` span
    where the trace has one, else ``forward+backward`` less its first ``forward_share``."""
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_rank[e["pid"]].append(e)
    out: dict[int, list[float]] = defaultdict(list)
    for evs in by_rank.values():
        steps = sorted((e for e in evs if e["name"].startswith("step ")), key=lambda e: e["ts"])
        marked = sorted((e for e in evs if e["name"] == "backward"), key=lambda e: e["ts"])
        computes = marked or sorted((e for e in evs if e["name"] == "forward+backward"),
                                    key=lambda e: e["ts"])
        share = 0.0 if marked else forward_share
        buckets = [e for e in evs if e["name"].startswith("bucket ")]
        for step, compute in zip(steps, computes, strict=False):
            if int(step["name"].split()[1]) < warmup:
                continue
            begin = compute["ts"] + share * compute["dur"]
            length = (1 - share) * compute["dur"]
            end = step["ts"] + step["dur"]
            for b in buckets:
                if step["ts"] <= b["ts"] <= end and length > 0:
                    out[int(b["name"].split()[1])].append((b["ts"] - begin) / length)
    return dict(out)


def run_bench(args: argparse.Namespace, log=print) -> list[dict[str, Any]]:
    """Real and emulated runs of each algorithm at 1 and 2 workers, ``repeats`` rounds; the 2-worker
    runs are traced. Rows: one per bucket (``check`` "bucket_launch"), one per throughput point
    (``check`` "throughput")."""
    check_args(args)
    load_start = os.getloadavg()[0]  # a shared machine's load spreads the throughput ratios
    rate: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    fractions: dict[tuple[str, str], dict[int, list[float]]] = {}
    share: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="downpour-bench-emulated-") as tmp:
        for round_ in range(args.repeats):
            for algorithm in args.algorithms:
                # emulated first: its summary holds the forward's share the real run is read with
                for compute in ("emulated", "real"):
                    for workers in (1, 2):
                        traced = workers == 2 and round_ == 0
                        where = str(Path(tmp) / f"{algorithm}-{compute}") if traced else None
                        summary = mpiexec_launch(_config(args, algorithm, compute, where),
                                                 workers, args.timeout)
                        rate[(algorithm, compute, workers)].append(summary["samples_per_s"])
                        if compute == "emulated":
                            fwd, bwd = summary["emulated_forward_s"], summary["emulated_backward_s"]
                            share.setdefault(algorithm, fwd / (fwd + bwd))
                        if traced:
                            events = trace.load(Path(where) / "trace.json")
                            fractions[(algorithm, compute)] = launch_fractions(
                                events, share[algorithm], args.warmup_steps)
                        log(f"  [{round_ + 1}/{args.repeats}] {algorithm:<9} {compute:<8} "
                            f"{workers} worker(s): {summary['samples_per_s']:.1f} samples/s")
    common = {"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
              "bucket_cap_mb": args.bucket_cap_mb, "backend": args.backend, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "threads": args.threads,
              "repeats": args.repeats, "tolerance": args.tolerance,
              "load_1min_start": load_start, "load_1min_end": os.getloadavg()[0], **environment()}
    rows: list[dict[str, Any]] = []
    for algorithm in args.algorithms:
        real, emulated = fractions[(algorithm, "real")], fractions[(algorithm, "emulated")]
        for bucket in sorted(set(real) | set(emulated)):
            r = statistics.median(real[bucket]) if bucket in real else None
            e = statistics.median(emulated[bucket]) if bucket in emulated else None
            diff = abs(e - r) if r is not None and e is not None else None
            rows.append({"check": "bucket_launch", "algorithm": algorithm, "workers": 2,
                         "bucket": bucket, "buckets": len(set(real) | set(emulated)),
                         "real_fraction": r, "emulated_fraction": e, "difference": diff,
                         "within": diff is not None and diff <= args.tolerance,
                         "forward_share": share[algorithm], **common})
        for workers in (1, 2):
            r = statistics.median(rate[(algorithm, "real", workers)])
            e = statistics.median(rate[(algorithm, "emulated", workers)])
            rows.append({"check": "throughput", "algorithm": algorithm, "workers": workers,
                         "real_samples_per_s": r, "emulated_samples_per_s": e, "ratio": e / r,
                         "within": abs(e / r - 1) <= args.tolerance,
                         "real_runs": rate[(algorithm, "real", workers)],
                         "emulated_runs": rate[(algorithm, "emulated", workers)], **common})
    return rows


def _f(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    tol = rows[0]["tolerance"] if rows else 0.1
    print(f"bucket launches, as fractions of backward (2 workers; within: |difference| <= {tol:g})")
    cells = [("algorithm", "bucket", "real", "emulated", "difference", "within")]
    cells += [(r["algorithm"], str(r["bucket"]), _f(r["real_fraction"]),
               _f(r["emulated_fraction"]), _f(r["difference"]), "yes" if r["within"] else "NO")
              for r in rows if r["check"] == "bucket_launch"]
    print_columns(cells)
    print(f"\nthroughput, emulated / real (within: |ratio - 1| <= {tol:g})")
    cells = [("algorithm", "workers", "real samples/s", "emulated samples/s", "ratio", "within")]
    cells += [(r["algorithm"], str(r["workers"]), _f(r["real_samples_per_s"], ".1f"),
               _f(r["emulated_samples_per_s"], ".1f"), _f(r["ratio"]),
               "yes" if r["within"] else "NO") for r in rows if r["check"] == "throughput"]
    print_columns(cells)
    if rows:
        print(f"load average (1 min): {rows[0]['load_1min_start']:.1f} at the start, "
              f"{rows[0]['load_1min_end']:.1f} at the end")


def cmd_bench_emulated(args: argparse.Namespace) -> int:
    def launch() -> list[dict[str, Any]]:
        check_args(args)
        print(f"downpour bench emulated: {len(args.algorithms) * 4 * args.repeats} launch(es) of "
              f"{args.model} on {args.dataset}, batch {args.batch_size} per worker, buckets of "
              f"{args.bucket_cap_mb:g} MB", flush=True)
        return run_bench(args, log=lambda line: print(line, flush=True))

    def report(rows: list[dict[str, Any]]) -> None:
        print_table(rows)
        few = {r["algorithm"]: r["buckets"] for r in rows if r["check"] == "bucket_launch"
               and r["buckets"] < 4}
        for algorithm, n in few.items():
            print(f"note: {algorithm} had {n} bucket(s); a smaller --bucket-cap-mb gives more")

    return run_command("emulated", launch, report, args.json)
