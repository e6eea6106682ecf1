"""The data pipeline: real-format data through DataLoader workers in ShardSampler's order, and
augmentation drawn from (seed, epoch, index), so batches are bit-identical whoever reads them."""

import pytest
import torch
from conftest import explain, mpi_python

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import ShardSampler, load_dataset
from downpour_lib.data.augment import CropFlip, generator, resized_crop_box
from downpour_lib.data.catalog import CIFAR_MEAN, CIFAR_STD
from downpour_lib.data.generate import write_imagefolder, write_mnist
from downpour_lib.data.loader import TrainBatches, eval_indices
from downpour_lib.data.sources import TensorSource
from downpour_lib.engine import evaluate
from downpour_lib.errors import ConfigError

CPU = torch.device("cpu")


def cifar_like(n=96, seed=0):
    """A CIFAR-shaped uint8 source with CIFAR's standard augmentation, read in workers."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), generator=g)
    return TensorSource(images, labels, 10, CIFAR_MEAN, CIFAR_STD, 255.0, CropFlip(4, True),
                        in_workers=True)


def read(source, workers, augment=True, steps=range(0, 9), seed=5, worker=0, of=2, batch=8):
    stream = TrainBatches(source, ShardSampler(len(source), batch, worker, of, seed), steps, augment,
                          seed, workers, CPU)
    try:
        return list(stream)
    finally:
        stream.close()


def same(a, b):
    return len(a) == len(b) and all(
        ea == eb and torch.equal(ia, ib) and torch.equal(xa, xb) and torch.equal(ya, yb)
        for (ea, ia, xa, ya), (eb, ib, xb, yb) in zip(a, b, strict=True))


def test_augmented_batches_are_bit_identical_across_runs_and_data_worker_counts():
    source = cifar_like()
    inline = read(source, workers=0)
    assert same(inline, read(cifar_like(), workers=0))  # a second run
    assert same(inline, read(source, workers=1))
    assert same(inline, read(source, workers=3))
    # ... and in ShardSampler's order, step by step (9 steps cross into the second epoch)
    sampler = ShardSampler(len(source), 8, 0, 2, 5)
    assert [(e, i.tolist()) for e, i, _, _ in inline] == \
        [(e, i.tolist()) for e, i in map(sampler.indices, range(9))]
    assert {e for e, *_ in inline} == {0, 1}


def test_augmentation_changes_samples_per_epoch_and_none_leaves_them():
    source = cifar_like()
    plain = read(source, workers=0, augment=False)
    x, y = source.batch(plain[0][1])  # the unaugmented batch, read directly
    assert torch.equal(plain[0][2], x) and torch.equal(plain[0][3], y)
    augmented = read(source, workers=0)
    assert not torch.equal(augmented[0][2], plain[0][2])
    # the same sample is drawn differently in another epoch, alike in the same one
    index = 7
    draws = [source.sample(index, epoch, True, seed=5)[0] for epoch in (0, 0, 1)]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_crop_flip_is_a_shifted_window_of_the_padded_image():
    x = torch.arange(2 * 6 * 6, dtype=torch.float32).view(2, 6, 6) + 1
    for index in range(40):
        out = CropFlip(pad=2, flip=True)(x, generator(0, 0, index))
        padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
        windows = [padded[:, i:i + 6, j:j + 6] for i in range(5) for j in range(5)]
        assert any(torch.equal(out, w) or torch.equal(out, w.flip(-1)) for w in windows)
    flips = sum(not torch.equal(CropFlip(0, True)(x, generator(0, 0, i)), x) for i in range(200))
    assert 70 < flips < 130  # about half


def test_resized_crop_boxes_lie_inside_the_image_with_torchvisions_area_and_ratio():
    for index in range(200):
        top, left, h, w = resized_crop_box(320, 256, generator(1, 2, index))
        assert 0 <= top and top + h <= 256 and 0 <= left and left + w <= 320
        assert 0.08 * 320 * 256 * 0.9 <= h * w <= 320 * 256
        assert 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1


def test_imagefolder_jpegs_through_workers_equal_reading_inline(tmp_path):
    root = write_imagefolder(tmp_path / "folder", classes=3, per_class=6, size=(96, 80))
    splits = load_dataset("imagefolder", root)
    assert (len(splits.train), splits.train.num_classes, splits.train.input_shape) == \
        (18, 3, (3, 224, 224))
    inline = read(splits.train, workers=0, steps=range(4), batch=4, of=1)
    assert same(inline, read(splits.train, workers=2, steps=range(4), batch=4, of=1))
    assert inline[0][2].shape == (4, 3, 224, 224)
    x, _ = splits.test.batch(torch.arange(2))  # evaluation: resize + centre crop, no draws
    assert torch.equal(x, splits.test.batch(torch.arange(2))[0])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 3))
    assert evaluate(model, splits.test, 4, CPU, workers=2) == evaluate(model, splits.test, 4, CPU)


def test_an_evaluation_of_some_samples_reads_them_evenly_over_the_split():
    """eval_samples=N evaluates N samples spread evenly over the split (an ImageFolder's test split
    is sorted by class, so its first N could be one class), through workers as inline, and its
    loss and accuracy are those of exactly those samples; a run's evaluation reports N."""
    assert eval_indices(10, 4) == [0, 2, 5, 7]
    assert [list(eval_indices(10, n)) for n in (0, 10, 99)] == [list(range(10))] * 3
    source = cifar_like(96)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 10))
    x, y = source.batch(torch.tensor(eval_indices(96, 20)))  # the reference: those 20, at once
    with torch.no_grad():
        out = model(x)
    reference = (torch.nn.functional.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item())
    inline = evaluate(model, source, 8, CPU, samples=20)
    assert inline == pytest.approx(reference, rel=1e-6)
    assert evaluate(model, source, 8, CPU, workers=2, samples=20) == inline
    assert evaluate(model, source, 8, CPU) != inline  # all 96 are another mean

    config = TrainConfig(model="mlp", dataset="digits", steps=3, warmup_steps=1, threads=1,
                         eval_samples=50)
    result = make_trainer(config, DistContext.single()).run()
    assert result.evals["samples"].tolist() == [50]
    with pytest.raises(ConfigError, match="eval_samples=-1"):
        TrainConfig(eval_samples=-1)


