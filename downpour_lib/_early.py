"""The first thing ``import downpour_lib`` runs: ``downpour train`` as a rank holds its preemption
signal from the first moment. A signal that arrives while it still imports torch (seconds) would
kill it (the default action) before ``Trainer`` installs its handler (``preempt.StopSignal``); held
here, it stops the run before its first step instead. Nothing happens in any other program that
imports the library. Imports nothing of the library (it runs before the rest of it)."""

import os
import signal
import sys

EARLY_SIGNALS: list[int] = []  # preemption signals held before the run's handler was installed
HELD: list[int] = []  # the signal held (none: this is not `downpour train`)


def _hold() -> None:
    argv = sys.argv
    if os.path.basename(argv[0]) != "downpour" or argv[1:2] != ["train"]:
        return
    name = "USR2"
    for i, arg in enumerate(argv):
        if arg == "--preempt-signal" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--preempt-signal="):
            name = arg.split("=", 1)[1]
    if name in ("USR2", "USR1", "TERM", "INT", "HUP"):
        HELD.append(getattr(signal, f"SIG{name}"))
        signal.signal(HELD[0], lambda signum, frame: EARLY_SIGNALS.append(signum))
    from . import _startup

    _startup.start()  # the start-up's deadline: forked now, while this process is one thread


_hold()
