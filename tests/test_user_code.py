"""Your own model and data set: by import path from a file outside the package, or defined in a
notebook cell, through `downpour train`, `downpour study`, notebook 02 and a cluster's engines;
bad input is one line naming the value and what would work, before any rank waits."""

from __future__ import annotations

import json
import textwrap

import nbformat
import pandas as pd
import pytest
import torch
from conftest import BIN, ROOT, explain, launch_env, mpiexec_path
from torch import nn
from torch.utils.data import TensorDataset

from downpour_lib import TrainConfig, make_trainer
from downpour_lib.cluster.mpiexec import run_mpiexec
from downpour_lib.comm.runtime import DistContext
from downpour_lib.data import load_dataset
from downpour_lib.data import register as register_dataset
from downpour_lib.errors import ConfigError
from downpour_lib.models import register as register_model
from downpour_lib.notebooks import run_notebook

USERS_FILE = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset


    class TwoLayer(nn.Module):
        def __init__(self, features, classes):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(features, 32), nn.ReLU(),
                                     nn.Linear(32, classes))

        def forward(self, x):
            return self.net(x)


    def build(input_shape, num_classes):
        return TwoLayer(int(torch.tensor(input_shape).prod()), num_classes)


    def blobs(data_dir):
        """Four well-separated clusters of 2x5x5 inputs: any working model learns them."""
        g = torch.Generator().manual_seed(0)
        centers = torch.randn(4, 2, 5, 5, generator=g) * 2

        def make(n):
            y = torch.randint(4, (n,), generator=g)
            return TensorDataset(centers[y] + torch.randn(n, 2, 5, 5, generator=g), y)

        return make(1024), make(256)


    def too_narrow(input_shape, num_classes):
        return TwoLayer(3, num_classes)


    def no_module(input_shape, num_classes):
        return 42


    def not_pairs(data_dir):
        return [1, 2, 3], [4]


    def one_argument(input_shape):
        return TwoLayer(50, 4)


    def no_directory():
        return blobs(None)


    def inputs_alone(data_dir):
        train, validation = blobs(data_dir)
        return [(x,) for x, _ in train], [(x,) for x, _ in validation]
    ''')


@pytest.fixture
def users_dir(tmp_path, monkeypatch):
    """A user's own file, outside the package, in the working directory."""
    (tmp_path / "mymodels.py").write_text(USERS_FILE)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import sys

    sys.modules.pop("mymodels", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_a_model_and_data_set_by_import_path_train_and_are_recorded(users_dir):
    config = TrainConfig(algorithm="local", model="mymodels:build", dataset="mymodels:blobs",
                         epochs=2, batch_size=32, threads=1)
    s = make_trainer(config, DistContext.single()).run().summary
    assert s["model"] == "mymodels:build" and s["test_accuracy"] > 0.9, s
    source = (users_dir / "mymodels.py").read_text()
    import hashlib

    assert s["model_source_sha256"] == hashlib.sha256(source.encode()).hexdigest()[:12]
    assert s["dataset_source_sha256"] == s["model_source_sha256"]  # the same module


@pytest.mark.parametrize("model, dataset, says", [
    ("nosuchmodule:build", "digits", "module 'nosuchmodule' does not import"),
    ("mymodels:nothere", "digits", "module 'mymodels' has no 'nothere'"),
    ("mymodels:", "digits", "an import path package.module:function"),
    ("mymodels:no_module", "mymodels:blobs", "it returned int, not a torch.nn.Module"),
    ("mymodels:too_narrow", "mymodels:blobs", "forward fails on the data set's samples of shape (2, 5, 5)"),
    ("mymodels:build", "mymodels:not_pairs", "(x, y) pairs"),
    ("mlp", "mymodels:nowhere", "module 'mymodels' has no 'nowhere'"),
    ("mymodels:one_argument", "mymodels:blobs", "model='mymodels:one_argument' is not valid: it is "
     "one_argument(input_shape), which cannot be called with (input_shape, num_classes); give a "
     "function (input_shape, num_classes) -> nn.Module"),
    ("mymodels:build", "mymodels:no_directory", "it is no_directory(), which cannot be called with "
     "(data_dir)"),
    ("mymodels:build", "mymodels:inputs_alone", "sample 0 is a tuple of 1 (Tensor)"),
])
def test_bad_user_code_is_one_line_naming_the_value(users_dir, model, dataset, says):
    proc = __import__("subprocess").run(
        [str(BIN / "downpour"), "train", "--model", model, "--dataset", dataset, "--steps", "5"],
        env=launch_env(), capture_output=True, text=True, timeout=120, cwd=users_dir)
    assert proc.returncode == 2, explain(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_a_model_whose_logits_do_not_fit_the_classes_is_refused_before_training():
    register_model("three_out", lambda shape, classes: nn.Sequential(nn.Flatten(), nn.LazyLinear(3)))
    with pytest.raises(ConfigError, match=r"returns \(2, 3\); the data set needs logits of shape \(2, 10\)"):
        make_trainer(TrainConfig(model="three_out", dataset="digits", steps=2, warmup_steps=1),
                     DistContext.single())


def test_names_of_built_ins_are_refused_and_callables_are_registered():
    with pytest.raises(ConfigError, match="'lenet' is a built-in model; give yours another name"):
        register_model("lenet", lambda shape, classes: nn.Linear(1, 1))
    with pytest.raises(ConfigError, match=r"cannot be called with \(input_shape, num_classes\)"):
        register_model("one_argument", lambda shape: nn.Linear(1, 1))
    with pytest.raises(ConfigError, match="'digits' is a built-in dataset"):
        register_dataset("digits", lambda d: None)

    def tiny_lm_data(data_dir):
        tokens = torch.arange(4000) % 50
        x = tokens[:-1].unfold(0, 16, 16)[:200]
        y = tokens[1:].unfold(0, 16, 16)[:200]
        train = TensorDataset(x, y)
        train.vocabulary = 64
        return train, TensorDataset(x[:20], y[:20])

    config = TrainConfig(algorithm="local", model="gpt-nano", dataset=tiny_lm_data, steps=30,
                         warmup_steps=1, batch_size=8, threads=1, optimizer="adam", lr=0.01)
    assert config.data.dataset == "tiny_lm_data"  # registered under its name
    train = load_dataset("tiny_lm_data").train
    assert train.task == "lm" and train.input_shape == (16,) and train.num_classes == 64
    s = make_trainer(config, DistContext.single()).run().summary
    assert s["test_perplexity"] < 3, s  # a counting sequence: the next token is all but certain
    assert "dataset_source_sha256" in s


def test_downpour_train_and_study_run_your_file_under_mpiexec(users_dir):
    out = users_dir / "s.json"
    proc = run_mpiexec([mpiexec_path(), "-n", "2", "--oversubscribe", "--bind-to", "none",
                        str(BIN / "downpour"), "train", "--algorithm", "allreduce", "--model",
                        "mymodels:build", "--dataset", "mymodels:blobs", "--epochs", "2",
                        "--summary-json", str(out)], env=launch_env(), capture_output=True,
                       text=True, timeout_s=300, cwd=users_dir)  # run where your file is
    assert proc.returncode == 0, explain(proc)
    s = json.loads(out.read_text())
    assert s["world_size"] == 2 and s["test_accuracy"] > 0.9 and s["model_source_sha256"], s
    proc = __import__("subprocess").run(
        [str(BIN / "downpour"), "study", "--model", "mymodels:build", "--dataset",
         "mymodels:blobs", "--algorithms", "allreduce", "--workers", "1,2", "--steps", "6",
         "--repeats", "1", "--out", str(users_dir / "study")],
        env=launch_env(), capture_output=True, text=True, timeout=600, cwd=users_dir)
    assert proc.returncode == 0, explain(proc)
    runs = pd.read_csv(users_dir / "study" / "runs.csv")
    assert sorted(runs.world_size) == [1, 2] and (runs.model == "mymodels:build").all()
    assert (runs.model_source_sha256 == s["model_source_sha256"]).all()


def _cells(*sources: str):
    """A notebook of these code cells, after an empty ``parameters`` cell."""
    nb = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("engines = 2")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, *(nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in sources)]
    return nb


def test_a_model_class_defined_in_a_notebook_cell_trains_on_the_engines(tmp_path):
    path = tmp_path / "mine.ipynb"
    nbformat.write(_cells(
        """
        from torch import nn
        from downpour_lib import TrainConfig
        from downpour_lib.cluster import use_cluster

        class Wide(nn.Module):  # defined here: the engines have no module to import it from
            def __init__(self, input_shape, num_classes):
                super().__init__()
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(),
                                         nn.Linear(128, num_classes))
            def forward(self, x):
                return self.net(x)
        """,
        """
        with use_cluster("local-mpi", n=engines) as cluster:
            result = cluster.train(TrainConfig(algorithm="allreduce", model=Wide, dataset="digits",
                                               epochs=3, threads=1))
        print("RESULT", result.summary["model"], result.summary["world_size"],
              result.summary["test_accuracy"])
        """), path)
    nb = run_notebook(path, timeout_s=600)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    _, name, world, accuracy = next(line for line in text.splitlines() if line.startswith("RESULT")).split()
    assert name == "Wide" and world == "2" and float(accuracy) > 0.85, text


def test_notebook_02_scales_a_model_from_your_file(users_dir):
    params = {"algorithms": ["allreduce"], "engines": 2, "workers": [1, 2], "repeats": 1,
              "out": str(users_dir / "scaling"),
              "overrides": {"model": "mymodels:build", "dataset": "mymodels:blobs",
                            "batch_size": 16, "steps": 6, "warmup_steps": 2},
              "emulated_workers": []}
    env = {**launch_env(), "PYTHONPATH": str(users_dir)}
    run_notebook(ROOT / "notebooks" / "02_scaling_study.ipynb", params, env=env)
    runs = pd.read_csv(users_dir / "scaling" / "runs.csv")
    assert sorted(runs.world_size) == [1, 2] and (runs.model == "mymodels:build").all()
    assert runs.model_source_sha256.notna().all() and (runs.samples_per_s > 0).all()


class _ReadsItsData(nn.Module):
    """A forward that branches on its input's values, as a check for bad data would: the meta
    device has no values to branch on."""

    def __init__(self, classes: int, reads: bool = True):
        super().__init__()
        self.net, self.reads = nn.Sequential(nn.Flatten(), nn.Linear(64, classes)), reads

    def forward(self, x):
        if self.reads and not torch.isfinite(x).all():
            raise ValueError("non-finite input")
        return self.net(x)


def test_a_forward_that_reads_its_data_is_checked_on_the_cpu_and_trains_as_seeded():
    """The fit check runs such a forward on the CPU (the meta device cannot): it trains, from the
    parameters its seed gives (the check's own build draws aside), and a misfit is still said."""
    register_model("reads_data", lambda shape, classes: _ReadsItsData(classes))
    register_model("reads_nothing", lambda shape, classes: _ReadsItsData(classes, reads=False))
    register_model("reads_narrow", lambda shape, classes: _ReadsItsData(3))
    runs = {name: make_trainer(TrainConfig(algorithm="local", model=name, dataset="digits", steps=3,
                                           warmup_steps=0, threads=1), DistContext.single()).run()
            for name in ("reads_data", "reads_nothing")}
    assert runs["reads_data"].summary["final_train_loss"] == runs["reads_nothing"].summary["final_train_loss"]
    with pytest.raises(ConfigError, match=r"returns \(2, 3\); the data set needs logits of shape \(2, 10\)"):
        make_trainer(TrainConfig(model="reads_narrow", dataset="digits", steps=2, warmup_steps=1),
                     DistContext.single())


def _labelled(y_train, y_val=None):
    """A data-set function of 2x5x5 inputs with these labels (validation: the train's first 8)."""
    x = torch.randn(len(y_train), 2, 5, 5)
    val = y_train[:8] if y_val is None else y_val
    return lambda data_dir: (TensorDataset(x, y_train), TensorDataset(x[:len(val)], val))


@pytest.mark.parametrize("name, labels, says", [
    # float targets were cast to 0 and trained to accuracy 1.0; one-hot ones taken for tokens
    ("float_labels", _labelled(torch.rand(64)), "its labels y must be class indices (integers), "
     "or a language model's next tokens (integers shaped like x); sample 0's y is a float32 number"),
    ("one_hot_labels", _labelled(nn.functional.one_hot(torch.arange(64) % 4, 4).float()),
     "sample 0's y is a float32 tensor of shape (4,)"),
    # a label the loss cannot index failed mid-run, or after training at the evaluation
    ("negative_labels", _labelled(torch.arange(64) % 4 - 1), "its train labels run from -1 to 2; "
     "give class indices from 0 to 2 (3 classes"),
    ("unseen_label", _labelled(torch.arange(64) % 3, torch.tensor([0, 1, 9])),
     "its validation labels run from 0 to 9; give class indices from 0 to 2"),
])
def test_labels_that_are_not_class_indices_are_refused_before_training(name, labels, says):
    register_dataset(name, labels)
    with pytest.raises(ConfigError, match=f"dataset='{name}' is not valid: ") as refused:
        load_dataset(name, "data")
    assert says in str(refused.value), refused.value


def test_a_study_and_from_dict_take_your_model_class_itself():
    """Notebook 02's overrides (study_spec) and TrainConfig.from_dict take the class or function,
    as TrainConfig does: registered under its name, which the planned runs carry."""
    from downpour_lib.study.scaling import study_spec

    class CellWide(nn.Module):
        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

        def forward(self, x):
            return self.net(x)

    spec = study_spec(["allreduce"], [1, 2], {"model": CellWide, "dataset": "digits"},
                      csv="unused.csv")
    assert {run.config.model for run in spec.planned()} == {"CellWide"}
    assert TrainConfig.from_dict({"model": CellWide, "dataset": "digits"}).model == "CellWide"


def test_an_import_path_with_a_dot_for_its_colon_gets_the_colon():
    with pytest.raises(ConfigError, match=r"model='mymodels.build' is not valid: did you mean "
                                          r"mymodels:build\? An import path names"):
        TrainConfig(model="mymodels.build")
    with pytest.raises(ConfigError, match=r"dataset='mine.data.blobs' is not valid: did you mean "
                                          r"mine.data:blobs\?"):
        TrainConfig(dataset="mine.data.blobs")
    with pytest.raises(ConfigError, match="did you mean resnet20"):  # a built-in's typo stays so
        TrainConfig(model="resnt20")


def test_your_constructors_own_error_is_one_traceback_not_two():
    """A constructor that fails is built again on the CPU (the meta device may be what failed);
    its error there is its own, not raised "during handling of" the first."""
    from downpour_lib.models import build_shaped

    def broken(input_shape, num_classes):
        raise RuntimeError("my constructor is broken")

    register_model("broken_constructor", broken)
    with pytest.raises(RuntimeError, match="my constructor is broken") as raised:
        build_shaped("broken_constructor", (1, 8, 8), 10)
    assert raised.value.__context__ is None and raised.value.__cause__ is None
