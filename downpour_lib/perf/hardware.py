"""Hardware as an input: a YAML file describing devices, nodes and links, read into a ``Calibration``.

``model predict --hardware FILE.yaml`` reads one; the presets are such files (``hardware/*.yaml``);
every number names its source (docs/perf_model.md, field by field). The fields::

    name: my-cluster                  # what prediction rows name as their calibration
    source: "where the description comes from"
    devices_per_node: 8               # workers (GPUs) per node
    collective: auto                  # ring, tree, hierarchical, or auto (NCCL's tuner per bucket)
    bucket_mb: 25                     # DDP's bucket_cap_mb (Horovod's fusion buffer: 64)
    bucketing: fixed                  # fixed (DDP's buckets) or ready (Horovod's Tensor Fusion)
    overlap: null                     # bucket pipeline's achieved share; null: a range (terms)
    jitter: 0.0                       # a step's cv; device_spread, node_spread: speeds'; else a range
    framework: 2.5                    # the framework's work a round of talk, in samples; omitted: a range
    node_compute: pytorch             # busy node's share by pipeline: pytorch, dali-cpu, none, {fp32:, amp:}
    host: {cores: 128, source: "..."} # physical cores, all sockets (ranks beyond them time-share)
    memory_gbyte_per_s: 2039          # a device's memory (datasheet), for models' optimizer
    links:
      intra:                          # between devices of one node
        gbit_per_s: 1200              # line rate, per direction (latency_us: 5 by default)
        efficiency: fitted            # achieved / line rate: a number (measured), fitted
                                      # (terms.LINK_EFFICIENCY), or published: the range of
        transport: rdma               # its transport (rdma, tcp: terms.TRANSPORT_RATE; across
        source: "..."                 # nodes only; published is the default with a transport)
      inter: {gbit_per_s: 100, latency_us: 5, transport: rdma, source: "..."}
    models:
      resnet50:
        batch: 256                    # samples per worker per pass (forward and backward)
        images_per_s: 367             # samples/s of one device alone; or step_s: s per pass
        parameters: 25557032          # what an allreduce carries: parameters x bytes_per_parameter
        bytes_per_parameter: 4        # devices_per_worker: >1, a worker is a node (per_node 1)
        ready_at: [0.01, ..., 1.0]    # backward's share done as each tenth of the gradient is ready
        accumulation: 1               # forward+backward passes (batches) per allreduce
        precision: amp                # fp32 (full, TF32 too: the default) or amp (mixed)
        full_precision: resnet50      # amp's twin at full precision: its samples count the framework
        multiply_adds: 4.09e9         # forward multiply-adds of a sample: the framework's unit
        node_compute: none            # its own input pipeline, where not the file's (tokens: none)
        optimizer: lamb               # sgd, adam or lamb: its update once a step (a range)
        source: "..."
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .calibration import MIB, Calibration, Workload
from .netmodel import GBIT, Link, Network
from .perfmodel import predict
from .terms import (
    DEVICE_SPREAD_RANGE,
    FRAMEWORK_MACS_PER_PARAMETER,
    JITTER_RANGE,
    LINK_EFFICIENCY,
    NODE_SPREAD_RANGE,
    PIPELINES,
    PRECISIONS,
    TRANSPORT_RATE,
    NodeCompute,
    fit_node_compute,
    optimizer_s,
    transport_rate,
)

HARDWARE_DIR = Path(__file__).parent / "hardware"

_TOP = {"name", "source", "devices_per_node", "collective", "bucket_mb", "bucketing", "overlap", "jitter",
        "device_spread", "node_spread", "framework", "node_compute", "host", "links", "models",
        "memory_gbyte_per_s"}
_LINK = {"gbit_per_s", "latency_us", "efficiency", "transport", "source"}
#: the largest line rate and latency a link can have: past them a value is in another unit (bit/s
#: or bytes/s for Gbit/s, 1.8 TB/s of NVLink 5 being 14,400; ns or ms for us, a WAN's round trip
#: under a second)
MAX_GBIT_PER_S = 100_000
MAX_LATENCY_US = 1_000_000
_MODEL = {"batch", "images_per_s", "step_s", "parameters", "bytes_per_parameter",
          "devices_per_worker", "backward_fraction", "ready_at", "accumulation", "precision",
          "full_precision", "multiply_adds", "node_compute", "optimizer", "source"}
_HOST = {"cores", "source"}
_SPREAD = ("a coefficient of variation of the devices' own speeds (each one's mean step time), a "
           "number >= 0, e.g. 0.015")
_NODE_SPREAD = ("a coefficient of variation of the nodes' own speeds (each node's mean step time), "
                "a number >= 0, e.g. 0.02")
_NODE_COMPUTE = ("the input pipeline the node's term is fitted for: " + ", ".join(PIPELINES)
                 + " (fitted: pytorch), none, or the shares measured: {fp32: 0.01, amp: 0.1}")
_NODE_SHARES = ("the share of a step lost at each precision with all the node's devices busy, "
                "measured (step together / step alone - 1, >= 0): {fp32: 0.01, amp: 0.1}")


#: the preset each input pipeline's node term is fitted on (the node of its table: its links),
#: and which of its models is which precision of the table: the rows the fit reads
FITTED_ON = {"pytorch": "dgx1-v100", "dali-cpu": "dgx1-v100-dali"}
FITTED_MODELS = {"fp32": "resnet50", "amp": "resnet50-amp"}


@cache
def fitted_node_compute(pipeline: str = "pytorch") -> NodeCompute:
    """The node-compute term of an input ``pipeline`` (``terms.PIPELINES``), fitted once on each
    of NVIDIA's DGX-1 tables run with it (the PyTorch DataLoader's: ``terms.DGX1_TABLE``, of
    pytorch-21.03, and ``DGX1_2012_TABLE``, of 20.12), so that the model gives each table back
    at its end of the term; two tables make each share a range from the smaller to the larger."""
    if pipeline not in PIPELINES:
        raise ConfigError("node_compute", pipeline, _NODE_COMPUTE)
    spec = read_hardware(HARDWARE_DIR / f"{FITTED_ON[pipeline]}.yaml")
    node_less = hardware_from_dict(dict(spec, node_compute="none"))  # its own term: what we fit
    fits = [_fit_table(node_less, table, source) for table, source in PIPELINES[pipeline]]
    if len(fits) == 1:
        return fits[0]
    low = {k: min(getattr(f, k) for f in fits) for k in PRECISIONS}
    high = {f"{k}_high": max(getattr(f, k) for f in fits) for k in PRECISIONS}
    return NodeCompute(**low, **high, at=fits[0].at, source="; ".join(f.source for f in fits))


def _fit_table(node_less: Calibration, table, source: str,
               models: dict[str, str] = FITTED_MODELS) -> NodeCompute:
    """The node term at which ``node_less`` gives ``table`` back: what the model adds to a step of
    the table's node beyond the node's loss (the allreduce left exposed, the wait for the slowest
    of its devices, the framework's work, each at the middle of its range) is taken off the
    table's loss, to a fixed point. ``models``: which model of ``node_less`` each precision of
    the table ran."""
    node, added = fit_node_compute(table, source=source), {}
    for _ in range(20):  # what is added moves with the loss by the slowest's share: ~1e-2
        cal = replace(node_less, node_compute=node)
        for precision, model in models.items():
            most = max(r.gpus for r in table if r.precision == precision)
            p = predict(cal, "allreduce", most, model)
            w = cal.workload(model)  # a step: its passes, then what the model adds to them
            added[precision] = p.step_s / (w.compute_s * w.accumulation) - 1 / p.compute_efficiency
        refit = fit_node_compute(table, added, source=source)
        if all(abs(getattr(refit, k) - getattr(node, k)) <= 1e-12 for k in PRECISIONS):
            return refit
        node = refit
    return node


def _node_compute(where: str, value: Any, per_node: int = 8) -> NodeCompute:
    """The node term a hardware file names (its ``node_compute``, or a model's own): an input
    pipeline's fitted term, none, or the shares measured on this node (a point)."""
    if isinstance(value, dict):
        _unknown(where, value, set(PRECISIONS))
        if set(value) != set(PRECISIONS):
            raise ConfigError(where, value, _NODE_SHARES)
        shares = {k: _share(f"{where}.{k}", v, _NODE_SHARES, high=math.inf) for k, v in value.items()}
        return NodeCompute(**shares, at=max(2, per_node), source="measured")
    if not isinstance(value, str) or value not in ("fitted", "none", *PIPELINES):
        raise ConfigError(where, value, _NODE_COMPUTE)
    return NodeCompute() if value == "none" else fitted_node_compute(
        "pytorch" if value == "fitted" else value)


def _number(where: str, value: Any, what: str, low: float = 0.0) -> float:
    if value is None:
        raise ConfigError.missing(where, what)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= low:
        raise ConfigError(where, value, what)
    return float(value)


def _unknown(where: str, given: dict, known: set[str], elsewhere: dict[str, str] | None = None) -> None:
    """A key ``where`` does not know: named, with where it belongs (``elsewhere``: key -> the
    mapping that takes it) or the closest known one (difflib), and the rest."""
    import difflib

    extra = sorted(set(given) - known, key=str)
    if extra and extra[0] in (elsewhere or {}):
        raise ConfigError(where, extra[0], f"a field of {elsewhere[extra[0]]}: give it there")
    if extra:
        # a key not given yet first: a typo of "inter" beside "intra" means inter
        close = (difflib.get_close_matches(str(extra[0]), sorted(known - set(given)), n=1, cutoff=0.5)
                 or difflib.get_close_matches(str(extra[0]), sorted(known), n=1, cutoff=0.5))
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(where, extra[0], hint + "not a field here: use " + ", ".join(sorted(known)))


def _share(where: str, value: Any, what: str, low: float = 0.0, high: float = 1.0) -> float:
    """A number in [low, high] (a bool, text or NaN is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ConfigError(where, value, what)
    return float(value)


#: what a link's transport may be, and which a network's name is
_TRANSPORTS = ("choose from " + ", ".join(TRANSPORT_RATE)
               + " (InfiniBand, RoCE: rdma; Ethernet without RDMA: tcp)")


def _link(name: str, d: Any) -> Link:
    return _link_range(name, d)[0]


def _link_range(name: str, d: Any,
                per_node: int = 1) -> tuple[Link, tuple[float, float], str | None]:
    """A link at its point rate, the factors on that rate at the favourable and unfavourable
    ends of its transport's range with ``per_node`` ranks on its card (``terms.transport_rate``;
    1, 1 where the efficiency is given as a number or fitted), and that transport (None where
    the rate is no range: ``Calibration.inter_transport``)."""
    if not isinstance(d, dict):
        raise ConfigError(f"links.{name}", d, "a mapping with gbit_per_s, latency_us, efficiency")
    _unknown(f"links.{name}", d, _LINK)
    rate = _number(f"links.{name}.gbit_per_s", d.get("gbit_per_s"),
                   "a line rate in Gbit/s > 0, e.g. 100")
    if rate > MAX_GBIT_PER_S:  # bit/s or bytes/s given for Gbit/s
        raise ConfigError(f"links.{name}.gbit_per_s", d["gbit_per_s"], f"a line rate in Gbit/s, "
                          f"at most {MAX_GBIT_PER_S:,}: bytes/s x 8 / 1e9, e.g. 100 for 12.5e9 bytes/s")
    latency = d.get("latency_us", 5)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) \
            or not 0 <= latency <= MAX_LATENCY_US:
        raise ConfigError(f"links.{name}.latency_us", latency,
                          f"microseconds, from 0 to {MAX_LATENCY_US:,} (a second), e.g. 5")
    transport = d.get("transport")
    eff = d.get("efficiency", "published" if transport is not None else "fitted")
    factors, ranged = (1.0, 1.0), None
    if eff == "published":  # not measured: the transport's published range, its middle the point
        if transport is None:
            raise ConfigError.missing(f"links.{name}.transport", "rdma or tcp (efficiency: "
                                      "published takes the range its transport reaches)")
        if transport not in TRANSPORT_RATE:
            raise ConfigError(f"links.{name}.transport", transport, _TRANSPORTS)
        low, high = transport_rate(transport, rate, per_node)
        eff = (low + high) / 2
        factors, ranged = (high / eff, low / eff), transport
    elif transport is not None and transport not in TRANSPORT_RATE:
        raise ConfigError(f"links.{name}.transport", transport, _TRANSPORTS)
    eff = LINK_EFFICIENCY if eff == "fitted" else eff
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise ConfigError(f"links.{name}.efficiency", eff,
                          "a measured share in (0, 1], fitted, or published (with transport)")
    return Link(latency * 1e-6, rate * GBIT * eff), factors, ranged


def _host_cores(d: Any) -> int | None:
    """A node's host cores (``host.cores``), or None where the file gives no host."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ConfigError("host", d, "a mapping with cores (the node's CPU cores) and source")
    _unknown("host", d, _HOST)
    cores = d.get("cores")
    if isinstance(cores, bool) or not (isinstance(cores, int) and cores >= 1):
        raise ConfigError("host.cores", cores, "the node's physical CPU cores, an integer >= 1, "
                          "e.g. 128 for 2x AMD EPYC 7742")
    return cores


