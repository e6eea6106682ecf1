"""The early signal hold of ``downpour train``, done by the console entry point (``console.main``)
before anything heavy is imported: a rank holds its preemption signal from the first moment. A
signal that arrives while it still imports torch (seconds) would kill it (the default action)
before ``Trainer`` installs its handler (``preempt.StopSignal``); held here, it stops the run
before its first step instead. Importing this module does nothing; only ``hold`` acts. Imports
nothing of the library but ``_startup`` (it runs before the rest of it)."""

import signal

EARLY_SIGNALS: list[int] = []  # preemption signals held before the run's handler was installed
HELD: list[int] = []  # the signal held (none: this is not `downpour train`)


def hold(args: list[str]) -> None:
    """``args``: the command line after the program's name. For ``train``, hold its preemption
    signal (``--preempt-signal``, USR2 by default) and fork the start-up's sentinel, now, while
    this process is one thread (``_startup``). Any other command: nothing."""
    if args[:1] != ["train"]:
        return
    name = "USR2"
    for i, arg in enumerate(args):
        if arg == "--preempt-signal" and i + 1 < len(args):
            name = args[i + 1]
        elif arg.startswith("--preempt-signal="):
            name = arg.split("=", 1)[1]
    if name in ("USR2", "USR1", "TERM", "INT", "HUP") and not HELD:
        HELD.append(getattr(signal, f"SIG{name}"))
        signal.signal(HELD[0], lambda signum, frame: EARLY_SIGNALS.append(signum))
    from . import _startup

    _startup.start()  # the start-up's deadline: forked now, while this process is one thread