def test_real_data_sets_default_to_standard_augmentation_and_others_to_none(tmp_path):
    assert TrainConfig(dataset="cifar10").data.augment == "standard"
    assert TrainConfig(dataset="imagefolder").data.augment == "standard"
    assert TrainConfig(dataset="digits").data.augment == "none"
    assert TrainConfig(dataset="synthetic-cifar").data.augment == "none"
    config = TrainConfig(dataset="digits", augment="standard", steps=3, warmup_steps=0)
    with pytest.raises(ConfigError, match="augment='standard'.*'digits' has no standard"):
        make_trainer(config, DistContext.single())


def test_mnist_trains_through_data_workers(tmp_path):
    root = write_mnist(tmp_path / "data", train=256, test=64)
    runs = [make_trainer(TrainConfig(dataset="mnist", data_dir=str(root), model="mlp", batch_size=32,
                                     steps=6, warmup_steps=1, threads=1, data_workers=workers,
                                     seed=2), DistContext.single()).run() for workers in (0, 2)]
    assert runs[0].steps.loss.tolist() == runs[1].steps.loss.tolist()  # the same samples and draws
    assert runs[0].summary["augment"] == "standard"


def test_two_algorithms_read_identical_batches_under_mpiexec(tmp_path):
    """allreduce, sgp and sync_ps (a dedicated server: 2 workers on 3 ranks) read the same
    augmented MNIST batches in DataLoader workers, worker by worker, and train on them."""
    root = write_mnist(tmp_path / "data", train=256, test=64)
    proc = mpi_python(3, "same_batches.py", str(root), timeout=300)
    assert proc.returncode == 0, explain(proc)
    assert "identical batches: allreduce, sgp, sync_ps" in proc.stdout, explain(proc)


def test_reading_ahead_in_a_thread_keeps_order_hands_over_errors_and_stops_when_closed():
    from downpour_lib.data.loader import Ahead

    assert list(Ahead(iter(range(50)), depth=2)) == list(range(50))

    def failing():
        yield 1
        raise ValueError("bad sample 2")

    ahead = Ahead(failing())
    it = iter(ahead)
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad sample 2"):
        next(it)
    endless = Ahead(iter(lambda: 0, 1), depth=2)  # a producer that never ends
    assert next(iter(endless)) == 0
    endless.close()
    assert not endless.thread.is_alive()
