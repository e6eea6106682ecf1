"""Emulated compute: a worker sleeps its forward and backward while real gradients appear on time.

Past the core count, real ranks slow each other's compute and measure nothing; ranks that sleep
cost no CPU, so communication can still be measured at many ranks on one machine. Network
simulators that replay traces do the same (compute as delays, communication for real).

``ComputeProfile`` is a model's step as the real one runs it: forward seconds, backward seconds,
and for each parameter the fraction of the backward at which its gradient is ready (measured
with ``Tensor.register_post_accumulate_grad_hook``, the moment a bucketed allreduce or DDP would
launch). ``EmulatedCompute`` then replaces the model's forward with one that sleeps the forward
time and returns a scalar "loss" whose backward, one autograd node per parameter, sleeps each
parameter's share of the backward and hands it a deterministic pseudo-gradient of its real
shape, dtype and device. The gradients flow through autograd's own ``AccumulateGrad``, so every
gradient hook (our buckets, DDP's reducer) fires as in a real backward, in the same order; the
update, the servers and every message after it are real.

``emulated_profile`` is what the engine asks for: the step a run's workers emulate, measured once
on the first worker and handed to the others (kept per process, ``_MEASURED``, so a sweep on one
cluster's engines measures each model once). Loss and accuracy mean nothing under emulation: the
engine records them as absent.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .data.sources import is_language_model
from .errors import ConfigError
from .precision import autocast
from .records import device_sync

if TYPE_CHECKING:
    from .comm.collectives import Comm
    from .comm.runtime import DistContext
    from .config import TrainConfig
    from .data.sources import ImageSource
    from .options import Roles

#: Deadlines nearer than this are not slept for: a sleep overshoots by tens of microseconds.
MIN_SLEEP_S = 100e-6


@dataclass(frozen=True)
class ComputeProfile:
    """One worker step's compute: ``forward_s`` and ``backward_s`` (seconds), and ``ready[i]``,
    the fraction of the backward after which parameter ``i`` (in ``model.parameters()`` order,
    trainable ones only) has its gradient. ``source`` says where the numbers come from."""

    forward_s: float
    backward_s: float
    ready: tuple[float, ...]
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(name, value, "a time in seconds >= 0")
        if any(not 0.0 <= f <= 1.0 for f in self.ready):
            raise ConfigError("ready", self.ready, "fractions of the backward, each in [0, 1]")

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s

    def scaled(self, step_s: float, source: str) -> ComputeProfile:
        """The same shape (forward share, gradient order and moments) at ``step_s`` a step,
        e.g. a GPU's step time on this machine's measured backward order."""
        if not step_s > 0:
            raise ConfigError("emulated_step_s", step_s, "seconds per step > 0, or none for auto")
        k = step_s / self.step_s if self.step_s > 0 else 0.0
        return ComputeProfile(self.forward_s * k, self.backward_s * k, self.ready, source)


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 5, warmup: int = 2,
            loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
            source: str = "measured") -> ComputeProfile:
    """Time ``steps`` real forward and backward passes of ``model`` on one batch (after
    ``warmup`` untimed ones) and return their medians, with each parameter's median moment of
    readiness. The model's gradients are left as the last backward made them."""
    if steps < 1:
        raise ConfigError("steps", steps, "at least 1 timed step")
    loss_fn = loss_fn or nn.functional.cross_entropy
    params = _trainable(model)
    stamps = [0.0] * len(params)

    def stamp(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            device_sync(x.device)
            stamps[i] = time.perf_counter()
        return hook

    hooks = [p.register_post_accumulate_grad_hook(stamp(i)) for i, p in enumerate(params)]
    forwards, backwards, moments = [], [], []
    try:
        for k in range(warmup + steps):
            for p in params:
                p.grad = None
            device_sync(x.device)
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            device_sync(x.device)
            t1 = time.perf_counter()
            loss.backward()
            device_sync(x.device)
            t2 = time.perf_counter()
            if k >= warmup:
                forwards.append(t1 - t0)
                backwards.append(t2 - t1)
                moments.append([min(1.0, max(0.0, (s - t1) / (t2 - t1))) for s in stamps])
    finally:
        for h in hooks:
            h.remove()
    ready = tuple(statistics.median(m[i] for m in moments) for i in range(len(params)))
    return ComputeProfile(statistics.median(forwards), statistics.median(backwards), ready, source)


class _Ready(torch.autograd.Function):
    """One parameter's share of the backward: its backward sleeps, then hands autograd the
    parameter's pseudo-gradient (which ``AccumulateGrad`` stores and whose hooks then fire)."""

    @staticmethod
    def forward(ctx, param: torch.Tensor, grad: torch.Tensor, wait: Callable[[], None]):  # type: ignore[override]
        ctx.grad, ctx.wait = grad, wait
        return param.new_zeros(())

    @staticmethod
    def backward(ctx, _: torch.Tensor):  # type: ignore[override]
        ctx.wait()
        return ctx.grad, None, None


class EmulatedCompute:
    """Replaces ``model``'s forward and backward by the sleeps of ``profile``; see the module.

    ``install()`` makes ``model(x)`` (or a wrapper's, e.g. DDP's, forward that calls it) sleep
    the forward and return a scalar whose backward sleeps each gradient's share and gives every
    trainable parameter its pseudo-gradient; ``remove()`` restores the real forward. The
    pseudo-gradients are fixed per (seed, parameter): the same on every run, different on each
    rank's seed, of scale ``scale``."""

    def __init__(self, model: nn.Module, profile: ComputeProfile, seed: int = 0,
                 scale: float = 1e-3, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model, self.profile, self.sleep, self.clock = model, profile, sleep, clock
        self.params = _trainable(model)
        if len(profile.ready) != len(self.params):
            raise ConfigError("profile.ready", len(profile.ready),
                              f"one fraction per trainable parameter of the model "
                              f"({len(self.params)}): a profile measured on another model?")
        gen = torch.Generator().manual_seed(seed)
        self.grads = [(torch.randn(p.shape, generator=gen) * scale).to(p.device, p.dtype)
                      for p in self.params]
        # backward order: the earliest-ready gradient's node must run first, and autograd runs
        # the most recently created of the ready nodes first, so they are created latest-first
        self.order = sorted(range(len(self.params)), key=lambda i: -profile.ready[i])
        self.t_backward = 0.0  # when this step's backward began (the loss node's backward)
        self._installed = False

    def _until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the clock, if it is far enough ahead to sleep at all.
        Deadlines, not durations: what the host does between two gradients (AccumulateGrad's
        copy, a hook launching a bucket) then takes the emulated compute's time, not adds to it,
        as a GPU's backward runs on while the host launches, and a sleep's overshoot never
        accumulates."""
        left = deadline - self.clock()
        if left >= MIN_SLEEP_S:
            self.sleep(left)

    def _backward_began(self) -> None:
        self.t_backward = self.clock()

    def forward(self, *_: object, **__: object) -> torch.Tensor:
        """The emulated forward: sleeps ``forward_s``, returns the scalar to call backward on."""
        self._until(self.clock() + self.profile.forward_s)
        ready, backward_s = self.profile.ready, self.profile.backward_s
        nodes = []
        for i in self.order:  # created latest-ready first, so they run earliest first
            def wait(at: float = ready[i] * backward_s) -> None:
                self._until(self.t_backward + at)
            nodes.append(_Ready.apply(self.params[i], self.grads[i], wait))
        loss = torch.stack(nodes).sum() if nodes else torch.zeros((), requires_grad=True)
        return _Tail.apply(loss, self._backward_began,
                           lambda: self._until(self.t_backward + backward_s))

    def install(self) -> EmulatedCompute:
        if not self._installed:
            self.model.forward = self.forward  # type: ignore[method-assign]
            self._installed = True
        return self

    def remove(self) -> None:
        if self._installed:
            del self.model.forward
            self._installed = False


class _Tail(torch.autograd.Function):
    """The loss's own node, so the first of the backward: it marks the backward's start, and
    queues the rest of the backward after the last gradient (e.g. a first layer's input
    gradient) to autograd's end-of-backward callbacks, which run after every gradient's hooks and
    before the callbacks queued later (DDP queues its wait for the buckets at its first gradient),
    as the real tail would."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, began: Callable[[], None],  # type: ignore[override]
                tail: Callable[[], None]):
        ctx.began, ctx.tail = began, tail
        return loss.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.began()
        torch.autograd.Variable._execution_engine.queue_callback(ctx.tail)
        return grad, None, None


def backward_order(model: nn.Module, run: Callable[[], None]) -> list[int]:
    """The order in which ``run()`` (a forward and backward) makes the trainable parameters'
    gradients ready, as indices into ``model.parameters()``'s trainable ones."""
    params, seen = _trainable(model), []
    hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: seen.append(i))
             for i, p in enumerate(params)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


