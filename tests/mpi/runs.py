"""Under mpiexec -n N: several trainings one after another in one session, so that a test of several
configurations starts its ranks (and imports torch) once, not once per configuration.

argv: the backend (``auto``: what ``downpour train`` would pick, ``mpi`` under mpiexec), then a
JSON object {case: a TrainConfig dict}. Rank 0 prints one JSON line per run: ``case`` and the run's
summary, as ``downpour train --summary-json`` writes it. Exits non-zero on an exception (which
ends the job, naming the rank). Read through ``one_session`` in tests/conftest.py.
"""

import json
import sys

from downpour_lib import TrainConfig, Trainer, runtime


def main() -> int:
    backend, runs = sys.argv[1], json.loads(sys.argv[2])
    with runtime.abort_on_error(), runtime.session(backend=backend, timeout_s=120) as ctx:
        for case, config in runs.items():
            result = Trainer(TrainConfig.from_dict(config), ctx).run()
            if ctx.rank == 0:
                print(json.dumps({"case": case, **result.summary}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
