"""Under mpiexec -n 3: PyTorch's own distributed tests (``DistributedTest._DistTestBase``, shipped in
the torch wheel) with ``BACKEND=mpi``, against our ``mpi`` backend.

PyTorch drives its MPI run the same way (its old ``test_distributed_fork.py``): every rank is an MPI
process that joins ``init_process_group("mpi")`` once and runs the tests one after another in a plain
``TestCase``. All 285 tests of the class run -- the collective, point-to-point, group and DDP parts
and the few others (ranks, backend names, the sampler) -- because the whole class takes a few
seconds for MPI: PyTorch skips about two thirds of it for MPI (CUDA, NCCL- or gloo-only features,
and the DDP tests it gates on ``DistTestCases.backend_feature["ddp"]``, which has no ``mpi``). What
this driver adds to PyTorch's harness:

* each test's outcome gathered over MPI after the test (on a communicator of the driver's own), so
  rank 0 writes one JSON of per-test, per-rank outcomes (``--out``), and exits 1 when a test that
  is not in ``UNPASSABLE`` failed on some rank;
* a skip by ``sys.exit(<TEST_SKIPS code>)``, which torch's multi-process harness reads as a skip,
  counts as a skip here too;
* ``_barrier`` is an MPI barrier with a deadline instead of torch's file barrier, which polls every
  0.1 s (the tests call it a few hundred times).

``tests/test_mpi_conformance.py`` runs this and checks the JSON.

    mpiexec -n 3 --oversubscribe python tests/mpi/dist_conformance.py --out results.json [-k PATTERN]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from functools import wraps

from mpi4py import MPI

WORLD = MPI.COMM_WORLD
os.environ["BACKEND"] = "mpi"
os.environ["WORLD_SIZE"] = str(WORLD.Get_size())
# torch's tests keep files in TEMP_DIR (per-rank notes in test_dir, checkpoints), which all ranks
# share; its harness makes these subdirectories (common_distributed.initialize_temp_directories)
if WORLD.Get_rank() == 0:
    _tmp = tempfile.mkdtemp(prefix="dist-conformance-")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(_tmp, sub))
os.environ["TEMP_DIR"] = WORLD.bcast(_tmp if WORLD.Get_rank() == 0 else None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest  # noqa: E402

import downpour_lib.comm.mpi  # noqa: E402,F401  (registers "mpi")

#: Tests PyTorch runs for MPI that our backend cannot pass, each with the reason (none today: all
#: pass). Keep it honest: tests/test_mpi_conformance.py fails when a listed test passes or is skipped.
UNPASSABLE: dict[str, str] = {}
SKIP_CODES = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}
BARRIER_S = 60.0


class MPIConformance(TestCase, DistributedTest._DistTestBase):
    """``_DistTestBase`` in one process per rank, on the default group of our mpi backend."""

    _sync = None  # the driver's own communicator (set in main)

    def _barrier(self, *args, **kwargs) -> None:
        request = self._sync.Ibarrier()
        deadline = time.monotonic() + BARRIER_S
        while not request.Test():
            if time.monotonic() > deadline:
                raise RuntimeError(f"barrier: not every rank arrived within {BARRIER_S:.0f} s")
            time.sleep(1e-4)


def _skips_by_exit(method):
    """torch's decorators skip by ``sys.exit(code)`` (read by its multi-process harness)."""

    @wraps(method)
    def run(self):
        try:
            return method(self)
        except SystemExit as exc:
            if exc.code in SKIP_CODES:
                raise unittest.SkipTest(SKIP_CODES[exc.code]) from None
            raise

    return run


def test_names(patterns: list[str] | None) -> list[str]:
    names = sorted(n for n in dir(MPIConformance) if n.startswith("test_"))
    return [n for n in names if not patterns or any(re.search(p, n) for p in patterns)]


class _Outcome(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcome, self.detail = "passed", ""

    def _set(self, outcome: str, detail: str) -> None:
        if self.outcome == "passed" or outcome in ("failed", "error"):
            self.outcome, self.detail = outcome, detail[-3000:]

    def addError(self, test, err):
        self._set("error", "".join(traceback.format_exception(*err)))

    def addFailure(self, test, err):
        self._set("failed", "".join(traceback.format_exception(*err)))

    def addSkip(self, test, reason):
        self._set("skipped", reason)

    def addExpectedFailure(self, test, err):
        self._set("failed", "expected failure (torch marks it)")

    def addUnexpectedSuccess(self, test):
        self._set("passed", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON of outcomes (rank 0 writes it)")
    parser.add_argument("-k", action="append", help="only tests matching this pattern (repeatable)")
    parser.add_argument("--timeout", type=float, default=60.0, help="the process group's timeout (s)")
    args = parser.parse_args()
    rank = WORLD.Get_rank()
    MPIConformance._sync = WORLD.Dup()
    names = test_names(args.k)
    for name in names:
        setattr(MPIConformance, name, _skips_by_exit(getattr(MPIConformance, name)))
    dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    results, started = {}, time.monotonic()
    for name in names:
        t0 = time.monotonic()
        outcome = _Outcome()
        MPIConformance(name).run(outcome)
        per_rank = MPIConformance._sync.allgather((outcome.outcome, outcome.detail))
        results[name] = {"outcome": _overall([o for o, _ in per_rank]),
                         "seconds": round(time.monotonic() - t0, 3),
                         "ranks": [{"outcome": o, "detail": d} for o, d in per_rank]}
        if rank == 0:
            print(f"{results[name]['outcome']:8} {results[name]['seconds']:7.2f} s  {name}",
                  flush=True)
    unexpected = sorted(n for n, r in results.items()
                        if r["outcome"] != "skipped" and r["outcome"] != "passed"
                        and n not in UNPASSABLE)
    summary = {"world_size": WORLD.Get_size(), "torch": torch.__version__,
               "seconds": round(time.monotonic() - started, 1), "tests": results,
               "unpassable": UNPASSABLE, "unexpected": unexpected}
    if rank == 0:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)
        counts = {o: sum(r["outcome"] == o for r in results.values())
                  for o in sorted({r["outcome"] for r in results.values()})}
        print(f"{len(results)} tests in {summary['seconds']} s: {counts}; unexpected: {unexpected}")
    dist.destroy_process_group()
    MPIConformance._sync.Barrier()
    if rank == 0:
        shutil.rmtree(os.environ["TEMP_DIR"], ignore_errors=True)
    return 1 if unexpected else 0


def _overall(outcomes: list[str]) -> str:
    """One outcome for all ranks: a skip on every rank is a skip; any failure is a failure."""
    if all(o == "skipped" for o in outcomes):
        return "skipped"
    bad = [o for o in outcomes if o in ("failed", "error")]
    if bad:
        return bad[0]
    return "passed" if "skipped" not in outcomes else "partly skipped"


if __name__ == "__main__":
    sys.exit(main())
