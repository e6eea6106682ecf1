"""downpour: distributed data-parallel training algorithms on torch.distributed, compared fairly.

    from downpour_lib import TrainConfig, runtime, Trainer
    with runtime.session() as ctx:
        result = Trainer(TrainConfig(algorithm="sync_ps", model="lenet", dataset="digits"), ctx).run()
"""

from . import _early  # noqa: F401 -- first: `downpour train` holds its preemption signal
from .comm import runtime
from .config import TrainConfig
from .engine import Trainer, plan_run, train
from .records import RunResult

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
