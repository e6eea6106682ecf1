"""Emulated compute (downpour_lib.emulate): real gradients' shapes, order and moments, no compute.

The schedule is checked on a simulated clock (every sleep advances it by what was asked plus a
fixed overshoot), so the moments asserted are the schedule's own, not this machine's timing."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import explain, mpi_python, one_session
from torch import nn

from downpour_lib import TrainConfig, plan_run
from downpour_lib.bench.emulated import launch_fractions
from downpour_lib.cli import main
from downpour_lib.data import load_dataset
from downpour_lib.emulate import ComputeProfile, EmulatedCompute, backward_order, measure
from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model
from downpour_lib.study.scaling import EMULATED_SWEEP
from downpour_lib.study.scaling_plots import with_series
from downpour_lib.study.studies import emulated_variant


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model("lenet", (1, 8, 8), 10)


def _batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


class FakeClock:
    """A clock only sleeps move; each sleep overshoots by ``over`` seconds, as real ones do."""

    def __init__(self, over: float = 60e-6) -> None:
        self.t, self.over, self.asked = 0.0, over, []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.asked.append(s)
        self.t += s + self.over


def test_emulated_backward_readies_gradients_in_the_real_order():
    model = _model()
    x, y = _batch()
    real = backward_order(model, lambda: nn.functional.cross_entropy(model(x), y).backward())
    profile = measure(model, x, y, steps=2, warmup=1)
    emulated = EmulatedCompute(model, profile.scaled(0.001, "test")).install()
    try:
        assert backward_order(model, lambda: model(x).backward()) == real
    finally:
        emulated.remove()
    assert model.forward.__self__ is model  # the real forward is back
    nn.functional.cross_entropy(model(x), y).backward()


def test_gradients_have_real_shapes_and_reproduce_per_seed():
    model = _model()
    profile = ComputeProfile(0.0, 0.0, (0.5,) * len(list(model.parameters())))
    runs = []
    for seed in (3, 3, 4):
        model.zero_grad(set_to_none=True)
        emulated = EmulatedCompute(model, profile, seed=seed).install()
        model(torch.zeros(1)).backward()
        emulated.remove()
        runs.append([p.grad.clone() for p in model.parameters()])
    for p, g in zip(model.parameters(), runs[0], strict=True):
        assert g.shape == p.shape and g.dtype == p.dtype and g.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(runs[0], runs[2], strict=True))


def test_each_gradient_is_ready_at_its_measured_moment():
    model = _model()
    n = len(list(model.parameters()))
    ready = tuple(1.0 - (i + 1) / (n + 1) for i in range(n))  # the last layer first, as backward
    profile = ComputeProfile(forward_s=0.010, backward_s=0.020, ready=ready)
    clock = FakeClock()
    EmulatedCompute(model, profile, sleep=clock.sleep, clock=clock).install()
    moments = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: moments.__setitem__(i, clock.t))
             for i, p in enumerate(model.parameters())]
    model(torch.zeros(1)).backward()
    for h in hooks:
        h.remove()
    for i in range(n):  # deadlines: no drift beyond the forward's and one sleep's overshoot
        assert moments[i] == pytest.approx(0.010 + ready[i] * 0.020, abs=2.5 * clock.over)
    assert clock.t == pytest.approx(0.030, abs=2.5 * clock.over)  # the tail after the last gradient


def test_bad_profiles_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="backward_s"):
        ComputeProfile(0.1, -1.0, ())
    with pytest.raises(ConfigError, match="ready"):
        ComputeProfile(0.1, 0.1, (1.5,))
    with pytest.raises(ConfigError, match="profile.ready"):
        EmulatedCompute(_model(), ComputeProfile(0.1, 0.1, (0.5,)))
    with pytest.raises(ConfigError, match="emulated_step_s"):
        ComputeProfile(0.1, 0.1, ()).scaled(0.0, "x")


def test_ddp_reduces_the_emulated_gradients():
    """DDP's reducer is driven by AccumulateGrad hooks: it must see every emulated gradient."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _model()
        profile = ComputeProfile(0.0, 0.0, (0.5,) * len(list(model.parameters())))
        emulated = EmulatedCompute(model, profile, seed=7).install()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        ddp(torch.zeros(1)).backward()
        for p, g in zip(model.parameters(), emulated.grads, strict=True):
            torch.testing.assert_close(p.grad, g)
        emulated.remove()
    finally:
        dist.destroy_process_group()


