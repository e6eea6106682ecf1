"""A performance model of data-parallel training: one worker's step of each algorithm at N workers.

A step is the worker's computation (data, forward, backward, update: measured for the model and the
device, less what is lost when its node's other devices are busy: ``terms.NodeCompute``), the wait
for the slowest of N in synchronous algorithms (``terms.straggler_factor`` of a step's jitter, the
devices' own spread and, across nodes, the nodes', or ``slow_workers``), plus the communication its
algorithm cannot hide, on a network of alpha-beta links (``netmodel``). What an algorithm sends is
what its options class declares (``traffic``, one of ``TRAFFIC``):

- ``collective`` (allreduce, ddp): the gradients allreduced (ring, tree, hierarchical, or what
  NCCL's tuner would run per bucket: ``netmodel.nccl_choices``) in buckets that start as backward
  produces them (``pipeline_exposed_s``); ``overlap`` in [0, 1] says how much of that ideal pipeline a system
  achieves (measured: ``calibrate.overlap_from_study``; not measured: a band from 0 to 1);
- ``push_pull`` (sync_ps): push to and pull from S server shards, whose cards are the bottleneck;
- ``gossip`` (sgp, dpsgd): to one peer (SGP, Assran et al. 2019) or to both ring neighbours
  (D-PSGD, Lian et al. 2017); ``overlapped_gossip`` (osgp) hides it behind the next step;
- ``periodic`` (localsgd, diloco, slowmo, easgd): one allreduce of the model every ``period``
  steps, amortized over the period;
- ``async_push_pull``, ``async_gossip`` (downpour, easgd_async, adpsgd): the discrete-event
  simulation of ``perfsim``, which also gives Downpour's staleness.

What it leaves out: congestion between jobs, and algorithms' accuracy: it predicts time per step,
not steps to a target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..options import OPTIONS, AlgorithmOptions
from ..topology import exponential_offsets, make_topology
from ..traffic import ring_share
from .calibration import Calibration, Prediction, Workload
from .netmodel import (
    Link,
    allreduce_s,
    gossip_s,
    pipeline_exposed_s,
    ps_transfer_s,
)
from .terms import (
    FRAMEWORK_RANGE,
    MEASUREMENT_SPREAD,
    OVERLAP_RANGE,
    NodeCompute,
    straggler_factor,
)

#: what an algorithm sends a step, as its options class declares it (``traffic``, beside its
#: options in ``downpour_lib.algorithms``): the model reads the registry, not a list of names
TRAFFIC = {
    "collective": "the gradients allreduced in buckets, every step",
    "push_pull": "push to and pull from S server shards, every step, in lock-step",
    "gossip": "the model sent to k peers of a graph, every step",
    "overlapped_gossip": "k-peer gossip hidden behind the next step's computation",
    "periodic": "the model allreduced once every `period` steps",
    "async_push_pull": "push and fetch to S shards, each worker on its own clock (simulated)",
    "async_gossip": "pairwise averaging on each worker's own clock (simulated)",
    "none": "no communication",
}
SIMULATED = ("async_push_pull", "async_gossip")


#: algorithm name -> its options class: every algorithm but ``local`` (one process: nothing to
#: predict at N workers)
MODELLED_ALGORITHMS: dict[str, type[AlgorithmOptions]] = {name: cls for name, cls in OPTIONS.items()
                                                 if name != "local"}


#: the options a prediction reads (others, e.g. a learning rate, do not change a step's time)
MODELLED_OPTIONS = ("servers", "n_fetch", "n_push", "period", "topology", "peers_per_step",
                    "max_lag", "max_staleness", "warmstart", "slow_workers", "slowdown")


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


#: options a prediction reads that are not fields of an algorithm's options (the simulation's)
_SIMULATION_ONLY = ("slow_workers", "slowdown")


def options_for(algorithm: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The modelled options of ``algorithm``: its options class's defaults, updated by ``options``,
    so that a prediction models what runs."""
    import dataclasses

    from ..options.base import build_options

    registry = MODELLED_ALGORITHMS
    if algorithm not in registry:
        raise ConfigError("algorithm", algorithm, "choose from " + ", ".join(registry))
    cls, given = registry[algorithm], dict(options or {})
    own = {f.name for f in dataclasses.fields(cls)}
    # the options class checks what it holds, as a run's would (localsgd.period=0 divided by 0)
    built = build_options(algorithm, cls, {k: v for k, v in given.items() if k in own})
    fields = {name: getattr(built, name) for name in own if name in MODELLED_OPTIONS}
    return {**given, **{k: v for k, v in fields.items() if v is not None}}


