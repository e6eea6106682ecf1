"""Work handles for the ``mpi`` backend, and the one thread that runs its asynchronous collectives.

torch's ``Work`` contract: ``wait()`` blocks until the operation is done (and raises its error);
``get_future()`` returns a ``torch.futures.Future`` that completes with the operation's tensors.
DDP's reducer relies on the future alone (it never calls ``wait`` on a bucket's work), so an
asynchronous operation must complete without anyone polling it. Open MPI's nonblocking collectives
(libnbc) are also many times slower than its blocking ones on shared memory (measured here: a 4 MB
Iallreduce+Wait 11 ms, Allreduce 0.7 ms). Hence:

* a synchronous collective (``async_op=False``) runs at once on the calling thread, after any
  asynchronous ones still queued (so every rank issues collectives in program order); its ``Work`` is
  already complete;
* an asynchronous collective is queued to ``Executor``, one thread per process that runs blocking MPI
  collectives in issue order (mpi4py releases the GIL inside MPI, so computation overlaps) and then
  completes the work's future. This needs ``MPI_THREAD_MULTIPLE``, mpi4py's default; with a lower
  thread level every operation runs synchronously;
* a future's callbacks run on the thread that completes it, often the executor's: a collective a
  callback issues runs there at once (torch's PowerSGD hooks issue one and wait for it inside the
  callback), and a work a callback waits for runs there once what is queued ahead of it has run
  (``Executor.run_through``); the issue order stays the one every rank shares;
* point-to-point operations are MPI nonblocking requests (``Isend``/``Irecv``), posted at once so that
  exchanges cannot deadlock; ``wait()`` polls the request, napping (``liveness.wait_request``),
  and ``get_future()`` waits first.

Timeouts: every wait honours the group's timeout. A queued operation enters its blocking MPI calls
only after the gate (``liveness``), which raises ``CommTimeout`` naming the rank that went
silent; waiting for a queued operation allows that diagnosis its time before it gives up itself.
A rank that raises aborts the job (``backend`` installs that hook).
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI
from torch.futures import Future

from . import profiling
from .liveness import BACKSTOP_S, WATCHDOG, CommTimeout, PeerTimeout, wait_request


def _seconds(timeout: timedelta | None, default: float) -> float:
    """torch passes timedelta(0) (C++ kNoTimeout) when the caller gave none: use the group's."""
    seconds = timeout.total_seconds() if timeout is not None else 0.0
    return seconds if seconds > 0 else default


class DoneWork(dist._Work):
    """An operation that already completed on the calling thread; made by ``done``."""

    __slots__ = ("_result",)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list:
        return self._result

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._result)
        return future


def done(result: list) -> DoneWork:
    """The work of an operation that completed on the calling thread, with its ``result``. Every
    synchronous collective returns one, so it is made without a Python ``__init__`` (torch's own
    constructs it): 0.32 us, where one that called ``super().__init__()`` took 0.52."""
    work = DoneWork()
    work._result = result
    return work


class QueuedWork(dist._Work):
    """A collective queued to the ``Executor``; completed (or failed) by its thread.
    ``event``: its profiler event (``profiling.begin``), ended on that thread as the work completes."""

    def __init__(self, name: str, result: list, timeout_s: float, owner: Executor,
                 event: object = None) -> None:
        super().__init__()
        self.name, self._result, self._timeout_s, self._owner = name, result, timeout_s, owner
        self._done = threading.Event()
        self._ran = False  # its operation ran (its futures may still be completing)
        self._error: BaseException | None = None
        self._future: Future = Future()
        # The event ends through a future of its own, attached here (on the issuing thread, whose
        # profiler state the end needs), and completed before the work's: ending it through the
        # work's future, which torch and DDP also hold and chain on, corrupted memory now and then
        # (about 1 run in 3 of tests/mpi/profiled.py, in the garbage collector after a profiled
        # asynchronous collective); with a future of its own, none in 8 runs of 100 rounds.
        self._event_end: Future | None = None
        if event is not None:
            self._event_end = Future()
            profiling.end_with(event, self._event_end)

    def _finish(self, error: BaseException | None) -> None:
        self._error, self._ran = error, True  # on the executor's thread, the work is done now
        if self._event_end is not None:  # the event has ended before anyone sees the work complete
            self._event_end.set_result(None)
        # The future first: whoever sees ``_done`` may rely on the future being complete too.
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)
        self._done.set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        # The queued operation's own deadline comes first, and names the silent rank; this one is
        # for an executor that never got to it (when no caller passed a shorter timeout).
        seconds = _seconds(timeout, self._timeout_s + BACKSTOP_S)
        if self._owner.on_thread():  # a future's callback: nobody else would run the work
            if not self._ran:
                self._owner.run_through(self)
            if not self._ran:
                raise RuntimeError(f"mpi backend: {self.name} waited for inside a callback, but "
                                   "the backend is closing and will not run it")
        elif not self._done.wait(seconds):
            raise RuntimeError(f"mpi backend: {self.name} did not complete within {seconds:.0f} s "
                               "(a peer is stuck or gone); abort the job")
        if self._error is not None:
            if self._error is self._owner._error:
                self._owner._error_seen = True
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def get_future(self) -> Future:
        return self._future


