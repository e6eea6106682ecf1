"""Profiler events of the ``mpi`` backend: the ones torch's native backends record.

torch's C++ backends give every operation's ``Work`` a profiling title and its input tensors
(``ProcessGroupMPI`` enqueues ``"mpi:all_reduce"`` with ``tensors``; ``send`` is ``"mpi:send"``,
a receive from any rank ``"mpi:recvAnySource"``). While a profiler runs, that is one event per
operation, named ``<backend>:<op>``, with the inputs' shapes and dtypes (``record_shapes=True``),
and *async*: it begins on the calling thread when the operation is issued and ends where the work
completes (native MPI's worker thread; for point-to-point, the thread that waits), so a trace draws
it apart from the caller's stack. torch's own tests read exactly that (``call_dist_op`` and the
send/recv tests in ``distributed_test.py``: the name, one event per call, ``is_async``,
``input_shapes``). Operations native MPI lacks take torch's op names (``mpi:reduce_scatter_tensor``,
``mpi:all_reduce_coalesced``...).

Here an event begins with its inputs on the calling thread (``begin``) and ends through a future
whose callbacks run with the caller's profiler state (how torch's ``record_function`` ends on a
future). An asynchronous collective's event ends on the executor's thread as its work completes
(``end_with``, attached before the work is queued). A synchronous collective runs on the calling
thread, and a point-to-point operation completes on the thread that waits; their events end on a
small thread of this module (``end_elsewhere``), because the profiler marks an event async when it
ends on another thread than it began (native backends set the flag from C++, which Python cannot).
Profiling changes nothing about where or how operations run; the caller waits for the hand-over
(tens of microseconds), so every event has ended when the operation returns.

When no profiler is active, ``active()`` (one C call, about 30 ns) is all an operation pays.
"""

from __future__ import annotations

import queue
import threading

import torch
from torch.futures import Future

#: is a profiler recording on this thread? (checked before anything else is done for it)
active = torch.autograd._profiler_enabled

_enter = torch._C._autograd._record_function_with_args_enter


def begin(title: str, inputs) -> object:
    """An event named ``title`` begins on this thread, with ``inputs`` (tensors) as its inputs."""
    return _enter(title, *inputs)


def end_with(event: object, future: Future) -> None:
    """``event`` ends when ``future`` completes (or fails), on the thread that completes it."""
    torch.ops.profiler._call_end_callbacks_on_jit_fut(event, future)


def end_elsewhere(event: object) -> None:
    """``event`` ends now, on this module's thread (so the profiler sees an async event)."""
    future: Future = Future()
    end_with(event, future)
    _ENDER.complete(future)


class _Ender:
    """A thread that completes the futures it is handed, one at a time; the caller waits."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def complete(self, future: Future) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="downpour-mpi-profiler",
                                                    daemon=True)
                    self._thread.start()
        done = threading.Event()
        self._queue.put((future, done))
        done.wait()

    def _loop(self) -> None:
        while True:
            future, done = self._queue.get()
            try:
                future.set_result(None)
            finally:
                done.set()


_ENDER = _Ender()