def readable_options(algorithm: str) -> tuple[str, ...]:
    """The options of ``algorithm`` a prediction reads: its options class's modelled fields, and
    the slow workers every synchronous wait takes."""
    import dataclasses

    own = {f.name for f in dataclasses.fields(MODELLED_ALGORITHMS[algorithm])}
    return tuple(k for k in MODELLED_OPTIONS if k in own) + _SIMULATION_ONLY


def option_value(raw: str) -> int | float | str:
    """An option's value as written (``--option ALG.KEY=VALUE``, a checks file's ``options``): an
    int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def traffic(algorithm: str) -> str:
    """What ``algorithm`` sends a step: its options class's ``traffic`` (one of ``TRAFFIC``)."""
    cls = MODELLED_ALGORITHMS[algorithm]
    pattern = getattr(cls, "traffic", None)
    if pattern not in TRAFFIC:
        raise ConfigError("algorithm", algorithm, f"its {cls.__name__} declares no `traffic` of "
                          + ", ".join(TRAFFIC) + ": add one beside its options")
    return pattern


def gossip_peers(workers: int, opts: Mapping[str, Any]) -> int:
    """How many others a gossip worker sends its model to per step: the out-peers of the graph the
    run builds from its ``topology`` and ``peers_per_step`` (at a sweep's small N, where the
    exponential graph has fewer hops than asked for, all of them)."""
    name, per_step = opts.get("topology", "exponential"), int(opts.get("peers_per_step", 1))
    if name == "exponential":
        per_step = min(per_step, max(1, len(exponential_offsets(workers))))
    return len(make_topology(name, workers, per_step).out_peers(0, 0))


def bucketed_allreduce_s(workers: int, w: Workload, cal: Calibration,
                         compute_s: float | None = None,
                         overlap: float | None = None) -> tuple[float, float]:
    """(all of the allreduce, what of it backward does not hide) for one step's gradients, of a
    step computing ``compute_s`` (default: the workload's) at ``overlap`` (default: the
    calibration's; 1 where it was not measured)."""
    buckets = max(1, math.ceil(w.param_bytes / cal.bucket_bytes))
    total = buckets * allreduce_s(workers, w.param_bytes / buckets, cal.network, cal.collective)
    backward = w.backward_fraction * (compute_s if compute_s is not None else w.compute_s)
    if cal.bucketing == "ready":
        ideal = _fused_pipeline_s(workers, w, cal, backward)
    elif w.ready_at:
        ideal = _ready_pipeline_s(total, buckets, backward, w.ready_at)
    else:
        ideal = pipeline_exposed_s(total, buckets, backward)
    share = overlap if overlap is not None else (1.0 if cal.overlap is None else cal.overlap)
    return total, (1 - share) * total + share * ideal


def _ready_pipeline_s(comm_s: float, buckets: int, backward_s: float,
                      ready_at: tuple[float, ...]) -> float:
    """``netmodel.pipeline_exposed_s`` with bucket i of B ready when i/B of the bytes are
    (``ready_at``, linear between its points) rather than at i/B of backward."""
    if comm_s <= 0:
        return 0.0
    each, done = comm_s / buckets, 0.0
    for i in range(1, buckets + 1):
        done = max(done, _ready_time(i / buckets, ready_at) * backward_s) + each
    return max(each, done - backward_s)


def _ready_time(share: float, ready_at: tuple[float, ...]) -> float:
    """When ``share`` of the gradient bytes is ready, as a share of backward: ``ready_at`` read
    linearly between its points (evenly over backward where it is empty)."""
    if not ready_at:
        return min(1.0, max(0.0, share))
    x = min(1.0, max(0.0, share)) * len(ready_at)
    k = min(len(ready_at), max(1, math.ceil(x - 1e-9)))
    before = ready_at[k - 2] if k >= 2 else 0.0
    return before + (ready_at[k - 1] - before) * (x - (k - 1))


def _share_ready(t: float, ready_at: tuple[float, ...]) -> float:
    """Share of the gradient bytes ready at ``t`` (a share of backward): ``ready_at`` inverted,
    linear between its points (evenly over backward where it is empty)."""
    if not ready_at:
        return min(1.0, max(0.0, t))
    times, step, share = (0.0, *ready_at), 1 / len(ready_at), 0.0
    for k in range(len(ready_at)):
        if t >= times[k + 1]:
            share = (k + 1) * step
        elif t > times[k]:
            share = max(share, (k + (t - times[k]) / (times[k + 1] - times[k])) * step)
    return share


