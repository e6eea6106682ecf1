"""One Communicator, metered or not: byte counting against the ring formula, the world of one
against what the real collectives return, and the metered collectives on real ranks (gloo and mpi)."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import explain, launch_env, mpi_python

from downpour_lib import comm
from downpour_lib.comm.runtime import DistContext
from downpour_lib.records import Meter
from downpour_lib.traffic import collective_bytes, ring_share


def test_collective_bytes_is_the_ring_formula_and_the_rooted_fan_out():
    for n in range(1, 9):
        for nbytes in (0, 1, 7, 4096, 45 * 2**20 + 3):
            moved = 2 * (n - 1) * nbytes // n  # what the meter counted before it was written once
            assert collective_bytes("allreduce", nbytes, n) == (moved, moved)
            shared = (n - 1) * nbytes // n
            for op in ("allgather", "reduce_scatter", "alltoall"):
                assert collective_bytes(op, nbytes, n) == (shared, shared)
            if n > 1:
                assert collective_bytes("broadcast", nbytes, n, rank=1, root=1) == ((n - 1) * nbytes, 0)
                assert collective_bytes("broadcast", nbytes, n, rank=0, root=1) == (0, nbytes)
                assert collective_bytes("reduce", nbytes, n, rank=0, root=0) == (0, (n - 1) * nbytes)
    assert collective_bytes("broadcast", 10, 1) == (0, 0)
    assert [float(ring_share(op, 4)) for op in ("allreduce", "allgather", "broadcast")] == [1.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="op='gather' is not valid"):
        ring_share("gather", 2)


def test_a_world_of_one_returns_what_the_real_collectives_return_and_meters_nothing():
    c = comm.Comm(DistContext.single())
    x = torch.arange(4.0)
    assert c.allreduce(x, op="mean") is x and torch.equal(x, torch.arange(4.0))
    assert c.broadcast(x, root=0) is x and c.reduce(x, root=0, scratch=True) is x
    assert c.allgather(x)[0] is x and c.reduce_scatter(x) is x and c.alltoall(x) is x
    out = torch.empty(1, 4)
    assert c.allgather(x, out=out) is out and torch.equal(out[0], x)
    assert c.reduce_scatter(x, out=torch.empty(4)).tolist() == x.tolist()
    assert c.alltoall(x, async_op=True).wait() is x
    assert c.gather_object("a") == ["a"] and c.allgather_object("b") == ["b"]
    c.barrier()
    with c.timed("comm"):
        pass
    c.count(sent=0)
    assert (c.meter.bytes_sent, c.meter.bytes_received) == (0, 0)
    with pytest.raises(ValueError, match="root=1 is not valid"):
        c.broadcast(x, root=1)


def test_an_unmetered_communicator_times_and_counts_nothing():
    c = comm.Communicator((0,), None, 0)
    assert c.meter is None
    with c.timed("wait"):
        c.count(sent=5, received=5)
    metered = comm.Communicator((0,), None, 0, Meter())
    with metered.timed(None):
        pass
    assert metered.meter == Meter()


@pytest.mark.parametrize("n", [2, 3])
def test_metered_collectives_on_real_ranks_on_gloo_and_mpi(n):
    proc = mpi_python(n, "metered.py")
    assert proc.returncode == 0, explain(proc)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == list(range(n)), explain(proc)
    for line in lines:
        assert line["failures"] == [] and line["cases"] > 30, line


#: a heartbeat whose store is gone (its host, rank 0, exited first): the beat is inside TCPStore's
#: connect, which gives up 3-5 s later, when the rank closes it and exits. The interpreter's
#: teardown outlasts the connect (torch's took seconds under a loaded make test; here an object
#: whose finalizer sleeps until 10 s after the start), so the thread comes back as it finalizes
STORE_GONE = """
import json, socket, time
START = time.monotonic()
from downpour_lib.comm import peers
gone = socket.socket(); gone.bind(("127.0.0.1", 0)); port = gone.getsockname()[1]; gone.close()
beat = peers.Heartbeat(1, 2, ["h", "h"], [[], []], "127.0.0.1", port, "gloo")
beat.start(); time.sleep(0.5)
thread, peers.PROBE_S = beat._thread, 0.1  # close gives up after 1.1 s, inside the connect
beat.close()
print(json.dumps({"left_by_close": thread.is_alive()}), flush=True)

class Finalized:  # what it uses, its own: the module's names are cleared by then
    def __init__(self):
        self.until, self.clock, self.sleep = START + 10, time.monotonic, time.sleep

    def __del__(self):
        self.sleep(max(0.0, self.until - self.clock()))

finalized = Finalized()
"""


def test_a_heartbeat_left_connecting_to_a_gone_store_does_not_abort_the_exit():
    """A rank whose run finished exited 134 under make test: its heartbeat thread, still inside
    TCPStore's connect to the store of a rank that had exited, came back into Python as the
    interpreter finalized, and was unwound through pybind11's noexcept code (std::terminate,
    "terminate called without an active exception"). Now a thread its close could not wait for is
    joined at exit, before finalization (downpour_lib/_threads.py)."""
    proc = subprocess.run([sys.executable, "-c", STORE_GONE], env=launch_env(), capture_output=True,
                          text=True, timeout=120)
    assert json.loads(proc.stdout.splitlines()[0]) == {"left_by_close": True}, explain(proc)
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, explain(proc)


def test_a_thread_left_to_the_exit_is_forgotten_once_it_has_ended():
    """join_or_leave keeps only threads still running for the join at exit: a long run whose
    heartbeats were each left once does not carry every one of them to its end."""
    import threading

    from downpour_lib import _threads

    release = [threading.Event(), threading.Event()]
    first, second = (threading.Thread(target=e.wait, daemon=True) for e in release)
    first.start()
    assert not _threads.join_or_leave(first, 0.05, at_exit_s=1.0)
    assert (first, 1.0) in _threads._LEFT
    release[0].set()
    first.join()
    second.start()
    assert not _threads.join_or_leave(second, 0.05, at_exit_s=2.0)
    assert (second, 2.0) in _threads._LEFT and all(t is not first for t, _ in _threads._LEFT)
    release[1].set()
    second.join()