def test_emulated_training_reduces_the_real_sized_gradients_exactly_on_two_ranks():
    """Two ranks, allreduce and DDP, on gloo and on our mpi backend: after k SGD steps every
    worker holds p0 - k lr (the mean of both ranks' pseudo-gradients), to float rounding; loss
    and accuracy are absent (NaN), and the summary names the emulated step."""
    proc = mpi_python(2, "emulated.py")
    assert proc.returncode == 0, explain(proc)
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {(r["algorithm"], r["backend"]) for r in runs} == {
        (a, b) for a in ("allreduce", "ddp") for b in ("gloo", "mpi")}
    for r in runs:
        assert max(r["errors"]) < 1e-6, r
        assert r["loss_absent"] and r["accuracy_absent"], r
        assert r["emulated_s"] == pytest.approx(0.004), r
        assert r["bytes_sent"] > 0.9 * 4 * 62006, r  # lenet's gradients, every step


def test_emulated_compute_refuses_what_it_cannot_emulate():
    with pytest.raises(ConfigError, match="emulated_step_s.*compute=emulated only"):
        TrainConfig(algorithm="allreduce", emulated_step_s=0.05)
    with pytest.raises(ConfigError, match="emulated_step_s"):
        TrainConfig(algorithm="allreduce", compute="emulated", emulated_step_s=-1)
    with pytest.raises(ConfigError, match="compute"):
        TrainConfig(algorithm="allreduce", compute="fake")
    config = TrainConfig(algorithm="allreduce", compute="emulated", precision="fp16")
    with pytest.raises(ConfigError, match="fp16"):
        plan_run(config, 1, load_dataset("digits", "data").train)


#: Every algorithm notebook 02's emulated sweep names, with options that make each communicate
#: within a short run (localsgd and diloco meet every 2 steps; downpour's workers start together).
SWEPT = {
    "allreduce": ("allreduce", {}), "ddp": ("ddp", {}), "sync_ps": ("sync_ps", {}),
    "sync_ps-sharded": ("sync_ps", {"servers": 2}), "downpour": ("downpour", {"warmstart": 0}),
    "sgp": ("sgp", {}), "localsgd": ("localsgd", {"period": 2}),
    "diloco": ("diloco", {"period": 2}),
}
STEP_S = 0.02


def swept_config(name: str) -> dict:
    algorithm, options = SWEPT[name]
    return {"algorithm": algorithm, "model": "lenet", "dataset": "synthetic-cifar", "batch_size": 8,
            "steps": 8, "warmup_steps": 2, "eval_every": 4, "eval_batch_size": 64, "threads": 1,
            "backend": "gloo", "compute": "emulated", "emulated_step_s": STEP_S, "options": options}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Every swept algorithm's run, one after another in one mpiexec -n 3 session."""
    return one_session(3, {name: swept_config(name) for name in SWEPT},
                       tmp_path_factory.mktemp("swept"))


@pytest.mark.ranks
@pytest.mark.slow
@pytest.mark.parametrize("name", list(SWEPT))
def test_every_swept_algorithm_trains_emulated_on_three_ranks(swept, name):
    """Under mpiexec -n 3 (servers' updates real), each algorithm finishes a few emulated steps:
    loss and accuracy absent, bytes sent every step on average, no step shorter than the emulated
    compute it sleeps."""
    config, s = TrainConfig.from_dict(swept_config(name)), swept[name]
    assert s["num_workers"] == len(config.options.roles(3).workers)
    assert math.isnan(s["final_train_loss"]) and math.isnan(s["test_accuracy"]), s
    assert s["emulated_forward_s"] + s["emulated_backward_s"] == pytest.approx(STEP_S)
    assert s["bytes_sent_per_step"] > 0, s
    assert s["step_s"] >= STEP_S - 1e-3, s


@pytest.mark.ranks
@pytest.mark.slow
def test_a_process_measures_the_step_it_emulates_once_for_runs_of_the_same_shape(swept):
    """The session's first run measures on rank 0; ddp after it, whose first worker is rank 0
    too, takes that measurement (the same forward share, to the bit) and says so; sync_ps, whose
    first worker is rank 1, measures there anew."""
    first, again, other = swept["allreduce"], swept["ddp"], swept["sync_ps"]
    assert "earlier run" not in first["emulated_compute"], first["emulated_compute"]
    assert again["emulated_compute"].endswith("rank 0 (in an earlier run of its process)")
    assert again["emulated_forward_s"] == first["emulated_forward_s"]
    assert other["emulated_compute"].endswith("rank 1"), other["emulated_compute"]


