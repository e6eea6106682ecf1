"""downpour: distributed data-parallel training algorithms on torch.distributed, compared fairly.

    from downpour_lib import TrainConfig, runtime, Trainer
    with runtime.session() as ctx:
        result = Trainer(TrainConfig(algorithm="sync_ps", model="lenet", dataset="digits"), ctx).run()
"""

from .comm import runtime
from .config import TrainConfig
from .engine import Trainer, plan_run, train
from .records import RunResult

__all__ = ["RunResult", "TrainConfig", "Trainer", "plan_run", "runtime", "train"]
__version__ = "0.1.0"
