"""``monitored_barrier`` on the ``mpi`` backend: a barrier that names the ranks that never came.

gloo's design (``ProcessGroupGloo::monitoredBarrier``), with its messages, which torch's tests
read: every rank but 0 tells rank 0 that it arrived and waits for rank 0's answer; rank 0 waits up
to the timeout for all of them, then answers every rank that arrived. A rank still missing at the
deadline fails the barrier on rank 0 with "[Rank 0]: Rank R failed to pass monitoredBarrier in
T ms" (the lowest such rank; with ``wait_all_ranks``, "Ranks R, S failed ..."). Where gloo's other
ranks learn nothing and wait out the group's timeout, here rank 0's answer tells the ranks that
arrived which ranks did not, and they raise at once, naming them too.

Ranks are group ranks. Messages go point to point on the group's communicator, with the top two
tags of MPI's tag space (``TAG_UB``, ``TAG_UB - 1``: reserved). Calls are not numbered (a rank
that skipped one is not a call behind for ever): a rank that arrives after its barrier failed
takes part in rank 0's next one, or times out. Every wait sleeps
(``liveness``) and has a deadline: rank 0's is the barrier's timeout (or sooner, once the
heartbeat finds a rank silent); another rank waits for rank 0, which may come late, up to the
group's timeout, and then names rank 0 if it went silent (``CommTimeout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mpi4py import MPI

from .liveness import BACKSTOP_S, WATCHDOG, CommTimeout, PeerTimeout, wait_request
from .waits import NAP_S, SPIN_S


def _ranks(ranks: list[int]) -> str:
    return ("Rank " if len(ranks) == 1 else "Ranks ") + ", ".join(map(str, ranks))


def barrier(comm: MPI.Intracomm, timeout_s: float, group_timeout_s: float, wait_all_ranks: bool,
            explain: Callable[[PeerTimeout], CommTimeout], group: str) -> None:
    """A monitored barrier of ``comm``'s group; raises ``RuntimeError`` naming the ranks that did
    not arrive within ``timeout_s`` (on every rank that did)."""
    n, me = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return
    arrive = comm.Get_attr(MPI.TAG_UB)
    answer_tag, ms = arrive - 1, int(timeout_s * 1000)
    WATCHDOG.enter("monitored_barrier", max(timeout_s, group_timeout_s), group)
    try:
        if me == 0:
            missing = _collect(comm, arrive, answer_tag, timeout_s)
            if missing:
                first = missing if wait_all_ranks else missing[:1]
                raise RuntimeError(f"[Rank 0]: {_ranks(first)} failed to pass monitoredBarrier "
                                   f"in {ms} ms")
            return
        answer = bytearray(n)
        answered = comm.Irecv(answer, 0, answer_tag)
        arrived = comm.Isend(bytearray(1), 0, arrive)
        try:
            wait_request(answered, max(group_timeout_s, timeout_s + BACKSTOP_S),
                         "monitored_barrier (waiting for rank 0)")
        except PeerTimeout as exc:
            answered.Cancel()
            answered.Wait()
            arrived.Free()
            raise explain(exc) from None
        arrived.Wait()
        missing = [r for r in range(n) if answer[r]]
        if missing:
            raise RuntimeError(f"Rank {me} successfully reached monitoredBarrier, but rank 0 found "
                               f"that {_ranks(missing).lower()} failed to pass monitoredBarrier "
                               f"in {ms} ms")
    finally:
        WATCHDOG.leave()


def _collect(comm: MPI.Intracomm, arrive: int, answer_tag: int, timeout_s: float) -> list[int]:
    """On rank 0: wait for every other rank's arrival until the deadline, answer the ranks that
    arrived (with the missing ones), and return the missing ones."""
    n = comm.Get_size()
    arrivals = {r: comm.Irecv(bytearray(1), r, arrive) for r in range(1, n)}
    pending = set(arrivals)
    start = time.perf_counter()
    deadline = start + timeout_s
    WATCHDOG.waiting()
    while True:
        pending = {r for r in pending if not arrivals[r].Test()}
        now = time.perf_counter()
        if not pending or now >= deadline or WATCHDOG.silent:
            break
        if now - start > SPIN_S:
            time.sleep(min(NAP_S, max(SPIN_S, (now - start) / 32), deadline - now))
    for r in sorted(pending):  # take the receive back, unless the rank arrived meanwhile
        arrivals[r].Cancel()
        status = MPI.Status()
        arrivals[r].Wait(status)
        if not status.Is_cancelled():
            pending.discard(r)
    missing = sorted(pending)
    answer = bytearray(n)
    for r in missing:
        answer[r] = 1
    # the ranks that arrived posted their receive first: the answers complete without waiting
    MPI.Request.Waitall([comm.Isend(answer, r, answer_tag) for r in arrivals if r not in pending])
    return missing
