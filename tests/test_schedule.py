"""Learning-rate schedules: warm-up, step and cosine decay, the linear scaling rule, as functions
of the step; and their configuration."""

import math

import pytest

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.comm.runtime import DistContext
from downpour_lib.errors import ConfigError
from downpour_lib.schedule import LRSchedule


def schedule(**kw):
    config = TrainConfig(lr=0.1, batch_size=32, **kw)
    return LRSchedule.of(config, steps_per_epoch=10, total_steps=100, workers=4)


def test_goyal_warm_up_then_step_decay_at_milestones():
    lr = schedule(lr_schedule="step", lr_warmup_epochs=2, lr_milestones=(3, 6.5), lr_decay=0.1)
    assert [lr(s) for s in (0, 9, 19)] == pytest.approx([0.1 / 20, 0.1 / 2, 0.1])
    assert [lr(s) for s in (20, 29, 30, 64, 65, 99)] == \
        pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_cosine_decays_from_the_end_of_warm_up_to_zero_at_the_last_step():
    lr = schedule(lr_schedule="cosine", lr_warmup_epochs=1)
    assert lr(9) == pytest.approx(0.1) and lr(10) == pytest.approx(0.1)
    assert lr(55) == pytest.approx(0.05)
    assert lr(100) == pytest.approx(0.0, abs=1e-12)
    assert all(lr(s) >= lr(s + 1) for s in range(10, 99))


def test_linear_scaling_rule_multiplies_by_global_batch_over_reference():
    lr = schedule(lr_scaling="linear", lr_reference_batch=256)  # 4 workers x 32 = 128
    assert lr(0) == pytest.approx(0.1 * 128 / 256)
    assert schedule()(50) == 0.1  # constant, unscaled


def test_engine_records_the_scheduled_lr_of_every_step():
    config = TrainConfig(lr=0.2, batch_size=64, steps=40, warmup_steps=1, threads=1,
                         lr_schedule="step", lr_warmup_epochs=0.5, lr_milestones="1,1.5")
    result = make_trainer(config, DistContext.single()).run()
    spe = 1437 // 64  # 22 steps per epoch on digits
    lr = LRSchedule.of(config, spe, 40, 1)
    assert result.steps.lr.tolist() == pytest.approx([lr(s) for s in range(40)])
    assert result.steps.lr.iloc[0] == pytest.approx(0.2 / 11) and result.steps.lr.iloc[-1] == \
        pytest.approx(0.002)


@pytest.mark.parametrize("kw, match", [
    (dict(lr_schedule="step"), "lr_milestones=.*needs milestones"),
    (dict(lr_schedule="cosine", lr_milestones=(3,)), "lr_milestones='3.0'.*belong to lr_schedule=step"),
    (dict(lr_schedule="step", lr_milestones="30,20"), "must increase"),
    (dict(lr_schedule="step", lr_milestones="30,x"), "list of epochs"),
    (dict(lr_schedule="linear"), "lr_schedule='linear'"),
    (dict(lr_warmup_epochs=-1.0), "lr_warmup_epochs=-1.0"),
    (dict(lr_warmup_epochs=math.inf), "lr_warmup_epochs=inf"),
    (dict(lr_decay=0.0), "lr_decay=0.0.*\\(0, 1\\]"),
    (dict(lr_scaling="sqrt"), "lr_scaling='sqrt'"),
    (dict(lr_reference_batch=0), "lr_reference_batch=0"),
    (dict(precision="fp8"), "precision='fp8'"),
    (dict(augment="heavy"), "augment='heavy'"),
    (dict(data_workers=-1), "data_workers=-1"),
])
def test_bad_schedule_precision_and_data_settings_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


def test_milestones_from_a_flag_or_a_file_are_epochs():
    assert TrainConfig(lr_schedule="step", lr_milestones="30, 60,80").optim.lr_milestones == (30, 60, 80)
    config = TrainConfig.from_dict({"lr_schedule": "step", "lr_milestones": [30, 60.5]})
    assert config.optim.lr_milestones == (30.0, 60.5)
    assert config.to_dict()["lr_milestones"] == [30.0, 60.5]  # plain data for JSON and YAML
