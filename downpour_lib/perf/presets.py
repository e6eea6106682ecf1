"""Presets of published hardware, each a hardware YAML file with its sources
(``downpour_lib/perf/hardware/*.yaml``, read by ``hardware.load_hardware``), and the published
results the model is checked against (``published_checks``; the notebook and
tests/test_perfmodel.py print and assert them).

A preset's compute times are published single-GPU throughputs; its links are the published line
rates times the fitted link efficiency. The latencies (alpha) are not published for these systems:
they are typical values for the transport, named as assumptions. Only ``dgx1-v100`` and
``dgx1-v100-dali`` are fitted on (their tables fix ``terms.fit_node_compute`` for the two input
pipelines, ``terms.PIPELINES``: the DataLoader's in two containers, 20.12 and 21.03), and
``ddp-bench-dgx1`` (PyTorch's DDP benchmark: the overlap's and the framework's ranges); every
other published number is a check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .calibration import Calibration
from .hardware import FITTED_MODELS, FITTED_ON, load_hardware, preset_files, with_fields
from .perfmodel import predict, predict_ends, relative
from .terms import DDP_BENCH, DDP_BENCH_SOURCE

#: parameters of the published models (torchvision's counts; tests check them against torchvision)
PARAMETERS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "vgg16": 138_357_544,
              "inception_v3": 23_834_568, "resnext101-32x4d": 44_177_704,
              "se-resnext101-32x4d": 45_251_128,  # DLE's: ResNeXt with SE blocks of 16 channels
              "bert-large": 336_232_258,  # with its pre-training heads, vocabulary padded to 30528
              "bert-large-tf": 336_226_108,  # Google's vocabulary of 30522 (TensorFlow's, PaddlePaddle's)
              "transformer-xl-large": 285_167_482}  # DLE's, WikiText-103: adaptive input and softmax

_HOROVOD = ('Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep learning in '
            'TensorFlow"; horovod docs/benchmarks.rst')
#: the chart Horovod's README and benchmarks page showed before the 512-GPU one: the same servers
#: (4 Pascal GPUs, RoCE 25 Gbit/s), 32 of them
_HOROVOD_128 = ("horovod/horovod README.md and docs/benchmarks.md from 6bb6a2db (2017-10-17) until "
                "8318a898 (2018-05-10) replaced the chart with 512 GPUs: 32 servers with 4 Pascal "
                "GPUs each, RoCE 25 Gbit/s")

PRESETS: dict[str, Calibration] = {name: load_hardware(path) for name, path in preset_files().items()}

#: Horovod's paper ran 128 of those GPUs (32 servers) on the same 25 Gbit/s cards over plain TCP
#: before RDMA (its section 8, Figures 6 and 7): the preset at TCP's range for 4 ranks a card, and
#: an assumed 50 us a message (``sgp-v100-10g``'s for TCP)
_HOROVOD_PAPER = ('Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep learning in '
                  'TensorFlow" (arXiv 1802.05799), section 8, ')
HOROVOD_TCP = with_fields(PRESETS["horovod-pascal-25g"], inter_gbit=25, inter_latency_us=50,
                          inter_transport="tcp")


@dataclass(frozen=True)
class Published:
    """A published scaling result and what the model predicts for it: the band that the ranges of
    what the preset does not measure give together (``low``, ``high``: overlap, cross-node rate,
    jitter, the devices' spread, the framework's work, a busy node's shares;
    ``perfmodel.unknown_ends``; and how far two runs lie apart, ``terms.MEASUREMENT_SPREAD``) and
    its middle."""

    claim: str
    source: str
    published: float
    predicted: float
    unit: str  # "efficiency" or "speedup"
    tolerance: str  # what counts as agreement
    low: float = math.nan
    high: float = math.nan
    fitted: bool = False  # a row of the table the model is fitted on: not a check
    kind: str = ""  # which models, inside one node or across nodes (``KINDS``)

    @property
    def error(self) -> float:
        """The point's error: predicted - published (efficiency points, or speedup)."""
        return self.predicted - self.published

    @property
    def outside_band(self) -> float:
        """How far the published value lies outside the predicted band (0: inside it)."""
        low, high = (self.low, self.high) if self.low == self.low else (self.predicted,) * 2
        return max(0.0, low - self.published, self.published - high)


