"""Data sets and sharding: disjoint shards whose union is the single-process batch."""

import pytest
import torch

from downpour_lib.data import DATASETS, ShardSampler, load_dataset
from downpour_lib.errors import ConfigError, DataError


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_worker_batches_together_are_the_single_process_batch(workers):
    n, b, seed = 103, 4, 7
    single = ShardSampler(n, workers * b, 0, 1, seed)
    shards = [ShardSampler(n, b, w, workers, seed) for w in range(workers)]
    assert all(s.steps_per_epoch == single.steps_per_epoch for s in shards)
    for step in range(2 * single.steps_per_epoch):  # two epochs, reshuffled
        epoch, ref = single.indices(step)
        parts = [s.indices(step)[1] for s in shards]
        assert sorted(torch.cat(parts).tolist()) == sorted(ref.tolist())


def test_shards_are_disjoint_and_reshuffled_per_epoch():
    shards = [ShardSampler(100, 5, w, 3, seed=1) for w in range(3)]
    epoch0 = [set(s.shard(0).tolist()) for s in shards]
    assert all(len(a & b) == 0 for i, a in enumerate(epoch0) for b in epoch0[i + 1:])
    assert sum(map(len, epoch0)) == 99  # 100 // 3 * 3: equal shards
    assert not torch.equal(shards[0].shard(0), shards[0].shard(1))
    # the order depends only on seed and epoch
    assert torch.equal(ShardSampler(100, 5, 0, 3, seed=1).shard(4), shards[0].shard(4))


def test_batch_too_large_for_the_data():
    with pytest.raises(ConfigError, match="batch_size=64.*2 worker.*<= 50"):
        ShardSampler(100, 64, 0, 2, seed=0)


def test_digits_fixed_split_and_normalized():
    splits = load_dataset("digits")
    assert (len(splits.train), len(splits.test)) == (1437, 360)
    x, y = splits.train.batch(torch.arange(len(splits.train)))
    assert x.shape == (1437, 1, 8, 8) and y.dtype == torch.int64
    assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-2
    again = load_dataset("digits")
    assert torch.equal(again.test.batch(torch.arange(360))[1], splits.test.batch(torch.arange(360))[1])
    assert set(splits.test.batch(torch.arange(360))[1].tolist()) == set(range(10))


def test_digits_from_the_cache_are_scikit_learns_split_and_a_cut_file_is_made_again(tmp_path,
                                                                                   monkeypatch):
    """A rank reads the split digits from the cache, not from scikit-learn (a second of CPU each):
    made in an empty cache, read back, and made again over a file cut short, always the images,
    labels and stratified split scikit-learn gives."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digits = load_digits()
    train, test = train_test_split(range(1797), test_size=360, random_state=0, stratify=digits.target)
    expected = {"train": torch.tensor(digits.images[train], dtype=torch.float32),
                "test": torch.tensor(digits.images[test], dtype=torch.float32)}
    labels = {"train": torch.tensor(digits.target[train]), "test": torch.tensor(digits.target[test])}
    for attempt in ("made", "read", "made over a cut file"):
        cached = list((tmp_path / "downpour").glob("digits_sklearn*.npz"))
        assert len(cached) == (attempt != "made"), attempt
        if attempt == "made over a cut file":
            cached[0].write_bytes(cached[0].read_bytes()[:1000])
        splits = load_dataset("digits")
        for part in ("train", "test"):
            source = getattr(splits, part)
            assert torch.equal(source.images[:, 0], expected[part]), (attempt, part)
            assert torch.equal(source.labels, labels[part]), (attempt, part)
        assert splits.train.mean.item() == pytest.approx(expected["train"].mean().item(), rel=1e-6)


@pytest.mark.parametrize("name", ["synthetic-mnist", "synthetic-cifar", "synthetic-imagenet"])
def test_synthetic_sets_are_deterministic_and_shaped(name):
    spec = DATASETS[name]
    a, b = load_dataset(name), load_dataset(name)
    idx = torch.tensor([0, 5, len(a.train) - 1])
    xa, ya = a.train.batch(idx)
    xb, yb = b.train.batch(idx)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.shape == (3, *spec.input_shape) and len(a.train) == spec.train_size
    assert int(ya.max()) < spec.num_classes


@pytest.mark.parametrize("name, expected", [
    ("mnist", "MNIST/raw"), ("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python"),
    ("imagefolder", "train/<class>/<image>"),
])
def test_missing_files_name_the_directory_and_what_to_put_there(tmp_path, name, expected):
    with pytest.raises(DataError) as err:
        load_dataset(name, tmp_path)
    message = str(err.value)
    assert str(tmp_path) in message and expected in message and "--data-dir" in message


def test_real_cifar_loader_reads_the_python_batches(tmp_path, monkeypatch):
    """The real loader, on files in CIFAR-10's own format (pickled dicts), built here."""
    import pickle

    import numpy as np

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, 4).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": ["c"] * 10}))
    import torchvision.datasets.cifar as cifar

    # torchvision verifies the MD5 sums of the published files; ours have the layout, not the sums.
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    splits = load_dataset("cifar10", tmp_path)
    x, y = splits.train.batch(torch.arange(20))
    assert x.shape == (20, 3, 32, 32) and len(splits.test) == 4


def test_unknown_dataset():
    with pytest.raises(ConfigError, match="choose one of .*digits"):
        load_dataset("svhn")