class RequestWork(dist._Work):
    """A point-to-point operation: an MPI request, and what to do once it completes. ``wait`` naps
    until it completes, and past ``timeout_s`` raises what ``explain`` makes of the timeout.
    ``event``: its profiler event (``profiling.begin``), which ends when it completes."""

    def __init__(self, request: MPI.Request, result: list, timeout_s: float, what: str,
                 explain: Callable[[PeerTimeout], CommTimeout],
                 finish: Callable[[], None] | None = None, keep: object = None,
                 group: str = "default group", event: object = None) -> None:
        super().__init__()
        self._group, self._event = group, event
        self._request, self._result, self._finish = request, result, finish
        self._timeout_s, self._what, self._explain = timeout_s, what, explain
        self._keep = keep  # a staged send buffer must outlive the request
        self._source = -1
        self._completed = False

    def _complete(self, status: MPI.Status) -> None:
        self._source = status.Get_source()
        self._completed, self._keep = True, None
        try:
            if self._finish is not None:
                self._finish()
        finally:
            self._end_event()

    def _end_event(self) -> None:
        if self._event is not None:
            event, self._event = self._event, None
            profiling.end_elsewhere(event)

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._completed:
            status = MPI.Status()
            WATCHDOG.enter(self._what, self._timeout_s, self._group)
            try:
                wait_request(self._request, _seconds(timeout, self._timeout_s), self._what, status)
            except PeerTimeout as exc:
                self._end_event()
                raise self._explain(exc) from None
            finally:
                WATCHDOG.leave()
            self._complete(status)
        return True

    def is_completed(self) -> bool:
        if not self._completed:
            status = MPI.Status()
            if self._request.Test(status):
                self._complete(status)
        return self._completed

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> list:
        self.wait()
        return self._result

    def get_future(self) -> Future:
        self.wait()
        future: Future = Future()
        future.set_result(self._result)
        return future

    def _source_rank(self) -> int:
        """The group rank a receive got its message from (``dist.recv`` with no source)."""
        self.wait()
        return self._source

    source_rank = _source_rank


