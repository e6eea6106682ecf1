"""A performance model of data-parallel training: one worker's step of each algorithm at N workers.

A step is the worker's computation (data, forward, backward, update: measured for the model and the
device) plus the communication its algorithm cannot hide, on a network of alpha-beta links
(``netmodel``):

- ``allreduce``, ``ddp``: the gradients allreduced (ring, tree or hierarchical) in buckets that start
  as backward produces them (``pipeline_exposed_s``); ``overlap`` in [0, 1] says how much of that
  ideal pipeline a system achieves (measured: ``calibrate.overlap_from_study``);
- ``sync_ps``: push to and pull from S server shards, whose cards are the bottleneck;
- ``sgp``, ``dpsgd``: gossip to one peer (SGP, Assran et al. 2019) or to both ring neighbours
  (D-PSGD, Lian et al. 2017); ``osgp`` hides the gossip behind the next step's computation;
- ``localsgd``, ``diloco``, ``slowmo``, sync ``easgd``: one allreduce of the model every ``period``
  steps, amortized over the period;
- the asynchronous ones (``downpour``, ``adpsgd``, async ``easgd``) through the discrete-event
  simulation of ``perfsim``, which also gives Downpour's staleness.

What it leaves out, on purpose: compute that slows with N (memory or CPU contention on a shared
node; a calibration measured at the worker counts it predicts avoids it), stragglers in synchronous
steps (the simulation has slow workers), congestion between jobs, and algorithms' accuracy: it
predicts time per step, not steps to a target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..topology import exponential_offsets, make_topology
from .netmodel import Network, allreduce_s, gossip_s, pipeline_exposed_s, ps_transfer_s

MIB = 1 << 20

#: algorithm -> how its communication is modelled
SYNC_ALLREDUCE = ("allreduce", "ddp")
PERIODIC = ("localsgd", "diloco", "slowmo", "easgd")
GOSSIP = ("sgp", "osgp", "dpsgd")
SIMULATED = ("downpour", "adpsgd")
ALGORITHMS = ("sync_ps",) + SYNC_ALLREDUCE + GOSSIP + SIMULATED + PERIODIC

#: the defaults of our implementations (their Options), so a prediction models what runs
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "localsgd": {"period": 4}, "slowmo": {"period": 4}, "easgd": {"period": 4, "mode": "sync"},
    "diloco": {"period": 20}, "sync_ps": {"servers": 1}, "downpour": {"servers": 1, "n_fetch": 1,
                                                                   "n_push": 1},
    "sgp": {"topology": "exponential", "peers_per_step": 1},
    "osgp": {"topology": "exponential", "peers_per_step": 1}, "dpsgd": {"topology": "ring"},
}


#: the options a prediction reads (others, e.g. a learning rate, do not change a step's time)
MODELLED_OPTIONS = ("servers", "n_fetch", "n_push", "period", "mode", "topology", "peers_per_step",
                    "max_lag", "max_staleness", "warmstart", "slow_workers", "slowdown")


@dataclass(frozen=True)
class Workload:
    """One model on one device: what a worker computes per step."""

    model: str
    batch_size: int  # samples per worker per step
    compute_s: float  # one worker's step without communication
    param_bytes: float  # what one allreduce, push or gossip message carries
    backward_fraction: float = 2 / 3  # backward's share of compute: where buckets can overlap
    source: str = ""  # where compute_s comes from

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compute_s) and self.compute_s > 0):
            raise ConfigError("compute_s", self.compute_s, "seconds per step > 0")
        if not self.param_bytes > 0:
            raise ConfigError("param_bytes", self.param_bytes, "the model's size in bytes > 0")
        if not 0 <= self.backward_fraction <= 1:
            raise ConfigError("backward_fraction", self.backward_fraction, "a share in [0, 1]")


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction needs besides the algorithm and N, and where it came from."""

    name: str
    network: Network
    workloads: dict[str, Workload]  # model name -> its workload on this device
    collective: str = "ring"  # the allreduce algorithm: ring, tree or hierarchical
    bucket_bytes: float = 25 * MIB  # DDP's bucket_cap_mb; Horovod's fusion threshold is 64 MiB
    overlap: float = 1.0  # share of the ideal bucket pipeline achieved (0: none, 1: ideal)
    source: str = ""  # the measurement or publication it came from

    def __post_init__(self) -> None:
        if not 0 <= self.overlap <= 1:
            raise ConfigError("overlap", self.overlap, "a share in [0, 1]")

    def workload(self, model: str) -> Workload:
        if model not in self.workloads:
            raise ConfigError("model", model, f"calibration {self.name!r} has "
                              + ", ".join(sorted(self.workloads)))
        return self.workloads[model]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        from .netmodel import Link

        net = d["network"]
        network = Network(Link(**net["intra"]), Link(**net["inter"]), net["per_node"])
        workloads = {k: Workload(**w) for k, w in d["workloads"].items()}
        return cls(**{**d, "network": network, "workloads": workloads})


