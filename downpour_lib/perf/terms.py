"""The terms of a step the alpha-beta network alone misses, each with its fitted value and source.

Fitted once, on what the model may be fitted on: NVIDIA's DeepLearningExamples ResNet-50 v1.5 tables
for PyTorch on a DGX-1, per input pipeline (``DGX1_TABLE`` and ``DGX1_2012_TABLE``, ``DGX1_DALI_TABLE``),
PyTorch's own DDP benchmark (``DDP_BENCH``: the ranges of the overlap, the jitter and the
framework's work a step, ``FRAMEWORK_RANGE``) and our own measurements (the sandbox's shaped
links). Every other published result is a check (``presets.published_checks``), never a fit.

- **Compute that slows when devices share a node** (``NodeCompute``): a node's devices share its
  input pipeline, host memory and PCIe, and communication kernels take compute units from the step.
  The loss is a share of the step set by the precision the devices run at (full, or mixed: a
  model's ``precision``), at the fitted devices per node, growing with log2 of the devices in use
  below and beyond it (an assumption: the tables have 1 and 8 devices only). Each share is the
  table's own at that precision (8 V100), less what the model itself adds to those steps (the
  allreduce over NVLink left exposed, the wait for the slowest, the framework's work:
  ``hardware.fitted_node_compute``), so that the model gives the table back. Not the device's rate
  nor the host's cores: at one precision NVIDIA's tables lose alike across models, rates and nodes
  (``presets.DLE_2103_CHECKS``). The input pipeline changes the shares (``PIPELINES``: the
  DataLoader's, DALI's); a hardware file names its pipeline. The DataLoader's are a range: the
  same table a container earlier lost more (``DGX1_2012_TABLE``).
- **Link (transport) efficiency** (``LINK_EFFICIENCY``): what a collective achieves of a line
  rate. Fitted on our sandbox: gloo over TCP on links shaped to 100 and 200 Mbit/s, two and four
  nodes (``results/reference/model/sandbox-*nodes/validation.csv``: the fitted bandwidth over the
  shaped rate, mean of four). Assumed for NVLink; across nodes a transport's range
  (``TRANSPORT_RATE``) from published reports.
- **The slowest of N** (``straggler_factor``): a synchronous step waits for the slowest worker.
  With independent normal step times of coefficient of variation ``cv`` the expected maximum of N
  is ``mean * (1 + cv * e_N)``, ``e_N`` the expected largest of N standard normals, integrated
  (``expected_max_of_normals``). ``cv`` joins a step's jitter, which averages out over the passes a
  step accumulates, and the devices' own spread, which does not (``DEVICE_SPREAD_RANGE``); across
  nodes, the nodes' own spread too (``NODE_SPREAD_RANGE``), which a node's devices share.
- **The collective chosen per size and N** (``netmodel.nccl_choices``): what NCCL's tuner would
  run per bucket, ring or tree under each of its protocols (LL, LL128, Simple).
- **When each gradient is ready** (``gradient_ready_at``): backward runs the layers in reverse, so
  a model whose large layers come last (VGG's fully connected layers: 89 % of its bytes) has most
  of its gradient ready at the start of backward, not spread evenly over it. Measured on the
  model's own layers (parameters and multiply-adds), with backward time taken proportional to
  multiply-adds (an assumption: memory-bound layers are fast but not free); the work between
  layers that has no parameters (attention's scores) counts too, in the gap backward runs it in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist

from ..errors import ConfigError, unknown_name

DLE_SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
              "section \"Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)\" (pytorch-21.03 "
              "NGC container; commit 291f0d02e815)")


@dataclass(frozen=True)
class TableRow:
    """One row of a published throughput table."""

    precision: str
    gpus: int
    images_per_s: float


#: the table the compute-efficiency term is fitted on, copied from ``DLE_SOURCE``
DGX1_TABLE = (TableRow("fp32", 1, 367), TableRow("fp32", 8, 2855),
              TableRow("amp", 1, 1200), TableRow("amp", 8, 8322))

#: the same benchmark on the same DGX-1 16GB a container earlier (pytorch-20.06), run as its README
#: says, with ``main.py``'s own input pipeline: NVIDIA DALI decoding on the CPU (``--data-backend``
#: default ``dali-cpu``, 5 workers). Its two precisions lose alike (3.0 % at 373 images/s, 3.3 % at
#: 857, where the DataLoader of ``DGX1_TABLE`` lost 2.8 % at 367 and 15.4 % at 1200): the pipeline
#: sets what a busy node loses. Both its steps lose about the same milliseconds, the framework's work
#: (``FRAMEWORK_RANGE``) and the wait for the slowest device (``DEVICE_SPREAD_RANGE``): at their
#: middles they leave its node term all but nothing (a few millionths of a step).
DLE_DALI_SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/"
                   "README.md of the pytorch-20.06 NGC container (as kept in the IST-DASLab/"
                   "DeepLearningExamples fork, commit cc73a1755fd8), section \"Training "
                   "performance: NVIDIA DGX-1 16GB (8x V100 16GB)\"; main.py --data-backend "
                   "default: dali-cpu")
DGX1_DALI_TABLE = (TableRow("fp32", 1, 373.21), TableRow("fp32", 8, 2899.62),
                   TableRow("amp", 1, 856.52), TableRow("amp", 8, 6635.90))

#: the DataLoader's table a container earlier (pytorch-20.12): the same README, benchmark, node,
#: batches (configs.yml) and loader workers. The same host lost 4.1 % at FP32 and 24.1 % at AMP
#: where 21.03 lost 2.8 % and 15.4 %: what a busy node loses depends on the software as much as
#: on the node, and a user's container is not known. The two tables are the ends of the DataLoader's
#: node term (``NodeCompute.fp32_high``, ``amp_high``).
DLE_2012_SOURCE = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/"
                   "README.md, section \"Training performance: NVIDIA DGX-1 16GB (8x V100 16GB)\" "
                   "(pytorch-20.12 NGC container; commit 097c7ff917b7)")
DGX1_2012_TABLE = (TableRow("fp32", 1, 371), TableRow("fp32", 8, 2851),
                   TableRow("amp", 1, 1180), TableRow("amp", 8, 7608))

#: input pipelines with a node-compute term of their own (``hardware``'s ``node_compute``), each
#: fitted on NVIDIA's DGX-1 16GB tables run with it, one per container: ((table, source), ...).
#: Two containers make the term a range, one a point.
PIPELINES = {"pytorch": ((DGX1_TABLE, DLE_SOURCE), (DGX1_2012_TABLE, DLE_2012_SOURCE)),
             "dali-cpu": ((DGX1_DALI_TABLE, DLE_DALI_SOURCE),)}


#: achieved / line rate of a TCP link under gloo: 95.6, 97.0 (2 nodes; 100, 200 Mbit/s), 94.9,
#: 96.5 % (4 nodes), results/reference/model/sandbox-{2,4}nodes/validation.csv
LINK_EFFICIENCY = 0.96
LINK_EFFICIENCY_SOURCE = ("fitted bandwidth / shaped rate of gloo allreduce on the Slurm sandbox "
                          "(100 and 200 Mbit/s, 2 and 4 nodes): results/reference/model/"
                          "sandbox-{2,4}nodes/validation.csv, mean of 0.956, 0.970, 0.949, 0.965")


#: the precisions a model runs at: full (FP32, or TF32 on tensor cores), or mixed (FP16 or BF16
#: math with FP32 master weights: AMP)
PRECISIONS = ("fp32", "amp")


def check_precision(precision: str) -> None:
    """``precision`` is one of ``PRECISIONS``, or a ConfigError names it."""
    if precision not in PRECISIONS:
        raise ConfigError("precision", precision, "one of " + ", ".join(PRECISIONS)
                          + " (fp32: full precision, TF32 included; amp: mixed precision)")


@dataclass(frozen=True)
class NodeCompute:
    """Loss of compute when ``devices`` share a node: a share of the step alone, ``fp32`` or
    ``amp`` by the precision the devices run at, at ``at`` devices (none by default). Where the
    shares are a range (``fp32_high``, ``amp_high``), ``fp32`` and ``amp`` are its favourable end,
    and a prediction runs each end (``perfmodel.unknown_ends``)."""

    fp32: float = 0.0
    amp: float = 0.0
    at: int = 8
    source: str = ""
    #: the unfavourable end of each share where it is a range (tables of two containers); None:
    #: a point
    fp32_high: float | None = None
    amp_high: float | None = None

    @property
    def measured(self) -> bool:
        """Whether each share is a point, not a range."""
        return self.fp32_high is None and self.amp_high is None

    def end(self, end: int) -> NodeCompute:
        """The point at the favourable (0) or unfavourable (1) end of each share's range."""
        if self.measured:
            return self
        fp32 = self.fp32 if not end or self.fp32_high is None else self.fp32_high
        amp = self.amp if not end or self.amp_high is None else self.amp_high
        return NodeCompute(fp32, amp, self.at, self.source)

    def efficiency(self, devices: int, precision: str = "fp32") -> float:
        """Share of one device's lone throughput each of ``devices`` on a node keeps, running at
        ``precision`` (``PRECISIONS``); of a range, the middle of its two ends'."""
        if not self.measured:
            return sum(self.end(end).efficiency(devices, precision) for end in (0, 1)) / 2
        check_precision(precision)
        share = getattr(self, precision)
        if devices <= 1 or share == 0:
            return 1.0
        return 1 / (1 + share * math.log2(devices) / math.log2(self.at))


