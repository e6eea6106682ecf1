"""``downpour bench collectives``: latency and bandwidth of collectives, per torch.distributed backend.

Run it under ``mpiexec -n N`` (or ``srun --mpi=pmix``; ``torchrun`` for gloo and nccl only). The
default group is gloo (it is also the rendezvous); each other backend gets ``comm.new_group`` over all
ranks, so every backend runs in the same processes on the same buffers. The collectives are the
``Communicator``'s, unmetered, on buffers made once per case (``out=``), so a repetition times the
backend's call plus about a microsecond of the Communicator's checks. For each backend, operation
and size: warm-up iterations, then repetitions, each started right after a barrier; a repetition
takes as long as its slowest rank. Enough repetitions are run to fill ``--min-time`` seconds (at least
``--min-reps``) so the median is stable; the table and the JSON rows give the median (p50) and 95th
percentile.

Bandwidths as nccl-tests defines them (its doc/PERFORMANCE.md): ``bytes`` is the size of the whole
buffer (for allgather the gathered output, for reduce_scatter and alltoall the input), algbw =
bytes / time, busbw = algbw x a factor that makes it comparable to the hardware's link bandwidth:
2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and alltoall, 1 for broadcast and reduce.
The host's memcpy bandwidth for the same sizes (one thread of rank 0, while the other ranks wait) is
the physical ceiling on one node and is reported as backend ``memcpy``.

With ``mpi`` among the backends, the same operations also run through the MPI library itself (mpi4py,
no torch), reported as backend ``mpi4py``: the reference for the ``mpi`` backend, which shows what
torch's dispatch and our checks add and what the shared-memory path saves. Each reference case runs
in turns with the ``mpi`` case of the same operation and size, a tenth of the repetitions at a time
(``timing.measure_paired``), so the two see the machine in the same state: on this shared 2-core VM
two blocks of the same case measured minutes apart differ by up to 20%. The reference works on memory
torch allocated, as the backend's buffers are (numpy's arrays here made Open MPI's own allgather
1.3-1.4x faster than torch's tensors of the same size at 4-16 MB in one sitting, and not in another:
the allocator, not the wrapper, and not a fair reference).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..checkpoint import atomic_write_text
from ..comm import Communicator, new_group, runtime
from ..errors import ConfigError, refuse
from ..launch_env import Placement, discover
from ..paths import check_output_file
from ..traffic import parse_sizes, ring_share
from .timing import Sync, buffer_size, measure, measure_paired

OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce")
#: op -> n -> nccl-tests' bus factor (``traffic.ring_share``)
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    op: (lambda n, op=op: float(ring_share(op, n))) for op in OPS}
BACKENDS = ("gloo", "mpi", "nccl")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
def parse_list(field: str, text: str, choices: tuple[str, ...] | None = None) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError(field, text, "give a comma-separated list")
    for item in items:
        if choices is not None and item not in choices:
            raise ConfigError(field, item, "choose from " + ", ".join(choices))
    return items


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collectives", help="collective latency/bandwidth per backend "
                       "(run under mpiexec -n N)", description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=None,
                   help="comma list of gloo, mpi, nccl (default: gloo,mpi; gloo alone on a torch "
                        "before 2.14, whose c10d keeps the name mpi)")
    p.add_argument("--ops", default="allreduce,broadcast,allgather",
                   help="comma list of " + ", ".join(BUS_FACTOR))
    p.add_argument("--sizes", default="4K,64K,1M,4M,64M", help="buffer sizes in bytes (K, M, G)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per case")
    p.add_argument("--min-reps", type=int, default=20, help="fewest timed repetitions per case")
    p.add_argument("--max-reps", type=int, default=2000, help="most timed repetitions per case")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds of timed repetitions per case")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per rank (1: a rank's copies and reductions use one core)")
    p.add_argument("--json", help="rank 0 writes the rows here (a JSON list)")
    p.add_argument("--written", action="store_true",
                   help="every rank writes the buffers it sends before each repetition (untimed), "
                        "as training writes gradients and parameters between calls; by default they "
                        "are reused as they are, as nccl-tests and OSU do (IMB's -off_cache for "
                        "the same reason)")
    p.add_argument("--breakdown", action="store_true",
                   help="with mpi: also time the parts of each mpi call (torch's dispatch floor, "
                        "our code, the executor hand-off, the gate) against MPI's own, and a native "
                        "C++ backend without and with the gate where one builds (bench/breakdown.py)")
    p.add_argument("--paths", action="store_true",
                   help="with mpi: time each path the backend can take for allreduce, broadcast, "
                        "allgather and reduce_scatter on one node (shared memory, gate + MPI's "
                        "blocking call, MPI's nonblocking call), in turns with MPI's own: what "
                        "comm/mpi/paths.py's table is read from (bench/breakdown.py)")
    p.set_defaults(func=cmd_collectives)


class Case:
    """One (backend, op, size): the buffers and a callable that runs the collective once."""

    def __init__(self, op: str, group: Communicator, nbytes: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        n = group.size
        count, self.bytes = buffer_size(op, nbytes, n, dtype)
        zeros = lambda k: torch.zeros(k, dtype=dtype, device=device)  # noqa: E731 -- no overflow
        if op == "allreduce":
            t = zeros(count)
            self.run = lambda: group.allreduce(t)
        elif op == "broadcast":
            t = zeros(count)
            self.run = lambda: group.broadcast(t, root=0)
        elif op == "reduce":
            t = zeros(count)  # no private copy on the other ranks: the buffer is ours to spoil
            self.run = lambda: group.reduce(t, root=0, scratch=True)
        elif op == "allgather":
            t, out = zeros(count), zeros(count * n)
            self.run = lambda: group.allgather(t, out=out)
        elif op == "reduce_scatter":
            t, out = zeros(count * n), zeros(count)
            self.run = lambda: group.reduce_scatter(t, out=out)
        else:  # alltoall
            t, out = zeros(count * n), zeros(count * n)
            self.run = lambda: group.alltoall(t, out=out)
        self.touch = t.zero_  # writes what this rank sends (``--written``)
        if device.type == "cuda":  # each done before the clock reads: kernels run asynchronously
            inner = self.run
            self.run = lambda: (inner(), torch.cuda.synchronize(device))
            self.touch = lambda: (t.zero_(), torch.cuda.synchronize(device))


class MPICase:
    """One (op, size) straight through mpi4py: the MPI library beneath the ``mpi`` backend, without
    torch's dispatch or ours. The same buffer sizes as ``Case``, and memory from torch's allocator
    (viewed as numpy arrays), as the backend gets it."""

    DTYPES = (torch.float32, torch.float64)  # standard MPI has no 16-bit float type

    def __init__(self, op: str, comm, nbytes: int, dtype: torch.dtype) -> None:
        from mpi4py import MPI  # only here: importing it initializes MPI

        n, rank = comm.Get_size(), comm.Get_rank()
        count, self.bytes = buffer_size(op, nbytes, n, dtype)
        zeros = lambda k: torch.zeros(k, dtype=dtype).numpy()  # noqa: E731
        if op == "allreduce":
            t = zeros(count)
            self.run = lambda: comm.Allreduce(MPI.IN_PLACE, t, MPI.SUM)
        elif op == "broadcast":
            t = zeros(count)
            self.run = lambda: comm.Bcast(t, root=0)
        elif op == "reduce":
            t = zeros(count)
            send, recv = (MPI.IN_PLACE, t) if rank == 0 else (t, None)  # chosen once, not in the timed call
            self.run = lambda: comm.Reduce(send, recv, MPI.SUM, root=0)
        elif op == "allgather":
            t, out = zeros(count), zeros(count * n)
            self.run = lambda: comm.Allgather(t, out)
        elif op == "reduce_scatter":
            t, out = zeros(count * n), zeros(count)
            self.run = lambda: comm.Reduce_scatter_block(t, out, MPI.SUM)
        else:  # alltoall
            t, out = zeros(count * n), zeros(count * n)
            self.run = lambda: comm.Alltoall(t, out)
        self.touch = lambda: t.fill(0)  # ``Case.touch``


def row(backend: str, op: str, nbytes: int, n: int, times: list[float]) -> dict:
    p50 = statistics.median(times)
    p95 = sorted(times)[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    algbw = nbytes / p50 / 1e9
    factor = 1.0 if op == "memcpy" else BUS_FACTOR[op](n)
    return {"backend": backend, "op": op, "bytes": nbytes, "world_size": n, "p50_s": p50,
            "p95_s": p95, "algbw_GBps": algbw, "busbw_GBps": algbw * factor, "reps": len(times)}


def memcpy_rows(sizes: list[int], dtype: torch.dtype, sync: Sync, args) -> list[dict]:
    """Rank 0 copies buffers of each size while the others wait: one core's memcpy bandwidth."""
    rows = []
    elem = torch.empty(0, dtype=dtype).element_size()
    for nbytes in sizes:
        count = max(1, nbytes // elem)
        times: list[float] = []
        if sync.world.rank == 0:
            src, dst = torch.zeros(count, dtype=dtype), torch.empty(count, dtype=dtype)
            for _ in range(args.warmup):
                dst.copy_(src)
            deadline = time.perf_counter() + args.min_time
            while len(times) < args.min_reps or (time.perf_counter() < deadline
                                                 and len(times) < args.max_reps):
                start = time.perf_counter()
                dst.copy_(src)
                times.append(time.perf_counter() - start)
            rows.append(row("memcpy", "memcpy", count * elem, 1, times))
        sync.barrier()
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows, each with its time over memcpy's for the nearest size, then speedups over gloo."""
    memcpy = [r for r in rows if r["backend"] == "memcpy"]
    print(f"{'backend':8} {'op':15} {'bytes':>10} {'ranks':>5} {'p50 ms':>10} {'p95 ms':>10} "
          f"{'algbw GB/s':>10} {'busbw GB/s':>10} {'x memcpy':>9}")
    for r in rows:
        near = min(memcpy, key=lambda m: abs(m["bytes"] - r["bytes"])) if memcpy else None
        ratio = f"{r['p50_s'] / near['p50_s']:9.2f}" if near else f"{'-':>9}"
        print(f"{r['backend']:8} {r['op']:15} {r['bytes']:>10} {r['world_size']:>5} "
              f"{r['p50_s'] * 1e3:>10.4f} {r['p95_s'] * 1e3:>10.4f} {r['algbw_GBps']:>10.3f} "
              f"{r['busbw_GBps']:>10.3f} {ratio}")
    by_key = {(r["backend"], r["op"], r["bytes"]): r for r in rows}
    for (backend, op, nbytes), r in by_key.items():
        gloo = by_key.get(("gloo", op, nbytes))
        if backend != "gloo" and gloo is not None:
            print(f"{backend} {op} {nbytes} B: {r['algbw_GBps'] / gloo['algbw_GBps']:.1f}x gloo's algbw")
    sys.stdout.flush()


def cmd_collectives(args: argparse.Namespace) -> int:
    placement = discover(os.environ)
    try:
        cases = check(args, placement)
    except ConfigError as exc:  # every rank checks the same flags: a host's first rank speaks for it
        return refuse(f"downpour bench collectives: error: {exc}", placement.local_rank == 0)
    with runtime.abort_on_error():
        ctx = runtime.init(backend="gloo", device="cuda" if "nccl" in cases.backends else "cpu",
                           timeout_s=600)
        in_session(args, cases, ctx)
        runtime.shutdown()
    return 0


class Cases(NamedTuple):
    """What a run of the benchmark measures: each backend, operation and size (bytes)."""

    backends: list[str]
    ops: list[str]
    sizes: list[int]


def check(args: argparse.Namespace, placement: Placement | None = None) -> Cases:
    """The cases ``args`` ask for, or a ConfigError naming the flag that cannot be met, before any
    rank starts a process group; with a launch's ``placement``, the flags that it decides too."""
    default = "gloo,mpi" if runtime.backend_usable("mpi") else "gloo"
    backends = parse_list("backends", args.backends or default, BACKENDS)
    ops = parse_list("ops", args.ops, OPS)
    sizes = parse_sizes(args.sizes)
    if placement is None or placement.rank == 0:  # rank 0 writes the rows; the launcher ends the rest
        check_output_file("json", args.json)
    if placement is not None and placement.world_size < 2:
        raise ConfigError("world size", placement.world_size,
                          "run under a launcher with 2 or more ranks, e.g. mpiexec -n 2 downpour bench ...")
    if placement is not None and "mpi" in backends and placement.launcher != "mpi":
        raise ConfigError("backends", "mpi", f"mpi needs an MPI launch (mpiexec, srun --mpi=pmix), "
                          f"this is a {placement.launcher} launch; use gloo")
    for flag in ("breakdown", "paths"):
        if getattr(args, flag) and "mpi" not in backends:
            raise ConfigError(flag, "on", f"--{flag} times the mpi backend's parts: "
                              "add mpi to --backends")
    if args.paths and DTYPES[args.dtype] not in MPICase.DTYPES:
        raise ConfigError("dtype", args.dtype, "--paths sets each path against MPI's own call, "
                          "and standard MPI has no 16-bit float: float32 or float64")
    if "mpi" in backends and not runtime.backend_usable("mpi"):  # torch's own MPI error otherwise
        raise ConfigError("backends", "mpi", f"{runtime.mpi_name_taken()}; use --backends gloo "
                          "(or gloo,nccl on GPUs)")
    if "nccl" in backends and not torch.cuda.is_available():
        raise ConfigError("backends", "nccl", "nccl needs CUDA devices; use gloo,mpi on CPU")
    return Cases(backends, ops, sizes)


def in_session(args: argparse.Namespace, cases: Cases, ctx: runtime.DistContext) -> list[dict]:
    """The ``cases`` that ``check`` made of ``args``, measured on every rank of ``ctx``: a session
    started for them (``cmd_collectives``) or for more (a ``study.batch`` that measures the link
    before it trains); each backend but the default group's gets a group of its own. The rows,
    which rank 0 prints and writes to ``args.json``."""
    backends, ops, sizes = cases
    torch.set_num_threads(args.threads)
    world = Communicator.world()
    groups = {name: world if name == ctx.backend else new_group(world.ranks, backend=name)
              for name in backends}
    if "mpi" in groups and ctx.rank == 0:
        from ..comm.mpi import native  # loaded once the group was made

        where = "C" if native.load() is not None else f"Python ({native.why_not()})"
        print(f"bench: the mpi backend's data phase is in {where}", file=sys.stderr, flush=True)
    sync, rows, references = Sync(world), [], []
    rows += memcpy_rows(sizes, DTYPES[args.dtype], sync, args)
    # MPI's own calls, on a duplicate of MPI_COMM_WORLD (our own traffic)
    mpi_comm = sync.comm.Dup() if "mpi" in backends and DTYPES[args.dtype] in MPICase.DTYPES \
        else None
    for backend in backends:
        dev = ctx.device if backend == "nccl" else torch.device("cpu")
        for op in ops:
            for nbytes in sizes:
                case = Case(op, groups[backend], nbytes, DTYPES[args.dtype], dev)
                if backend == "mpi" and mpi_comm is not None:  # in turns with MPI's own
                    ref = MPICase(op, mpi_comm, nbytes, DTYPES[args.dtype])
                    ours, theirs = measure_paired([case.run, ref.run], sync, args,
                                                  lambda c=case, r=ref: (c.touch(), r.touch()))
                    references.append(row("mpi4py", op, ref.bytes, ctx.world_size, theirs))
                else:
                    ours = measure(case.run, sync, args, case.touch)
                rows.append(row(backend, op, case.bytes, ctx.world_size, ours))
    if mpi_comm is not None:
        mpi_comm.Free()
    rows += references
    parts = []
    if args.breakdown:
        from .breakdown import breakdown_rows

        parts = breakdown_rows(ops, sizes, DTYPES[args.dtype], groups["mpi"]._process_group(),
                               sync, args)
        rows += [{"backend": "mpi:breakdown", **r} for r in parts]
    paths = []
    if args.paths:
        from .breakdown import path_rows

        paths = path_rows(ops, sizes, DTYPES[args.dtype], groups["mpi"]._process_group(),
                          sync, args)
        rows += [{"backend": "mpi:paths", **r} for r in paths]
    for r in rows:
        r["written"] = bool(getattr(args, "written", False))  # how the buffers were sent
    if ctx.rank == 0:
        print_table([r for r in rows if not r["backend"].startswith("mpi:")])
        if parts:
            from .breakdown import print_breakdown

            print_breakdown(parts)
        if paths:
            from .breakdown import print_paths

            print_paths(paths)
        if args.json:
            atomic_write_text(args.json, json.dumps(rows, indent=1) + "\n")
    return rows
