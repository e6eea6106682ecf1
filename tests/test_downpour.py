"""Downpour SGD in one process (its server colocated with its one worker) and its pre-flight checks."""

import math

import pandas as pd
import pytest
import torch

from downpour_lib import TrainConfig, make_trainer, plan_run
from downpour_lib.cli import main
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import load_dataset
from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model
from downpour_lib.records import staleness_summary

FAST = dict(model="mlp", dataset="digits", threads=1, seed=1, steps=10, warmup_steps=1)


def final(config):
    trainer = make_trainer(config, DistContext.single())
    result = trainer.run()
    return [p.detach().clone() for p in trainer.model.parameters()], result


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_one_worker_fetching_and_pushing_every_step_is_sequential_training(optimizer):
    params, result = final(TrainConfig(algorithm="downpour", optimizer=optimizer, **FAST))
    reference, _ = final(TrainConfig(algorithm="local", optimizer=optimizer, **FAST))
    for a, b in zip(params, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert result.summary["staleness_mean"] == 0 and result.summary["staleness_hist"] == {"0": 10}


def test_adagrad_is_downpours_default_and_sgd_everyone_elses():
    assert TrainConfig(algorithm="downpour").optim.optimizer == "adagrad"
    assert TrainConfig(algorithm="downpour").optim.momentum == 0.0
    assert (TrainConfig().optim.optimizer, TrainConfig().optim.momentum) == ("sgd", 0.9)


def test_n_push_accumulates_and_the_last_partial_push_is_not_lost():
    config = TrainConfig(algorithm="downpour", options={"n_fetch": 2, "n_push": 3}, **FAST)
    params, result = final(config)
    pushes = result.steps.dropna(subset=["staleness"])
    assert list(pushes.step) == [2, 5, 8, 9]  # every 3rd step, and the last one
    # fetches before steps 0, 2, 4, 6, 8: the push after step 5 carries gradients from the
    # parameters fetched before step 2 (version 0), applied at version 1; the push after step 9,
    # from those fetched before step 8 (version 2), applied at version 3
    assert list(pushes.staleness) == [0, 1, 0, 1]
    assert result.summary["staleness_hist"] == {"0": 2, "1": 2}
    torch.manual_seed(FAST["seed"])
    start = [p.detach() for p in build_model("mlp", (1, 8, 8), 10).parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(params, start, strict=True)) > 1e-3


def test_staleness_summary_uses_every_shard_of_every_push():
    steps = pd.DataFrame({"role": ["worker", "worker", "worker", "server"],
                          "staleness": [0.5, math.nan, 2.0, 9.0],
                          "staleness_shard0": [0.0, math.nan, 2.0, math.nan],
                          "staleness_shard1": [1.0, math.nan, 2.0, math.nan]})
    s = staleness_summary(steps)
    assert s == {"staleness_mean": 1.25, "staleness_max": 2, "staleness_hist": {"0": 1, "1": 1, "2": 2}}


@pytest.mark.parametrize("options, field, hint", [
    ({"n_push": 0}, "n_push", ">= 1"),
    ({"n_fetch": -2}, "n_fetch", ">= 1"),
    ({"servers": 0}, "servers", ">= 1"),
    ({"warmstart": -1}, "warmstart", ">= 0"),
    ({"server": "remote"}, "server", "dedicated"),
])
def test_bad_options_name_field_value_and_fix(options, field, hint):
    with pytest.raises(ConfigError) as err:
        TrainConfig(algorithm="downpour", options=options)
    assert err.value.field == field and hint in str(err.value)


def test_bad_worlds_and_layouts_fail_in_the_plan():
    digits = load_dataset("digits").train
    with pytest.raises(ConfigError, match="2 dedicated servers need at least 3 ranks"):
        plan_run(TrainConfig(algorithm="downpour", options={"servers": 2, "server": "dedicated"}),
                 2, digits)
    with pytest.raises(ConfigError, match="servers=7.*only 6 tensor"):
        plan_run(TrainConfig(algorithm="downpour", options={"servers": 7}), 9, digits)


@pytest.mark.parametrize("args, expected", [
    (["--n-push", "0"], "n_push=0 is not valid: must be a whole number of steps >= 1"),
    (["--n-fetch", "0"], "n_fetch=0 is not valid"),  # the flag reaches the options
    (["--servers", "3"], "servers=3 is not valid: 3 servers need at least 3 ranks"),
    (["--server-optimizer", "x"], None),
])
def test_cli_refuses_bad_options_before_training(capsys, args, expected):
    if expected is None:  # the optimizer is the config's --optimizer, not a separate flag
        assert main(["train", "--algorithm", "downpour", *args]) == 2
        assert "unrecognized arguments: --server-optimizer x" in capsys.readouterr().err
        return
    assert main(["train", "--algorithm", "downpour", *args]) == 2
    assert expected in capsys.readouterr().err