class Executor:
    """The one thread per process that runs queued MPI collectives, in the order they were issued.

    ``start()`` and ``close()`` are explicit; every process group of the backend shares the executor
    (one issue order per process, whatever the group). An error in a queued operation completes its
    work with that error, and the next operation issued raises it too: after a failed collective the
    ranks may be out of step, so nothing further may run as if all were well.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # held while issuing: one total order per process
        self._thread: threading.Thread | None = None
        self._last: QueuedWork | None = None
        self._error: BaseException | None = None
        self._error_seen = False
        self._users = 0
        self._exit_hook = False
        self._stopping = False  # run_through took close()'s stop from the queue

    @property
    def running(self) -> bool:
        return self._thread is not None

    def acquire(self) -> None:
        """A process group starts using the executor; the first one starts the thread."""
        self._users += 1
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self.start()

    def release(self) -> None:
        """A process group is shut down; the last one closes the executor."""
        self._users = max(0, self._users - 1)
        if self._users == 0:
            self.close()

    def start(self) -> None:
        if self._thread is None:
            # A daemon thread: a job torn down by MPI_Abort must not wait for it at exit.
            self._thread = threading.Thread(target=self._loop, name="downpour-mpi", daemon=True)
            self._thread.start()
            if not self._exit_hook:
                # Registered after mpi4py's own exit handler, so it runs first: queued operations
                # finish before MPI_Finalize, even if the program never destroyed its groups.
                atexit.register(self._at_exit)
                self._exit_hook = True

    def _at_exit(self) -> None:
        try:
            self.close()
        except RuntimeError as exc:  # too late to raise to anyone: say it
            sys.stderr.write(f"{exc}: {exc.__cause__!r}\n")

    def close(self) -> None:
        """Finish what is queued, stop the thread, and raise a queued error nobody has seen."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
            self._last = None
        if self._error is not None and not self._error_seen:
            self._error_seen = True
            raise RuntimeError("mpi backend: an asynchronous operation failed and was never "
                               "waited for") from self._error

    def on_thread(self) -> bool:
        """Is the caller the executor's thread (a callback of a future it completes)?"""
        return self._thread is not None and threading.current_thread() is self._thread

    def idle(self) -> bool:
        """Nothing queued since a synchronous operation last drained the queue, no failure unseen,
        and the caller is not the executor's thread: a synchronous operation may run at once,
        without ``run_now`` and its lock (0.6 of a 4 KB broadcast's 5 us, called directly, on one
        rank). Two threads issuing collectives at once give the ranks no order to share anyway."""
        thread = self._thread
        return self._last is None and self._error is None and (
            thread is None or thread.ident != threading.get_ident())

    def run_now(self, fn: Callable[..., None], timeout_s: float, *args) -> None:
        """Run ``fn(*args)`` on this thread once every queued operation is done."""
        if self._thread is not None and threading.current_thread() is self._thread:
            self._run_nested(fn, *args)
            return
        with self._lock:
            last = self._last
            if last is not None:
                if not last._done.is_set():
                    self._drain(timeout_s)
                self._last = None  # done: the next call need not look at it
            if self._error is not None:
                self._check()
            fn(*args)

    def submit(self, name: str, fn: Callable[[], None], result: list, timeout_s: float,
               event: object = None) -> dist._Work:
        """Queue ``fn`` (or run it now when there is no thread); returns its work handle.
        ``event``: a profiler event (``profiling.begin``) that ends when the work completes."""
        if self._thread is None or self.on_thread():
            try:
                self.run_now(fn, timeout_s)
            finally:
                if event is not None:
                    profiling.end_elsewhere(event)
            return done(result)
        with self._lock:
            try:
                self._check()
            except BaseException:
                if event is not None:
                    profiling.end_elsewhere(event)
                raise
            work = QueuedWork(name, result, timeout_s, self, event)
            self._last = work
            self._queue.put((fn, work))
        return work

    def drain(self, timeout_s: float) -> None:
        with self._lock:
            self._drain(timeout_s)

    def _drain(self, timeout_s: float) -> None:
        """Wait for the last queued operation (so for all of them), then raise any queued error."""
        last = self._last
        if last is not None and not last._done.wait(timeout_s + BACKSTOP_S):
            raise RuntimeError(f"mpi backend: {last.name} did not complete within {timeout_s:.0f} s "
                               "(a peer is stuck or gone); abort the job")
        self._check()

    def check(self) -> None:
        """Raise the error of a failed queued operation, if any (before issuing anything new)."""
        if self._error is not None:
            self._check()

    def _check(self) -> None:
        if self._error is not None:
            self._error_seen = True
            raise RuntimeError("mpi backend: an earlier asynchronous operation failed; the ranks "
                               "may be out of step") from self._error

    def _run_nested(self, fn: Callable[..., None], *args) -> None:
        """Run ``fn``, issued by a future's callback on this thread, at once.

        torch's PowerSGD hooks (and any code chaining collectives through futures) issue a
        collective inside a callback and wait for it there; the executor's thread is the one running
        the callback, so queued, the collective would wait for its own waiter. Run here, it takes
        the place every rank gives it: right after the operation whose future the callback follows,
        before anything queued behind that one. Where the future had completed before the callback
        was attached, the callback runs on the issuing thread instead: at the same place, when it
        was attached right after its operation was issued (as torch's hooks attach theirs; one
        attached after other operations were issued races its future's completion, on any backend).
        Nothing runs concurrently with queued work, so the one issue order holds."""
        try:
            fn(*args)
        except BaseException as exc:  # the callback gets it; the next issuer, too (out of step)
            if self._error is None:
                self._error = exc
            raise

    def run_through(self, work: QueuedWork) -> None:
        """Run queued operations on this (the executor's) thread, in order, until ``work`` is done:
        a callback waits for a work queued behind the one whose future it follows."""
        while not work._ran:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return  # not queued here: the caller raises
            if item is None:  # close() asked to stop: stop once the callback returns
                self._stopping = True
                return
            self._run(*item)

    def _run(self, fn: Callable[[], None], work: QueuedWork) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 -- delivered to the work and the next issuer
            if self._error is None:
                self._error = exc
            work._finish(exc)
        else:
            work._finish(None)

    def _loop(self) -> None:
        while not self._stopping and (item := self._queue.get()) is not None:
            self._run(*item)
        self._stopping = False


EXECUTOR = Executor()