def fit_node_compute(rows: tuple[TableRow, ...] = DGX1_TABLE, added: dict[str, float] | None = None,
                     source: str = DLE_SOURCE) -> NodeCompute:
    """The share each precision of the table loses at its largest device count: (throughput
    alone * devices / throughput together) - 1, less what the model adds to that step beyond the
    node's loss, as a share of the step alone (``added``, per precision: the allreduce left
    exposed, the wait for the slowest, the framework's work; none when not given;
    ``hardware.fitted_node_compute`` gives it)."""
    added = added or {}
    shares, at = {}, set()
    for precision in sorted({r.precision for r in rows}):
        mine = sorted((r for r in rows if r.precision == precision), key=lambda r: r.gpus)
        alone, most = mine[0], mine[-1]
        if precision not in PRECISIONS or alone.gpus != 1 or most.gpus < 2:
            raise ConfigError("table", precision, "a precision of " + ", ".join(PRECISIONS)
                              + ", with a row at 1 device and one at more")
        ratio = alone.images_per_s * most.gpus / most.images_per_s  # step together / step alone
        shares[precision] = max(0.0, ratio - 1 - added.get(precision, 0.0))
        at.add(most.gpus)
    if set(shares) != set(PRECISIONS) or len(at) != 1:
        raise ConfigError("table", sorted(shares), "both precisions, at the same device count")
    return NodeCompute(**shares, at=at.pop(), source=source)


