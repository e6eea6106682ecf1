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


class Stamp:
    """Stands for a recorded CUDA event's device time (seconds): ``elapsed_time`` is what
    ``torch.cuda.Event`` answers, in milliseconds, negative for an earlier event."""

    def __init__(self, device_s: float) -> None:
        self.device_s = device_s

    def elapsed_time(self, other: "Stamp") -> float:
        return (other.device_s - self.device_s) * 1000


def test_a_launch_the_device_reached_is_put_on_the_hosts_clock_at_the_steps_end():
    """On the CPU a launch is the host's time; on a GPU, where the device reached its mark,
    converted against the step's start (the device idle then, at the start's host time), also for
    a launch that completes after its step's conversion (at the next one, or at the export)."""
    tracer = trace.Tracer(rank=0, t0=100.0)
    tracer.launch("on the cpu", 101.0, None, 101.5, "buckets")
    tracer.launch("bucket 0", 102.0, Stamp(10.3), 102.6, "buckets")  # queued at 102.0, run at 10.3
    assert [s[0] for s in tracer.spans] == ["on the cpu"]  # the other waits for the step's end
    tracer.on_device_clock(Stamp(10.0), 102.0)  # the step started at device 10.0 = host 102.0
    tracer.launch("late", 102.1, Stamp(10.4), 103.0, "buckets")  # completed after the conversion
    tracer.on_device_clock(Stamp(11.0), 103.0)  # the next step: an earlier mark, a negative time
    tracer.launch("after the last step", 103.2, Stamp(11.5), 104.0, "buckets")
    events = {e["name"]: (e["ts"], e["dur"]) for e in tracer.export()}
    assert events["on the cpu"] == (1e6, 0.5e6)
    assert events["bucket 0"] == pytest.approx((2.3e6, 0.3e6))
    assert events["late"] == pytest.approx((2.4e6, 0.6e6))
    assert events["after the last step"] == pytest.approx((3.5e6, 0.5e6))
