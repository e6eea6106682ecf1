"""Calibrations of published hardware, each with its source, and the published results the model is
checked against (``published_checks``; the notebook and tests/test_perfmodel.py print and assert them).

A preset's compute times are published single-GPU throughputs; its links are the published line rates.
The latencies (alpha) are not published for these systems: they are typical values for the
transport, named as assumptions. Where a preset needed a choice the publication does not state,
the ``source`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from .netmodel import GBIT, Link, Network
from .perfmodel import MIB, Calibration, Workload, predict

#: parameters of the published models (torchvision's counts; tests check them against torchvision)
PARAMETERS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "vgg16": 138_357_544,
              "inception_v3": 23_834_568}
FP32 = 4

_TF_P100 = ("TensorFlow benchmarks, NVIDIA DGX-1 (P100), tf_cnn_benchmarks, synthetic data, batch 64, "
            "1 GPU (tensorflow.org/performance/benchmarks, May 2017)")
_HOROVOD = ('Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep learning in '
            'TensorFlow"; horovod docs/benchmarks.rst')


def _p100(model: str, images_per_s: float, source: str = _TF_P100) -> Workload:
    return Workload(model, 64, 64 / images_per_s, PARAMETERS[model] * FP32,
                    source=f"{images_per_s:g} images/s: {source}")


def _sgp_node(model: str, images_per_s_per_gpu: float) -> Workload:
    # SGP's unit of gossip is a node: its 8 GPUs average over NVLink inside their step (folded into
    # compute here), 256 images per node per step (32 per GPU; Assran et al. 2019, section 6)
    return Workload(model, 256, 256 / (8 * images_per_s_per_gpu), PARAMETERS[model] * FP32,
                    source=f"{images_per_s_per_gpu:g} images/s per V100 in fp32 (NVIDIA "
                           "DeepLearningExamples, ResNet-50 v1.5 for PyTorch, DGX-1V; about)")


def _sgp_cluster(name: str, card: Link, source: str) -> Calibration:
    """SGP's experiments: a worker is a node of 8 V100, one card between nodes."""
    return Calibration(name, Network(intra=card, inter=card, per_node=1),
                       {"resnet50": _sgp_node("resnet50", 360)}, collective="ring",
                       bucket_bytes=25 * MIB, overlap=1.0, source=source)


PRESETS: dict[str, Calibration] = {
    "horovod-pascal-25g": Calibration(
        "horovod-pascal-25g",
        Network(intra=Link(5e-6, 12e9), inter=Link(10e-6, 25 * GBIT), per_node=4),
        {"inception_v3": _p100("inception_v3", 142),
         "vgg16": _p100("vgg16", 154),
         # not in TensorFlow's table: Horovod's own example run prints 1656.82 images/s on 16 GPUs
         "resnet101": _p100("resnet101", 1656.82 / 16, "Horovod docs/benchmarks.rst, 16 P100 with "
                            "Horovod (a per-GPU rate that already includes 16-GPU overhead)"),
         "resnet50": _p100("resnet50", 219)},
        collective="ring", bucket_bytes=64 * MIB, overlap=1.0,
        source=f"{_HOROVOD}: 128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s, NCCL 2 ring; fusion "
               "buffer 64 MiB (HOROVOD_FUSION_THRESHOLD's default). Assumed: PCIe 3 x16 inside a "
               "server (12 GB/s, 5 us), 10 us per RoCE message."),
    "sgp-v100-10g": _sgp_cluster(
        "sgp-v100-10g", Link(50e-6, 10 * GBIT),
        'Assran et al. 2019, "Stochastic Gradient Push for Distributed Deep Learning", section 6: '
        "32 nodes x 8 V100, 10 Gbit/s Ethernet; a worker is a node. Assumed: 50 us per TCP "
        "message; DDP's 25 MiB buckets for AllReduce SGD."),
    "sgp-v100-ib100": _sgp_cluster(
        "sgp-v100-ib100", Link(5e-6, 100 * GBIT),
        "Assran et al. 2019, section 6: the same 32 x 8 V100 on 100 Gbit/s InfiniBand. Assumed: "
        "5 us per message."),
    "dgx-h100-ib400": Calibration(
        "dgx-h100-ib400",
        # 8 H100 per node on NVLink 4 (450 GB/s each way per GPU), one 400 Gbit/s NDR card per GPU
        Network(intra=Link(3e-6, 450e9), inter=Link(5e-6, 8 * 400 * GBIT), per_node=8),
        {"resnet50": Workload("resnet50", 256, 256 / 3000, PARAMETERS["resnet50"] * FP32,
                              source="about 3000 images/s per H100 SXM, mixed precision (NVIDIA's "
                                     "published ResNet-50 v1.5 training throughput)"),
         "resnet101": Workload("resnet101", 256, 256 / 1700, PARAMETERS["resnet101"] * FP32,
                               source="about 1700 images/s per H100: ResNet-50's rate scaled by "
                                      "their FLOPs (4.1 vs 7.8 GFLOPs), an estimate")},
        collective="hierarchical", bucket_bytes=25 * MIB, overlap=1.0,
        source="NVIDIA DGX H100 datasheet: 8 H100 SXM, NVLink 4 (900 GB/s per GPU, both ways), "
               "8 ConnectX-7 400 Gbit/s InfiniBand. Assumed: 3 us NVLink, 5 us IB per message."),
}


@dataclass(frozen=True)
class Published:
    """A published scaling result and what the model predicts for it."""

    claim: str
    source: str
    published: float
    predicted: float
    unit: str  # "efficiency" or "speedup"
    tolerance: str  # what counts as agreement

    @property
    def error(self) -> float:
        return self.predicted - self.published


def _efficiency(preset: str, model: str, workers: int) -> float:
    return predict(PRESETS[preset], "allreduce", workers, model).efficiency


def published_checks() -> list[Published]:
    """Each published result next to the model's prediction (the notebook's table)."""
    checks = [Published(f"Horovod {name} scaling efficiency at 512 GPUs", _HOROVOD, value,
                        _efficiency("horovod-pascal-25g", model, 512), "efficiency",
                        "within 10 points")
              for name, model, value in (("ResNet-101", "resnet101", 0.90),
                                         ("Inception V3", "inception_v3", 0.90),
                                         ("VGG-16", "vgg16", 0.68))]
    sgp = PRESETS["sgp-v100-10g"]
    ar = predict(sgp, "allreduce", 32, "resnet50").step_s
    best = min(predict(sgp, a, 32, "resnet50").step_s for a in ("sgp", "osgp"))
    checks.append(Published("SGP (best of SGP, OSGP) vs AllReduce SGD, 32 nodes on 10 GbE: speedup",
                            "Assran et al. 2019: up to 3x faster than AllReduce SGD on 10 GbE",
                            3.0, ar / best, "speedup", "faster, by 1.5x to 4.5x"))
    return checks


def published_table():
    """``published_checks`` as a table: claim, published, predicted, error, what counts as agreement."""
    import pandas as pd

    return pd.DataFrame([{"claim": c.claim, "published": c.published, "predicted": c.predicted,
                          "error": c.error, "agreement": c.tolerance, "source": c.source}
                         for c in published_checks()])
