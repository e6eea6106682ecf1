"""Waiting with a deadline, and naming the rank that went silent, for the ``mpi`` backend.

Open MPI's blocking calls neither time out nor sleep: a rank whose peer was stopped spins at 100% of
a core for ever. So the backend never enters a blocking call until every peer is there, and never
waits without a deadline:

* a collective moves its data with MPI's nonblocking form, waited on as below, or through shared
  memory, whose barrier waits on semaphores with a deadline; only before MPI's blocking calls
  (large data phases that neither takes) does it first pass a **gate**, ``MPI_Ibarrier`` on the
  group's communicator: once it completes every member has issued the collective, so the blocking
  call finishes in the time the data takes;
* every wait (the gate, a point-to-point request) spins for ``SPIN_S`` (ranks in step meet within
  microseconds), then sleeps in naps that grow with the time already waited (at most ``NAP_S``,
  about 3% of the wait), so a waiting rank leaves its core to its own backward pass;
* past the group's timeout the wait raises ``PeerTimeout``, and the group turns it into a
  ``CommTimeout`` that says which rank went silent: the waiting rank asks every rank of the world
  over a communicator of its own whether it is alive (a **liveness probe**). Each process's
  ``Watchdog`` thread answers within ``POLL_S`` with what the process is doing; a stopped, hung or
  dead process does not answer within ``PROBE_S``. One resumed meanwhile (the launcher sends
  SIGCONT before it ends a job) answers that it was stopped, and for how long, first: stopped for
  half the wait or more, it is the one named.

A rank that waits on nobody cannot time out: an asynchronous Downpour worker keeps pushing to its
server, and the server keeps serving it, while another worker is stopped. So the watchdogs also
keep a **heartbeat** around a ring: each rank asks the next one whether it is alive every
``BEAT_S``; one that has not answered for the group's timeout has gone silent (the ranks stop
watching together, when the default group is destroyed). Its watcher tells
every rank, and from then on every wait of the backend gives up at once (and names it), so the job
ends within the timeout and a few seconds whatever its ranks were doing. The ring keeps the traffic
at one small message per rank and beat, at any scale.

A peer stopped after its part of a gate (it may be napping in its own wait when the others'
gate completes) leaves the others in a blocking call. The watchdog covers what makes one after a
gate: ``gate`` marks the thread as *committed* to a blocking call, and once the heartbeat finds a
rank silent, a committed thread still inside its operation
``GRACE_S`` later ends the job (``job_end``) with the same message a wait gives (the operation,
its group, the silent rank). Whatever is left (a thread inside one operation ``BACKSTOP_S`` after
the group's timeout, every rank answering) ends the job the same way, naming what it can.
"""

from __future__ import annotations

import atexit
import json
import socket
import threading
import time
from collections.abc import Iterable

from mpi4py import MPI

from ...defaults import TORCH_TIMEOUT_S
from .. import job_end
from . import native
from .waits import NAP_S, PAUSED_S, SPIN_S

POLL_S = 0.1  # how often the watchdog answers probes and checks for stuck threads
PROBE_S = 3.0  # how long a probe waits for the answers of the living
BACKSTOP_S = 10.0  # past the timeout, how long a thread may stay inside one operation
GRACE_S = 0.5  # once a rank is known silent, how long a committed thread may still take to leave
BEAT_S = 1.0  # how often a rank asks the next one around the ring whether it is alive
# Tags on the watchdog's own communicator. A ping's one byte says which answer it asks for: a
# probe's (_PONG) or a heartbeat's (_BEAT).
_PING, _PONG, _BEAT, _SILENT = 1, 2, 3, 4
_PROBE, _HEARTBEAT = b"?", b"h"
_ANSWER_BYTES = 256
_STOPPED = "stopped for"  # how a probe's answer from a process woken from a stop begins


class PeerTimeout(RuntimeError):
    """A wait of the ``mpi`` backend passed its deadline (the group explains it: ``CommTimeout``)."""

    def __init__(self, what: str, waited_s: float) -> None:
        super().__init__(f"{what} waited {waited_s:.0f} s")
        self.what, self.waited_s = what, waited_s


