"""The performance model against the emulated sweep: measured communication at many workers.

An emulated run's compute is a sleep of known length, so what grows with the workers is
communication (and what the machine does for it: copies, reductions, the scheduler). Each
emulated series is set beside the model with the same compute (its own 1-worker step, which
holds the sleep, the data and the update) and this machine's measured link (the calibration's
``intra`` link, every rank on this one node), or for a sandbox series (``where``: ``sandbox
1gbit``) that link inside each host of 4 ranks and the shaped rate between hosts. Past the
calibration's ``network.cores`` the ranks time-share them: the step's CPU work (all of its 1-worker
step but the sleep and the messages) and every rank's copies and hops (``Network.shared``,
``wake_s``) take ``crowding`` times as long. Where they differ, the model leaves out what the
machine adds.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ..perf.calibration import Calibration
from ..perf.perfmodel import predict
from .core import with_series

#: The tolerance the issue sets at 32 workers.
TOLERANCE = 0.15


def emulated_vs_model(runs: pd.DataFrame, cal: Calibration) -> pd.DataFrame:
    """One row per emulated series and worker count: measured and predicted step (s) and the
    relative error (predicted / measured - 1; negative: the model is optimistic), with the
    measured step's parts. Empty when ``runs`` holds no emulated row; a series whose model the
    calibration has no size for, or that lacks its 1-worker point, is left out."""
    runs = with_series(runs)
    emulated = runs[runs["compute"] == "emulated"]
    rows = []
    for series, part in emulated.groupby("series"):
        model = part.model.iloc[0]
        base = part[part.num_workers == 1]
        if base.empty or model not in cal.workloads:
            continue
        # the sleep, the data and the update: not the messages (a server's, at one worker), which
        # the model adds itself
        compute = float((base.step_s - base.comm_s - base.wait_s).mean())
        # past the calibration's cores, the step's CPU work (all but the sleep) time-shares them
        sleep = _sleep_s(base)
        network = _network(cal, part)
        for n, point in part.groupby("num_workers"):
            busy = network.time_shared_s(compute - sleep, int(point.world_size.max()))
            workload = replace(cal.workload(model), compute_s=sleep + busy,
                               batch_size=int(part.batch_size.iloc[0]),
                               source=f"{series}: its 1-worker step")
            here = replace(cal, network=network, workloads={model: workload})
            p = predict(here, part.algorithm.iloc[0], int(n), model)
            measured = float(point.step_s.mean())
            rows.append({"series": series, "algorithm": part.algorithm.iloc[0], "workers": int(n),
                         "measured_step_s": measured, "predicted_step_s": p.step_s,
                         "error": p.step_s / measured - 1,
                         "within": abs(p.step_s / measured - 1) <= TOLERANCE,
                         "comm_s": float(point.comm_s.mean()), "wait_s": float(point.wait_s.mean()),
                         "compute_s": float(point.compute_s.mean()),
                         "update_s": float(point.update_s.mean()), "runs": len(point)})
    return pd.DataFrame(rows)


def _sleep_s(base: pd.DataFrame) -> float:
    """The emulated compute's sleep in a 1-worker step: the given seconds, or where they were
    timed (auto), its forward and backward (``compute_s``), which the sleep replaced."""
    given = base["emulated_step_s"] if "emulated_step_s" in base else pd.Series(dtype=float)
    sleep = float(given.mean()) if given.notna().any() else float(base["compute_s"].mean())
    return min(sleep, float((base.step_s - base.comm_s - base.wait_s).mean()))


def _network(cal: Calibration, part: pd.DataFrame):
    """The links a series ran on: this node's (every rank on it), or the sandbox's, 4 ranks a
    host (``emulated_sandbox``) behind each host's link shaped to the series' rate."""
    where = part["where"].iloc[0] if "where" in part else "local"
    if pd.isna(where) or where == "local":
        return replace(cal.network, per_node=max(int(part.world_size.max()), 1))
    from ..perf.netmodel import Link
    from ..sandbox.netns import parse_rate
    from .emulated_sandbox import RANKS_PER_NODE

    inter = Link(cal.network.inter.alpha_s, parse_rate(where.split()[-1]) / 8)
    return replace(cal.network, inter=inter, per_node=RANKS_PER_NODE)
