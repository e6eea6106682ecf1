"""Naming the rank that went silent or died, for the backends that do not say it (gloo, nccl).

Gloo reports a dead or stopped peer in its own words, ``Connection closed by peer
[10.213.0.12]:40123`` (the peer's process or its link went away) or ``Timed out waiting 20000ms
for recv operation`` (it stopped answering), neither of which says which rank, or where. The ``mpi``
backend answers that with a watchdog over MPI (``comm/mpi/liveness``); without MPI the rendezvous
store is the one channel that every rank has, so:

* each rank's ``Heartbeat`` thread adds 1 to its own counter in the store every ``BEAT_S``, over a
  connection of its own (one small message per rank and beat: at a thousand ranks, a thousand a
  second to the store's host, which it serves in microseconds each);
* when a collective fails, ``explain`` reads every counter twice, ``PROBE_S`` apart: a rank whose
  counter did not move went silent (stopped, hung or gone), and the error says so in the words the
  mpi backend uses ("rank 1 on node2 went silent"). A store that does not answer is its host,
  rank 0, stopped or gone, or this rank cut off from it (a cut link: each side names the other);
* the peer address in gloo's message, mapped to ranks by the host addresses every rank gave at
  start-up, names the host when the store cannot tell.

Only failures of communication are explained (``DistError``, and gloo's and NCCL's messages); any
other exception keeps its own message and traceback.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch.distributed as dist

from .._threads import join_or_leave

BEAT_S = 0.5  # how often a rank adds to its counter
PROBE_S = 3.0  # how long a probe waits between its two readings (a live rank beats about 6 times)
LEFT_S = 15.0  # the longest a beat can take: a connect and an add, PROBE_S each, and their retries
_KEY = "downpour/heartbeat/{}"
# gloo's and NCCL's words for a peer that went away or stopped answering
_FAILURES = ("connection closed by peer", "connection reset by peer", "timed out waiting",
             "broken pipe", "gloo", "nccl", "socket timeout", "connection refused")
_PEER = re.compile(r"\[(?:::ffff:)?([0-9A-Fa-f.:]+)\]:(\d+)")


def default_store() -> dist.TCPStore | None:
    """The TCPStore under the default group's store (init_process_group wraps it in prefixes)."""
    from torch.distributed import distributed_c10d as c10d

    try:
        store = c10d._get_default_store()
    except (RuntimeError, ValueError):
        return None
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store if isinstance(store, dist.TCPStore) else None


