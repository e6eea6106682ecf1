"""downpour: distributed data-parallel training algorithms on torch.distributed, compared fairly.

    from downpour_lib import TrainConfig, runtime, Trainer
    with runtime.session() as ctx:
        result = Trainer(TrainConfig(algorithm="sync_ps", model="lenet", dataset="digits"), ctx).run()
"""



def _hold_early_preemption() -> None:
    """``downpour train`` as a rank: a preemption signal that arrives while it still imports torch
    (seconds) would kill it (the default action) before ``Trainer`` installs its handler; held
    here from the first moment, it stops the run before its first step instead. Nothing happens
    for any other program that imports the library."""
    import os
    import signal
    import sys

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


EARLY_SIGNALS: list[int] = []  # preemption signals held before the run's handler was installed
HELD: list[int] = []  # the signal held (none: this is not `downpour train`)
_hold_early_preemption()

from .comm import runtime  # noqa: E402 -- after the signal is held
from .config import TrainConfig  # noqa: E402
from .engine import Trainer, plan_run, train  # noqa: E402
from .records import RunResult  # noqa: E402

__all__ = ["RunResult", "TrainConfig", "Trainer", "plan_run", "runtime", "train"]
__version__ = "0.1.0"


def _in_a_notebook() -> None:
    """Imported in IPython (a notebook, a console): bad input fails a cell with one line."""
    import sys

    ipython = sys.modules.get("IPython")  # never imported here: a rank or a script pays nothing
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        from .notebooks import one_line_errors

        one_line_errors(shell)


_in_a_notebook()
