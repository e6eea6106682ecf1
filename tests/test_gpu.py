"""On a CUDA machine (``make gpu-check``; skipped without CUDA): every algorithm on the GPU, ranks
sharing one GPU with CUDA tensors, mixed precision, and the ImageFolder pipeline onto the device."""

import pytest
import torch
from conftest import BIN, explain, mpiexec, read_json

from downpour_lib import TrainConfig, Trainer
from downpour_lib.bench.gpu import one_gpu_algorithms
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import ShardSampler, load_dataset
from downpour_lib.data.generate import write_imagefolder
from downpour_lib.data.loader import TrainBatches

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("name", one_gpu_algorithms())
def test_every_algorithm_trains_30_steps_on_the_gpu(name):
    config = TrainConfig(algorithm=name, model="resnet20", dataset="synthetic-cifar", steps=30,
                         warmup_steps=5, device="cuda", precision="bf16", channels_last=True)
    trainer = Trainer(config, DistContext.single(CUDA))
    result = trainer.run()
    assert result.summary["device"] == "cuda:0"
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())
    assert result.steps.loss.notna().all() and torch.isfinite(torch.tensor(result.steps.loss.values)).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_mixed_precision_learns_on_the_gpu(precision):
    config = TrainConfig(model="lenet", dataset="digits", epochs=10, device="cuda",
                         precision=precision)
    result = Trainer(config, DistContext.single(CUDA)).run()
    assert result.summary["test_accuracy"] >= 0.9, result.summary


@pytest.mark.parametrize("name", ["sync_ps", "downpour", "allreduce", "sgp"])
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_ranks_sharing_one_gpu_train_with_cuda_tensors(name, backend, tmp_path):
    out = tmp_path / "s.json"
    proc = mpiexec(3, str(BIN / "downpour"), "train", "--algorithm", name, "--backend", backend,
                   "--device", "cuda", "--model", "lenet", "--dataset", "digits", "--epochs", "5",
                   "--precision", "bf16", "--summary-json", str(out), timeout=400)
    assert proc.returncode == 0, explain(proc)
    s = read_json(out)
    assert s["device"].startswith("cuda") and s["backend"] == backend, s
    assert s["test_accuracy"] > 0.5, s


def test_imagefolder_pipeline_delivers_pinned_batches_to_the_gpu(tmp_path):
    root = write_imagefolder(tmp_path / "folder", classes=4, per_class=16, size=(500, 375))
    train = load_dataset("imagefolder", root).train
    sampler = ShardSampler(len(train), 8, 0, 1, 0)
    on_gpu = TrainBatches(train, sampler, range(6), True, 0, 2, CUDA)
    on_cpu = TrainBatches(train, sampler, range(6), True, 0, 0, torch.device("cpu"))
    try:
        for (_, _, xg, yg), (_, _, xc, yc) in zip(on_gpu, on_cpu, strict=True):
            assert xg.device == CUDA and torch.equal(xg.cpu(), xc) and torch.equal(yg.cpu(), yc)
        assert on_gpu.loader.pin_memory
    finally:
        on_gpu.close()
        on_cpu.close()
    config = TrainConfig(model="resnet18", dataset="imagefolder", data_dir=str(root), batch_size=8,
                         steps=6, warmup_steps=1, device="cuda", precision="bf16", data_workers=2)
    result = Trainer(config, DistContext.single(CUDA)).run()
    assert result.summary["augment"] == "standard" and result.steps.loss.notna().all()