class CommTimeout(RuntimeError):
    """An operation of the ``mpi`` backend waited past its group's timeout. ``silent``: the world
    ranks that did not answer a liveness probe (stopped, hung or gone); ``states``: what the ranks
    that answered were doing."""

    def __init__(self, message: str, rank: int, what: str, silent: list[int],
                 states: dict[int, str]) -> None:
        super().__init__(message)
        self.rank, self.what, self.silent, self.states = rank, what, silent, states

    def __reduce__(self):  # keeps its fields through pickling (ipyparallel, futures)
        return (type(self), (str(self), self.rank, self.what, self.silent, self.states))


def wait_request(request: MPI.Request, timeout_s: float, what: str,
                 status: MPI.Status | None = None, spin_s: float = SPIN_S) -> None:
    """Wait for ``request`` without spinning past ``spin_s`` (longer only where every peer is
    known to be inside the operation: ``data_phase``); ``PeerTimeout`` after ``timeout_s``,
    or as soon as the heartbeat finds a rank silent. The request stays active after a timeout (the
    job is ending)."""
    if request.Test(status):
        return
    WATCHDOG.waiting()
    clock = time.perf_counter
    start = clock()
    spin_until = start + spin_s
    while clock() < spin_until:
        if request.Test(status):
            return
    deadline, last = start + timeout_s, start
    while True:
        now = clock()
        if now - last > PAUSED_S:  # this process did not run meanwhile
            deadline += now - last
        last = now
        if now >= deadline or WATCHDOG.silent:
            raise PeerTimeout(what, now - start)
        time.sleep(min(NAP_S, max(SPIN_S, (now - start) / 32), deadline - now))
        if request.Test(status):
            return


def gate(comm: MPI.Intracomm, timeout_s: float, what: str) -> None:
    """Return once every rank of ``comm`` has reached this point (``PeerTimeout`` after
    ``timeout_s``): a blocking collective after it cannot wait on a missing peer."""
    if comm.Get_size() > 1:
        wait_request(comm.Ibarrier(), timeout_s, what)
        WATCHDOG.committed()