def _workload(name: str, d: Any, node: NodeCompute, per_node: int | None = None,
              memory: float | None = None) -> Workload:
    where = f"models.{name}"
    if not isinstance(d, dict):
        raise ConfigError(where, d, "a mapping with batch, images_per_s (or step_s), parameters")
    _unknown(where, d, _MODEL)
    batch, per_batch = d.get("batch"), "samples per worker per pass (a forward and backward), an integer >= 1"
    if batch is None:
        raise ConfigError.missing(f"{where}.batch", per_batch)
    if isinstance(batch, bool) or not (isinstance(batch, int) and batch >= 1):
        raise ConfigError(f"{where}.batch", batch, per_batch)
    devices = d.get("devices_per_worker", 1)
    if isinstance(devices, bool) or not (isinstance(devices, int) and devices >= 1):
        raise ConfigError(f"{where}.devices_per_worker", devices, "an integer >= 1")
    if per_node is not None and per_node > 1 and devices > 1:  # the network counts workers a node
        raise ConfigError(f"{where}.devices_per_worker", devices, f"1 with devices_per_node={per_node}"
                          " (a worker a device); a worker of several devices is a whole node's: set "
                          "devices_per_node: 1, a worker a node, as sgp-v100-10g.yaml")
    if ("images_per_s" in d) == ("step_s" in d):
        raise ConfigError(where, sorted(d), "give one of images_per_s (one device alone) or step_s")
    if "images_per_s" in d:
        rate = _number(f"{where}.images_per_s", d["images_per_s"], "samples/s of one device > 0")
    else:
        step = _number(f"{where}.step_s", d["step_s"], "seconds per pass (a forward and backward) > 0")
        rate = batch / devices / step
    precision = d.get("precision", "amp" if "full_precision" in d else "fp32")
    if precision not in PRECISIONS or precision == "fp32" and "full_precision" in d:
        raise ConfigError(f"{where}.precision", precision, "fp32 (full precision, TF32 included) or "
                          "amp (mixed precision; the default where full_precision names its twin)")
    own = (_node_compute(f"{where}.node_compute", d["node_compute"], per_node or 8)
           if "node_compute" in d else None)
    # a worker of several devices of one node: their own averaging is inside its step
    compute = batch / (devices * rate * (node if own is None else own).efficiency(devices, precision))
    params = _number(f"{where}.parameters", d.get("parameters"), "the model's parameter count > 0")
    width = _number(f"{where}.bytes_per_parameter", d.get("bytes_per_parameter", 4),
                    "bytes per gradient element, e.g. 4 (fp32) or 2 (fp16)")
    if "multiply_adds" in d:
        _number(f"{where}.multiply_adds", d["multiply_adds"], "forward multiply-adds of one sample "
                "> 0, e.g. 4.09e9 (ResNet-50 at 224 pixels)")
    extra = {k: d[k] for k in ("backward_fraction", "ready_at", "accumulation") if k in d}
    if "backward_fraction" in extra:
        extra["backward_fraction"] = _share(f"{where}.backward_fraction", extra["backward_fraction"],
                                            "backward's share of a step, a number in [0, 1], e.g. 0.67")
    if "ready_at" in extra and not isinstance(extra["ready_at"], (list, tuple)):
        raise ConfigError(f"{where}.ready_at", extra["ready_at"], "a list of shares of backward")
    if "optimizer" in d:  # its update, once a step (terms.optimizer_s)
        if memory is None:
            raise ConfigError(f"{where}.optimizer", d["optimizer"], "a device's memory bandwidth "
                              "beside it, for the update's time: memory_gbyte_per_s (datasheet, "
                              "e.g. 2039 for an A100 80GB)")
        try:
            extra["optimizer_s"] = optimizer_s(d["optimizer"], params, width, memory)
        except ConfigError as exc:
            raise ConfigError(f"{where}.optimizer", exc.value, exc.expected) from None
        passes = extra.get("accumulation", 1)  # a bad one is the Workload's to refuse, below
        step = compute * passes if type(passes) is int else math.inf
        if extra["optimizer_s"][1] >= step:  # a measured step holds its update
            raise ConfigError("memory_gbyte_per_s", memory, f"a bandwidth at which {name}'s "
                              f"{d['optimizer']} update ({extra['optimizer_s'][1]:.3g} s at most) "
                              f"fits in its measured step ({step:.3g} s): the device's datasheet "
                              "memory bandwidth in GB/s")
    try:
        return Workload(name, batch, compute, params * width, source=str(d.get("source", "")),
                        precision=precision, node_compute=own, devices_per_worker=devices, **extra)
    except ConfigError as exc:  # name the model the bad field belongs to
        raise ConfigError(f"{where}.{exc.field}", exc.value, exc.expected) from None


