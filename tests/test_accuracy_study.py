"""MNIST-1D (made offline), its 1-D CNN, and the time-and-bytes-to-target study: its plan checked
before anything runs (to an accuracy, or to a language model's validation loss), its bytes and time
to target read from the records. The study itself runs in test_notebooks.py (notebooks 05 and 07,
local ranks) and test_slurm_nodes.py (across the sandbox's nodes)."""

import numpy as np
import pandas as pd
import pytest
import torch

from downpour_lib.data import DATASETS, load_dataset
from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model, parameter_count
from downpour_lib.study.accuracy import (
    COMPARED_ALGORITHMS,
    Target,
    bytes_by_eval,
    first_reaching,
    plan_study,
    plan_table,
    settings,
    train_seconds_through,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "downpour" / "mnist1d_seed42.npz"


def test_mnist1d_is_the_packages_data_set_made_offline_and_cached(cache):
    from mnist1d.data import get_dataset_args, make_dataset

    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    splits = load_dataset("mnist1d")
    # the package seeds NumPy's global generator; ours is given back as it was
    assert np.array_equal(np.random.get_state()[1], before)
    assert cache.is_file()
    spec = DATASETS["mnist1d"]
    assert (len(splits.train), len(splits.test)) == (spec.train_size, spec.test_size) == (4000, 1000)
    x, y = splits.train.batch(torch.arange(4000))
    assert x.shape == (4000, 1, 1, 40) and set(y.tolist()) == set(range(10))
    reference = make_dataset(get_dataset_args())
    assert torch.allclose(x.view(4000, 40), torch.tensor(reference["x"], dtype=torch.float32))
    assert torch.equal(y, torch.tensor(reference["y"]))
    again = load_dataset("mnist1d")  # from the cache: the same
    assert torch.equal(again.test.batch(torch.arange(1000))[0], splits.test.batch(torch.arange(1000))[0])


def test_cnn1d_reads_the_signal_and_has_the_papers_size():
    model = build_model("cnn1d", (1, 1, 40), 10)
    # conv 1->25 k5, 25->25 k3 twice, linear 25*5 -> 10 (Greydanus 2020's ConvBase on 40 samples)
    assert parameter_count(model) == (25 * 5 + 25) + 2 * (25 * 25 * 3 + 25) + (125 * 10 + 10)
    assert model(torch.randn(3, 1, 1, 40)).shape == (3, 10)
    # a signal shorter than the three samples the convolutions need is read zero-padded to three
    torch.manual_seed(0)
    short = build_model("cnn1d", (1, 1, 2), 10)
    torch.manual_seed(0)
    three = build_model("cnn1d", (1, 1, 3), 10)
    x = torch.randn(4, 1, 1, 2)
    assert torch.equal(short(x), three(torch.nn.functional.pad(x, (0, 1))))


def test_the_plan_is_every_algorithm_in_every_setting_checked_first(cache):
    plan = plan_study({"epochs": 2}, network="sandbox", links=["1gbit", "50mbit"])
    assert len(plan) == len(COMPARED_ALGORITHMS) * 4
    table = plan_table(plan)
    assert list(table.columns[:6]) == ["label", "network", "link", "slow_workers", "slowdown",
                                       "target_accuracy"]
    assert set(zip(table.link, table.slow_workers, table.slowdown, strict=True)) == {
        ("1gbit", 0, 1.0), ("1gbit", 1, 2.0), ("50mbit", 0, 1.0), ("50mbit", 1, 2.0)}
    sizes = dict(zip(table.algorithm, table.world_size, strict=False))
    assert sizes["downpour"] == 5 and sizes["allreduce"] == 4  # downpour's server on a rank of its own
    assert all(run.config.model == "cnn1d" and run.config.data.dataset == "mnist1d" for run in plan)
    assert len({run.run_id for run in plan}) == len(plan)
    assert [s.name for s in settings("local")] == ["local", "local, 1 slow x2"]


@pytest.mark.parametrize("kwargs, field, what", [
    ({"algorithms": ["allreduce", "nope"]}, "algorithms", "nope"),
    ({"algorithms": []}, "algorithms", "at least one"),
    ({"network": "cloud"}, "network", "sandbox"),
    ({"network": "sandbox", "links": ["1gbit", "fast"]}, "links", "fast"),
    ({"stragglers": [4]}, "stragglers", "0 to 3"),
    ({"slowdown": 0.5}, "slowdown", ">= 1"),
    ({"target": 1.5}, "target", "an accuracy in (0, 1]"),
    ({"target": 0, "metric": "accuracy"}, "target", "an accuracy in (0, 1]"),
    ({"target": 0, "metric": "loss"}, "target", "a validation loss per token > 0"),
    ({"target": -2.5, "metric": "loss"}, "target", "> 0, e.g. 2.5"),
    ({"target": float("inf"), "metric": "loss"}, "target", "> 0"),
    ({"target": True, "metric": "loss"}, "target", "> 0"),
    ({"target": 3.0, "metric": "perplexity"}, "metric", "accuracy (reached at or above"),
    ({"target": Target(3.0, "loss"), "metric": "accuracy"}, "metric", "the Target's own, loss"),
    ({"base": {"algorithm": "sgp"}}, "algorithm", "sets it per run"),
    ({"options": {"localsgd": {"period": 0}}}, "period", "0"),
])
def test_a_bad_plan_is_refused_naming_the_field(cache, kwargs, field, what):
    with pytest.raises(ConfigError) as err:
        plan_study(**{"network": "local", **kwargs})
    assert field in str(err.value) and what in str(err.value)


def test_bytes_and_time_to_target_come_from_every_ranks_records():
    steps = pd.DataFrame({"rank": [0, 1, 0, 1, 2], "time_s": [1.0, 1.1, 2.0, 2.2, 2.5],
                          "bytes_sent": [10, 20, 10, 20, 100]})
    evals = pd.DataFrame({"time_s": [0.5, 2.1, 3.0], "accuracy": [0.2, 0.85, 0.9]})
    assert list(bytes_by_eval(steps, evals)) == [0, 40, 160]
    evals = evals.assign(bytes_sent=bytes_by_eval(steps, evals))
    assert first_reaching(evals, 0.8, "time_s") == 2.1 and first_reaching(evals, 0.8, "bytes_sent") == 40
    assert np.isnan(first_reaching(evals, 0.95, "time_s"))


LM = {"model": "gpt-nano", "dataset": "stdlib-text", "steps": 40, "epochs": None, "batch_size": 8}
LM_ALGORITHMS = ("allreduce", "ddp", "localsgd", "diloco", "slowmo", "downpour", "sgp")


def test_a_loss_target_plans_the_language_model_study_naming_its_target():
    """Notebook 07's plan: every algorithm on gpt-nano / stdlib-text, each row's target a loss
    (``target_loss``, no accuracy column), checked in full before anything runs."""
    plan = plan_study(LM, LM_ALGORITHMS, network="sandbox", links=["1gbit", "50mbit"], workers=2,
                      stragglers=[0], target=3.3, metric="loss")
    table = plan_table(plan)
    assert len(plan) == 14 and set(table.link) == {"1gbit", "50mbit"}
    assert "target_loss" in table and "target_accuracy" not in table
    assert (table.target_loss == 3.3).all()
    assert dict(zip(table.algorithm, table.world_size, strict=False))["downpour"] == 3
    assert all(run.config.model == "gpt-nano" and run.config.length.steps == 40 for run in plan)
    # the target is part of a run's identity: the same run to another loss is another row
    other = plan_study(LM, ["allreduce"], network="local", workers=2, stragglers=[0], target=3.0,
                       metric="loss")
    same = plan_study(LM, ["allreduce"], network="local", workers=2, stragglers=[0],
                      target=Target(3.3, "loss"))
    assert other[0].run_id != same[0].run_id
    assert same[0].columns["target_loss"] == 3.3


def test_a_loss_target_is_reached_at_or_below_it_an_accuracy_at_or_above():
    evals = pd.DataFrame({"time_s": [1.0, 2.0, 3.0, 4.0], "step": [9, 19, 29, 39],
                          "loss": [4.0, 3.4, 3.3, 3.5], "accuracy": [0.1, 0.3, 0.25, 0.4],
                          "bytes_sent": [10, 20, 30, 40]})
    loss = Target(3.3, "loss")
    assert first_reaching(evals, loss, "time_s") == 3.0 and first_reaching(evals, loss, "step") == 29
    assert first_reaching(evals, Target(3.4, "loss"), "bytes_sent") == 20
    assert np.isnan(first_reaching(evals, Target(3.2, "loss"), "time_s"))
    assert first_reaching(evals, Target(0.3), "time_s") == 2.0  # an accuracy: at or above
    assert Target.of_columns({"target_loss": 3.3}) == loss
    assert Target.of_columns({"target_accuracy": 0.8, "target_loss": float("nan")}) == Target(0.8)
    assert (loss.column, Target(0.8).column) == ("target_loss", "target_accuracy")


def test_the_seconds_to_a_target_without_evaluations_are_the_workers_steps():
    """``train_s_to_target``: each worker's step seconds through the target's step, averaged over
    the workers; a server's records and later steps do not count."""
    steps = pd.DataFrame({"rank": [0, 1, 0, 1, 2, 0, 1], "role": ["worker"] * 4 + ["server"]
                          + ["worker"] * 2, "step": [0, 0, 1, 1, 1, 2, 2],
                          "step_s": [1.0, 2.0, 1.0, 2.0, 9.0, 5.0, 5.0]})
    assert train_seconds_through(steps, 1) == pytest.approx(3.0)  # (1 + 1 + 2 + 2) / 2
    assert np.isnan(train_seconds_through(steps, float("nan")))
