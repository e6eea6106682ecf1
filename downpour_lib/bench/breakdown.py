"""``downpour bench collectives --breakdown``: where the ``mpi`` backend's time goes, per op and size.

The parts are timed in turns with each other (``timing.measure_paired``: a tenth of the
repetitions at a time, so that each sees the machine as the others do), in the same processes and
on the same buffers, p50 of the slowest rank as every row of the bench:

* ``noop``: torch.distributed's call into a process group that does nothing (``comm/floor/noop.py``):
  the floor of torch's dispatch, which no backend of this kind can go under;
* ``torch``: the ``mpi`` backend through ``torch.distributed`` (what users and DDP call);
* ``direct``: the backend's own method called without torch (our argument checks, staging, path
  choice, the waits and MPI): ``torch - direct`` is torch's dispatch into a Python backend;
* ``async``: the same with ``async_op=True`` and ``wait()``: ``async - torch`` is the executor
  hand-off asynchronous work takes;
* ``gate``: the liveness gate alone (``MPI_Ibarrier`` waited on with naps), what a handshake
  costs where one is still made (before MPI's blocking calls: see ``comm/mpi/process_group.py``);
* ``mpi4py``: MPI itself, Open MPI's own call through mpi4py on the same tensors (``_reference``);
* ``native``: torch.distributed into a C++ backend whose calls are MPI's blocking ones and nothing
  else (``comm/floor/native_floor.py``): what a native backend with none of our guarantees takes,
  built on the spot where a compiler and ``mpicxx`` are at hand (the column is left out, with the
  reason, where not);
* ``gated``: the same native backend with our liveness gate before each collective, in C++: what
  that guarantee would cost a native backend (``gated - native``; ``gate`` is what it costs ours).

``direct - mpi4py`` is then what our code adds over the MPI call, or saves where the path is ours
(shared memory).
"""

from __future__ import annotations

import sys
from statistics import geometric_mean

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from ..comm.floor import native_floor
from ..comm.floor.noop import noop_group
from ..comm.mpi.liveness import gate
from ..comm.mpi.paths import PATHS
from ..comm.mpi.types import reduction, spec
from ..errors import ConfigError
from .timing import buffer_size, measure_paired

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce")
PARTS = ("noop", "torch", "direct", "async", "gate", "mpi4py")


def _torch_call(op: str, group, x: torch.Tensor, out: torch.Tensor | None, async_op: bool):
    """``op`` through torch.distributed on ``group``; ranks are the world's (one group of all)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "allreduce":
        return lambda: _wait(dist.all_reduce(x, group=group, async_op=async_op))
    if op == "broadcast":
        return lambda: _wait(dist.broadcast(x, src=0, group=group, async_op=async_op))
    if op == "reduce":
        return lambda: _wait(dist.reduce(x, dst=0, group=group, async_op=async_op))
    if op == "allgather":
        return lambda: _wait(gather(out, x, group=group, async_op=async_op))
    return lambda: _wait(scatter(out, x, group=group, async_op=async_op))


def _wait(work) -> None:
    if work is not None:
        work.wait()


def _direct_call(op: str, pg, x: torch.Tensor, out: torch.Tensor | None):
    """``op`` as the backend's own method, synchronous, without torch's dispatch."""
    opts = {"allreduce": dist.AllreduceOptions, "broadcast": dist.BroadcastOptions,
            "reduce": dist.ReduceOptions, "allgather": AllgatherOptions,
            "reduce_scatter": dist.ReduceScatterOptions}[op]()
    opts.asyncOp = False  # torch's default is True: the call would only queue the work
    if op in ("broadcast", "reduce"):
        opts.rootRank = 0
    if op == "allreduce":
        return lambda: _wait(pg.allreduce([x], opts))
    if op == "broadcast":
        return lambda: _wait(pg.broadcast([x], opts))
    if op == "reduce":
        return lambda: _wait(pg.reduce([x], opts))
    if op == "allgather":
        return lambda: _wait(pg.all_gather_single(out, x, opts))
    return lambda: _wait(pg.reduce_scatter_single(out, x, opts))


def _reference(op: str, comm, x: torch.Tensor, out: torch.Tensor | None):
    """``op`` as Open MPI's own call on ``comm`` (mpi4py), on the same tensors."""
    from mpi4py import MPI

    if op == "allreduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, spec(x), MPI.SUM)
    if op == "broadcast":
        return lambda: comm.Bcast(spec(x), 0)
    if op == "reduce":
        return lambda: comm.Reduce(MPI.IN_PLACE if comm.Get_rank() == 0 else spec(x), spec(x),
                                   MPI.SUM, 0)
    if op == "allgather":
        return lambda: comm.Allgather(spec(x), spec(out, x.numel()))
    return lambda: comm.Reduce_scatter_block(spec(x, out.numel()), spec(out), MPI.SUM)