def flop_counter():
    """torch's ``FlopCounterMode``, which also counts attention on the CPU: there
    ``scaled_dot_product_attention`` runs a fused kernel torch has no count for (on the meta
    device, and on GPUs, it counts one already)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def attention(query, key, value, *_args, out_shape=None, **_kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    fused = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return FlopCounterMode(display=False, custom_mapping={fused: attention} if fused else None)


def gradient_ready_at(model, example, points: int = 10) -> tuple[float, ...]:
    """When each ``1/points`` of ``model``'s gradient bytes is ready, as shares of backward: the
    k-th number is the share of backward done when (k+1)/points of the bytes are
    (``ready_shares`` of ``forward_layers``)."""
    return ready_shares(forward_layers(model, example)[0], points)


def forward_layers(model, example) -> tuple[list[list[int]], int]:
    """The layers with parameters in ``model``'s forward order, ``[multiply-adds, parameters]``
    each, and the multiply-adds of the whole forward (torch's flop counter's). Backward visits
    them in reverse, each taking time in proportion to its forward multiply-adds (convolutions,
    linear layers; others: one per output element; a layer holding raw weights, what the flop
    counter finds it multiply). Work between
    two such layers that has no parameters of its own (attention's scores and their product with
    the values; torch's flop counter finds it) is backward's before the earlier layer's gradient:
    it counts with that layer. A module whose own parameters sit beside its children (a ViT's
    class token, ``nn.MultiheadAttention``'s input projection) is taken as using them when it
    starts; its children's parameters that no forward hook sees (such a module's ``out_proj``)
    count with it. ``example``: one input batch (its spatial size sets the convolutions' cost)."""
    import torch

    layers: list[list[int]] = []  # [multiply-adds, parameters] in forward order
    seen: set[int] = set()  # a shared weight (a language model's tied head) counts where first used
    entry: dict[int, int] = {}  # a module with its own parameters: its first row in layers
    counted = flop_counter()
    mark = [0]  # the flops counted when the last row's own work ended

    def trainable(module) -> list:
        return [p for p in module.parameters(recurse=False) if p.requires_grad]

    def between() -> None:
        # parameterless work since the last row's own: backward runs it before that row's
        # gradient, so it is that row's (before the first row: not backward's at all)
        flops = counted.get_total_flops()
        if layers:
            layers[-1][0] += (flops - mark[0]) // 2
        mark[0] = flops

    def add(module, macs: int) -> None:
        own = trainable(module)
        layers.append([macs, sum(p.numel() for p in own if id(p) not in seen)])
        entry.setdefault(id(module), len(layers) - 1)
        seen.update(id(p) for p in own)

    def leaf(module) -> bool:
        return not any(True for c in module.children() for _ in c.parameters())

    def before(module, _inputs) -> None:
        between()
        if not leaf(module):
            add(module, 0)

    def after(module, _inputs, output) -> None:
        if not leaf(module):
            return
        while isinstance(output, (tuple, list)) and output:  # an RNN's (output, state): the output
            output = output[0]
        macs = output.numel() if isinstance(output, torch.Tensor) else 0
        if isinstance(module, torch.nn.Conv2d):
            macs *= module.in_channels // module.groups * math.prod(module.kernel_size)
        elif isinstance(module, torch.nn.Linear):
            macs *= module.in_features
        flops = counted.get_total_flops()  # its own products, where it holds raw weights
        add(module, max(macs, (flops - mark[0]) // 2))
        mark[0] = flops

    owners = [m for m in model.modules() if trainable(m)]
    hooks = [h for m in owners for h in (m.register_forward_pre_hook(before),
                                         m.register_forward_hook(after))]
    try:
        with torch.no_grad(), counted:
            model.train()(example)
            between()  # work after the last layer (a head applied as a function) is backward's first
    finally:
        for h in hooks:
            h.remove()
    # parameters no hook saw count with the nearest module above them that ran (children first)
    for m in reversed(list(model.modules())):
        if id(m) in entry:
            extra = sum(p.numel() for p in m.parameters() if p.requires_grad and id(p) not in seen)
            seen.update(id(p) for p in m.parameters())
            layers[entry[id(m)]][1] += extra
    if not layers:
        raise ConfigError("model", type(model).__name__, "a model with trainable parameters")
    return layers, counted.get_total_flops() // 2


def ready_shares(layers: list[list[int]], points: int = 10) -> tuple[float, ...]:
    """``gradient_ready_at`` from ``forward_layers``' rows: backward runs them in reverse."""
    total_t, total_b = sum(t for t, _ in layers), sum(b for _, b in layers)
    done_t = done_b = 0
    ready: list[float] = []
    for macs, params in reversed(layers):
        done_t, done_b = done_t + macs, done_b + params
        while len(ready) < points and done_b * points >= (len(ready) + 1) * total_b:
            ready.append(round(done_t / total_t, 3))
    return tuple(ready)


@cache
def _max_of_normals_moment(n: int, k: int) -> float:
    """``E[M**k]`` for ``M`` the largest of ``n`` independent standard normals, ``integral of
    x**k n phi(x) Phi(x)**(n-1) dx``, by the trapezoid rule on [-8, 10] in steps of 1/256
    (1/sqrt(pi) at n=2 to 1e-9; the integrand is below 1e-13 past either end for n up to 1e9)."""
    h, total = 1 / 256, 0.0
    for i in range(-8 * 256, 10 * 256 + 1):
        x = i * h
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        total += x ** k * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * cdf ** (n - 1)
    return total * h


def expected_max_of_normals(n: int) -> float:
    """The expected largest of ``n`` independent standard normals (0 for one): 0.56 at 2, 3.04 at
    512, where the asymptote ``sqrt(2 ln n)`` it replaces gave 1.18 and 3.53."""
    return 0.0 if n <= 1 else _max_of_normals_moment(n, 1)


def sd_max_of_normals(n: int) -> float:
    """The standard deviation of the largest of ``n`` independent standard normals (1 for one)."""
    if n <= 1:
        return 1.0
    return math.sqrt(_max_of_normals_moment(n, 2) - expected_max_of_normals(n) ** 2)


def straggler_factor(workers: int, cv: float, node_cv: float = 0.0, per_node: int = 1) -> float:
    """Expected slowest of ``workers`` step times over their mean.

    Each worker's time is its own (coefficient of variation ``cv``, independent) plus its node's
    (``node_cv``, shared by the ``per_node`` workers of a node). Without a node's share it is
    ``1 + cv * e_N`` (``expected_max_of_normals``). With it, a node's slowest worker is its
    node's share plus the slowest of ``d = min(workers, per_node)`` own times, of mean
    ``cv * e_d`` and deviation ``cv * s_d`` (``sd_max_of_normals``), and the step waits for the
    slowest of the ``n`` nodes: read as normals, that adds ``e_n * (hypot(node_cv, cv * s_d) -
    cv * s_d)`` to ``cv * e_N``. Exact where either share is 0 or a node has one worker (an
    assumption between: the largest of ``d`` normals is near a normal itself; it is skewed, and
    the sum reads it up to a few tenths of a point slow)."""
    for name, value in (("jitter", cv), ("node_spread", node_cv)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(name, value, "a coefficient of variation of step times >= 0, "
                              "e.g. 0.05")
    if workers <= 1:
        return 1.0
    factor = 1 + cv * expected_max_of_normals(workers)
    nodes = -(-workers // max(1, per_node))
    if node_cv and nodes > 1:
        own = cv * sd_max_of_normals(min(workers, per_node))
        factor += expected_max_of_normals(nodes) * (math.hypot(node_cv, own) - own)
    return factor


def step_spread(step_s: list[float] | tuple[float, ...]) -> float:
    """Coefficient of variation of a run's step times (``steps.csv``'s ``step_s``)."""
    values = [float(v) for v in step_s if math.isfinite(float(v))]
    if len(values) < 3:
        raise ConfigError("steps", len(values), "3 or more step times to measure their spread")
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean


# --- What the model cannot know for hardware nobody here measured: each a range with its source.
# A prediction on such hardware is the band these ranges give together (every one at its
# favourable end, every one at its unfavourable end) and its point is the band's middle
# (``perfmodel.predict``). A measured value (a number in the hardware file, or a calibration)
# replaces its range by a point.

#: PyTorch's own DDP benchmark on GPUs: sec/iter at the 50th and 95th percentiles, batch 32 per
#: GPU, synthetic inputs, NCCL, on 8-GPU DGX-1 (V100) machines with 4x 100 Gbit/s InfiniBand each,
#: PyTorch 1.4 (pytorch/pytorch, benchmarks/distributed/ddp/README.md, its example output: 1 GPU
#: without DDP, and DDP on 8 GPUs of one machine and 16 of two). Printed to the millisecond.
DDP_BENCH_SOURCE = ("pytorch/pytorch benchmarks/distributed/ddp/README.md (commit bf69c149b872), "
                    "example output: PyTorch 1.4, CUDA 10.0, NCCL, DGX-1 V100 machines, 4x 100 "
                    "Gbit/s InfiniBand each, batch 32, synthetic inputs")
DDP_BENCH = {  # model: {"alone": (p50, p95) without DDP on 1 GPU, 8: p50, 16: p50}, in seconds
    "resnet50": {"alone": (0.097, 0.097), 8: 0.104, 16: 0.104},
    "resnet101": {"alone": (0.162, 0.162), 8: 0.179, 16: 0.179},
    "resnext50_32x4d": {"alone": (0.145, 0.145), 8: 0.157, 16: 0.157},
    "resnext101_32x8d": {"alone": (0.415, 0.417), 8: 0.447, 16: 0.450},
}
DDP_BENCH_PRECISION_S = 0.001  # the table's: each time is within half of it

#: share of the ideal bucket pipeline a GPU system achieves (``Calibration.overlap``), where it
#: was not measured. From ``DDP_BENCH``: going from 8 GPUs of one machine to 16 of two adds the
#: allreduce across the machines' InfiniBand and nothing else, and the step grows by 0 (ResNet-50,
#: ResNet-101, ResNeXt-50) and 3 ms (ResNeXt-101), where the model left it all exposed would add
#: 3-10 ms. The lowest share at which the model adds no more (each time +-0.5 ms, the cross-node
#: rate at its favourable end) is 0.672 (ResNeXt-101; the other three need 0.89-0.95), and the
#: range starts at it rounded down; no row rules out the ideal pipeline (tests/test_perfmodel.py
#: recomputes it). On CPU backends over 2 cores we measured 0 (results/reference/model/
#: calibration.json): a CPU calibration measures its own.
OVERLAP_RANGE = (0.67, 1.0)

#: how far a measured efficiency lies from the one its run would give again: a published value is
#: one measurement, and an efficiency divides two (N workers' throughput by one's). NVIDIA's BERT
#: README (DeepLearningExamples at a07d20a1cb2c, PyTorch/LanguageModeling/BERT) measures one DGX
#: A100's 8 GPUs twice, in its single-node and its multi-node tables (the same benchmark, batch and
#: accumulation), in sequences/s: ``REPEATED_RUNS``, 0.55-0.83 % apart. Two runs of a setting, each
#: within s of its own middle, lie up to 2s apart; a ratio of two runs lies up to about 2s from its
#: middle, the most two runs were seen apart (0.0083). Only multi-worker efficiencies carry it
#: (one worker's is 1 by definition). The same README's 2 nodes run 1.009 times as fast as 2 of
#: its 1 node, above what any term can give: that is this spread, not a speed-up.
REPEATED_RUNS = ((2505, 2486), (4591, 4553), (860, 854), (1657, 1648))  # TF32, mixed: 128, 512
MEASUREMENT_SPREAD = max(max(a, b) / min(a, b) - 1 for a, b in REPEATED_RUNS)

#: achieved / line rate of a collective across nodes, by transport, where it was not measured.
#: rdma (InfiniBand, RoCE): NCCL's all_reduce bus bandwidth against the cards' line rate, as its
#: maintainers and users report it: 12.2 GB/s on one 100 Gbit/s card, "as good as you can get",
#: and 48 GB/s on a DGX-1's four (NVIDIA/nccl-tests#29: 0.976, 0.96); 192 GB/s on a DGX A100's
#: eight 200 Gbit/s cards (NVIDIA/nccl#812, quoted in #1576: 0.96); 86 GB/s where 96 was the
#: cards' (NVIDIA/nccl#1048, two A100 nodes, left open: 0.90). Misconfigured systems go far
#: lower (0.56 in VMs, NVIDIA/nccl#949; 0.3, nccl-tests#152): measure, and give the efficiency.
#: tcp: NCCL's sockets (or gloo's) below the rates their threads can drive: 0.95-0.97 on our
#: sandbox at 100-200 Mbit/s (``LINK_EFFICIENCY``), 0.96-0.98 of 32 Gbit/s with one GPU per node
#: (NVIDIA/nccl#209, GCP, tuned sockets). Past them a node's sockets move a rate of their own,
#: whatever the card's: with 4-8 GPUs per node 13.6 Gbit/s of 25 (NVIDIA/nccl-tests#83, Azure),
#: 14.5-22.9 of 32 (nccl#209), 32-48 of 100 (NVIDIA/nccl#450, 8 V100 per node); Horovod on AWS
#: gains nothing past 25 of 100 (Zhang et al. 2020, arXiv 2006.10103). So the low end is
#: min(0.95, 13.6 Gbit/s / line) and the high end min(0.98, 48 Gbit/s / line). Several ranks
#: sharing a card's sockets move less of it than one: on nccl#209's same 32 Gbit/s network one
#: GPU a node moved 0.95-0.98 and eight 0.45-0.72 (2 and 4 nodes), and no source with several
#: ranks a node moved more than that 0.72 (``TCP_SHARED_HIGH``); their high end is at most it,
#: and at least what every source's sockets moved (13.6 Gbit/s: on a slow card, the wire's).
TRANSPORT_RATE = {"rdma": (0.90, 0.976), "tcp": (0.95, 0.98)}
TCP_CAPS_GBIT = (13.6, 48.0)  # the lowest and highest a node's sockets were reported to move
TCP_SHARED_HIGH = 22.9 / 32  # the most of its line a node of several ranks was seen to move


def transport_rate(transport: str, gbit_per_s: float, per_node: int = 1) -> tuple[float, float]:
    """(low, high) achieved / line rate of ``transport`` at a line rate of ``gbit_per_s``, with
    ``per_node`` ranks sharing the node's card."""
    if transport not in TRANSPORT_RATE:
        raise ConfigError("transport", transport, "choose from " + ", ".join(TRANSPORT_RATE)
                          + ", or give the link's measured efficiency")
    low, high = TRANSPORT_RATE[transport]
    if transport == "tcp":  # past what its sockets move, a node's rate is theirs, not the card's
        floor, ceiling = TCP_CAPS_GBIT
        if per_node > 1:  # several ranks' sockets: never seen above TCP_SHARED_HIGH of the line
            ceiling = min(ceiling, max(floor, TCP_SHARED_HIGH * gbit_per_s))
        low, high = min(low, floor / gbit_per_s), min(high, ceiling / gbit_per_s)
    return low, max(low, high)


#: coefficient of variation of a GPU worker's step times, where not measured (``straggler_factor``):
#: from 0 to the largest spread ``DDP_BENCH``'s steps without DDP on one GPU allow (the 95th
#: percentile is 1.645 standard deviations above the median of a normal; each time +-0.5 ms):
#: 0.0063, ResNet-50's, whose 97 ms steps the millisecond resolves least. The same table shows
#: rarer, larger waits across machines (ResNet-101 at 16 GPUs: p95 5 % above p50) that a normal
#: spread does not describe; the range does not cover them. Our CPU runs measure their own
#: (``calibrate --steps``).
JITTER_RANGE = (0.0, max((p95 - p50 + DDP_BENCH_PRECISION_S) / 1.645 / p50
                         for p50, p95 in (row["alone"] for row in DDP_BENCH.values())))

#: coefficient of variation of the devices' own speeds (``straggler_factor``), where not measured:
#: a synchronous step waits for the slowest device of N, and one device slower than its peers
#: stays slower, so unlike ``JITTER_RANGE`` it does not average out over accumulated passes.
#: Sinha et al. measured GPUs of one SKU across five clusters (Summit, Vortex, Frontera, Longhorn,
#: Corona; arXiv 2208.11035v3, SC'22): 8 % average performance variation (22 % at most, outliers
#: aside). Read as the span of a box plot's whiskers (1.5 interquartile ranges past the quartiles,
#: +-2.70 standard deviations of a normal; an assumption: the span's definition is the paper's,
#: its shape ours), that is a spread of 0.08 / 5.40 = 0.0148. The range runs from a cluster of
#: identical devices to that average one: clusters as uneven as the 22 % lie beyond it, and so
#: do single outliers (1.5x slower than the median GPU in the same study), which a user who has
#: one should give as slow_workers.
DEVICE_SPREAD_WHISKER = 4 * NormalDist().inv_cdf(0.75)  # a quartile plus 1.5 IQR: 2.698 sd
DEVICE_SPREAD_RANGE = (0.0, 0.08 / (2 * DEVICE_SPREAD_WHISKER))

#: coefficient of variation of the nodes' own speeds (``straggler_factor``'s ``node_cv``), shared
#: by a node's devices, where not measured. Sinha et al.'s variation is among all of a cluster's
#: GPUs and is not split by node; one node's tables bound what its own devices may spread (at the
#: 22 % the DGX-1 tables are not given back, so ``DEVICE_SPREAD_RANGE`` ends at the average 8 %),
#: and nothing the model is fitted on bounds the spread between nodes. So the rest of the most
#: uneven cluster's variation is put between nodes (an assumption: the paper does not say where
#: it lies): at the unfavourable end of both ranges a cluster's devices spread as its 22 % did,
#: sqrt(0.22^2 - 0.08^2) = 0.205 between nodes, the same whiskers' span: 0.038. A node runs alone
#: in a one-node baseline, so it costs only what is spread over nodes. A run of yours across nodes
#: measures it (``downpour model spread``, ``calibrate.spreads_from_steps``): ``node_spread``.
NODE_SPREAD_RANGE = (0.0, math.sqrt(0.22 ** 2 - 0.08 ** 2) / (2 * DEVICE_SPREAD_WHISKER))

#: DDP's own work in a step beyond its allreduce, in one sample's compute (a calibration's
#: ``framework``), where not measured: its hooks, its copies into buckets, and the collective's
#: kernels taking the device beside backward. ``DDP_BENCH`` at 8 GPUs of one machine loses 7-11 %
#: of a 32-sample step against one GPU without DDP, where the allreduce over NVLink costs the
#: model about 1 % and the slowest of 8 up to 2 % (``DEVICE_SPREAD_RANGE``, which the range is
#: fitted beside). The narrowest range that puts each of its rows (8 and 16 GPUs) inside the band
#: the model prints is 1.9-2.45 samples' compute (tests/test_perfmodel.py recomputes it). A
#: cost fixed per step, not a share of it: NVIDIA's DGX-1 tables lose 3 % in all at 8 GPUs of 128-
#: 256 samples (``DGX1_DALI_TABLE``), which a share of 7-11 % could not. Counted in full-precision
#: samples (``Workload.framework_sample_s``, a hardware file's ``full_precision``): that table's FP32
#: and AMP steps lose the same milliseconds, where AMP's samples are 2.3 times as fast (tests/
#: test_perfmodel.py). Horovod's compute grows too, by up to 15 % (Zhang et al. 2020, arXiv
#: 2006.10103); one framework's table fixes this range. Its unit is a sample of 224-pixel images:
#: a model whose sample does more work a parameter counts it per parameter (below).
#: The model charges it once per round of communication to every algorithm that talks in lock-step
#: (an assumption: only DDP's was measured), so that they compare fairly.
FRAMEWORK_RANGE = (1.9, 2.45)

#: The framework's work is per parameter (hooks, copies of each gradient into its bucket), so
#: the sample it is counted in is a sample of ``DDP_BENCH``'s images: their models do 160-185
#: forward multiply-adds a parameter for a 224-pixel image (ResNet-50 160.0, ResNet-101 175.1,
#: ResNeXt-50 169.0, ResNeXt-101 32x8d 184.9: torch.utils.flop_counter on the meta device;
#: tests/test_perfmodel.py recounts them), and this is their mean. A model whose sample does more
#: work a parameter (a sequence of 384 tokens: about 440) gives ``multiply_adds`` (a hardware
#: file's), and its unit is that many parameters' worth of its own compute; gradients of half
#: the bytes (``bytes_per_parameter: 2``) halve that. Transformer-XL's one-node rows, which
#: charged in a sample of 384 tokens lost about 4 times what they publish, chose this (see
#: ``presets.TXL_ONE_NODE``); the CNNs' samples keep their unit within 7 %.
FRAMEWORK_MACS_PER_PARAMETER = (160.0 + 175.1 + 169.0 + 184.9) / 4

#: The optimizer's update, once a step: a device's memory streams each parameter's state through
#: it (parameter, gradient, moments), so it takes bytes a parameter / memory bandwidth. A measured
#: rate holds it amortized over the passes its step accumulated; a step of fewer passes (more
#: nodes at one global batch) pays it more often a sample (``perfmodel``). The bytes a parameter
#: moved, g the gradient's bytes (2 or 4) and the state 4-byte, counted from the kernels: at the
#: low end a fused implementation, at the high end one kernel an operation:
#:
#: - ``sgd`` (momentum): read p, g, buffer; write p, buffer (16 + g). One kernel an operation:
#:   the buffer's update, then the parameter's (20 + g).
#: - ``adam`` (and AdamW): read p, g, m, v; write p, m, v (24 + g; torch's fused=True). One
#:   kernel an operation: m (8 + g), v (8 + g), then p from m and v (16): 32 + 2g.
#: - ``lamb``: NVIDIA's fused LAMB (apex ``multi_tensor_lamb``, DeepLearningExamples'
#:   ``lamb_amp_opt``): the gradient's global norm (g), the parameters' norm (4), stage 1 reads
#:   g, p, m, v and writes m, v and the update (in the gradient's buffer, g), the update's norm
#:   (g), stage 2 reads the update and p and writes p: 32 + 5g (a half-precision model's copy
#:   of p, written beside it, 2-4 more: left out). One kernel an operation (as
#:   TensorFlow's LAMBOptimizer writes it, op by op, where XLA fuses none): m and v (16 + 2g), the
#:   update from m, v and p (16), both norms (8), p (12) and the gradient's clipping (3g): 52 + 5g.
#:
#: Clipping is counted for LAMB only, whose published recipes clip.
OPTIMIZER_BYTES = {"sgd": ((16, 1), (20, 1)), "adam": ((24, 1), (32, 2)),
                   "lamb": ((32, 5), (52, 5))}  # name: ((constant, gradients) low, ... high)

#: what a streaming kernel achieves of a device's datasheet memory bandwidth: 88 % (1.80 of an
#: A100 80GB's 2.04 TB/s, measured by Nsight Compute; and "around 90 %", the most any kernel
#: reached in NVIDIA's GTC talk the same thread cites: forums.developer.nvidia.com, "Trouble to
#: reach peak bandwidth of A100"). An optimizer's kernels over a model's many tensors reach
#: at most that: the bytes' range above carries the rest.
MEMORY_RATE = 0.88


def optimizer_s(optimizer: str, parameters: float, gradient_bytes: float,
                memory_gbyte_per_s: float) -> tuple[float, float]:
    """(low, high) seconds of one update of ``optimizer`` (``OPTIMIZER_BYTES``) over
    ``parameters`` on a device of ``memory_gbyte_per_s`` (datasheet)."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZER_BYTES:
        raise unknown_name("optimizer", optimizer, OPTIMIZER_BYTES)
    rate = memory_gbyte_per_s * 1e9 * MEMORY_RATE
    low, high = ((c + k * gradient_bytes) * parameters / rate for c, k in OPTIMIZER_BYTES[optimizer])
    return low, high
