"""Emulated compute (downpour_lib.emulate): real gradients' shapes, order and moments, no compute.

The schedule is checked on a simulated clock (every sleep advances it by what was asked plus a
fixed overshoot), so the moments asserted are the schedule's own, not this machine's timing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from downpour_lib.emulate import ComputeProfile, EmulatedCompute, backward_order, measure
from downpour_lib.errors import ConfigError
from downpour_lib.models import build_model


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
    for i in range(n):  # overshoot is paid back: no drift beyond one sleep's overshoot
        assert moments[i] == pytest.approx(0.010 + ready[i] * 0.020, abs=2 * clock.over)
    assert clock.t == pytest.approx(0.030, abs=2 * clock.over)  # the tail after the last gradient


def test_bad_profiles_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match="backward_s"):
        ComputeProfile(0.1, -1.0, ())
    with pytest.raises(ConfigError, match="ready"):
        ComputeProfile(0.1, 0.1, (1.5,))
    with pytest.raises(ConfigError, match="profile.ready"):
        EmulatedCompute(_model(), ComputeProfile(0.1, 0.1, (0.5,)))
    with pytest.raises(ConfigError, match="compute_s"):
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
