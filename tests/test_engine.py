"""The training loop in one process: records, evaluation, summaries, and every algorithm at world 1."""

import math

import pandas as pd
import pytest
import torch

from downpour_lib import TrainConfig, make_trainer, plan_run
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import load_dataset
from downpour_lib.errors import ConfigError
from downpour_lib.records import TIME_PARTS, summarize

FAST = dict(model="mlp", dataset="digits", threads=1, seed=1)


def test_records_evaluations_and_summary(tmp_path):
    config = TrainConfig(algorithm="local", steps=12, warmup_steps=2, eval_every=5,
                         output_dir=str(tmp_path), **FAST)
    result = make_trainer(config, DistContext.single()).run()
    steps = result.steps
    assert list(steps.step) == list(range(12)) and set(steps.role) == {"worker"}
    # the five parts add up to the step's wall time
    assert ((steps[list(TIME_PARTS)].sum(axis=1) - steps.step_s).abs() < 1e-3).all()
    assert list(result.evals.step) == [4, 9, 11]  # every 5 steps, and at the end
    s = result.summary
    assert s["measured_steps"] == 10 and s["samples_per_s"] > 0 and s["num_workers"] == 1
    assert s["test_accuracy"] == result.evals.accuracy.iloc[-1]
    assert s["algorithm"] == "local" and s["torch_version"] == torch.__version__
    assert math.isclose(s["final_train_loss"], steps.loss.iloc[-2:].mean())
    for name in ("steps.csv", "evals.csv", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert len(pd.read_csv(tmp_path / "steps.csv")) == 12


@pytest.mark.parametrize("algorithm", ["sync_ps", "ddp", "allreduce"])
def test_every_algorithm_in_a_world_of_one_equals_local(algorithm):
    def final(name):
        trainer = make_trainer(TrainConfig(algorithm=name, steps=8, **FAST), DistContext.single())
        trainer.run()
        return [p.detach().clone() for p in trainer.model.parameters()]

    for a, b in zip(final(algorithm), final("local"), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_cpu_trainer_treats_subnormal_floats_as_zero():
    """Optimizer state that decays into subnormal floats made CPU steps grow with a run's length
    (``engine.flush_denormals``): a trainer on the CPU flushes them."""
    torch.set_flush_denormal(False)  # as a fresh process has it (an earlier trainer here set it)
    tiny = torch.tensor([1e-39])  # subnormal in float32 (the smallest normal is 1.2e-38)
    try:
        assert (tiny * 1.0).item() > 0
        make_trainer(TrainConfig(algorithm="local", steps=3, **FAST), DistContext.single())
        assert (tiny * 1.0).item() == 0
    finally:
        torch.set_flush_denormal(False)


def test_lenet_learns_digits_in_one_process():
    config = TrainConfig(algorithm="local", model="lenet", dataset="digits", epochs=6,
                         batch_size=32, threads=1)
    assert make_trainer(config, DistContext.single()).run().summary["test_accuracy"] >= 0.9


def test_plan_checks_before_anything_runs():
    digits = load_dataset("digits").train
    plan = plan_run(TrainConfig(algorithm="sync_ps", epochs=2, batch_size=32), 3, digits)
    assert plan.roles.workers == (1, 2) and plan.roles.servers == (0,)
    assert plan.steps_per_epoch == 1437 // 2 // 32 and plan.total_steps == 2 * plan.steps_per_epoch
    with pytest.raises(ConfigError, match="warmup_steps=2.*less than the 1 steps"):
        plan_run(TrainConfig(epochs=0.01), 1, digits)
    with pytest.raises(ConfigError, match="vgg16 needs images at least 32x32.*8x8"):
        plan_run(TrainConfig(model="vgg16"), 1, digits)
    with pytest.raises(ConfigError, match="batch_size=1000.*2 worker"):
        plan_run(TrainConfig(algorithm="ddp", batch_size=1000), 2, digits)


def test_throughput_sums_worker_rates_after_warmup():
    rows = []
    for rank in (1, 2):
        for step in range(4):
            slow = step < 1  # warm-up: excluded
            rows.append(dict(rank=rank, role="worker", step=step, samples=10, loss=1.0,
                             step_s=5.0 if slow else 0.5, bytes_sent=100, bytes_received=50,
                             **{p: 0.1 for p in TIME_PARTS}))
    rows.append(dict(rank=0, role="server", step=0, samples=0, loss=float("nan"), step_s=0.5,
                     bytes_sent=0, bytes_received=0, **{p: 0.1 for p in TIME_PARTS}))
    summary = summarize(pd.DataFrame(rows), pd.DataFrame(), warmup_steps=1)
    assert summary["samples_per_s"] == pytest.approx(40.0)  # 2 workers x 10 samples / 0.5 s
    assert summary["num_workers"] == 2 and summary["measured_steps"] == 3
    assert summary["bytes_sent_per_step"] == 100


def test_a_worker_given_a_server_by_setup_is_refused_naming_the_rank(monkeypatch):
    """``setup`` returns the module to run forward on, or on a server rank a ``Server``: a
    mix-up is an error that says which, before any step runs."""
    from downpour_lib.algorithms import ALGORITHMS
    from downpour_lib.algorithms.base import Server
    from downpour_lib.algorithms.local import Local
    from downpour_lib.options import OPTIONS

    class Confused(Local):
        name = "confused"

        def setup(self, model, optimizer):
            return Server()

    monkeypatch.setitem(ALGORITHMS, "confused", Confused)
    monkeypatch.setitem(OPTIONS, "confused", Confused.Options)
    with pytest.raises(TypeError, match="confused: setup on rank 0, a worker, returned Server"):
        make_trainer(TrainConfig(algorithm="confused", steps=6, **FAST), DistContext.single())


def test_algorithm_metrics_reach_records_and_the_records_summarize_them(monkeypatch):
    """An algorithm reports numbers per step and per evaluation; the summary is the records' own
    analysis of them (staleness here), which no algorithm implements."""
    from downpour_lib.algorithms import ALGORITHMS
    from downpour_lib.algorithms.local import Local
    from downpour_lib.options import OPTIONS

    class Counting(Local):
        name = "counting"
        updates = 0

        def metrics(self, model=None):
            if model is not None:
                return {"param_norm": float(sum(p.detach().norm() ** 2
                                                for p in model.parameters()) ** 0.5)}
            self.updates += 1
            return {"updates_so_far": float(self.updates), "staleness": float(self.updates % 3)}

    monkeypatch.setitem(ALGORITHMS, "counting", Counting)
    monkeypatch.setitem(OPTIONS, "counting", Counting.Options)
    result = make_trainer(TrainConfig(algorithm="counting", steps=6, eval_every=3, **FAST),
                          DistContext.single()).run()
    assert list(result.steps.updates_so_far) == [1, 2, 3, 4, 5, 6]
    assert len(result.evals.param_norm) == 2 and (result.evals.param_norm > 0).all()
    assert result.summary["staleness_mean"] == 1.0 and result.summary["staleness_max"] == 2
    assert result.summary["staleness_hist"] == {"0": 2, "1": 2, "2": 2}
    assert "final_consensus_distance" not in result.summary  # no consensus recorded