class Watchdog:
    """One per process, from the default group's creation to its destruction: a thread that answers
    liveness probes, keeps the heartbeat with the next rank around the ring, and ends the job when a
    thread is stuck inside an operation (see the module docstring). ``start`` and ``close`` are
    explicit; ``start`` is collective over the world."""

    def __init__(self) -> None:
        self._comm: MPI.Intracomm | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._probe_lock = threading.Lock()
        # thread -> what it is doing: (operation, group, since, timeout, committed to a blocking call)
        self._busy: dict[int, tuple[str, str, float, float, bool]] = {}
        self._paused_s = 0.0  # how long this process did not run (``PAUSED_S``): ``_clock`` skips it
        self._pause: tuple[float, float] | None = None  # the last pause: (when it ended, seconds)
        self._timeout_s = TORCH_TIMEOUT_S  # until ``start`` gives the world's
        self._exit_hook = False
        # world rank -> how long it had been silent when the heartbeat gave up on it. Read by every
        # wait of the backend (``wait_request``): once it is not empty, they all give up.
        self.silent: dict[int, float] = {}
        self.hosts: list[str] = []  # each world rank's host name

    def name(self, ranks: Iterable[int]) -> str:
        """"rank 2 on node2", "ranks 1 on a, 3 on b": world ranks and where they run."""
        ranks = sorted(ranks)
        where = [f"{r} on {self.hosts[r]}" if r < len(self.hosts) else str(r) for r in ranks]
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(where)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank() if self._comm is not None else 0

    @property
    def size(self) -> int:
        return self._comm.Get_size() if self._comm is not None else 1

    def start(self, world: MPI.Intracomm, timeout_s: float) -> None:
        """Watch the ranks of ``world``; a rank silent for ``timeout_s`` ends the job."""
        if self._thread is not None:
            return
        self._comm = world.Dup()
        self.hosts = self._comm.allgather(socket.gethostname())  # to say where a silent rank runs
        self._timeout_s = timeout_s
        self.silent = {}
        native.set_silent(False)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="downpour-mpi-watchdog",
                                        daemon=True)
        self._thread.start()
        if not self._exit_hook:  # after mpi4py's own exit handler, so it runs before MPI_Finalize
            atexit.register(self.close)
            self._exit_hook = True

    def close(self) -> None:
        """Stop watching; collective over the world, like ``start``. The ranks stop together, once
        every heartbeat has its answer: a message left unreceived on the freed communicator would
        reach the next one MPI creates with the same context id (the next job of a cluster's
        engines) and break it. Ranks that never close (the job is failing) leave it after the
        timeout."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._comm is not None:
            if not MPI.Is_finalized():
                self._comm.Free()
            self._comm = None

    # -- what this process is doing (cheap: called around every operation) --------------------
    def _clock(self) -> float:
        """Seconds this process ran: how long its threads have been in an operation."""
        return time.monotonic() - self._paused_s

    def enter(self, what: str, timeout_s: float, group: str = "default group") -> None:
        self._busy[threading.get_ident()] = (what, group, self._clock(), timeout_s, False)

    def committed(self) -> None:
        """The calling thread is about to enter a blocking MPI call (its gate has passed)."""
        self._mark(True)

    def waiting(self) -> None:
        """The calling thread waits with a deadline of its own (``wait_request``)."""
        self._mark(False)

    def _mark(self, committed: bool) -> None:
        me = threading.get_ident()
        entry = self._busy.get(me)
        if entry is not None and entry[4] is not committed:
            self._busy[me] = entry[:4] + (committed,)

    def leave(self) -> None:
        self._busy.pop(threading.get_ident(), None)

    def state(self) -> str:
        """What this process is doing, as a probe's answer. A process that did not run for a while
        (stopped, then resumed: the launcher sends SIGCONT before it ends a job) says so first,
        since the timeout: a rank that probes it then must not take it for one that was there."""
        busy = set(self._busy)
        doing = [f"in {what} for {in_s:.0f} s" for what, _, in_s, _, _ in self._in_operations()]
        # the short paths' C steps are not in the table: besides their blocking calls
        # (``_in_operations``), their waits note themselves once they spin out (``native_common.c``'s
        # notes), on time.monotonic()'s clock
        doing += [f"in {what} for {time.monotonic() - since:.0f} s"
                  for thread, what, since in native.waiting() if thread not in busy]
        state = "; ".join(doing) or "alive, in no operation of the mpi backend"
        if self._pause is not None and time.monotonic() - self._pause[0] < self._timeout_s:
            state = f"{_STOPPED} {self._pause[1]:.0f} s, resumed; {state}"
        return state

    def _paused(self, now: float, gap: float) -> None:
        """The watchdog thread did not run for ``gap`` seconds, up to ``now``: the process did not."""
        self._paused_s += gap
        self._pause = (now, gap)

    # -- probing --------------------------------------------------------------------------------
    def probe(self, ranks: Iterable[int]) -> dict[int, str | None]:
        """Ask ``ranks`` (world ranks) what they are doing; None for a rank that did not answer
        within ``PROBE_S``."""
        ranks = [r for r in ranks if r != self.rank]
        comm = self._comm
        if comm is None or not ranks:
            return {}
        with self._probe_lock:
            buffers = {r: bytearray(_ANSWER_BYTES) for r in ranks}
            recvs = {r: comm.Irecv(buffers[r], r, _PONG) for r in ranks}
            sends = [comm.Isend(_PROBE, r, _PING) for r in ranks]
            deadline = time.monotonic() + PROBE_S
            pending = set(ranks)
            on_watch = threading.current_thread() is self._thread
            while pending and time.monotonic() < deadline:
                pending = {r for r in pending if not recvs[r].Test()}
                if pending:
                    time.sleep(0.01)
                    if on_watch:  # the others may be probing this rank meanwhile
                        self._answer()
            for r in pending:  # no answer: take the receive back (the job is ending anyway)
                recvs[r].Cancel()
                recvs[r].Free()
            for s in sends:
                s.Free()
        return {r: None if r in pending else _decode(buffers[r]) for r in ranks}

    # -- the thread -----------------------------------------------------------------------------
    def _answer(self) -> None:
        """Answer the probes and heartbeats that arrived (on the watchdog thread only)."""
        while self._pings.Test(self._status):
            asked = bytes(self._ping)
            answer = json.dumps(self.state()).encode()[:_ANSWER_BYTES]
            self._sent.append(self._comm.Isend(answer, self._status.Get_source(),
                                               _BEAT if asked == _HEARTBEAT else _PONG))
            self._pings = self._comm.Irecv(self._ping, MPI.ANY_SOURCE, _PING)

    def _loop(self) -> None:
        comm, me, n = self._comm, self.rank, self.size
        watched = (me + 1) % n if n > 1 else None  # the next rank around the ring
        self._ping, self._status, self._sent = bytearray(1), MPI.Status(), []
        self._pings = comm.Irecv(self._ping, MPI.ANY_SOURCE, _PING)
        notice, status = bytearray(_ANSWER_BYTES), MPI.Status()
        notices = comm.Irecv(notice, MPI.ANY_SOURCE, _SILENT)
        beat, beat_answer = None, bytearray(_ANSWER_BYTES)
        heard = next_beat = time.monotonic()
        closing, quiet = None, None  # when close began; the barrier of the ranks that are done
        silent_since = None  # when this rank learnt that a rank went silent
        last = heard
        try:
            while True:
                if closing is None:
                    self._stop.wait(POLL_S)
                else:
                    time.sleep(NAP_S)
                now = time.monotonic()  # before any answer: one woken from a stop says so
                if now - last > PAUSED_S:  # this process did not run: nobody else went silent
                    heard += now - last
                    self._paused(now, now - last)
                last = now
                self._answer()  # until the very end
                while notices.Test(status):  # another rank's watchdog found a rank silent
                    rank, silent_s = json.loads(bytes(notice[:status.Get_count(MPI.BYTE)]))
                    self._heard_silent(rank, silent_s)
                    notices = comm.Irecv(notice, MPI.ANY_SOURCE, _SILENT)
                if beat is not None and beat.Test():
                    heard, beat = now, None
                self._sent = [r for r in self._sent if not r.Test()]
                if self._stop.is_set():  # closing: no new heartbeat; the last one answered, and
                    closing = closing or now  # every rank there too, the ranks stop together
                    if beat is None and quiet is None:
                        quiet = comm.Ibarrier()
                    if (quiet is not None and quiet.Test() and not self._sent) \
                            or now - closing > self._timeout_s:
                        return
                    continue
                if watched is not None and beat is None and now >= next_beat:
                    beat = comm.Irecv(beat_answer, watched, _BEAT)
                    self._sent.append(comm.Isend(_HEARTBEAT, watched, _PING))
                    next_beat = now + BEAT_S
                if watched is not None and now - heard > self._timeout_s:
                    self._found_silent(watched, now - heard)
                    watched = None
                if self.silent:
                    silent_since = silent_since or now
                    if now - silent_since >= GRACE_S:
                        self._check_committed()
                self._check_stuck()
        finally:
            for request in (self._pings, notices, beat):
                if request is not None:
                    request.Cancel()
                    request.Wait()
            for r in self._sent:
                r.Free()

    def _found_silent(self, rank: int, silent_s: float) -> None:
        """``rank`` missed its heartbeats for the whole timeout: tell every rank (this one too),
        so that every wait gives up and names it."""
        self._heard_silent(rank, silent_s)
        message = json.dumps([rank, round(silent_s, 1)]).encode()
        self._sent.extend(self._comm.Isend(message, r, _SILENT)
                          for r in range(self.size) if r not in (self.rank, rank))

    def _heard_silent(self, rank: int, silent_s: float) -> None:
        """``rank`` went silent: every wait gives up, the C ones too (``native``)."""
        self.silent.setdefault(rank, silent_s)
        native.set_silent(True)

    def _in_operations(self) -> list[tuple[str, str, float, float, bool]]:
        """(what, group, seconds in it, timeout, committed to a blocking call) of each thread in an
        operation: the table's (``enter``), and the C data phase's blocking calls made outside it
        (the short paths: ``native.committed``)."""
        now, busy = self._clock(), dict(self._busy)
        in_c = {thread: entry for thread, *entry in native.committed()}
        doing = [(what, group, now - since, timeout_s, committed or thread in in_c)
                 for thread, (what, group, since, timeout_s, committed) in busy.items()]
        clock = time.monotonic()
        return doing + [(what, group, clock - since, timeout_s, True)
                        for thread, (what, group, since, timeout_s) in in_c.items()
                        if thread not in busy]

    def _check_committed(self) -> None:
        """A rank is silent: a thread inside a blocking MPI call will never come back from it."""
        for what, group, in_s, _, committed in self._in_operations():
            if committed:
                longest = max(self.silent.values())
                self._abort(f"mpi backend: rank {self.rank} of {self.size} waited "
                            f"{in_s:.0f} s in {what} ({group}): {self.name(self.silent)} "
                            f"went silent (no answer to its heartbeat for {longest:.0f} s: stopped, "
                            "hung or gone); ending the job")

    def _check_stuck(self) -> None:
        for what, group, in_s, timeout_s, _ in self._in_operations():
            if in_s > timeout_s + BACKSTOP_S:
                silent = sorted(r for r, a in self.probe(range(self.size)).items() if a is None)
                who = (f"{self.name(silent)} went silent (no answer to a liveness probe "
                       f"within {PROBE_S:.0f} s: stopped, hung or gone)" if silent
                       else "every rank answered a liveness probe")
                self._abort(f"mpi backend: rank {self.rank} of {self.size} waited "
                            f"{in_s:.0f} s in {what} ({group}): {who}; stuck inside MPI "
                            f"past the timeout of {timeout_s:.0f} s; ending the job")

    def _abort(self, message: str) -> None:
        """End the job from the watchdog thread: the stuck thread cannot raise."""
        job_end.report(self.rank, self.size, message)
        job_end.end_job(1, self._comm)


def _stopped_s(answer: str) -> float:
    """How long the rank that gave a probe ``answer`` says it was stopped (0: it was not)."""
    if not answer.startswith(_STOPPED):
        return 0.0
    try:
        return float(answer[len(_STOPPED):].split(" s,", 1)[0])
    except ValueError:
        return 0.0


def _decode(buffer: bytearray) -> str:
    try:
        return json.loads(bytes(buffer).rstrip(b"\0").decode())
    except ValueError:
        return "alive"


def explain(timeout: PeerTimeout, group: str) -> CommTimeout:
    """The ``CommTimeout`` for ``timeout``: the ranks the heartbeat found silent, else those that do
    not answer a liveness probe. The heartbeat's verdict reaches every rank (and is what a watchdog
    that ends a committed thread names), so when there is one it is the answer: a probe of its own
    could name another rank, or none, and the ranks would disagree about the culprit."""
    me, n = WATCHDOG.rank, WATCHDOG.size
    where = f"{timeout.what} ({group})"
    heartbeat = dict(WATCHDOG.silent)
    answers = {} if heartbeat else WATCHDOG.probe(range(n))
    silent = sorted(heartbeat) or sorted(r for r, a in answers.items() if a is None)
    states = {r: a for r, a in sorted(answers.items()) if a is not None}
    # A rank stopped for much of the wait may answer all the same: the launcher resumes it (SIGCONT)
    # to end the job another rank's heartbeat ended, as this probe goes out. It is the silent one.
    stopped = {r: s for r, a in states.items() if (s := _stopped_s(a)) >= timeout.waited_s / 2}
    if heartbeat:
        message = (f"mpi backend: rank {me} of {n} waited {timeout.waited_s:.0f} s in {where}: "
                   f"{WATCHDOG.name(silent)} went silent (no answer to its heartbeat for "
                   f"{max(heartbeat.values()):.0f} s: stopped, hung or gone); ending the job")
    elif stopped and not silent:
        silent = sorted(stopped)
        message = (f"mpi backend: rank {me} of {n} waited {timeout.waited_s:.0f} s in {where}: "
                   f"{WATCHDOG.name(silent)} went silent (stopped for {max(stopped.values()):.0f} s, "
                   "it answered a liveness probe once resumed); ending the job")
    elif silent:
        message = (f"mpi backend: rank {me} of {n} waited {timeout.waited_s:.0f} s in {where}: "
                   f"{WATCHDOG.name(silent)} went silent (no answer to a liveness probe within "
                   f"{PROBE_S:.0f} s: stopped, hung or gone); ending the job")
    else:
        doing = "; ".join(f"rank {r} {a}" for r, a in states.items())
        message = (f"mpi backend: rank {me} of {n} waited {timeout.waited_s:.0f} s in {where}, "
                   f"but every rank is alive ({doing}): the ranks issued different operations, "
                   "or one is slower than the timeout allows (raise --timeout-s)")
    return CommTimeout(message, me, where, silent, states)


WATCHDOG = Watchdog()
native.raise_on_timeout(PeerTimeout)  # the C data phase's waits give up as wait_request does
