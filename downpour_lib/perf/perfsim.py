"""A discrete-event simulation of the asynchronous algorithms, for the performance model.

Where there is no barrier, a step's time is not a formula: it depends on who queues behind whom at a
server's card, and a slow worker shifts everyone's staleness. ``simulate`` runs the protocols our
implementations run (``algorithms/downpour.py``, ``adpsgd.py``, ``easgd_async.py``) as
``simpy`` processes over alpha-beta links (``netmodel.Link``), each card a FIFO resource per
direction (links are full duplex):

- ``downpour`` (Dean et al. 2012): a worker fetches every shard before each step that is a multiple
  of ``n_fetch``, computes, and every ``n_push`` steps (and after its last) pushes its accumulated
  gradient to every shard and waits for the receipt, as ``Downpour._push`` does. A shard applies
  pushes in arrival order; a push's staleness is the shard's version when it is applied minus the
  version the worker fetched. With ``max_staleness`` a shard refuses a staler push and the worker
  fetches before its next step. With ``warmstart`` (Dean et al.'s, as ``Downpour.start``) the other
  workers start once the first worker's pushes alone have moved shard 0 that many times.
- ``adpsgd`` (Lian et al. 2018): training never waits for a peer except through ``max_lag``;
  averaging round r of a rank starts once its training finished step r and exchanges the model with
  the partner of a perfect matching between even and odd ranks, both directions at once.
- ``easgd_async`` (Zhang et al. 2015, Algorithm 2): every ``period`` steps a worker sends its model
  to the center's server and gets the center back.

Slow workers (``slow_workers`` of them, each step ``slowdown`` times the compute) are the first
ranks, as ``--slow-workers`` chooses them. Pure Python over ``simpy``; no ``torch.distributed``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from ..errors import ConfigError
from .netmodel import Link

SIMULATED_ALGORITHMS = ("downpour", "adpsgd", "easgd_async")  # the ones `simulate` can run


@dataclass(frozen=True)
class SimResult:
    """What a simulated run gives the model."""

    algorithm: str
    workers: int
    steps: int  # per worker
    step_s: float  # mean over workers of (time to finish / steps)
    makespan_s: float  # until the last worker finished
    staleness_hist: dict[int, int] = field(default_factory=dict)  # applied pushes by staleness
    refused: int = 0  # pushes a bounded-staleness server refused
    server_busy: float = 0.0  # busiest server card's share of the makespan (inbound)

    @property
    def staleness_fraction(self) -> dict[int, float]:
        total = sum(self.staleness_hist.values())
        return {k: v / total for k, v in sorted(self.staleness_hist.items())} if total else {}


class _Card:
    """A node's network card: one FIFO queue per direction, with the time it was busy."""

    def __init__(self, env: simpy.Environment, link: Link):
        self.env, self.link = env, link
        self.send = simpy.Resource(env, capacity=1)
        self.recv = simpy.Resource(env, capacity=1)
        self.busy = 0.0

    def carry(self, direction: simpy.Resource, nbytes: float):
        with direction.request() as turn:
            yield turn
            t = self.link.transfer_s(nbytes)
            self.busy += t if direction is self.recv else 0.0
            yield self.env.timeout(t)


class _Shard:
    """A parameter-server shard: its card and its version (updates applied so far)."""

    def __init__(self, env: simpy.Environment, link: Link):
        self.card = _Card(env, link)
        self.version = 0


def _compute(index: int, compute_s: float, slow_workers: int, slowdown: float, jitter: float,
             seed: int) -> Callable[[], float]:
    """Worker ``index``'s step times: ``compute_s`` (times ``slowdown`` for the slow ones), each
    drawn from a gamma distribution of that mean whose coefficient of variation is ``jitter``."""
    mean = compute_s * (slowdown if index < slow_workers else 1.0)
    if jitter == 0:
        return lambda: mean
    rng, shape = random.Random(seed * 1_000_003 + index), 1 / jitter**2
    return lambda: mean * rng.gammavariate(shape, 1 / shape)


def _downpour(env, shards, link, index, steps, compute_s, nbytes, n_fetch, n_push,
              max_staleness, warm, warm_pushes, hist, refused, finish):
    part = nbytes / len(shards)
    own = _Card(env, link)
    fetched = [0] * len(shards)
    refetch = False
    if index > 0:
        yield warm
    for t in range(steps):
        if t % n_fetch == 0 or refetch:
            refetch = False
            yield env.all_of([env.process(own.carry(own.recv, nbytes))]
                             + [env.process(shard.card.carry(shard.card.send, part))
                                for shard in shards])
            fetched = [shard.version for shard in shards]
        yield env.timeout(compute_s())
        if (t + 1) % n_push == 0 or t + 1 == steps:
            sends = [env.process(own.carry(own.send, nbytes))]
            sends += [env.process(shard.card.carry(shard.card.recv, part)) for shard in shards]
            yield env.all_of(sends)
            for s, shard in enumerate(shards):  # applied on arrival, in arrival order
                staleness = shard.version - fetched[s]
                if max_staleness is not None and staleness > max_staleness:
                    refused[0] += 1
                    refetch = True
                    continue
                hist[staleness] += 1
                shard.version += 1
            if not warm.triggered and shards[0].version >= warm_pushes:
                warm.succeed()
            # a fetch follows a push only at the n_fetch boundary; between fetches the worker
            # moves its own copy, so its next push is staler by the updates it has not fetched
    finish[index] = env.now