def _at_full_precision(model: dict) -> bool:
    return model.get("full_precision") is None and model.get("precision", "fp32") == "fp32"


def _framework_units(models: dict, workloads: dict[str, Workload]) -> dict[str, Workload]:
    """The sample each model's framework work is counted in (``Workload.framework_sample_s``,
    ``terms.FRAMEWORK_MACS_PER_PARAMETER``): a mixed-precision model's is a sample of the model it
    names as its ``full_precision`` (tensor cores speed up the math, not the framework); a model
    that gives ``multiply_adds`` counts it in parameters' worth of its compute, not in samples;
    half-precision gradients halve it."""
    for name, m in models.items():
        full = m.get("full_precision")
        if full is not None and (not isinstance(full, str) or full == name or full not in models
                                 or not _at_full_precision(models[full])):
            others = sorted(str(k) for k, v in models.items() if k != name and _at_full_precision(v))
            raise ConfigError(f"models.{name}.full_precision", full, "another model of this file, "
                              "run at full precision (no full_precision of its own): "
                              + (", ".join(others) or "add one"))
        ref = workloads[name if full is None else full]
        macs = m.get("multiply_adds", models[full].get("multiply_adds") if full else None)
        scale = (FRAMEWORK_MACS_PER_PARAMETER * m["parameters"] / macs if macs else 1.0) \
            * m.get("bytes_per_parameter", 4) / 4
        if full is not None or scale != 1.0:
            workloads[name] = replace(workloads[name],
                                      framework_sample_s=scale * ref.compute_s / ref.batch_size,
                                      macs_per_parameter=macs / m["parameters"] if macs else None)
    return workloads