@dataclass(frozen=True)
class Prediction:
    """One predicted point: a row of ``downpour model predict``."""

    algorithm: str
    workers: int
    model: str
    step_s: float
    compute_s: float
    comm_s: float  # communication not hidden behind computation
    samples_per_s: float  # all workers together
    efficiency: float  # samples_per_s / (workers x one worker without communication)
    bytes_per_step: float  # sent by one worker per step
    calibration: str
    collective: str
    staleness_mean: float | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        row.update({f"options.{k}": v for k, v in row.pop("options").items()})
        return row


def modelled_options(row: Mapping[str, Any]) -> dict[str, Any]:
    """The options a prediction reads from a run's summary or study row (its ``options.KEY``
    entries; missing and NaN ones left out, whole numbers from a CSV's floats made ints)."""
    out = {}
    for key in MODELLED_OPTIONS:
        value = row.get(f"options.{key}")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        out[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return out


def options_for(algorithm: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, "choose from " + ", ".join(ALGORITHMS))
    return {**DEFAULT_OPTIONS.get(algorithm, {}), **(options or {})}


def gossip_peers(workers: int, opts: Mapping[str, Any]) -> int:
    """How many others a gossip worker sends its model to per step: the out-peers of the graph the
    run builds from its ``topology`` and ``peers_per_step`` (at a sweep's small N, where the
    exponential graph has fewer hops than asked for, all of them)."""
    name, per_step = opts.get("topology", "exponential"), int(opts.get("peers_per_step", 1))
    if name == "exponential":
        per_step = min(per_step, max(1, len(exponential_offsets(workers))))
    return len(make_topology(name, workers, per_step).out_peers(0, 0))


def bucketed_allreduce_s(workers: int, w: Workload, cal: Calibration) -> tuple[float, float]:
    """(all of the allreduce, what of it backward does not hide) for one step's gradients."""
    buckets = max(1, math.ceil(w.param_bytes / cal.bucket_bytes))
    total = buckets * allreduce_s(workers, w.param_bytes / buckets, cal.network, cal.collective)
    ideal = pipeline_exposed_s(total, buckets, w.backward_fraction * w.compute_s)
    return total, (1 - cal.overlap) * total + cal.overlap * ideal


def simulated_steps(workers: int) -> int:
    """Steps per worker a simulation runs: enough for the queues to reach their steady state
    (200 at a few workers; about 20,000 pushes in all at many, at least 20 each)."""
    return min(200, max(20, 20_000 // workers))


def predict(cal: Calibration, algorithm: str, workers: int, model: str,
            options: dict[str, Any] | None = None, steps: int | None = None) -> Prediction:
    """The step time of ``algorithm`` at ``workers`` workers training ``model``."""
    if not (isinstance(workers, int) and workers >= 1):
        raise ConfigError("workers", workers, "an integer >= 1")
    opts = options_for(algorithm, options)
    w = cal.workload(model)
    net, m, c = cal.network, w.param_bytes, w.compute_s
    staleness = None
    if workers == 1 and algorithm not in ("sync_ps", "downpour"):
        exposed, sent = 0.0, 0.0  # nothing to talk to
    elif algorithm in SYNC_ALLREDUCE:
        _, exposed = bucketed_allreduce_s(workers, w, cal)
        sent = 2 * (workers - 1) / workers * m
    elif algorithm == "sync_ps":
        exposed = 2 * ps_transfer_s(workers, m, opts["servers"], net)
        sent = m
    elif algorithm in GOSSIP:
        peers = gossip_peers(workers, opts)
        comm = gossip_s(m, peers, net.path(workers))
        exposed = max(0.0, comm - c) if algorithm == "osgp" else comm
        sent = peers * m
    elif algorithm in PERIODIC and opts.get("mode", "sync") == "sync":
        period = opts["period"]
        exposed = allreduce_s(workers, m, net, cal.collective) / period
        sent = 2 * (workers - 1) / workers * m / period
    else:  # asynchronous: simulated
        from .perfsim import simulate

        link = net.path(workers + opts.get("servers", 0))
        sim_opts = {k: opts[k] for k in ("servers", "n_fetch", "n_push", "period", "max_lag",
                                         "max_staleness", "warmstart", "slow_workers", "slowdown")
                    if k in opts}
        result = simulate(algorithm, workers, compute_s=c, model_bytes=m, link=link,
                          steps=steps or simulated_steps(workers), **sim_opts)
        exposed = max(0.0, result.step_s - c)
        if result.staleness_hist:
            total = sum(result.staleness_hist.values())
            staleness = sum(k * v for k, v in result.staleness_hist.items()) / total
        sent = m / opts.get("n_push", opts.get("period", 1))
    step = c + exposed
    samples = workers * w.batch_size / step
    return Prediction(algorithm, workers, model, step, c, exposed, samples,
                      samples / (workers * w.batch_size / c), sent, cal.name, cal.collective,
                      staleness, opts)


def predict_rows(cal: Calibration, algorithms: list[str], workers: list[int], model: str,
                 options: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every algorithm at every worker count, as rows (the CSV and JSON of ``downpour model``)."""
    return [predict(cal, a, n, model, (options or {}).get(a)).row()
            for a in algorithms for n in workers]