def _fused_pipeline_s(workers: int, w: Workload, cal: Calibration, backward_s: float) -> float:
    """Exposed allreduce of Tensor Fusion (Sergeev & Del Balso 2018): whenever the link is free,
    one allreduce takes every gradient ready by then, up to ``bucket_bytes``; each pays the
    collective's full latency, so while one is in flight the next one grows. What is still in
    flight when backward ends is exposed (the last message: what backward's last layers made)."""
    sent, free = 0.0, 0.0
    for _ in range(100_000):  # every message carries >= 1/1000 of the bytes, or the rest
        if sent >= w.param_bytes * (1 - 1e-9):
            break
        start = free
        ready = _share_ready(start / backward_s if backward_s > 0 else 1.0, w.ready_at)
        if ready * w.param_bytes <= sent * (1 + 1e-9) + 1e-3 * w.param_bytes:
            # nothing (or little) ready: wait until a thousandth more of the bytes is
            ready = min(1.0, sent / w.param_bytes + 1e-3)
            start = max(start, _ready_time(ready, w.ready_at) * backward_s)
        size = min(ready * w.param_bytes - sent, cal.bucket_bytes)
        free = start + allreduce_s(workers, size, cal.network, cal.collective)
        sent += size
    return max(0.0, free - backward_s)


