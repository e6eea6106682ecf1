"""downpour: distributed data-parallel training algorithms on torch.distributed, compared fairly.

For example::

    from downpour_lib import TrainConfig, runtime, train
    with runtime.session() as ctx:
        result = train(TrainConfig(algorithm="sync_ps", model="lenet", dataset="digits"), ctx)

Importing the package runs nothing and imports nothing heavy: these names load on first use, so
the ``downpour`` entry point (``console``) can hold its signal before torch is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .comm import runtime
    from .config import TrainConfig
    from .engine import Trainer, make_trainer, train
    from .planning import plan_run
    from .records import RunResult

__all__ = ["RunResult", "TrainConfig", "Trainer", "make_trainer", "plan_run", "runtime", "train"]
__version__ = "0.1.0"

_WHERE = {"runtime": ".comm.runtime", "TrainConfig": ".config", "Trainer": ".engine",
          "make_trainer": ".engine", "plan_run": ".planning", "train": ".engine",
          "RunResult": ".records"}


def __getattr__(name: str):
    if name not in _WHERE:  # a submodule (`from downpour_lib import trace`) is imported as usual
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_WHERE[name], __name__)
    value = module if name == "runtime" else getattr(module, name)
    globals()[name] = value
    return value