def _easgd(env, center, link, index, steps, compute_s, nbytes, period, finish):
    own = _Card(env, link)
    for t in range(steps):
        yield env.timeout(compute_s())
        if (t + 1) % period == 0:
            yield env.all_of([env.process(own.carry(own.send, nbytes)),
                              env.process(center.card.carry(center.card.recv, nbytes))])
            yield env.process(center.card.carry(center.card.send, nbytes))
    finish[index] = env.now


def partner(rank: int, round_: int, workers: int) -> int | None:
    """The rank's averaging partner in round ``round_``: even ranks with odd ones, a different
    perfect matching each round (``None``: a rank left over when ``workers`` is odd)."""
    pairs = workers // 2 * 2
    if rank >= pairs:
        return None
    k = round_ % (pairs // 2)
    if rank % 2 == 0:
        return (rank + 2 * k + 1) % pairs
    return (rank - 2 * k - 1) % pairs


def simulate(algorithm: str, workers: int, *, compute_s: float, model_bytes: float, link: Link,
             steps: int = 200, servers: int = 1, n_fetch: int = 1, n_push: int = 1,
             period: int = 4, max_lag: int = 1, max_staleness: int | None = None,
             warmstart: int = 0, slow_workers: int = 0, slowdown: float = 1.0,
             jitter: float = 0.0, seed: int = 0) -> SimResult:
    """Run ``steps`` steps of every worker of ``algorithm`` and measure them. With ``jitter`` > 0
    each step's compute varies (gamma-distributed, that coefficient of variation, drawn from
    ``seed``): a real run's steps do, and without it two equal workers lock into one phase."""
    if algorithm not in SIMULATED_ALGORITHMS:
        raise ConfigError("algorithm", algorithm, "simulated: " + ", ".join(SIMULATED_ALGORITHMS))
    for name, value in (("workers", workers), ("steps", steps), ("servers", servers),
                        ("n_fetch", n_fetch), ("n_push", n_push), ("period", period),
                        ("max_lag", max_lag)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(name, value, "an integer >= 1")
    if not 0 <= slow_workers <= workers:
        raise ConfigError("slow_workers", slow_workers, f"between 0 and workers={workers}")
    if isinstance(warmstart, bool) or not (isinstance(warmstart, int) and warmstart >= 0):
        raise ConfigError("warmstart", warmstart, "a whole number of pushes >= 0")
    if not (math.isfinite(jitter) and 0 <= jitter < 10):
        raise ConfigError("jitter", jitter, "a coefficient of variation >= 0, e.g. 0.2 (0: none)")
    if not slowdown >= 1:
        raise ConfigError("slowdown", slowdown, "a factor >= 1 (1: no slowdown)")
    env = simpy.Environment()
    finish = [0.0] * workers
    hist: Counter[int] = Counter()
    refused = [0]
    cards: list[_Card] = []
    if algorithm == "downpour":
        shards = [_Shard(env, link) for _ in range(servers)]
        cards = [s.card for s in shards]
        warm = env.event()  # the first worker's warmstart is over
        warm_pushes = min(warmstart, -(-steps // n_push))
        if warm_pushes == 0:
            warm.succeed()
        for i in range(workers):
            env.process(_downpour(env, shards, link, i, steps,
                                  _compute(i, compute_s, slow_workers, slowdown, jitter, seed), model_bytes,
                                  n_fetch, n_push, max_staleness, warm, warm_pushes, hist, refused,
                                  finish))
    elif algorithm == "easgd_async":
        center = _Shard(env, link)
        cards = [center.card]
        for i in range(workers):
            env.process(_easgd(env, center, link, i, steps,
                               _compute(i, compute_s, slow_workers, slowdown, jitter, seed), model_bytes,
                               period, finish))
    else:
        _adpsgd(env, link, workers, steps, [_compute(i, compute_s, slow_workers, slowdown, jitter,
                                                     seed) for i in range(workers)],
                model_bytes, max_lag, finish)
    env.run()
    makespan = max(finish)
    busy = max((c.busy for c in cards), default=0.0)
    return SimResult(algorithm, workers, steps, sum(finish) / (workers * steps), makespan,
                     dict(sorted(hist.items())), refused[0], busy / makespan if makespan else 0.0)


def _adpsgd(env, link, workers, steps, computes, nbytes, max_lag, finish):
    """Each rank: a training process and an averaging process (its thread)."""
    trained = [[env.event() for _ in range(steps)] for _ in range(workers)]
    averaged = [[env.event() for _ in range(steps)] for _ in range(workers)]
    cards = [_Card(env, link) for _ in range(workers)]

    def train(i: int):
        for t in range(steps):
            yield env.timeout(computes[i]())
            if t - max_lag >= 0:  # the update of step t waits for round t - max_lag
                yield averaged[i][t - max_lag]
            trained[i][t].succeed()
        for r in range(max(0, steps - max_lag), steps):
            yield averaged[i][r]
        finish[i] = env.now

    def average(i: int):
        for r in range(steps):
            yield trained[i][r]
            j = partner(i, r, workers)
            if j is not None:
                yield trained[j][r]  # the pair meets: both finished step r
                yield env.all_of([env.process(cards[i].carry(cards[i].send, nbytes)),
                                  env.process(cards[i].carry(cards[i].recv, nbytes))])
            averaged[i][r].succeed()

    for i in range(workers):
        env.process(train(i))
        env.process(average(i))