@pytest.mark.ranks
@pytest.mark.slow
def test_bench_emulated_prints_and_writes_both_checks(tmp_path, capsys):
    """``downpour bench emulated`` run small: its rows and table carry the fields (not the times,
    which the benchmark reports and this machine's load decides)."""
    out = tmp_path / "emulated.json"
    assert main(["bench", "emulated", "--model", "lenet", "--batch-size", "8",
                 "--bucket-cap-mb", "0.01", "--algorithms", "allreduce", "--steps", "6",
                 "--warmup-steps", "2", "--json", str(out)]) == 0, capsys.readouterr()
    rows = json.loads(out.read_text())
    launches = [r for r in rows if r["check"] == "bucket_launch"]
    rates = [r for r in rows if r["check"] == "throughput"]
    assert len(launches) >= 4 and {r["buckets"] for r in launches} == {len(launches)}
    for r in launches:  # every bucket launched in both runs, inside the step
        assert r["real_fraction"] is not None and r["emulated_fraction"] is not None, r
        assert r["difference"] == pytest.approx(abs(r["real_fraction"] - r["emulated_fraction"]))
        assert 0 < r["forward_share"] < 1 and isinstance(r["within"], bool)
    assert [r["workers"] for r in rates] == [1, 2]
    for r in rates:
        assert r["ratio"] == pytest.approx(r["emulated_samples_per_s"] / r["real_samples_per_s"])
        assert r["within"] == (abs(r["ratio"] - 1) <= 0.10) and r["model"] == "lenet"
    assert all(r["load_1min_start"] >= 0 and r["load_1min_end"] >= 0 for r in rows)
    text = capsys.readouterr().out
    assert "fractions of backward" in text and "emulated / real" in text and "within" in text
    assert "load average (1 min)" in text


@pytest.mark.parametrize("args, expected", [
    (["--algorithms", "sgp"], "algorithms='sgp' is not valid: the bucketed ones"),
    (["--steps", "5", "--warmup-steps", "5"], "steps=5"),
    (["--tolerance", "2"], "tolerance=2"),
    (["--model", "nope"], "model='nope'"),
])
def test_bench_emulated_refuses_bad_input_before_launching(capsys, args, expected):
    assert main(["bench", "emulated", *args]) == 2
    assert expected in capsys.readouterr().err


def test_launch_fractions_place_buckets_in_their_steps_backward():
    """Two steps of a trace: forward 40% of forward+backward, buckets at known moments."""
    events = []
    for step, t in ((0, 0.0), (1, 1000.0)):
        events += [{"name": f"step {step}", "pid": 1, "ts": t, "dur": 200.0},
                   {"name": "forward+backward", "pid": 1, "ts": t + 10, "dur": 100.0},
                   {"name": "bucket 0 allreduce", "pid": 1, "ts": t + 10 + 40 + 15, "dur": 5.0},
                   {"name": "bucket 1 allreduce", "pid": 1, "ts": t + 10 + 40 + 60, "dur": 5.0}]
    fractions = launch_fractions(events, forward_share=0.4, warmup=1)
    assert fractions == {0: [pytest.approx(0.25)], 1: [pytest.approx(1.0)]}
    # a trace with the backward marked: its span is the backward, the share is not used
    for t in (0.0, 1000.0):
        events.append({"name": "backward", "pid": 1, "ts": t + 10 + 30, "dur": 80.0})
    fractions = launch_fractions(events, forward_share=0.4, warmup=1)
    assert fractions == {0: [pytest.approx(25 / 80)], 1: [pytest.approx(70 / 80)]}


def test_emulated_sweep_entries_name_an_algorithm_and_its_own_options():
    assert emulated_variant("sync_ps") == ("sync_ps", {})
    assert emulated_variant("sync_ps:servers=2") == ("sync_ps", {"servers": 2})
    assert emulated_variant("diloco: period=4, outer_lr=0.5") == (
        "diloco", {"period": 4, "outer_lr": 0.5})
    with pytest.raises(ConfigError, match="emulated_algorithms='nope'"):
        emulated_variant("nope")
    with pytest.raises(ConfigError, match="options of sync_ps as key=value: .*servers"):
        emulated_variant("sync_ps:shards=2")
    with pytest.raises(ConfigError, match="servers"):
        emulated_variant("sync_ps:servers=two")
    # the full sweep plans (every run checked) without running anything
    sweep = EMULATED_SWEEP
    assert len(sweep["algorithms"]) == 8 and sweep["step_s"] == [None, 0.05]
    for entry in sweep["algorithms"]:
        name, opts = emulated_variant(entry)
        TrainConfig.from_dict({"algorithm": name, "options": opts}).options.roles_for(32)


def test_sharded_servers_are_a_series_of_their_own():
    runs = pd.DataFrame({"algorithm": ["sync_ps", "sync_ps", "sync_ps", "ddp"],
                         "options.servers": [1, 2, 2, float("nan")],
                         "compute": ["emulated", "emulated", "real", "emulated"],
                         "emulated_step_s": [0.05, 0.05, float("nan"), float("nan")]})
    assert list(with_series(runs).series) == [
        "sync_ps (emulated, 50 ms a step)", "sync_ps 2 servers (emulated, 50 ms a step)",
        "sync_ps 2 servers", "ddp (emulated, auto)"]