class Heartbeat:
    """One per process while a gloo or nccl default group exists: ``start`` and ``close`` are
    explicit, the thread is a daemon and never raises (a beat that fails is what a probe sees)."""

    def __init__(self, rank: int, world_size: int, hosts: Sequence[str],
                 addresses: Sequence[Iterable[str]], store_host: str, store_port: int,
                 backend: str) -> None:
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.hosts = list(hosts)
        self.addresses = [set(a) for a in addresses]  # each rank's host's IPv4 addresses
        self.store_host, self.store_port = store_host, store_port
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _client(self) -> dist.TCPStore:
        return dist.TCPStore(self.store_host, self.store_port, None, False,
                             timeout=datetime.timedelta(seconds=PROBE_S), wait_for_workers=False)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="downpour-heartbeat",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:  # a beat still connecting to a store that is gone: at exit
            join_or_leave(self._thread, PROBE_S + 1, at_exit_s=LEFT_S)
            self._thread = None

    def _beat(self) -> None:
        key, client = _KEY.format(self.rank), None
        while True:
            try:
                client = client or self._client()
                client.add(key, 1)
            except Exception:  # noqa: BLE001 -- a store that does not answer is what probes report
                client = None
            if self._stop.wait(BEAT_S):
                return

    # -- when a collective failed ----------------------------------------------------------------
    def name(self, ranks: Iterable[int]) -> str:
        """"rank 2 on node2", "ranks 1 on a, 3 on b" (as ``comm.mpi.liveness`` says it)."""
        ranks = sorted(ranks)
        where = [f"{r} on {self.hosts[r]}" if r < len(self.hosts) else str(r) for r in ranks]
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(where)

    def silent(self) -> list[int] | None:
        """The other ranks whose counters did not move in ``PROBE_S``; None when the store did
        not answer within its timeout."""
        def counters() -> list[int]:
            client = self._client()
            return [int(client.add(_KEY.format(r), 0)) for r in range(self.world_size)]

        first = _within(counters, 2 * PROBE_S)
        if first is None:
            return None
        time.sleep(PROBE_S)
        second = _within(counters, 2 * PROBE_S)
        if second is None:
            return None
        return [r for r in range(self.world_size) if r != self.rank and first[r] == second[r]]

    def ranks_at(self, address: str) -> list[int]:
        """The ranks on the host that has ``address`` (all of them on one host, for loopback)."""
        if address.startswith("127.") and len(set(self.hosts)) == 1:
            return [r for r in range(self.world_size) if r != self.rank]
        return [r for r, addrs in enumerate(self.addresses) if address in addrs and r != self.rank]

    def explain(self, exc: BaseException) -> str | None:
        """The failure ``exc`` of a collective as the rank(s) it waited on, or None when it is not
        a failure of communication."""
        said = _failure(exc)
        if said is None:
            return None
        me = f"{self.backend} backend"  # abort() says which rank this is
        gloo = f" ({self.backend} said: {said})"
        silent = self.silent()
        if silent:
            return (f"{me}: {self.name(silent)} went silent (no heartbeat within {PROBE_S:.0f} s: "
                    f"stopped, hung or gone); ending the job{gloo}")
        peer = _PEER.search(said)
        at = self.ranks_at(peer[1]) if peer else []
        if silent is None:
            where = (f"; the peer that failed was {self.name(at)}" if at and at != [0] else "")
            return (f"{me}: {self.name([0])}, which holds the rendezvous store, does not answer: "
                    f"it is stopped or gone, or the link from {self.hosts[self.rank]} to "
                    f"{self.hosts[0]} is down{where}; ending the job{gloo}")
        if at:  # it beats again (its connection closed, its process lives): name the host
            return f"{me}: the connection to {self.name(at)} failed; ending the job{gloo}"
        if "timed out" in said.lower() or "timeout" in said.lower():
            return (f"{me}: every rank is alive (each answered its heartbeat): the ranks issued "
                    f"different operations, or one is slower than the timeout allows (raise "
                    f"--timeout-s){gloo}")
        return None  # nobody silent, no peer named: the error's own message and traceback say more


def _failure(exc: BaseException) -> str | None:
    """The backend's own words when ``exc`` (or what caused it) is a failure of communication."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if isinstance(exc, dist.DistError) or any(f in text.lower() for f in _FAILURES):
            lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
            # gloo prefixes its source location: "[../third_party/gloo/.../pair.cc:534] Connection..."
            return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", lines[-1] if lines else text)
        exc = exc.__cause__ or exc.__context__
    return None


def _within(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()`` on a thread of its own, or None if it failed or did not return in time (a store
    whose host is stopped may hold a connection open without answering)."""
    out: list[Any] = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception:  # noqa: BLE001 -- no answer is the answer
            pass

    thread = threading.Thread(target=call, name="downpour-heartbeat-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return out[0] if out else None


HEARTBEAT: Heartbeat | None = None  # this process's, while its default group lives


def start(rank: int, world_size: int, hosts: Sequence[str], addresses: Sequence[Iterable[str]],
          backend: str) -> None:
    """Start this process's heartbeat on the default group's store (no TCPStore: nothing)."""
    global HEARTBEAT
    store = default_store()
    if store is None or world_size < 2:
        return
    stop()
    HEARTBEAT = Heartbeat(rank, world_size, hosts, addresses, store.host, store.port, backend)
    HEARTBEAT.start()


def stop() -> None:
    global HEARTBEAT
    if HEARTBEAT is not None:
        HEARTBEAT.close()
        HEARTBEAT = None


def explain(exc: BaseException) -> str | None:
    """``Heartbeat.explain`` on this process's heartbeat (None without one)."""
    return HEARTBEAT.explain(exc) if HEARTBEAT is not None else None
