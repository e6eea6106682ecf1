"""``downpour bench engines``: what N ranks cost on one machine, before a step is taken.

Emulated compute (``--compute emulated``) lets one machine hold many more ranks than it has cores,
because a rank that sleeps costs no CPU. What it still costs is start-up, memory and the idle
CPU of the engines and the controller. For each N asked for, one row:

- ``start_s``: ``start_cluster`` until every engine answers (MPI init, ipengine's registration);
- ``import_s``: every engine imports torch and downpour_lib (the study's first call pays it);
- ``rss_mb`` / ``pss_mb``: per engine, median, after the import; PSS splits the shared pages
  (torch's libraries) between the processes that map them, so ``pss_total_mb`` is what N ranks
  take from the machine's memory, and ``holds`` is how many such ranks its available memory fits;
- ``sleep_cpu``: the engines' and controller's CPU time while every engine sleeps ``--idle-s``
  seconds in a call, in cores (1.0 = one core busy), the floor an emulated rank adds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from ..checkpoint import atomic_write_text
from ..errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="start-up, memory and idle CPU of N engines (MPI ranks)")
    p.add_argument("--engines", default="4,8,16,32",
                   help="comma-separated engine counts (default: 4,8,16,32)")
    p.add_argument("--profile", default="local-mpi", help="cluster profile (default: local-mpi)")
    p.add_argument("--idle-s", type=float, default=5.0,
                   help="seconds every engine sleeps while its CPU is measured (default: 5)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to start (default: 600)")
    p.add_argument("--json", help="write the rows here (a JSON list)")
    p.set_defaults(func=cmd_bench_engines, output_files=("json",))


def _import_all() -> float:
    t = time.perf_counter()
    import torch  # noqa: F401

    import downpour_lib  # noqa: F401
    return time.perf_counter() - t


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _cpu_s(processes) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # noqa: BLE001 -- a process that ended has no more CPU to count
            pass
    return total


def measure_engines(n: int, profile: str, idle_s: float, timeout_s: float) -> dict[str, Any]:
    """One row for ``n`` engines of ``profile`` (see the module)."""
    import psutil

    from ..cluster import start_cluster

    t0 = time.perf_counter()
    with start_cluster(profile, n=n, timeout_s=timeout_s) as cluster:
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        cluster.run(_import_all, timeout_s=timeout_s)
        import_s = time.perf_counter() - t1
        engines = [psutil.Process(pid) for pid in cluster.local_pids()]
        rss, pss = [], []
        for p in engines[:n]:  # local_pids: the engines first, then the controller
            info = p.memory_full_info()
            rss.append(info.rss / 2**20)
            pss.append(getattr(info, "pss", info.rss) / 2**20)
        before, w0 = _cpu_s(engines), time.perf_counter()
        cluster.run(_sleep, idle_s, timeout_s=timeout_s + idle_s)
        sleep_cpu = (_cpu_s(engines) - before) / (time.perf_counter() - w0)
    available = psutil.virtual_memory().available / 2**20 + sum(pss)
    per = statistics.median(pss)
    return {"profile": profile, "engines": n, "start_s": start_s, "import_s": import_s,
            "rss_mb": statistics.median(rss), "pss_mb": per, "pss_total_mb": sum(pss),
            "holds": int(available // per) if per else None, "sleep_cpu": sleep_cpu,
            "idle_s": idle_s}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'engines':>7} {'start s':>8} {'import s':>9} {'RSS MB':>7} {'PSS MB':>7} "
          f"{'PSS total MB':>12} {'holds':>6} {'CPU asleep':>10}")
    for r in rows:
        print(f"{r['engines']:>7} {r['start_s']:>8.1f} {r['import_s']:>9.1f} {r['rss_mb']:>7.0f} "
              f"{r['pss_mb']:>7.0f} {r['pss_total_mb']:>12.0f} {r['holds']:>6} "
              f"{r['sleep_cpu']:>9.2f}c")


def cmd_bench_engines(args: argparse.Namespace) -> int:
    try:
        counts = [int(s) for s in args.engines.split(",") if s]
    except ValueError:
        raise ConfigError("engines", args.engines, "comma-separated engine counts, e.g. 4,8,32") from None
    if not counts or min(counts) < 1:
        raise ConfigError("engines", args.engines, "one or more engine counts >= 1")
    rows = []
    for n in counts:
        rows.append(measure_engines(n, args.profile, args.idle_s, args.timeout))
        print(f"{n} engines: up in {rows[-1]['start_s']:.1f} s", flush=True)
    print_table(rows)
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return 0