def hardware_from_dict(d: Any, where: str = "hardware") -> Calibration:
    """A ``Calibration`` from a hardware description (the module docstring's fields)."""
    if not isinstance(d, dict):
        raise ConfigError(where, type(d).__name__, "a YAML mapping of the fields in "
                          "downpour_lib/perf/hardware.py's docstring")
    _unknown(where, d, _TOP, {**{k: "links.intra or links.inter" for k in _LINK},
                              **{k: "each model (models.NAME)" for k in _MODEL}, "cores": "host"})
    per_node = d.get("devices_per_node", 1)
    if isinstance(per_node, bool) or not (isinstance(per_node, int) and per_node >= 1):
        raise ConfigError("devices_per_node", per_node, "an integer >= 1")
    links = d.get("links") or {}
    if not isinstance(links, dict) or "inter" not in links and "intra" not in links:
        raise ConfigError("links", links, "a mapping with intra and/or inter links")
    _unknown("links", links, {"intra", "inter"})  # a typo would make one link serve both
    # a file with one link uses it for both, and names it as written in its errors
    inter, inter_rate, transport = _link_range("inter" if "inter" in links else "intra",
                                               links.get("inter", links.get("intra")), per_node)
    intra = _link("intra" if "intra" in links else "inter", links.get("intra", links.get("inter")))
    node_compute = _node_compute("node_compute", d.get("node_compute", "fitted"), per_node)
    host = d.get("host")
    cores = _host_cores(host)
    memory = d.get("memory_gbyte_per_s")
    if memory is not None:
        memory = _number("memory_gbyte_per_s", memory, "a device's memory bandwidth in GB/s > 0 "
                         "(datasheet), e.g. 2039 for an A100 80GB")
    models = d.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigError("models", models, "one or more models, each with batch, images_per_s "
                          "(or step_s) and parameters")
    overlap = d.get("overlap")
    if overlap is not None and (isinstance(overlap, bool) or not isinstance(overlap, (int, float))
                                or not 0 <= overlap <= 1):
        raise ConfigError("overlap", overlap, "a share in [0, 1], or null (not measured: a band)")
    framework = d.get("framework")
    if framework is not None:
        framework = _share("framework", framework, "samples of compute the framework's own work "
                           "costs a round of communication, a number >= 0, e.g. 2.5, or null (a range)",
                           high=math.inf)
    sources = [str(d.get("source", ""))] + [f"{k}: {v['source']}" for k, v in links.items()
                                              if isinstance(v, dict) and v.get("source")]
    if host and host.get("source"):
        sources.append(f"host: {host['source']}")
    return Calibration(
        str(d.get("name", where)), Network(intra, inter, per_node, cores=cores),
        _framework_units(models, {name: _workload(name, m, node_compute, per_node, memory)
                                  for name, m in models.items()}),
        collective=str(d.get("collective", "auto")), bucketing=str(d.get("bucketing", "fixed")),
        bucket_bytes=_number("bucket_mb", d.get("bucket_mb", 25), "MiB > 0, e.g. 25") * MIB,
        overlap=None if overlap is None else float(overlap), source="; ".join(s for s in sources if s),
        jitter=_share("jitter", d.get("jitter", 0.0), "a coefficient of variation of step times, "
                      "a number >= 0, e.g. 0.05", high=math.inf), node_compute=node_compute,
        device_spread=_share("device_spread", d.get("device_spread", 0.0), _SPREAD, high=math.inf),
        node_spread=_share("node_spread", d.get("node_spread", 0.0), _NODE_SPREAD, high=math.inf),
        # what the file does not give is a range (terms): jitter, the devices' and the nodes'
        # spread, the cross-node rate, the framework's work
        jitter_high=None if "jitter" in d else JITTER_RANGE[1], inter_rate=inter_rate,
        device_spread_high=None if "device_spread" in d else DEVICE_SPREAD_RANGE[1],
        node_spread_high=None if "node_spread" in d else NODE_SPREAD_RANGE[1],
        framework=framework, inter_transport=transport)


