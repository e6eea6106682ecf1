"""The checks a multi-rank script makes: each counted, each failure kept with its rank, so that the
script can agree on the outcome over MPI and report every failing case, not just the first."""

import torch.distributed as dist


class Checker:
    def __init__(self):
        self.cases, self.failures = 0, []

    def check(self, name, ok, detail=""):
        self.cases += 1
        if not ok:
            self.failures.append(f"rank {dist.get_rank()}: {name} {detail}")
