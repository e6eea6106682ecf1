"""The engine tells the algorithm how the run ended: ``close()`` after a run that finished,
``abort()`` after one that failed. No algorithm guesses from ``sys.exc_info()``, which is set in
any ``except`` block, so a run trained while the caller handles an unrelated error still closes
properly (tests/mpi/closed_inside_except.py, 2 ranks)."""

import ast
import json

from conftest import ROOT, explain, mpi_python


def test_a_run_trained_inside_an_except_block_closes_properly():
    proc = mpi_python(2, "closed_inside_except.py", timeout=300)
    assert proc.returncode == 0, explain(proc)
    cases = {c["case"]: c for c in map(json.loads, filter(None, proc.stdout.splitlines()))}
    assert list(cases) == ["osgp", "adpsgd", "downpour colocated"], cases
    osgp = cases["osgp"]  # drained: every message landed, the weights sum to the world size
    assert osgp["in_flight"] == 0 and abs(osgp["weight_sum"] - 2.0) < 1e-9, osgp
    adpsgd = cases["adpsgd"]  # each rank's averaging thread joined, the pairs' group freed
    assert adpsgd["threads"] == 2 and adpsgd["threads_alive"] == 0 and adpsgd["unjoined"] == 0, adpsgd
    downpour = cases["downpour colocated"]  # the colocated server's thread joined
    assert downpour["threads"] == 1 and downpour["threads_alive"] == 0, downpour
    assert downpour["unjoined"] == 0, downpour


def test_no_algorithm_reads_the_exception_being_handled():
    for path in (ROOT / "downpour_lib" / "algorithms").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("exc_info", "exception"):
                assert not (isinstance(node.value, ast.Name) and node.value.id == "sys"), \
                    f"{path.name}:{node.lineno} reads sys.{node.attr}()"