def simulated_steps(workers: int) -> int:
    """Steps per worker a simulation runs: enough for the queues to reach their steady state
    (200 at a few workers; about 20,000 pushes in all at many, at least 20 each)."""
    return min(200, max(20, 20_000 // workers))


def _slowest(workers: int, opts: Mapping[str, Any], cal: Calibration, pattern: str,
             passes: int = 1) -> float:
    """The slowest worker's compute over the mean one's in a synchronous step: the expected
    slowest of N from the calibration's step-time spread, or ``slow_workers`` at ``slowdown``.
    Periodic averaging waits once per period, for the slowest sum of ``period`` steps."""
    slow, slowdown = opts.get("slow_workers", 0), opts.get("slowdown", 1.0)
    if not (isinstance(slow, int) and 0 <= slow <= workers):
        raise ConfigError("slow_workers", slow, f"a whole number between 0 and workers={workers}")
    if isinstance(slowdown, bool) or not (isinstance(slowdown, (int, float)) and slowdown >= 1):
        raise ConfigError("slowdown", slowdown, "a factor >= 1 (1: no slowdown), e.g. 2")
    if slowdown != 1 and not slow:
        raise ConfigError("slowdown", slowdown, "it slows the slow_workers, and there are none: "
                          "give slow_workers too, e.g. ALG.slow_workers=1")
    # a wait once per period (or per accumulated step) is for the slowest sum of its passes: a
    # step's jitter averages out over them, a device's own speed does not
    sums = passes * (opts.get("period", 1) if pattern == "periodic" else 1)
    cv = math.hypot(cal.jitter / math.sqrt(sums), cal.device_spread)
    spread = straggler_factor(workers, cv, cal.node_spread, cal.network.per_node)
    return max(spread, float(slowdown)) if slow else spread


def unknown_ends(cal: Calibration) -> tuple[Calibration, Calibration] | None:
    """``cal`` with every quantity it did not measure at its favourable end, and at its
    unfavourable end (``terms``' ranges): overlap, the cross-node rate, jitter, the devices' and
    the nodes' spread, the framework's work, a busy node's shares (its own, and each model's),
    each model's optimizer update (``Workload.optimizer_s``).
    None: all measured."""
    nodes = [cal.node_compute] + [w.node_compute for w in cal.workloads.values() if w.node_compute]
    if cal.overlap is not None and cal.inter_rate == (1.0, 1.0) and cal.jitter_high is None \
            and cal.device_spread_high is None and cal.node_spread_high is None \
            and cal.framework is not None \
            and all(n.measured for n in nodes) \
            and all(w.optimizer_s[0] == w.optimizer_s[1] for w in cal.workloads.values()):
        return None

    def at(end: int) -> Calibration:
        net = cal.network
        inter = Link(net.inter.alpha_s, net.inter.bandwidth_Bps * cal.inter_rate[end])
        jitter = cal.jitter_high if end and cal.jitter_high is not None else cal.jitter
        spread = cal.device_spread_high if end and cal.device_spread_high is not None \
            else cal.device_spread
        nodes = cal.node_spread_high if end and cal.node_spread_high is not None \
            else cal.node_spread
        return replace(cal, network=replace(net, inter=inter), jitter=jitter, jitter_high=None,
                       device_spread=spread, device_spread_high=None,
                       node_spread=nodes, node_spread_high=None,
                       overlap=OVERLAP_RANGE[1 - end] if cal.overlap is None else cal.overlap,
                       framework=FRAMEWORK_RANGE[end] if cal.framework is None else cal.framework,
                       inter_rate=(1.0, 1.0), node_compute=cal.node_compute.end(end),
                       workloads={k: replace(w, optimizer_s=(w.optimizer_s[end],) * 2,
                                             node_compute=w.node_compute if w.node_compute is None
                                             else w.node_compute.end(end))
                                  for k, w in cal.workloads.items()})
    return at(0), at(1)


def pinned(cal: Calibration) -> dict[str, Calibration]:
    """Each quantity ``cal`` did not measure (``unknown_ends``'), by name, and ``cal`` with that
    one alone at the middle of its range, as if measured there: what measuring it leaves."""
    def mid(low: float, high: float | None) -> float:
        return low if high is None else (low + high) / 2

    def node(n: NodeCompute | None) -> NodeCompute | None:
        return n if n is None or n.measured else NodeCompute(
            mid(n.fp32, n.fp32_high), mid(n.amp, n.amp_high), n.at, n.source)

    out = {}
    if cal.overlap is None:
        out["overlap"] = replace(cal, overlap=sum(OVERLAP_RANGE) / 2)
    if cal.inter_rate != (1.0, 1.0):  # the link's rate is its range's middle
        out["the cross-node rate"] = replace(cal, inter_rate=(1.0, 1.0))
    for name, field in (("jitter", "jitter"), ("the devices' spread", "device_spread"),
                        ("the nodes' spread", "node_spread")):
        high = getattr(cal, f"{field}_high")
        if high is not None:
            out[name] = replace(cal, **{field: mid(getattr(cal, field), high), f"{field}_high": None})
    if cal.framework is None:
        out["the framework's work"] = replace(cal, framework=sum(FRAMEWORK_RANGE) / 2)
    nodes = [cal.node_compute] + [w.node_compute for w in cal.workloads.values() if w.node_compute]
    if not all(n.measured for n in nodes):
        out["a busy node's share"] = replace(cal, node_compute=node(cal.node_compute), workloads={
            k: replace(w, node_compute=node(w.node_compute)) for k, w in cal.workloads.items()})
    if any(w.optimizer_s[0] != w.optimizer_s[1] for w in cal.workloads.values()):
        out["the optimizer's update"] = replace(cal, workloads={
            k: replace(w, optimizer_s=(sum(w.optimizer_s) / 2,) * 2) for k, w in cal.workloads.items()})
    return out


def band_parts(cal: Calibration, algorithm: str, workers: int, model: str,
               options: dict[str, Any] | None = None) -> dict[str, float]:
    """The efficiency band's width (points) were each unmeasured quantity measured at its range's
    middle, the others left ranges: where measuring narrows the band most. Smallest first."""
    widths = {}
    for name, one in pinned(cal).items():
        p = predict(one, algorithm, workers, model, options)
        widths[name] = 100 * (p.efficiency_high - p.efficiency_low)
    return dict(sorted(widths.items(), key=lambda kv: kv[1]))


def predict(cal: Calibration, algorithm: str, workers: int, model: str,
            options: dict[str, Any] | None = None, steps: int | None = None) -> Prediction:
    """The step time of ``algorithm`` at ``workers`` workers training ``model``: where ``cal``
    left quantities unmeasured, the middle of the band their ranges give together
    (``unknown_ends``) in what a user reads, the efficiency (and so the samples a second; the
    step is the one that rate implies), the band in ``step_s_low``/``high`` and
    ``efficiency_low``/``high``. The efficiency's band also holds how far one measurement of it
    lies from another (``terms.MEASUREMENT_SPREAD``): the band is what a run of it would measure."""
    return _merged(cal, *predict_ends(cal, algorithm, workers, model, options, steps))


def predict_ends(cal: Calibration, algorithm: str, workers: int, model: str,
                 options: dict[str, Any] | None = None,
                 steps: int | None = None) -> tuple[Prediction, Prediction]:
    """``algorithm``'s prediction at the favourable and at the unfavourable end of what ``cal``
    did not measure (``unknown_ends``); where it measured everything, the one point twice."""
    ends = unknown_ends(cal)
    if ends is None:
        point = _predict(cal, algorithm, workers, model, options, steps)
        return point, point
    best, worst = (_predict(e, algorithm, workers, model, options, steps) for e in ends)
    return best, worst


def _merged(cal: Calibration, best: Prediction, worst: Prediction) -> Prediction:
    """The prediction a user reads from its two ends (``predict``)."""
    if best is worst:
        return best
    w = cal.workload(best.model)
    spread = MEASUREMENT_SPREAD if best.workers > 1 else 0.0
    # the optimizer's larger end costs a step of fewer passes than it was measured at, and
    # saves one of more (one device alone pays it as often, so the efficiency keeps its order
    # where the step may not): each band takes its own lower and higher end
    samples = (best.samples_per_s + worst.samples_per_s) / 2
    step = best.workers * w.batch_size * w.accumulation / samples
    efficiencies = (best.efficiency, worst.efficiency)
    return replace(worst, calibration=cal.name, step_s=step, samples_per_s=samples,
                   efficiency=sum(efficiencies) / 2,
                   compute_s=(best.compute_s + worst.compute_s) / 2,
                   comm_s=(best.comm_s + worst.comm_s) / 2,
                   compute_efficiency=(best.compute_efficiency + worst.compute_efficiency) / 2,
                   straggler=(best.straggler + worst.straggler) / 2,
                   step_s_low=min(best.step_s, worst.step_s),
                   step_s_high=max(best.step_s, worst.step_s),
                   efficiency_low=min(efficiencies) * (1 - spread),
                   efficiency_high=max(efficiencies) * (1 + spread))


def relative(ends: tuple[Prediction, Prediction],
             base: tuple[Prediction, Prediction]) -> tuple[float, float, float]:
    """How many times ``base``'s throughput a worker of ``ends`` has (``predict_ends`` of each:
    another algorithm at the same workers, or the same one at other workers, against one node),
    where the two share their hardware: what neither measured sits at the same end in both, so
    each end is divided by the same end. The middle of the two ratios, the lower and the
    higher, each moved out by how far two measured runs lie apart (``terms.MEASUREMENT_SPREAD``):
    a ratio of two runs strays by that much whatever the model knows."""
    ratios = [(p.samples_per_s / p.workers) / (b.samples_per_s / b.workers)
              for p, b in zip(ends, base, strict=True)]
    return (sum(ratios) / 2, min(ratios) * (1 - MEASUREMENT_SPREAD),
            max(ratios) * (1 + MEASUREMENT_SPREAD))


def _predict(cal: Calibration, algorithm: str, workers: int, model: str,
             options: dict[str, Any] | None = None, steps: int | None = None) -> Prediction:
    """One point: every quantity of ``cal`` as it stands (overlap None: a band from 0 to 1)."""
    if not (isinstance(workers, int) and workers >= 1):
        raise ConfigError("workers", workers, "an integer >= 1")
    opts = options_for(algorithm, options)
    pattern = traffic(algorithm)
    w = cal.workload(model)
    net, m, passes = cal.network, w.param_bytes, w.accumulation
    devices = min(workers, net.per_node)  # the devices of a node its workers use
    node = cal.node_compute if w.node_compute is None else w.node_compute
    efficiency = node.efficiency(devices, w.precision)
    c = w.compute_s / efficiency  # one worker's pass, its node's other devices busy
    staleness, band, straggler = None, None, 1.0
    spread = _slowest(workers, opts, cal, pattern, passes)  # checks slow_workers, slowdown for all
    if pattern not in SIMULATED:  # the simulation draws its own slow workers and jitter
        straggler = spread
    # a step: every pass before the allreduce, and the optimizer's update once (compute_s
    # holds it spread over the passes it was measured at: fewer pay it more often a sample)
    update = w.optimizer_s[0] * (1 - passes / w.measured_accumulation)
    c_step = c * passes + update
    c_sync = c_step * straggler
    if workers == 1 and pattern not in ("push_pull", "async_push_pull"):
        exposed, sent = 0.0, 0.0  # nothing to talk to
    elif pattern == "collective":
        # behind the last pass's backward of the slowest worker: a bucket goes once every
        # worker has it, so the slowest sets when each is ready, and a longer backward hides more
        slowest = c * straggler
        _, exposed = bucketed_allreduce_s(workers, w, cal, slowest)
        if cal.overlap is None:  # not measured: the band between no overlap and the ideal
            band = (exposed, bucketed_allreduce_s(workers, w, cal, slowest, overlap=0.0)[1])
            exposed = sum(band) / 2
        sent = float(ring_share("allreduce", workers)) * m
    elif pattern == "push_pull":
        exposed = 2 * ps_transfer_s(workers, m, opts["servers"], net)
        sent = m
    elif pattern in ("gossip", "overlapped_gossip"):
        peers = gossip_peers(workers, opts)
        comm = gossip_s(m, peers, net.shared(workers))
        exposed = max(0.0, comm - c_sync) if pattern == "overlapped_gossip" else comm
        sent = peers * m
    elif pattern == "periodic":
        period = opts["period"]
        exposed = allreduce_s(workers, m, net, cal.collective) / period
        sent = float(ring_share("allreduce", workers)) * m / period
    elif pattern in SIMULATED:
        from .perfsim import simulate

        link = net.shared(workers + opts.get("servers", 0))
        sim_opts = {k: opts[k] for k in ("servers", "n_fetch", "n_push", "period", "max_lag",
                                         "max_staleness", "warmstart", "slow_workers", "slowdown")
                    if k in opts}
        result = simulate(algorithm, workers, compute_s=c_step, model_bytes=m, link=link,
                          steps=steps or simulated_steps(workers), jitter=cal.jitter, **sim_opts)
        exposed = max(0.0, result.step_s - c_step)
        if result.staleness_hist:
            total = sum(result.staleness_hist.values())
            staleness = sum(k * v for k, v in result.staleness_hist.items()) / total
        sent = m / opts.get("n_push", opts.get("period", 1))
    else:  # "none": a single process's algorithm
        raise ConfigError("algorithm", algorithm, "runs one process: nothing to predict at "
                          f"{workers} workers")
    wait = c_sync - c_step  # waiting for the slowest worker: not computation, not the link
    # the framework's own work, once per round of communication (DDP skips its hooks on
    # accumulation passes; periodic averaging talks once a period); the same for every algorithm
    # that talks in lock-step, so that they compare fairly. The simulated asynchronous ones: none.
    # (Not measured, it is a range: ``predict`` runs each end of it, ``unknown_ends``.)
    rounds = 0.0 if workers == 1 or pattern in SIMULATED else (
        1 / opts["period"] if pattern == "periodic" else 1.0)
    own = cal.framework * (w.framework_sample_s or w.compute_s / w.batch_size) * rounds
    samples_per_step = workers * w.batch_size * passes
    alone = samples_per_step / (w.compute_s * passes + update)  # one device, as many updates

    def rate(exposed_s: float) -> tuple[float, float, float]:
        step = c_step + wait + own + exposed_s
        return step, samples_per_step / step, samples_per_step / step / alone

    step, samples, eff = rate(exposed)
    low, high = (rate(band[0]), rate(band[1])) if band else ((step, samples, eff),) * 2
    return Prediction(algorithm, workers, model, step, c_step, exposed, samples, eff, sent,
                      cal.name, cal.collective, staleness, opts, low[0], high[0], high[2], low[2],
                      efficiency, straggler)


def predict_rows(cal: Calibration, algorithms: list[str], workers: list[int], model: str,
                 options: dict[str, dict[str, Any]] | None = None,
                 against: str | None = None) -> list[dict[str, Any]]:
    """Every algorithm at every worker count, as rows (the CSV and JSON of ``downpour model``);
    with ``against``, each row's ``speedup`` over that algorithm at its worker count and the band
    of it (``speedup_low``, ``speedup_high``: ``relative``), and ``verdict``: ``faster`` or
    ``slower`` where the whole band says so, else ``either`` (``reference``: its own rows)."""
    options = options or {}
    ends = {(a, n): predict_ends(cal, a, n, model, options.get(a))
            for a in dict.fromkeys([*algorithms, *([against] if against else [])]) for n in workers}
    rows = []
    for a in algorithms:
        for n in workers:
            row = _merged(cal, *ends[a, n]).row()
            if against == a:
                row.update(against=a, speedup=1.0, speedup_low=1.0, speedup_high=1.0,
                           verdict="reference")
            elif against:
                point, low, high = relative(ends[a, n], ends[against, n])
                row.update(against=against, speedup=point, speedup_low=low, speedup_high=high,
                           verdict="faster" if low > 1 else "slower" if high < 1 else "either")
            rows.append(row)
    return rows
