"""``downpour train --trace DIR``: the timeline's spans are the step records' own times, every bucket's
allreduce is there (and starts inside backward), servers show their updates."""

import pandas as pd
import pytest
from conftest import BIN, explain, mpiexec

from downpour_lib import trace

RUNS = {  # name: (ranks, flags)
    "allreduce": (2, ["--algorithm=allreduce", "--model=lenet", "--bucket-cap-mb=0.01"]),
    "downpour": (3, ["--algorithm=downpour", "--servers=1", "--model=mlp"]),
}


@pytest.mark.parametrize("name", RUNS)
def test_the_trace_agrees_with_the_step_records(tmp_path, name):
    ranks, flags = RUNS[name]
    proc = mpiexec(ranks, str(BIN / "downpour"), "train", *flags, "--dataset=digits", "--steps=30",
                   "--threads=1", "--output-dir", str(tmp_path), "--trace", str(tmp_path / "tr"))
    assert proc.returncode == 0, explain(proc)
    events = pd.DataFrame(trace.load(tmp_path / "tr" / "trace.json"))
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert (events["ts"] >= 0).all()  # one clock: every rank's starts at the common start
    for rank, records in steps[steps["role"] == "worker"].groupby("rank"):
        mine = events[events["pid"] == rank]
        spans = mine[mine["tid"] == trace.TRACKS["step"]]
        tol = 1e-6 * len(records) + 1e-9  # the trace keeps tenths of microseconds

        def total(name_: str, spans=spans) -> float:
            return spans.loc[spans["name"] == name_, "dur"].sum() / 1e6

        assert total("data") == pytest.approx(records["data_s"].sum(), abs=tol)
        # the forward's end splits forward+backward: the two spans tile it, step by step
        assert total("forward") + total("backward") == pytest.approx(
            total("forward+backward"), abs=2 * tol)
        assert total("forward") > 0 and total("backward") > 0
        step_s = spans.loc[spans["name"].str.startswith("step "), "dur"].sum() / 1e6
        assert step_s == pytest.approx(records["step_s"].sum(), abs=tol)
        comm = mine[mine["tid"] == trace.TRACKS["comm"]]
        # what a step's record counts is what its meter timed between the step's marks (the
        # start's fetch, an evaluation's or a checkpoint's messages are between steps)
        bounds = spans[spans["name"].str.startswith("step ")]
        inside = comm["ts"].map(lambda t, b=bounds: ((b["ts"] <= t) & (t <= b["ts"] + b["dur"])).any())
        comm = comm[inside]
        accounts = comm["args"].map(lambda a: a["account"])
        assert comm.loc[accounts == "comm", "dur"].sum() / 1e6 == pytest.approx(
            records["comm_s"].sum(), abs=tol)
        assert comm.loc[accounts == "wait", "dur"].sum() / 1e6 == pytest.approx(
            records["wait_s"].sum(), abs=tol)
        if name == "allreduce":
            buckets = mine[mine["tid"] == trace.TRACKS["buckets"]]
            per_step = buckets["name"].nunique()
            assert per_step > 1 and len(buckets) == per_step * len(records)
            backward = spans[spans["name"] == "forward+backward"]
            ends = (backward["ts"] + backward["dur"]).to_numpy()
            # the first bucket of each step starts while backward is still running
            firsts = buckets[buckets["name"] == "bucket 0 allreduce"]["ts"].to_numpy()
            assert (firsts < ends).mean() > 0.5, (firsts[:5], ends[:5])
            # and none starts before its step's backward does (the buckets hold gradients)
            begins = spans[spans["name"] == "backward"]["ts"].to_numpy()
            assert (firsts >= begins - 0.2).all(), (firsts[:5], begins[:5])
    if name == "downpour":
        served = events[(events["pid"] == 0) & (events["tid"] == trace.TRACKS["server"])]
        assert len(served) == (steps["rank"] == 0).sum() > 0  # one span per applied update
