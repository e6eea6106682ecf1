"""Threads told to stop that have not ended yet: joined once more at exit.

A daemon thread still inside a torch call when the interpreter finalizes takes the process down
with it: when the call returns, the thread may no longer take the GIL, and it is unwound through
pybind11's ``noexcept`` code, so the C++ runtime calls ``std::terminate`` ("terminate called without
an active exception", exit 134 after a run that had finished). Seen under a loaded make test: a
rank's heartbeat was connecting to the store of a rank that had already exited, and outlasted its
``close``. So a thread its owner stopped but could not wait for is joined again at exit, before the
interpreter finalizes, for as long as its blocking call can take.
"""

from __future__ import annotations

import atexit
import threading

_LEFT: list[tuple[threading.Thread, float]] = []
_registered = False


def join_or_leave(thread: threading.Thread, timeout_s: float, at_exit_s: float) -> bool:
    """Join ``thread`` for up to ``timeout_s``; if it is still running (it was told to stop and
    is inside a call with a timeout of its own), join it again at exit for up to ``at_exit_s``.
    Whether it has ended."""
    global _registered
    thread.join(timeout_s)
    if not thread.is_alive():
        return True
    if not _registered:
        atexit.register(_join_left)  # after torch's own handlers, so it runs before them
        _registered = True
    _LEFT[:] = [(t, s) for t, s in _LEFT if t.is_alive()]  # those that ended since: nothing to join
    _LEFT.append((thread, at_exit_s))
    return False


def _join_left() -> None:
    for thread, at_exit_s in _LEFT:
        thread.join(at_exit_s)