#: the kinds of check ``check_groups`` reports apart: a language model's sequences or images, on
#: one node's devices or across nodes (where the model misses most: docs/perf_model.md)
KINDS = ("images, one node", "images, across nodes", "language models, one node",
         "language models, across nodes")
_LANGUAGE_MODELS = ("bert-", "transformer-xl", "gpt")  # language models, by name


def kind_of(cal: Calibration, model: str, workers: int) -> str:
    models = "language models" if model.startswith(_LANGUAGE_MODELS) else "images"
    return f"{models}, {'one node' if workers <= cal.network.per_node else 'across nodes'}"


def _efficiency(claim: str, source: str, preset: str | Calibration, model: str, workers: int,
                published: float, fitted: bool = False,
                tolerance: str = "within 10 points of the band") -> Published:
    cal = PRESETS[preset] if isinstance(preset, str) else preset
    p = predict(cal, "allreduce", workers, model)
    return Published(claim, source, published, p.efficiency, "efficiency", tolerance,
                     p.efficiency_low, p.efficiency_high, fitted, kind_of(cal, model, workers))


#: NVIDIA's DeepLearningExamples ResNet-50 v1.5 PyTorch README: training throughput, 1 and 8 GPUs
_DLE = "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
DLE_CHECKS = (  # (preset, model, section, 1 GPU, 8 GPUs), img/s
    ("dgx1-v100", "resnet50", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), FP32",
     367, 2855),
    ("dgx1-v100", "resnet50-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), "
     "mixed precision", 1200, 8322),
    ("dgx1-v100-32g", "resnet50", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB), FP32",
     356, 2766),
    ("dgx1-v100-32g", "resnet50-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB), "
     "mixed precision", 1156, 8056),
    ("dgx-a100", "resnet50", "Training performance: NVIDIA DGX A100 (8x A100 80GB), TF32",
     938, 7248),
    ("dgx-a100", "resnet50-amp", "Training performance: NVIDIA DGX A100 (8x A100 80GB), mixed "
     "precision", 2470, 16621),
)
#: the same README a container earlier (pytorch-20.06), whose input pipeline was DALI on the CPU
_DLE_DALI = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md of "
             "the pytorch-20.06 NGC container (IST-DASLab/DeepLearningExamples fork, commit "
             "cc73a1755fd8), ")
DLE_DALI_CHECKS = (  # (preset, model, section, 1 GPU, 8 GPUs), img/s
    ("dgx1-v100-dali", "resnet50", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), FP32",
     373.21, 2899.62),
    ("dgx1-v100-dali", "resnet50-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), "
     "mixed precision", 856.52, 6635.90),
    ("dgx1-v100-32g-dali", "resnet50", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB), "
     "FP32", 359.76, 2813.23),
    ("dgx1-v100-32g-dali", "resnet50-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
     "32GB), mixed precision", 816.00, 6347.26),
    ("dgx-a100-40g-dali", "resnet50", "Training performance: NVIDIA DGX A100 (8x A100 40GB), TF32",
     680.15, 5379.82),
    ("dgx-a100-40g-dali", "resnet50-amp", "Training performance: NVIDIA DGX A100 (8x A100 40GB), "
     "mixed precision", 1240.81, 9604.92),
)
#: the same container's ResNeXt101-32x4d README (DALI on the CPU too): another model on the same
#: three nodes; every row a check, the fitted DGX-1 16GB's included (the fit is ResNet-50's)
_DLE_RESNEXT = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnext101-32x4d/README.md "
                "(commit 46ff3707e046; pytorch-20.06 NGC container), ")
