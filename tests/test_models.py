"""The model registry: every model builds, runs and trains for the shapes it accepts, parameter
counts match the papers, bad names and sizes fail with errors that say what to do, and seeded
builds are reproducible."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from downpour_lib.errors import ConfigError
from downpour_lib.models import MODELS, build_model, model_names, parameter_count

# the classifiers; the language models have tests/test_language_model.py
NAMES = [n for n in model_names() if MODELS[n].task == "classify"]


def _forward_backward(name: str, input_shape: tuple[int, int, int], num_classes: int) -> None:
    torch.manual_seed(0)
    model = build_model(name, input_shape, num_classes)
    out = model(torch.randn(2, *input_shape))
    assert out.shape == (2, num_classes)
    assert torch.isfinite(out).all()
    out.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_registry_order() -> None:
    assert model_names() == [
        "mlp", "lenet", "cnn1d", "inception_small",
        "resnet20", "resnet32", "resnet56", "resnet110",
        "resnet18", "resnet50", "resnet152", "vgg11", "vgg16",
        "gpt-nano", "gpt-mini", "gpt2",
    ]  # fmt: skip
    for name, spec in MODELS.items():
        assert spec.name == name
        assert "\n" not in spec.description
        assert re.search(r"\b(19|20)\d\d\b", spec.description)  # cites a paper by year


@pytest.mark.parametrize("name", NAMES)
def test_default_input_forward_backward(name: str) -> None:
    spec = MODELS[name]
    _forward_backward(name, spec.default_input, spec.default_classes)


@pytest.mark.parametrize("name", NAMES)
def test_cifar_shape_forward_backward(name: str) -> None:
    _forward_backward(name, (3, 32, 32), 10)


@pytest.mark.parametrize("name", NAMES)
def test_one_channel_at_min_size(name: str) -> None:
    # Exercises both the channel adaptation and the claim that min_size is accepted.
    size = MODELS[name].min_size
    _forward_backward(name, (1, size, size), 7)


@pytest.mark.parametrize("name", ["inception_small", "resnet20"])
def test_odd_image_size(name: str) -> None:
    # The two paths of each downsampling step must agree on odd sizes too.
    _forward_backward(name, (1, 15, 15), 10)


@pytest.mark.parametrize("input_shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_lenet_input_sizes(input_shape: tuple[int, int, int]) -> None:
    _forward_backward("lenet", input_shape, 10)


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_exact_gradient_models_are_deterministic(name: str) -> None:
    # Algorithms are tested by comparing gradients exactly, so no dropout or batch statistics.
    model = build_model(name, (1, 28, 28), 10)
    banned = (nn.Dropout, nn.BatchNorm1d, nn.BatchNorm2d)
    assert not any(isinstance(m, banned) for m in model.modules())
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(model(x), model(x))


def test_mlp_layers() -> None:
    model = build_model("mlp", (3, 8, 8), 5)
    linears = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears == [(192, 128), (128, 128), (128, 5)]


def test_inception_small_downsamples_to_8x8_on_cifar() -> None:
    model = build_model("inception_small", (3, 32, 32), 10)
    features = model.features(torch.randn(2, 3, 32, 32))
    assert features.shape == (2, 176 + 160, 8, 8)


def test_inception_small_parameter_count() -> None:
    count = parameter_count(build_model("inception_small", (3, 32, 32), 10))
    assert abs(count - 1_649_402) <= 0.01 * 1_649_402
    assert count == 1_649_402


@pytest.mark.parametrize(
    ("name", "paper", "option_a"),
    [
        ("resnet20", 0.27e6, 269_722),
        ("resnet32", 0.46e6, 464_154),
        ("resnet56", 0.85e6, 853_018),
        ("resnet110", 1.7e6, 1_727_962),
    ],
)
def test_cifar_resnet_parameter_counts(name: str, paper: float, option_a: int) -> None:
    count = parameter_count(build_model(name, (3, 32, 32), 10))
    assert abs(count - paper) <= 0.02 * paper
    # Option A shortcuts have no parameters; projection shortcuts would add 2,752.
    assert count == option_a


def test_resnet18_is_torchvisions() -> None:
    assert parameter_count(build_model("resnet18", (3, 224, 224), 1000)) == 11_689_512


def test_parameter_count_skips_frozen() -> None:
    model = build_model("mlp", (1, 2, 2), 2)
    total = parameter_count(model)
    model[1].weight.requires_grad_(False)
    assert parameter_count(model) == total - 4 * 128


def test_unknown_name_lists_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        build_model("resnet19", (3, 32, 32), 10)
    message = str(caught.value)
    assert "resnet19" in message
    assert all(name in message for name in NAMES)


def test_too_small_input_names_sizes_and_fitting_models() -> None:
    with pytest.raises(ConfigError) as caught:
        build_model("vgg16", (3, 8, 8), 10)
    message = str(caught.value)
    assert "32x32" in message and "8x8" in message
    assert "lenet" in message and "resnet20" in message
    assert "vgg11" not in message


@pytest.mark.parametrize("name", [name for name in NAMES if MODELS[name].min_size > 1])
def test_just_below_min_size_is_rejected(name: str) -> None:
    size = MODELS[name].min_size
    with pytest.raises(ConfigError):
        build_model(name, (1, size, size - 1), 10)


def test_too_few_classes() -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        build_model("mlp", (1, 28, 28), 1)


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [
        ("mlp", (1, 28, 28)),
        ("lenet", (1, 8, 8)),
        ("inception_small", (3, 32, 32)),
        ("resnet20", (3, 32, 32)),
        ("resnet18", (1, 32, 32)),
        ("vgg11", (1, 32, 32)),
    ],
)
def test_seeded_builds_are_identical(name: str, input_shape: tuple[int, int, int]) -> None:
    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, input_shape, 10).state_dict()

    first, again, other = build(1), build(1), build(2)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