#: The first worker's measured steps under emulated compute, by what decides them (model, batch
#: shape, precision, device, threads): a sweep on one cluster's engines measures once, not once a
#: run (seven real steps each, 8 s of inception_small here, 15% of `make study`'s emulated sweep).
_MEASURED: dict[tuple, ComputeProfile] = {}


def emulated_profile(config: TrainConfig, ctx: DistContext, comm: Comm, roles: Roles,
                     model: nn.Module, train: ImageSource,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                     ) -> ComputeProfile | None:
    """Under ``compute=emulated``, the step every worker emulates (None otherwise): the first
    worker times its real forward and backward (``loss_fn``, the run's loss) on one synthetic
    batch of the run's shape (alone: the other ranks wait in the broadcast that hands it to
    them), then ``emulated_step_s``, if given, rescales it. A process that measured the same
    model, batch, precision, device and threads before hands on that measurement (``_MEASURED``),
    and its source says so. Called on every rank before the algorithm's setup, so no gradient
    hook fires; the model's buffers and the random state are put back as they were."""
    emulation = config.emulation
    if emulation.compute != "emulated":
        return None
    n = sum(1 for p in model.parameters() if p.requires_grad)
    packed = torch.zeros(3 + n, dtype=torch.float64)
    if ctx.rank == roles.workers[0]:
        key = (config.model, tuple(train.input_shape), train.num_classes, config.data.batch_size,
               config.optim.precision, str(ctx.device), torch.get_num_threads(),
               config.system.channels_last)
        measured = _MEASURED.get(key)
        before = measured is not None
        if measured is None:
            state, rng = copy.deepcopy(model.state_dict()), torch.get_rng_state()
            g = torch.Generator().manual_seed(config.data.seed)
            if is_language_model(train):  # token windows, and their next tokens
                x = torch.randint(0, train.num_classes, (config.data.batch_size,
                                                         *train.input_shape), generator=g)
                y = torch.randint(0, train.num_classes, x.shape, generator=g)
            else:
                x = torch.randn(config.data.batch_size, *train.input_shape, generator=g)
                y = torch.randint(0, train.num_classes, (config.data.batch_size,), generator=g)
            x = x.to(ctx.device)
            with autocast(config.optim.precision, ctx.device):
                measured = _MEASURED[key] = measure(model, x, y.to(ctx.device), loss_fn=loss_fn)
            model.load_state_dict(state)
            model.zero_grad(set_to_none=True)
            torch.set_rng_state(rng)
        packed = torch.tensor([measured.forward_s, measured.backward_s, float(before),
                               *measured.ready], dtype=torch.float64)
    if comm.active:
        packed = comm.broadcast(packed.to(ctx.device), root=roles.workers[0]).cpu()
    values = packed.tolist()
    profile = ComputeProfile(values[0], values[1], tuple(values[3:]),
                             f"measured: {config.model}, batch {config.data.batch_size}, "
                             f"rank {roles.workers[0]}"
                             + (" (in an earlier run of its process)" if values[2] else ""))
    if emulation.emulated_step_s is not None:
        profile = profile.scaled(emulation.emulated_step_s,
                                 f"given: {emulation.emulated_step_s:g} s a step, the moments "
                                 f"{profile.source}")
    return profile


__all__: Sequence[str] = ["ComputeProfile", "EmulatedCompute", "backward_order", "emulated_profile",
                          "measure"]