def load_hardware(path: str | os.PathLike) -> Calibration:
    """A hardware YAML file as a ``Calibration``."""
    return hardware_from_dict(read_hardware(path), str(path))


@cache
def _loader():
    """PyYAML's safe loader, reading 4.09e9 as the number it is: YAML 1.1 wants a dot and a signed
    exponent (4.09e+9) and reads it as a string, and a hardware file means a number."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
        r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    return Loader


def read_hardware(path: str | os.PathLike) -> Any:
    """A hardware YAML file's fields, unchecked (``hardware_from_dict`` checks them); a missing
    file or a YAML error is one line naming where."""
    import yaml

    try:
        data = yaml.load(Path(path).read_text(), Loader=_loader())  # noqa: S506 -- a safe loader
    except FileNotFoundError:
        raise ConfigError("hardware", str(path), "no such file: write one as in "
                          f"{HARDWARE_DIR}/*.yaml, or give --preset") from None
    except yaml.YAMLError as exc:  # one line: where, and what the parser found there
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError("hardware", at, f"not YAML: {what}; fix that line (the fields: "
                          f"{HARDWARE_DIR}/*.yaml)") from None
    return data


def preset_files() -> dict[str, Path]:
    """The presets: every YAML file under ``HARDWARE_DIR``, by name."""
    return {p.stem: p for p in sorted(HARDWARE_DIR.glob("*.yaml"))}


def with_fields(cal: Calibration, *, devices_per_node: int | None = None,
                intra_gbit: float | None = None, intra_latency_us: float | None = None,
                inter_gbit: float | None = None, inter_latency_us: float | None = None,
                link_efficiency: float | None = None, jitter: float | None = None,
                device_spread: float | None = None, node_spread: float | None = None,
                framework: float | None = None, inter_transport: str | None = None,
                node_compute: Any = None, **overlap: float | None) -> Calibration:
    """``cal`` with the hardware fields given (``downpour model predict``'s flags) replaced: a
    rate given here is a line rate, times ``link_efficiency`` (measured: a point), else the
    range of ``inter_transport`` across nodes (``terms.transport_rate``; where none is given, the
    file's own link's transport), else the fitted one.
    A value given here is measured: its range (``jitter``'s, ``device_spread``'s,
    ``node_spread``'s, ``overlap``'s, ``framework``'s, the node's shares: ``node_compute``, as a
    file gives it) becomes a point."""
    from dataclasses import replace

    net = cal.network
    if link_efficiency is not None:
        _share("link_efficiency", link_efficiency, "achieved / line rate, a share in (0, 1], "
               "e.g. 0.9", low=1e-12)
        if intra_gbit is None and inter_gbit is None:
            raise ConfigError("link_efficiency", link_efficiency, "it scales the line rates given "
                              "with it: add --inter-gbit and/or --intra-gbit (a hardware file "
                              "sets efficiency per link)")
    if jitter is not None:
        _share("jitter", jitter, "a coefficient of variation of step times >= 0, e.g. 0.05",
               high=math.inf)
    for name, value, expected in (("device_spread", device_spread, _SPREAD),
                                  ("node_spread", node_spread, _NODE_SPREAD)):
        if value is not None:
            _share(name, value, expected, high=math.inf)
    if framework is not None:
        _share("framework", framework, "samples of compute a step >= 0, e.g. 2.5", high=math.inf)
    if inter_transport is not None and (inter_gbit is None or link_efficiency is not None):
        raise ConfigError("inter_transport", inter_transport, "it sets the range of the line rate "
                          "given with --inter-gbit, without --link-efficiency (a measured one)")
    if devices_per_node is not None and not (isinstance(devices_per_node, int)
                                             and devices_per_node >= 1):
        raise ConfigError("devices_per_node", devices_per_node, "an integer >= 1")
    whole = {k: w.devices_per_worker for k, w in cal.workloads.items() if w.devices_per_worker > 1}
    if devices_per_node is not None and devices_per_node > 1 and whole:
        name, devices = next(iter(whole.items()))  # as the file's own check (_workload)
        raise ConfigError("devices_per_node", devices_per_node, f"1: a worker of {name} is a whole "
                          f"node of {devices} devices (devices_per_worker), one worker a node")
    if devices_per_node is not None and inter_gbit is None and cal.inter_transport == "tcp" \
            and (devices_per_node > 1) != (cal.network.per_node > 1):
        # one rank a card moves more of it than several sharing its sockets (terms.transport_rate)
        raise ConfigError("devices_per_node", devices_per_node, "give the card's line rate with "
                          "it (--inter-gbit G --inter-transport tcp): a TCP card's range depends "
                          f"on the ranks sharing it, and this one's is for {cal.network.per_node}")
    links = {"intra": net.intra, "inter": net.inter}
    inter_rate, transport = cal.inter_rate, cal.inter_transport
    # a rate alone keeps the file's transport (and so its range): one given says which
    keep = inter_transport or (cal.inter_transport if link_efficiency is None else None)
    for side, rate, latency in (("intra", intra_gbit, intra_latency_us),
                                ("inter", inter_gbit, inter_latency_us)):
        if rate is None and latency is None:
            continue
        old = links[side]
        spec = {"gbit_per_s": rate if rate is not None else old.bandwidth_Bps / GBIT,
                "latency_us": latency if latency is not None else old.alpha_s * 1e6,
                "efficiency": (link_efficiency if link_efficiency is not None else "fitted")
                if rate is not None else 1.0}
        if side == "inter" and rate is not None and keep is not None:
            spec.update(efficiency="published", transport=keep)
        links[side], factors, ranged = _link_range(side, spec, devices_per_node or net.per_node)
        if side == "inter" and rate is not None:
            inter_rate, transport = factors, ranged
    network = replace(net, intra=links["intra"], inter=links["inter"],
                      per_node=devices_per_node or net.per_node)
    named = {"devices_per_node": devices_per_node, "intra_gbit": intra_gbit,
             "intra_latency_us": intra_latency_us, "inter_gbit": inter_gbit,
             "inter_latency_us": inter_latency_us, "link_efficiency": link_efficiency,
             "inter_transport": inter_transport, "jitter": jitter, "device_spread": device_spread,
             "node_spread": node_spread,
             "framework": framework, "node_compute": node_compute, **overlap}
    given = ", ".join(f"{k}={v}" for k, v in named.items() if v is not None)
    fields = {"network": network, "inter_rate": inter_rate, "inter_transport": transport, **overlap,
              "source": f"{cal.source}; given: {given}" if given else cal.source}
    if jitter is not None:
        fields.update(jitter=jitter, jitter_high=None)
    if device_spread is not None:
        fields.update(device_spread=device_spread, device_spread_high=None)
    if node_spread is not None:
        fields.update(node_spread=node_spread, node_spread_high=None)
    if framework is not None:
        fields.update(framework=framework)
    if node_compute is not None:  # every model's node, its own included
        fields.update(node_compute=_node_compute("node_compute", node_compute, network.per_node),
                      workloads={k: replace(w, node_compute=None) for k, w in cal.workloads.items()})
    return replace(cal, **fields)


def model_entry(model: str, dataset: str, data_dir: str | os.PathLike = "data", batch: int = 32,
                images_per_s: float | None = None, source: str | None = None) -> dict[str, Any]:
    """A hardware file's ``models:`` entry for ``model`` (downpour's, or yours by its import path)
    on samples of ``dataset``: its parameters, the forward multiply-adds of one sample (the
    framework's unit, ``terms.FRAMEWORK_MACS_PER_PARAMETER``) and when its gradient is ready in
    backward (``terms.gradient_ready_at``), all counted on the meta device: nothing computed,
    nothing allocated. ``images_per_s``, one device's samples/s alone, is what no count gives:
    measure it on the device (``downpour bench gpu``, or one run's summary) and give it."""
    import torch

    from ..data import load_dataset
    from ..models import build_shaped
    from .terms import forward_layers, ready_shares

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError("batch", batch, "samples per worker per step, an integer >= 1")
    if images_per_s is not None:
        _number("images_per_s", images_per_s, "one device's samples/s alone > 0, e.g. 1200")
    train = load_dataset(dataset, data_dir).train
    net = build_shaped(model, train.input_shape, train.num_classes)
    device = next(net.parameters()).device  # meta, unless your constructor computes on tensors
    example = train.batch(torch.arange(1))[0].to(device)
    parameters = sum(p.numel() for p in net.parameters() if p.requires_grad)
    layers, multiply_adds = forward_layers(net, example)  # one forward gives both counts
    language = len(train.input_shape) == 1  # token ids: no images for a pipeline to decode
    entry: dict[str, Any] = {"batch": batch}
    if images_per_s is not None:
        entry["images_per_s"] = images_per_s
    entry.update(parameters=parameters, multiply_adds=float(f"{multiply_adds:.4g}"),
                 ready_at=list(ready_shares(layers)))
    if language:
        entry["node_compute"] = "none"
    entry["source"] = (f"parameters, multiply_adds (one sample of {dataset}, "
                       f"{'x'.join(map(str, train.input_shape))}) and ready_at counted by `downpour "
                       f"model describe`; images_per_s: {source or 'give where it was measured'}")
    return entry