DLE_RESNEXT_CHECKS = (  # (preset, model, section, 1 GPU, 8 GPUs), img/s
    ("dgx1-v100-dali", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
     "16GB), FP32", 150.05, 1151.01),
    ("dgx1-v100-dali", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
     "16GB), mixed precision", 534.91, 4000.79),
    ("dgx1-v100-32g-dali", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
     "32GB), FP32", 139.80, 1070.94),
    ("dgx1-v100-32g-dali", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
     "32GB), mixed precision", 516.07, 3861.95),
    ("dgx-a100-40g-dali", "resnext101-32x4d", "Training performance: NVIDIA DGX A100 (8x A100 "
     "40GB), TF32", 300.42, 2380.51),
    ("dgx-a100-40g-dali", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX A100 (8x A100 "
     "40GB), mixed precision", 908.40, 6887.59),
)
#: the ResNet-50 README's siblings at the commit that updated all three tables (pytorch-21.03, the
#: DataLoader of configs.yml): two more models on the DataLoader's three nodes, every row a check
_DLE_2103 = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/{}/README.md (commit "
             "7bdfc81d2587; pytorch-21.03 NGC container; batches of configs.yml), ")
DLE_2103_CHECKS = {  # README: (preset, model, section, 1 GPU, 8 GPUs), img/s
    "resnext101-32x4d": (
        ("dgx1-v100", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), "
         "FP32", 147, 1133),
        ("dgx1-v100", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), mixed precision", 587, 4065),
        ("dgx1-v100-32g", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), FP32", 144, 1108),
        ("dgx1-v100-32g", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), mixed precision", 565, 3863),
        ("dgx-a100", "resnext101-32x4d", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "TF32", 456, 3471),
        ("dgx-a100", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "mixed precision", 1211, 7925)),
    "se-resnext101-32x4d": (
        ("dgx1-v100", "se-resnext101-32x4d", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), FP32", 132, 1004),
        ("dgx1-v100", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), mixed precision", 443, 2971),
        ("dgx1-v100-32g", "se-resnext101-32x4d", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), FP32", 130, 992),
        ("dgx1-v100-32g", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 32GB (8x "
         "V100 32GB), mixed precision", 427, 2925),
        ("dgx-a100", "se-resnext101-32x4d", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "TF32", 395, 2991),
        ("dgx-a100", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX A100 (8x A100 "
         "80GB), mixed precision", 855, 5779)),
}
#: the three READMEs a container earlier (pytorch-20.12, the first with configs.yml: the same
#: batches, loader workers and DataLoader). Its DGX-1 16GB ResNet-50 rows are the unfavourable end
#: of the DataLoader's node term (``terms.DGX1_2012_TABLE``, fitted); every other row is a check.
#: Each row's 1 GPU is 20.12's own; the presets' one-GPU rates are 21.03's.
_DLE_2012 = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/{}/README.md (commit "
             "097c7ff917b7; pytorch-20.12 NGC container; batches of configs.yml), ")
DLE_2012_CHECKS = {  # README: (preset, model, section, 1 GPU, 8 GPUs), img/s
    "resnet50v1.5": (
        ("dgx1-v100", "resnet50", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), FP32",
         371, 2851),
        ("dgx1-v100", "resnet50-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), "
         "mixed precision", 1180, 7608),
        ("dgx1-v100-32g", "resnet50", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB), "
         "FP32", 365, 2811),
        ("dgx1-v100-32g", "resnet50-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 32GB), "
         "mixed precision", 1115, 7375),
        ("dgx-a100", "resnet50", "Training performance: NVIDIA DGX A100 (8x A100 80GB), TF32",
         945, 7365),
        ("dgx-a100", "resnet50-amp", "Training performance: NVIDIA DGX A100 (8x A100 80GB), mixed "
         "precision", 2461, 15977)),
    "resnext101-32x4d": (
        ("dgx1-v100", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 16GB (8x V100 16GB), "
         "FP32", 149, 1117),
        ("dgx1-v100", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), mixed precision", 578, 3742),
        ("dgx1-v100-32g", "resnext101-32x4d", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), FP32", 151, 1102),
        ("dgx1-v100-32g", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), mixed precision", 556, 3595),
        ("dgx-a100", "resnext101-32x4d", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "TF32", 420, 3193),
        ("dgx-a100", "resnext101-32x4d-amp", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "mixed precision", 1169, 7399)),
    "se-resnext101-32x4d": (
        ("dgx1-v100", "se-resnext101-32x4d", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), FP32", 133, 994),
        ("dgx1-v100", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 16GB (8x V100 "
         "16GB), mixed precision", 430, 2716),
        ("dgx1-v100-32g", "se-resnext101-32x4d", "Training performance: NVIDIA DGX-1 32GB (8x V100 "
         "32GB), FP32", 134, 1011),
        ("dgx1-v100-32g", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX-1 32GB (8x "
         "V100 32GB), mixed precision", 413, 2572),
        ("dgx-a100", "se-resnext101-32x4d", "Training performance: NVIDIA DGX A100 (8x A100 80GB), "
         "TF32", 360, 2665),
        ("dgx-a100", "se-resnext101-32x4d-amp", "Training performance: NVIDIA DGX A100 (8x A100 "
         "80GB), mixed precision", 804, 5248)),
}
#: each README's model as its claims name it
_DLE_NAMES = {"resnet50v1.5": "ResNet-50 v1.5", "resnext101-32x4d": "ResNeXt101-32x4d",
              "se-resnext101-32x4d": "SE-ResNeXt101-32x4d"}
#: NVIDIA's BERT-large pre-training on DGX A100 nodes (preset ``dgx-a100-bert``): one node's 8
#: GPUs against one, and 2 to 32 nodes against one node at the same global batch, each row with
#: the accumulation steps it ran (strong scaling: fewer passes a step as nodes are added)
_BERT = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT/README.md (commit a07d20a1cb2c; "
         "pytorch:21.11 NGC container), ")
BERT_ONE_NODE = (  # preset, node, its full precision, section, ((model, 1 GPU, 8 GPUs), ...)
    ("dgx-a100-bert", "DGX A100", "TF32", "Pre-training NVIDIA DGX A100 (8x A100 80GB)",
     (("bert-large-128", 317, 2505), ("bert-large-128-amp", 580, 4591),
      ("bert-large-512", 110, 860), ("bert-large-512-amp", 210, 1657))),
    ("dgx1-v100-32g-bert", "DGX-1 32GB", "FP32", "Pre-training NVIDIA DGX-1 With 32G",
     (("bert-large-128", 50, 387), ("bert-large-128-amp", 224, 1746),
      ("bert-large-512", 19, 149.6), ("bert-large-512-amp", 75, 586))))  # sequences/s
BERT_NODES = {  # model: ((nodes, accumulation steps, sequences/s), ...), the first row 1 node
    "bert-large-128-amp": ((1, 32, 4553), (2, 16, 9191), (4, 8, 18119), (8, 4, 35774),
                           (16, 2, 70555), (32, 1, 138294)),
    "bert-large-128": ((1, 64, 2486), (2, 32, 4979), (4, 16, 9859), (8, 8, 19815), (16, 4, 38866),
                       (32, 2, 75706)),
    "bert-large-512-amp": ((1, 128, 1648), (2, 64, 3291), (4, 32, 6464), (8, 16, 13005),
                           (16, 8, 25570), (32, 4, 49663)),
    "bert-large-512": ((1, 256, 854), (2, 128, 1684), (4, 64, 3293), (8, 32, 6515), (16, 16, 12131),
                       (32, 8, 21298)),
}
BERT_PRESET = "dgx-a100-bert"


def _bert_label(model: str, full: str = "TF32") -> str:
    seq = model.split("-")[2]
    return f"BERT-large, sequence {seq}, " + ("mixed precision" if model.endswith("-amp") else full)


def _against_one_node(preset: str, model: str, rows, claim: str, source: str) -> list[Published]:
    """Rows of N nodes against one node (the first row), each ``(nodes, accumulation, rate)``:
    the published ratio of rates over N, and the model's ratio of its two predictions at each end
    of what was not measured (the same ends at both node counts), the point their middle."""
    cal = PRESETS[preset]
    per_node = cal.network.per_node
    (_, acc_one, one), *more = rows
    base = accumulating(cal, model, acc_one, per_node)
    out = []
    for nodes, accumulation, rate in more:
        point, low, high = relative(accumulating(cal, model, accumulation, per_node * nodes), base)
        out.append(Published(claim.format(nodes=nodes, gpus=per_node * nodes, passes=accumulation),
                             source, rate / one / nodes, point, "efficiency", "reported", low, high,
                             kind=kind_of(cal, model, per_node * nodes)))
    return out


def accumulating(cal: Calibration, model: str, accumulation: int | None, workers: int,
                 algorithm: str = "allreduce", options: dict | None = None):
    """``predict_ends`` of ``algorithm`` (with ``options``) training ``model`` at ``workers``,
    each step accumulating ``accumulation`` passes (None: the calibration's)."""
    from dataclasses import replace

    w = cal.workloads[model]
    if accumulation is not None:
        w = replace(w, accumulation=accumulation)
    return predict_ends(replace(cal, workloads={**cal.workloads, model: w}), algorithm, workers,
                        model, options)


def _bert_checks(source: str = _BERT, one_node=BERT_ONE_NODE, preset: str = BERT_PRESET,
                 nodes=BERT_NODES, nodes_section: str = "Pre-training NVIDIA DGX A100 (8x A100 80GB) "
                 "Multi-node Scaling", framework: str = "") -> list[Published]:
    """A BERT README's rows: 8 GPUs against 1 (``one_node``, as ``BERT_ONE_NODE``), and N DGX A100
    nodes against 1 at N's accumulation (``nodes``, as ``BERT_NODES``, on ``preset``);
    ``framework`` follows the setting in each claim (", TensorFlow")."""
    out = [_efficiency(f"{_bert_label(model, full)}{framework}: 8 GPUs of a {node} efficiency",
                       source + f'section "{section}"', node_preset, model, 8, eight / (8 * one),
                       tolerance="reported")
           for node_preset, node, full, section, rows in one_node for model, one, eight in rows]
    for model, rows in nodes.items():
        out += _against_one_node(
            preset, model, rows, _bert_label(model) + framework + ": {nodes} DGX A100 nodes "
            "({gpus} GPUs), {passes} passes a step, efficiency against 1 node",
            source + f'section "{nodes_section}"')
    return out


#: NVIDIA's BERT-large pre-training in TensorFlow (Horovod) on DGX A100 40GB nodes (preset
#: ``dgx-a100-bert-tf``): one node's 8 GPUs against one, and 4 to 32 nodes against one node, each
#: row with the accumulation it ran. Its DGX-2H multi-node table is left out: its one-node row is
#: the single-node table's (TensorFlow 20.06), its other rows another container's (19.08), and 4
#: nodes at FP32 run 1.11 times one node's rate a GPU, which no term can give.
_BERT_TF = ("NVIDIA DeepLearningExamples, TensorFlow/LanguageModeling/BERT/README.md (commit 96138d50, "
            "unchanged to 9de48bc9; TensorFlow 20.06-py3 NGC container), ")
BERT_TF_PRESET = "dgx-a100-bert-tf"
BERT_TF_ONE_NODE = (  # as BERT_ONE_NODE: preset, node, its full precision, section, rows
    (BERT_TF_PRESET, "DGX A100", "TF32", "Pre-training training performance: single-node on DGX A100 40GB",
     (("bert-large-128-amp", 356.845, 2871.89), ("bert-large-128", 238.10, 1889.71),
      ("bert-large-512-amp", 70.856, 572.112), ("bert-large-512", 39.96, 316.51))),)  # sequences/s
BERT_TF_NODES = {  # model: ((nodes, accumulation steps, sequences/s), ...), the first row 1 node
    "bert-large-128-amp": ((1, 128, 2871.89), (4, 32, 11159), (16, 8, 41144), (32, 4, 77479.87)),
    "bert-large-128": ((1, 128, 1889.71), (4, 32, 7532.00), (16, 8, 28605.62), (32, 4, 53585.82)),
    "bert-large-512-amp": ((1, 256, 572.112), (4, 128, 2197.44), (16, 32, 8723.1), (32, 16, 16705)),
    "bert-large-512": ((1, 512, 316.51), (4, 128, 1268.43), (16, 32, 4903.39), (32, 16, 9463.80)),
}


#: NVIDIA's BERT-large pre-training in PaddlePaddle (fleet) on DGX A100 80GB nodes (preset
#: ``dgx-a100-bert-paddle``), the PyTorch README's hardware and tables: one node's 8 GPUs against
#: one, and 2 to 32 nodes against one node at the same global batch, each row with the
#: accumulation it ran. The single-node table's 8-GPU rows are the multi-node table's 1-node rows.
_BERT_PADDLE = ("NVIDIA DeepLearningExamples, PaddlePaddle/LanguageModeling/BERT/README.md (commit "
                "a5388a45; PaddlePaddle 22.12-py3 NGC container), ")
BERT_PADDLE_PRESET = "dgx-a100-bert-paddle"
BERT_PADDLE_ONE_NODE = (  # as BERT_ONE_NODE: preset, node, its full precision, section, rows
    (BERT_PADDLE_PRESET, "DGX A100", "TF32", "Pre-training NVIDIA DGX A100 (8x A100 80GB)",
     (("bert-large-128", 307, 2428), ("bert-large-128-amp", 694, 5541),
      ("bert-large-512", 107, 851), ("bert-large-512-amp", 264, 2109))),)  # sequences/s
BERT_PADDLE_NODES = {  # model: ((nodes, accumulation steps, sequences/s), ...), the first row 1 node
    "bert-large-128-amp": ((1, 32, 5541), (2, 16, 10646), (4, 8, 21389), (8, 4, 41681),
                           (16, 2, 79023), (32, 1, 157952)),
    "bert-large-128": ((1, 64, 2428), (2, 32, 4638), (4, 16, 9445), (8, 8, 18335), (16, 4, 35526),
                       (32, 2, 69701)),
    "bert-large-512-amp": ((1, 128, 2109), (2, 64, 4051), (4, 32, 7972), (8, 16, 15760),
                           (16, 8, 31129), (32, 4, 60206)),
    "bert-large-512": ((1, 256, 851), (2, 128, 1601), (4, 64, 3240), (8, 32, 6329), (16, 16, 12273),
                       (32, 8, 24047)),
}

#: NVIDIA's Transformer-XL large on WikiText-103 on DGX-2H nodes (preset ``dgx2h-transformer-xl``):
#: one node's 16 GPUs against one at 8 sequences a GPU, and 2 to 8 nodes against one node at 4
#: (weak scaling: the same sequences a GPU at every size, no accumulation), in tokens/s. The
#: one-node rows chose how the framework's work is counted (per parameter and byte of gradient,
#: ``terms.FRAMEWORK_MACS_PER_PARAMETER``; no number was fitted on them): checks, but not blind ones.
_TXL = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/Transformer-XL/README.md (commit "
        "0f6e186562e0; pytorch-20.06 NGC container), ")
TXL_PRESET = "dgx2h-transformer-xl"
TXL_ONE_NODE = (  # (model, precision, 1 GPU, 16 GPUs)
    ("transformer-xl-large", "FP32", 5169, 77568),
    ("transformer-xl-large-amp", "mixed precision", 14787, 211387))
TXL_NODES = {  # model: ((nodes, accumulation, tokens/s), ...), the first row 1 node
    "transformer-xl-large-b4": ((1, 1, 69070), (2, 1, 136960), (4, 1, 270120), (8, 1, 514500)),
    "transformer-xl-large-b4-amp": ((1, 1, 154950), (2, 1, 307520), (4, 1, 605530),
                                    (8, 1, 1189700)),
}


def _txl_checks() -> list[Published]:
    """Transformer-XL's rows: 16 GPUs of a DGX-2H against 1, and N nodes against one node."""
    out = [_efficiency(f"Transformer-XL large, {precision}: 16 GPUs of a DGX-2H efficiency",
                       _TXL + 'section "Training performance: NVIDIA DGX-2H (16x V100 32GB)", '
                       "large model", TXL_PRESET, model, 16, sixteen / (16 * one),
                       tolerance="reported")
           for model, precision, one, sixteen in TXL_ONE_NODE]
    for model, rows in TXL_NODES.items():
        precision = "mixed precision" if model.endswith("-amp") else "FP32"
        out += _against_one_node(
            TXL_PRESET, model, rows, f"Transformer-XL large, {precision}: {{nodes}} DGX-2H nodes "
            "({gpus} GPUs), 4 sequences a GPU, efficiency against 1 node",
            _TXL + 'section "Training performance: 8x NVIDIA DGX-2H (16x V100 32GB)"')
    return out


#: PyTorch's DDP benchmark, whose rows the overlap's, the jitter's and the framework's ranges are
#: chosen on (``terms.DDP_BENCH``): fitted rows, not checks
DDP_BENCH_PRESET = "ddp-bench-dgx1"


def published_checks(include_fitted: bool = False) -> list[Published]:
    """Each published result next to the model's prediction (the notebook's table); with
    ``include_fitted`` also the rows of the table the model is fitted on (``fitted``: True)."""
    checks = [_efficiency(f"Horovod {name} scaling efficiency at 512 GPUs", _HOROVOD,
                          "horovod-pascal-25g", model, 512, value)
              for name, model, value in (("ResNet-101", "resnet101", 0.90),
                                         ("Inception V3", "inception_v3", 0.90),
                                         ("VGG-16", "vgg16", 0.68))]
    checks += [_efficiency(f"Horovod {name} scaling efficiency at 128 GPUs", _HOROVOD_128,
                           "horovod-pascal-25g", model, 128, value)
               for name, model, value in (("ResNet-101", "resnet101", 0.90),
                                          ("Inception V3", "inception_v3", 0.90),
                                          ("VGG-16", "vgg16", 0.79))]
    checks += [_efficiency(f"Horovod {name} scaling efficiency at 128 GPUs over 25 GbE TCP",
                           _HOROVOD_PAPER + "Figure 6: 88 % for both", HOROVOD_TCP, model, 128, 0.88,
                           tolerance="reported")
               for name, model in (("ResNet-101", "resnet101"), ("Inception V3", "inception_v3"))]
    rdma, tcp = (predict_ends(cal, "allreduce", 128, "vgg16") for cal in (PRESETS["horovod-pascal-25g"],
                                                                           HOROVOD_TCP))
    point, low, high = relative(rdma, tcp)  # the same samples a step: speedup is efficiency's
    checks.append(Published("Horovod VGG-16 on RDMA against TCP, 128 GPUs on 25 GbE: speedup",
                            _HOROVOD_PAPER + "Figure 7: about 30 % faster", 1.30, point, "speedup",
                            "reported", low, high))
    tables = [(_DLE, "{}", DLE_CHECKS), (_DLE_DALI, "{}, DALI", DLE_DALI_CHECKS),
              (_DLE_RESNEXT, _DLE_NAMES["resnext101-32x4d"] + ", {}, DALI", DLE_RESNEXT_CHECKS)]
    tables += [(_DLE_2103.format(readme), _DLE_NAMES[readme] + ", {}", rows)
               for readme, rows in DLE_2103_CHECKS.items()]
    tables += [(_DLE_2012.format(readme), _DLE_NAMES[readme] + ", {}, pytorch-20.12", rows)
               for readme, rows in DLE_2012_CHECKS.items()]
    for source, label, rows in tables:
        for preset, model, section, one, eight in rows:
            # a row the node term's fit reads (its preset's ResNet-50) is not a check
            fitted = preset in FITTED_ON.values() and model in FITTED_MODELS.values()
            if fitted and not include_fitted:
                continue
            checks.append(_efficiency(label.format(section.split(": ")[1]) + " efficiency at 8 GPUs",
                                      source + f'section "{section}"', preset, model, 8,
                                      eight / (8 * one), fitted,
                                      "the fit: inside the band" if fitted else "reported"))
    checks += _bert_checks()
    checks += _bert_checks(_BERT_TF, BERT_TF_ONE_NODE, BERT_TF_PRESET, BERT_TF_NODES,
                           "Pre-training training performance: multi-node on DGX A100 40GB", ", TensorFlow")
    checks += _bert_checks(_BERT_PADDLE, BERT_PADDLE_ONE_NODE, BERT_PADDLE_PRESET, BERT_PADDLE_NODES,
                           framework=", PaddlePaddle")  # its multi-node section is named as PyTorch's
    checks += _txl_checks()
    if include_fitted:  # the rows the overlap's and the framework's ranges are chosen on
        checks += [_efficiency(f"PyTorch DDP benchmark, {model}, {n} GPUs ({n // 8} DGX-1) efficiency",
                               DDP_BENCH_SOURCE, DDP_BENCH_PRESET, model, n, row["alone"][0] / row[n],
                               True, "the fit: inside the band")
                   for model, row in DDP_BENCH.items() for n in (8, 16)]
    sgp = PRESETS["sgp-v100-10g"]
    best = max((predict_ends(sgp, a, 32, "resnet50") for a in ("sgp", "osgp")),
               key=lambda ends: sum(p.samples_per_s for p in ends))
    # the same hardware under both: what it does not measure at one end for both (``relative``)
    point, low, high = relative(best, predict_ends(sgp, "allreduce", 32, "resnet50"))
    checks.append(Published("SGP (best of SGP, OSGP) vs AllReduce SGD, 32 nodes on 10 GbE: speedup",
                            "Assran et al. 2019: up to 3x faster than AllReduce SGD on 10 GbE",
                            3.0, point, "speedup", "faster, by 1.5x to 4.5x", low, high))
    return checks


def check_summary(checks: list[Published] | None = None) -> dict[str, float]:
    """The model against the efficiency checks (points of efficiency, x100): mean absolute error
    of the point, the largest, how many fall below and above, how many published values lie
    inside the band, and the band's mean and widest width."""
    rows = [c for c in (checks if checks is not None else published_checks())
            if c.unit == "efficiency"]
    errors = [100 * c.error for c in rows]
    widths = [100 * (c.high - c.low) for c in rows]
    return {"checks": len(rows), "mae": sum(map(abs, errors)) / len(rows),
            "max_error": max(map(abs, errors)), "below": sum(e < 0 for e in errors),
            "above": sum(e > 0 for e in errors),
            "inside": sum(c.outside_band == 0 for c in rows),
            "band_mean": sum(widths) / len(rows), "band_max": max(widths)}


def check_groups(checks: list[Published] | None = None) -> dict[str, dict[str, float]]:
    """``check_summary`` of each kind of efficiency check (``KINDS``) that has any, in that order."""
    rows = checks if checks is not None else published_checks()
    return {kind: check_summary(group) for kind in KINDS
            if (group := [c for c in rows if c.kind == kind and c.unit == "efficiency"])}


def published_table(checks: list[Published] | None = None):
    """``published_checks`` (or ``checks``) as a table: claim, published, predicted, error, what
    counts as agreement."""
    import pandas as pd

    return pd.DataFrame([{"claim": c.claim, "kind": c.kind, "published": c.published,
                          "predicted": c.predicted,
                          "low": c.low, "high": c.high, "error": c.error,
                          "band": c.high - c.low,
                          "outside_band": c.outside_band, "agreement": c.tolerance,
                          "source": c.source}
                         for c in (checks if checks is not None else published_checks())])
