"""Mixed precision: the loss scale (unscaling, skipping, growth), a skipped step that moves nothing,
the skip agreed by every rank that steps together, and every algorithm learning in bf16."""

import json

import pytest
import torch
from conftest import explain, mpi_python

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.comm.runtime import DistContext
from downpour_lib.errors import ConfigError
from downpour_lib.precision import LossScaler


def test_loss_scaler_unscales_finds_overflow_and_adapts():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([2.0, 4.0, 8.0])
    scaler = LossScaler(scale=4.0, growth_interval=2)
    assert scaler.unscale_([p]) is False and p.grad.tolist() == [0.5, 1.0, 2.0]
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0  # doubled after 2 good steps
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert scaler.unscale_([p]) is True
    scaler.update(True)
    assert (scaler.scale, scaler.good_steps, scaler.skipped) == (4.0, 0, 1)
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert (again.scale, again.good_steps) == (4.0, 0)


def fp16(**kw):
    return TrainConfig(**{**dict(model="mlp", dataset="digits", batch_size=32, lr=0.05,
                                 weight_decay=1e-3, threads=1, warmup_steps=0, precision="fp16",
                                 final_eval=False), **kw})


def test_an_overflowing_step_is_skipped_whole_and_the_scale_backs_off():
    trainer = make_trainer(fp16(steps=2), DistContext.single())
    trainer.scaler.scale = 2.0 ** 200  # every gradient overflows in fp32
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.run()
    # no update at all: momentum and weight decay would have moved the parameters
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert result.steps.skipped.tolist() == [1.0, 1.0]
    assert result.steps.loss_scale.tolist() == [2.0 ** 200, 2.0 ** 199]
    assert trainer.optimizer.state == {} or all(
        "momentum_buffer" not in s or s["momentum_buffer"] is None
        for s in trainer.optimizer.state.values())


def test_fp16_recovers_from_a_too_large_scale_and_learns():
    trainer = make_trainer(fp16(epochs=3, final_eval=True), DistContext.single())
    trainer.scaler.scale = 2.0 ** 24  # fp16 activations overflow above about 2^18 here
    result = trainer.run()
    skipped = result.steps.skipped.tolist()
    assert skipped[0] == 1.0 and skipped[-1] == 0.0 and 0 < sum(skipped) < 20
    assert result.summary["test_accuracy"] >= 0.9


def test_bf16_local_training_reaches_90_percent_on_digits():
    config = TrainConfig(model="lenet", dataset="digits", epochs=10, threads=1, precision="bf16")
    assert make_trainer(config, DistContext.single()).run().summary["test_accuracy"] >= 0.9


def test_fp16_with_gradient_accumulation_is_refused_before_training():
    config = fp16(steps=4, algorithm="allreduce", options={"accumulation_steps": 2})
    with pytest.raises(ConfigError, match="precision='fp16'.*accumulation_steps > 1.*bf16"):
        make_trainer(config, DistContext.single())


def cases(what: str) -> dict[str, dict]:
    proc = mpi_python(4 if what == "agree" else 2, "mixed_precision.py", what, timeout=300)
    assert proc.returncode == 0, explain(proc)
    return {c["case"]: c for c in map(json.loads, (line for line in proc.stdout.splitlines()
                                                    if line.startswith("{")))}


def test_a_rank_whose_fp16_gradients_overflow_makes_every_rank_that_steps_with_it_skip():
    found = cases("agree")
    for name in ("allreduce", "ddp", "sgp", "osgp", "dpsgd", "sync_ps"):
        c = found[f"agree {name}"]
        # every worker skipped every step, and no rank's parameters moved (D-PSGD still averages
        # its neighbours' identical parameters: rounding only)
        assert all(s == [1, 1, 1, 1] for s in c["skipped"].values()), c
        assert max(c["moved"]) < 1e-6 and all(c["finite"]), c
    for name in ("downpour", "adpsgd"):  # asynchronous: the others train without its gradients
        c = found[f"agree {name}"]
        bad = str(c["overflowing"])
        assert c["skipped"][bad] == [1, 1, 1, 1], c
        assert all(s == [0, 0, 0, 0] for r, s in c["skipped"].items() if r != bad), c
        assert max(c["moved"]) > 1e-3 and all(c["finite"]), c


def test_every_algorithm_reaches_90_percent_on_digits_in_bf16():
    found = cases("bf16")
    assert len(found) == 8, found
    for c in found.values():
        assert c["precision"] == "bf16" and c["test_accuracy"] >= 0.90, c