def _p50(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def breakdown_rows(ops: list[str], sizes: list[int], dtype: torch.dtype, pg, sync, args) -> list[dict]:
    """One row per (op, size): the p50 of each part (``PARTS``) in seconds, measured in turns;
    ``native_s`` and ``gated_s``, the native floor's without and with the gate (``comm/floor/``), in
    the same turns where it was built, else None."""
    n = pg.size()
    noop = noop_group()
    native, why_not = native_floor.native_group(pg._comm, pg.rank()) \
        if dtype in native_floor.DTYPES else \
        (None, f"it takes {', '.join(map(str, native_floor.DTYPES))}, not {dtype}")
    if why_not and pg.rank() == 0:
        print(f"bench: no native floor column: {why_not}", file=sys.stderr, flush=True)
    gated = native_floor.native_group(pg._comm, pg.rank(), gated=True, timeout_s=pg._timeout_s)[0] \
        if native is not None else None
    ref = pg._comm.Dup()
    rows = []
    for op in [o for o in ops if o in OPS]:
        for nbytes in sizes:
            count, reported = buffer_size(op, nbytes, n, dtype)
            x = torch.zeros(count * (n if op == "reduce_scatter" else 1), dtype=dtype)
            out = torch.zeros(count * n if op == "allgather" else count, dtype=dtype) \
                if op in ("allgather", "reduce_scatter") else None
            runs = {"noop": _torch_call(op, noop, x, out, False),
                    "torch": _torch_call(op, pg, x, out, False),
                    "direct": _direct_call(op, pg, x, out),
                    "async": _torch_call(op, pg, x, out, True),
                    "gate": lambda: gate(pg._comm, pg._timeout_s, "bench"),
                    "mpi4py": _reference(op, ref, x, out)}
            if native is not None:
                runs["native"] = _torch_call(op, native, x, out, False)
            if gated is not None:
                runs["gated"] = _torch_call(op, gated, x, out, False)
            row = {"op": op, "bytes": reported, "world_size": n, "native_s": None, "gated_s": None}
            for part, times in zip(runs, measure_paired(list(runs.values()), sync, args, x.zero_),
                                   strict=True):
                row[part + "_s"] = _p50(times)
            row["path"] = "" if op == "reduce" else _taken(op, pg, x, reported)
            rows.append(row)
    ref.Free()
    return rows


def _taken(op: str, pg, x: torch.Tensor, nbytes: int) -> str:
    """The path the group takes for ``op`` (allreduce, broadcast, allgather or reduce_scatter) on
    ``x``, ``nbytes`` the whole buffer as ``buffer_size`` reports it: its table's, or the one it
    timed at the size class's first call (``comm/mpi/tuning.py``), here if not before (collective,
    as that call is)."""
    if op == "allreduce":
        return pg._router.allreduce_path(x, reduction(dist.AllreduceOptions().reduceOp, x.dtype))
    return pg._router.path(op, x, nbytes)


def print_breakdown(rows: list[dict]) -> None:
    """The parts in microseconds, with ours over MPI's own; then, where the native floor was
    built, ours and it over MPI's own."""
    print("\nmpi backend, where the time goes (p50 us; dispatch = torch - direct, ours = direct - "
          "mpi4py, hand-off = async - torch; floor = (mpi4py + noop) / mpi4py, the least a backend "
          "called through torch's dispatch can take over MPI's own)")
    print(f"{'op':15} {'bytes':>10} {'mpi4py':>9} {'noop':>7} {'torch':>9} {'direct':>9} "
          f"{'dispatch':>8} {'ours':>8} {'hand-off':>8} {'gate':>7} {'x mpi4py':>8} {'floor':>6} "
          f"{'path':>5}")
    for r in rows:
        us = {k: r[k + "_s"] * 1e6 for k in PARTS}
        mpi = us["mpi4py"]
        print(f"{r['op']:15} {r['bytes']:>10} {mpi:9.1f} {us['noop']:7.1f} {us['torch']:9.1f} "
              f"{us['direct']:9.1f} {us['torch'] - us['direct']:8.1f} {us['direct'] - mpi:8.1f} "
              f"{us['async'] - us['torch']:8.1f} {us['gate']:7.1f} {us['torch'] / mpi:8.2f} "
              f"{(mpi + us['noop']) / mpi:6.2f} {r.get('path', ''):>5}")
    native = [r for r in rows if r["native_s"]]
    if native:
        print("\nnative floor: a C++ backend of MPI's blocking calls alone (no gate, timeout or "
              "watchdog), and the same behind our gate (gated), through torch.distributed, in the "
              "same turns (p50 us)")
        print(f"{'op':15} {'bytes':>10} {'mpi4py':>9} {'ours':>9} {'native':>9} {'gated':>9} "
              f"{'ours x':>7} {'native x':>8} {'gated x':>8}")
        for r in native:
            mpi, gated = r["mpi4py_s"], r["gated_s"]
            print(f"{r['op']:15} {r['bytes']:>10} {mpi * 1e6:9.1f} {r['torch_s'] * 1e6:9.1f} "
                  f"{r['native_s'] * 1e6:9.1f} {gated * 1e6 if gated else float('nan'):9.1f} "
                  f"{r['torch_s'] / mpi:7.2f} {r['native_s'] / mpi:8.2f} "
                  f"{gated / mpi if gated else float('nan'):8.2f}")
    cells = [r for r in rows if r["op"] in ("allreduce", "broadcast", "allgather")
             and 64 << 10 <= r["bytes"] <= 16 << 20]
    if cells:  # issue 36's goal: ours at most 1.05x MPI's own over these
        ours = geometric_mean(r["torch_s"] / r["mpi4py_s"] for r in cells)
        floor = geometric_mean((r["mpi4py_s"] + r["noop_s"]) / r["mpi4py_s"] for r in cells)
        others = "".join(f", {name} {geometric_mean(r[name + '_s'] / r['mpi4py_s'] for r in cells):.2f}"
                         for name in ("native", "gated") if all(r[name + "_s"] for r in cells))
        print(f"geometric mean over allreduce, broadcast and allgather, 64 KB to 16 MB "
              f"({len(cells)} cells, x mpi4py): ours {ours:.2f}, dispatch floor {floor:.2f}{others}")
    sys.stdout.flush()


PATH_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")


def _path_calls(op: str, pg, x: torch.Tensor, out: torch.Tensor | None) -> dict:
    """``op`` on ``x`` by each of the backend's paths on one node (``comm/mpi/paths.py``), and by
    MPI itself on the same tensors (``mpi4py``), as the backend's internals make them: ``mpi``
    and ``nb`` in C where the data phase is built (``DataPhase.in_c``), else in Python."""
    from mpi4py import MPI

    comm, shm, data = pg._comm, pg._shm, pg._data
    ref = comm.Dup()
    calls = {"mpi4py": _reference(op, ref, x, out)}
    if op == "allreduce":
        red = reduction(dist.AllreduceOptions().reduceOp, x.dtype)
        return {**calls, "shm": lambda: shm.allreduce(x, red.kernel, False, red.op),
                **{path: lambda b=blocking: data.in_c("Allreduce", x, reduce=red.op, blocking=b)
                   or data("Allreduce", MPI.IN_PLACE, spec(x), red.op, blocking=b)
                   for path, blocking in (("mpi", True), ("nb", False))}}, ref
    if op == "broadcast":
        return {**calls, "shm": lambda: shm.broadcast(x, 0),
                **{path: lambda b=blocking: data.in_c("Bcast", x, blocking=b)
                   or data("Bcast", spec(x), 0, blocking=b)
                   for path, blocking in (("mpi", True), ("nb", False))}}, ref
    if op == "allgather":
        return {**calls, "shm": lambda: shm.allgather(x, out),
                **{path: lambda b=blocking: data.in_c("Allgather", out, x, count=x.numel(), blocking=b)
                   or data("Allgather", spec(x), spec(out, x.numel()), blocking=b)
                   for path, blocking in (("mpi", True), ("nb", False))}}, ref
    # reduce_scatter: ``x`` the whole input, ``out`` one rank's block; no shared-memory path
    red = reduction(dist.ReduceScatterOptions().reduceOp, x.dtype)
    block = out.numel()
    return {**calls,
            **{path: lambda b=blocking: data.in_c("Reduce_scatter_block", out, x, reduce=red.op,
                                                  blocking=b)
               or data("Reduce_scatter_block", spec(x, block), spec(out), red.op, blocking=b)
               for path, blocking in (("mpi", True), ("nb", False))}}, ref


def path_rows(ops: list[str], sizes: list[int], dtype: torch.dtype, pg, sync, args) -> list[dict]:
    """One row per (op, size): the p50 of each path and of MPI's own call, measured in turns
    (``measure_paired``), and the path the group takes. A group on one node only (the shared
    memory must be set up); collective."""
    probe = torch.zeros(1 << 18, dtype=dtype)
    if not pg._shm.moves(probe, probe.nbytes, 0):  # sets the shared memory up, where it can
        raise ConfigError("paths", "on", "--paths needs the ranks on one node (the shared-memory "
                          "paths are for one node) and a float32 or float64 --dtype")
    rows = []
    for op in [o for o in ops if o in PATH_OPS]:
        for nbytes in sizes:
            count, reported = buffer_size(op, nbytes, pg.size(), dtype)
            x = torch.zeros(count * (pg.size() if op == "reduce_scatter" else 1), dtype=dtype)
            out = torch.zeros(count * pg.size(), dtype=dtype) if op == "allgather" \
                else torch.zeros(count, dtype=dtype) if op == "reduce_scatter" else None
            taken = _taken(op, pg, x, reported)
            calls, ref = _path_calls(op, pg, x, out)
            times = measure_paired(list(calls.values()), sync, args, x.zero_)
            ref.Free()
            row = {"op": op, "bytes": reported, "world_size": pg.size(), "taken": taken}
            for name, mine in zip(calls, times, strict=True):
                row[name + "_s"] = _p50(mine)
            rows.append(row)
    return rows


def print_paths(rows: list[dict]) -> None:
    """Each path's p50 over MPI's own in the same turns; ``*`` marks the path the group takes."""
    print("\nmpi backend, each path on one node against MPI's own call, measured in turns (p50 "
          "over mpi4py's; * the path the group takes: comm/mpi/paths.py's table, or the one it "
          "timed, comm/mpi/tuning.py)")
    print(f"{'op':10} {'bytes':>10} {'mpi4py us':>10} " + " ".join(f"{p:>7}" for p in PATHS))
    for r in rows:
        ref = r["mpi4py_s"]
        cells = " ".join(f"{r[p + '_s'] / ref:6.2f}" + ("*" if r["taken"] == p else " ")
                         if p + "_s" in r else f"{'-':>6} " for p in PATHS)
        print(f"{r['op']:10} {r['bytes']:>10} {ref * 1e6:10.1f} {cells}")
    sys.stdout.flush()
