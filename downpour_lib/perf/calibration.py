"""What a prediction reads and writes: a model's ``Workload`` on one device, the ``Calibration`` of
the hardware (the JSON ``downpour model calibrate`` writes; a hardware YAML, ``hardware.py``, is the
hand-written way in) and a ``Prediction``, a row of ``downpour model predict``.

Each checks its fields as it is built: a bad value is a ``ConfigError`` naming the field, the value
and what would work, wherever it came from (a file, a flag, a test).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from .netmodel import COLLECTIVES, Link, Network
from .terms import NodeCompute, check_precision

MIB = 1 << 20

#: how gradients become messages: DDP's fixed buckets, or Horovod's fusion of what is ready
BUCKETING = ("fixed", "ready")


@dataclass(frozen=True)
class Workload:
    """One model on one device: what a worker computes per step."""

    model: str
    batch_size: int  # samples per worker per step
    compute_s: float  # one worker's step without communication
    param_bytes: float  # what one allreduce, push or gossip message carries
    backward_fraction: float = 2 / 3  # backward's share of compute: where buckets can overlap
    source: str = ""  # where compute_s comes from
    #: share of backward done when each tenth (or 1/len) of the gradient bytes is ready, in the
    #: order backward makes them (``terms.gradient_ready_at``); empty: ready evenly over backward
    ready_at: tuple[float, ...] = ()
    #: gradient accumulation: forward+backward passes per allreduce (1: every step). A step of
    #: ``compute_s`` x accumulation; the allreduce overlaps only the last pass's backward
    accumulation: int = 1
    #: one sample's compute the framework's work is counted in (``Calibration.framework``): a
    #: mixed-precision model's full-precision sample, as tensor cores speed up its math and not
    #: the framework (``terms.FRAMEWORK_RANGE``); None: this workload's own
    framework_sample_s: float | None = None
    #: the precision it runs at (``terms.PRECISIONS``): sets what a busy node costs its step
    precision: str = "fp32"
    #: what a busy node costs this model where its input pipeline is not the calibration's (a
    #: language model reading tokens has no image pipeline: ``NodeCompute()``); None: the
    #: calibration's ``node_compute``
    node_compute: NodeCompute | None = None
    #: the devices a worker spans (a hardware file's ``devices_per_worker``): more than 1, a
    #: whole node's, in a network of one worker a node
    devices_per_worker: int = 1
    #: the optimizer's update, once a step, in seconds: (low, high), not measured
    #: (``terms.optimizer_s``; a hardware file's ``optimizer``), or one value twice (measured:
    #: the runs' ``update_s``, ``calibrate.workloads_from_study``). ``compute_s``
    #: holds it spread over the ``measured_accumulation`` passes it was measured at; a step of
    #: other passes pays it once all the same. (0, 0): inside ``compute_s`` at any accumulation
    optimizer_s: tuple[float, float] = (0.0, 0.0)
    #: the passes a step accumulated where ``compute_s`` was measured (None: ``accumulation``)
    measured_accumulation: int | None = None
    #: forward multiply-adds a parameter in one sample, where a hardware file gives
    #: ``multiply_adds``: the framework's work is counted in parameters' worth of that compute
    #: (``terms.FRAMEWORK_MACS_PER_PARAMETER``), a unit measured on models of 160 to 440
    macs_per_parameter: float | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        try:
            low, high = (float(t) for t in self.optimizer_s)
        except (TypeError, ValueError):
            low, high = math.nan, math.nan  # refused below, as a bad range is
        if not (math.isfinite(high) and 0 <= low <= high):
            raise ConfigError("optimizer_s", list(self.optimizer_s), "(low, high) seconds of the "
                              "optimizer's update, 0 <= low <= high")
        object.__setattr__(self, "optimizer_s", (low, high))
        if self.measured_accumulation is None:
            object.__setattr__(self, "measured_accumulation", self.accumulation)
        if isinstance(self.devices_per_worker, bool) or not (
                isinstance(self.devices_per_worker, int) and self.devices_per_worker >= 1):
            raise ConfigError("devices_per_worker", self.devices_per_worker, "an integer >= 1")
        if isinstance(self.accumulation, bool) or not (isinstance(self.accumulation, int)
                                                       and self.accumulation >= 1):
            raise ConfigError("accumulation", self.accumulation,
                              "passes per allreduce, an integer >= 1 (1: no accumulation)")
        ready = tuple(float(t) for t in self.ready_at)
        object.__setattr__(self, "ready_at", ready)  # a JSON list reads back as the tuple
        if ready and not (all(0 <= a <= b <= 1 for a, b in zip(ready, ready[1:] + (1,), strict=True))
                          and ready[-1] == 1):
            raise ConfigError("ready_at", list(ready), "shares of backward in [0, 1], "
                              "non-decreasing, the last 1 (terms.gradient_ready_at)")
        if not (math.isfinite(self.compute_s) and self.compute_s > 0):
            raise ConfigError("compute_s", self.compute_s, "seconds per step > 0")
        if not self.param_bytes > 0:
            raise ConfigError("param_bytes", self.param_bytes, "the model's size in bytes > 0")
        if isinstance(self.backward_fraction, bool) or not isinstance(
                self.backward_fraction, (int, float)) or not 0 <= self.backward_fraction <= 1:
            raise ConfigError("backward_fraction", self.backward_fraction, "a share in [0, 1]")
        if self.framework_sample_s is not None and (
                isinstance(self.framework_sample_s, bool)
                or not isinstance(self.framework_sample_s, (int, float))
                or not (math.isfinite(self.framework_sample_s) and self.framework_sample_s > 0)):
            raise ConfigError("framework_sample_s", self.framework_sample_s,
                              "seconds of one sample's compute > 0, or null (the workload's own)")


@dataclass(frozen=True)
class Calibration:
    """Everything a prediction needs besides the algorithm and N, and where it came from.

    ``to_dict`` is the calibration JSON that ``downpour model calibrate`` writes (``load`` reads
    it; a hardware YAML, ``hardware.py``, is the hand-written way in). Its keys, SI units::

        name            rows of `model predict` name it
        network.intra   {alpha_s, bandwidth_Bps}: between ranks of a node (achieved, not line rate)
        network.inter   {alpha_s, bandwidth_Bps}: a node's card, shared by its ranks
        network.per_node            workers per node
        network.gamma_s_per_byte    reduction cost per byte (CPU backends; 0 for GPUs)
        network.node_Bps            a node's memory throughput its ranks share (memcpy), or null
        network.cores               a node's cores (ranks beyond them time-share), or null
        workloads.MODEL {model, batch_size, compute_s, param_bytes, backward_fraction, source,
                         ready_at, accumulation, framework_sample_s, precision}: ready_at, when
                         each tenth of the gradient is ready in backward; framework_sample_s, the
                         sample the framework's work is counted in (null: compute_s / batch_size);
                         precision, fp32 or amp (terms.PRECISIONS); node_compute, its own where
                         its input pipeline is not the calibration's (null: the calibration's);
                         devices_per_worker, more than 1 where a worker is a whole node
        collective      ring, tree, hierarchical or auto
        bucket_bytes    gradient bucket (DDP's bucket_cap_mb in bytes)
        bucketing       fixed (DDP's buckets) or ready (Horovod's fusion of what is ready)
        overlap         measured share of the bucket pipeline achieved, or null (a band)
        jitter          coefficient of variation of a step's compute (steps.csv)
        device_spread   coefficient of variation of the devices' own speeds
        node_spread     coefficient of variation of the nodes' own speeds (a node's devices
                        share it)
        framework       the framework's own work a round of communication, in samples of
                        compute, or null (a range)
        node_compute    {fp32, amp, at, source}: the share of a step lost when a node's
                        devices share it, by precision, at ``at`` devices
        source          where all of it came from
    """

    name: str
    network: Network
    workloads: dict[str, Workload]  # model name -> its workload on this device
    collective: str = "ring"  # the allreduce algorithm: ring, tree, hierarchical or auto
    bucket_bytes: float = 25 * MIB  # DDP's bucket_cap_mb; Horovod's fusion threshold is 64 MiB
    #: share of the ideal bucket pipeline achieved (0: none, 1: ideal); None where it was not
    #: measured: then a prediction is a band between 0 and 1 (``step_s_low``, ``step_s_high``)
    overlap: float | None = 1.0
    source: str = ""  # the measurement or publication it came from
    #: coefficient of variation of one worker's step times (a run's steps.csv): a synchronous
    #: step waits for the slowest of N (``terms.straggler_factor``)
    jitter: float = 0.0
    #: compute lost when devices share a node (``terms.NodeCompute``; none by default)
    node_compute: NodeCompute = field(default_factory=NodeCompute)
    #: how gradients become messages: ``fixed`` buckets of ``bucket_bytes`` in backward's order,
    #: each sent once all of it is ready (PyTorch DDP); ``ready``: each message takes what is
    #: ready when the link frees, up to ``bucket_bytes`` (Horovod's Tensor Fusion)
    bucketing: str = "fixed"
    #: what was not measured, as ranges (``terms``): the network's cross-node bandwidth times
    #: each end of ``inter_rate`` (favourable, unfavourable; 1, 1: measured); ``jitter_high``:
    #: jitter ranges from ``jitter`` to it (None: measured)
    inter_rate: tuple[float, float] = (1.0, 1.0)
    jitter_high: float | None = None
    #: coefficient of variation of the devices' own speeds: one slower than its peers stays
    #: slower, so the slowest of N sets every synchronous step whatever it accumulates;
    #: ``device_spread_high``: a range from ``device_spread`` to it (None: measured;
    #: ``terms.DEVICE_SPREAD_RANGE``). A calibration on one host's identical cores: none.
    device_spread: float = 0.0
    device_spread_high: float | None = None
    #: coefficient of variation of the nodes' own speeds, which a node's devices share: across
    #: nodes the step waits for the slowest node too; ``node_spread_high`` as above
    #: (``terms.NODE_SPREAD_RANGE``). A calibration on one host: none.
    node_spread: float = 0.0
    node_spread_high: float | None = None
    #: the framework's own work a round of communication beyond the messages (DDP's hooks, bucket
    #: copies, the collective's kernels beside backward), in one sample's compute; None where it
    #: was not measured: a range (``terms.FRAMEWORK_RANGE``). A measured calibration's steps have it.
    framework: float | None = 0.0
    #: the cross-node link's transport (``terms.TRANSPORT_RATE``) where ``inter_rate`` is its
    #: published range, so that the link at another line rate takes that rate's range
    #: (``hardware.with_fields``); None where the rate was measured or fitted
    inter_transport: str | None = None

    def __post_init__(self) -> None:
        # a JSON list reads back as the tuple
        object.__setattr__(self, "inter_rate", tuple(float(v) for v in self.inter_rate))
        if self.overlap is not None and not 0 <= self.overlap <= 1:
            raise ConfigError("overlap", self.overlap, "a share in [0, 1], or None (not measured)")
        for name in ("jitter", "device_spread", "node_spread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (math.isfinite(value) and value >= 0):
                raise ConfigError(name, value, "a coefficient of variation >= 0, e.g. 0.05")
        if self.framework is not None and (isinstance(self.framework, bool) or not isinstance(
                self.framework, (int, float)) or not (math.isfinite(self.framework)
                                                      and self.framework >= 0)):
            raise ConfigError("framework", self.framework, "samples of compute a step >= 0, "
                              "e.g. 2.5, or None (not measured: a range)")
        if self.collective not in COLLECTIVES:
            raise ConfigError("collective", self.collective, "choose from " + ", ".join(COLLECTIVES))
        if self.bucketing not in BUCKETING:
            raise ConfigError("bucketing", self.bucketing, "choose from " + ", ".join(BUCKETING))

    def workload(self, model: str) -> Workload:
        if model not in self.workloads:
            raise ConfigError("model", model, f"calibration {self.name!r} has "
                              + ", ".join(sorted(self.workloads)))
        return self.workloads[model]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        net = dict(d["network"])
        network = Network(**{**net, "intra": Link(**net["intra"]), "inter": Link(**net["inter"])})
        workloads = {k: Workload(**{**w, "node_compute": NodeCompute(**w["node_compute"])})
                     if w.get("node_compute") else Workload(**w) for k, w in d["workloads"].items()}
        node = dict(d.get("node_compute") or {})
        if "c" in node:  # a calibration written under the rate law (before the precision law)
            if node["c"]:
                raise ConfigError("node_compute", node, "a measured calibration has none: "
                                  "calibrate again, or give the hardware as a YAML file")
            node = {k: node[k] for k in ("at", "source") if k in node}
        d = {k: v for k, v in d.items() if k != "host_law"}  # the rate law's range, likewise
        return cls(**{**d, "network": network, "workloads": workloads,
                      "node_compute": NodeCompute(**node)})


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
    efficiency: float  # samples_per_s / (workers x one device alone at the same passes a step)
    bytes_per_step: float  # sent by one worker per step
    calibration: str
    collective: str
    staleness_mean: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: the band where the calibration's overlap was not measured (overlap 1 and 0); else the point
    step_s_low: float = math.nan
    step_s_high: float = math.nan
    efficiency_low: float = math.nan
    efficiency_high: float = math.nan
    compute_efficiency: float = 1.0  # of one device alone, with its node's others busy
    straggler: float = 1.0  # the slowest worker's compute over the mean one's

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        row.update({f"options.{k}": v for k, v in row.pop("options").items()})
        return row

