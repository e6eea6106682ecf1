"""Model registry: a name -> a constructor for (input shape, number of classes).

Every model takes any channel count and any image size from its min_size up, so one name works
for scikit-learn digits, MNIST and CIFAR alike. Building after torch.manual_seed(s) gives the same
weights every time: constructors use only the global generator, in a fixed order. The registry
itself imports no torch (the config, the studies' plans and the performance model read it): a
model's module is imported when it is first built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from downpour_lib import user_code
from downpour_lib.errors import ConfigError, unknown_name

if TYPE_CHECKING:
    from torch import nn

InputShape = tuple[int, ...]
"""(channels, height, width) of one image, or (context,) tokens of a language model's sample."""


@dataclass(frozen=True)
class ModelSpec:
    """One registered model and what it needs."""

    name: str
    """The registry key, as given on the command line."""
    description: str
    """One line that names the architecture and cites its paper."""
    default_input: InputShape
    """The input `downpour models` counts parameters for: the data set the model was made for."""
    default_classes: int
    """The class count `downpour models` counts parameters for."""
    min_size: int
    """The smallest image height and width the network accepts: where its last downsampling stage
    still has a whole pixel to halve."""
    build: Callable[[InputShape, int], nn.Module]
    """(input_shape, num_classes) -> an untrained module."""
    task: Literal["classify", "lm"] = "classify"
    """An image classifier, or a language model: input shape (context,), classes the vocabulary,
    int64 tokens (B, T) in and logits (B, T, vocabulary) out."""


def _built_by(module: str, function: str, *args: Any) -> Callable[[InputShape, int], nn.Module]:
    """``function`` of this package's ``module``, called with ``args``, the input shape and the
    classes; the module (and torch) imported at the first build."""

    def build(input_shape: InputShape, num_classes: int) -> nn.Module:
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(
            *args, input_shape, num_classes)

    return build


# The smallest images the networks take (``ModelSpec.min_size``). LeNet: each of the two max pools
# halves the image (rounding down), so 4x4 still leaves one pixel for the classifier (8x8 digits
# leave 2x2). The CIFAR ResNets: each of the two stride-2 stages halves the image rounding up
# (32 -> 16 -> 8), and 4x4 leaves each a whole pixel to halve; so does the small Inception, whose
# Downsample branches both pad by 1 so that they agree on any size. torchvision's: VGG's five 2x2
# max pools round down, so anything under 32x32 pools to nothing; the ResNets halve five times as
# well, and 32x32 is where both reach 1x1 before the adaptive average pool.
_HALVED_TWICE = 4
_HALVED_FIVE_TIMES = 32

_DIGITS = (1, 28, 28)
_CIFAR = (3, 32, 32)
_IMAGENET = (3, 224, 224)
_HE2016 = 'He et al. 2016, "Deep Residual Learning for Image Recognition"'
_VGG2015 = (
    "Simonyan & Zisserman 2015, "
    '"Very Deep Convolutional Networks for Large-Scale Image Recognition"'
)


def _cifar_resnet(depth: int) -> ModelSpec:
    return ModelSpec(
        f"resnet{depth}",
        f"ResNet-{depth} for CIFAR-10, option A shortcuts ({_HE2016}, section 4.2)",
        _CIFAR,
        10,
        _HALVED_TWICE,
        _built_by("cifar_resnet", "cifar_resnet", depth),
    )


def _torchvision(arch: str, title: str, paper: str) -> ModelSpec:
    return ModelSpec(
        arch,
        f"torchvision {title}, untrained ({paper})",
        _IMAGENET,
        1000,
        _HALVED_FIVE_TIMES,
        _built_by("torchvision_models", "torchvision_model", arch),
    )


_SPECS = (
    ModelSpec(
        "mlp",
        "MLP, two hidden layers of 128 ReLU units (Rumelhart, Hinton & Williams 1986, "
        '"Learning representations by back-propagating errors")',
        _DIGITS,
        10,
        1,
        _built_by("mlp", "mlp"),
    ),
    ModelSpec(
        "lenet",
        "LeNet-5 style CNN with ReLU and max pooling (LeCun et al. 1998, "
        '"Gradient-based learning applied to document recognition")',
        _DIGITS,
        10,
        _HALVED_TWICE,
        _built_by("lenet", "lenet"),
    ),
    ModelSpec(
        "cnn1d",
        'Three strided 1-D convolutions and a linear layer, for MNIST-1D (Greydanus 2020, "Scaling '
        'down deep learning", its ConvBase)',
        (1, 1, 40),
        10,
        1,
        _built_by("cnn1d", "cnn1d"),
    ),
    ModelSpec(
        "inception_small",
        "Small Inception for CIFAR-10 (Zhang et al. 2017, "
        '"Understanding deep learning requires rethinking generalization", Figure 3)',
        _CIFAR,
        10,
        _HALVED_TWICE,
        _built_by("inception", "inception_small"),
    ),
    *(_cifar_resnet(depth) for depth in (20, 32, 56, 110)),
    _torchvision("resnet18", "ResNet-18", _HE2016),
    _torchvision("resnet50", "ResNet-50", _HE2016),
    _torchvision("resnet152", "ResNet-152", _HE2016),
    _torchvision("vgg11", "VGG-11", _VGG2015),
    _torchvision("vgg16", "VGG-16", _VGG2015),
    *(ModelSpec(name, f"GPT-2 style decoder-only transformer, {what} (Radford et al. 2019, "
                '"Language Models are Unsupervised Multitask Learners")', context, vocabulary, 1,
                _built_by("gpt", "gpt", name), "lm")
      for name, what, context, vocabulary in (
          ("gpt-nano", "2 layers, width 128 (trains in minutes on 2 cores)", (128,), 256),
          ("gpt-mini", "6 layers, width 384", (128,), 256),
          ("gpt2", "GPT-2 small: 12 layers, width 768, 124M parameters", (1024,), 50257))),
)

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def model_names() -> list[str]:
    """The registered names, in registry order."""
    return list(MODELS)


def build_model(name: str, input_shape: InputShape, num_classes: int) -> nn.Module:
    """An untrained `name` for images of input_shape and num_classes classes.

    Raises ConfigError for an unknown name, images smaller than the model accepts, or fewer than
    two classes, before anything is allocated.
    """
    if user_code.is_user_code("model", name):
        return _build_users(name, input_shape, num_classes)
    spec = MODELS.get(name)
    if spec is None:
        raise unknown_name("model", name, [*MODELS, "package.module:function"])
    lm = [n for n, s in MODELS.items() if s.task == "lm"]
    if spec.task == "lm":
        if len(input_shape) != 1:
            raise ConfigError("model", name, f"{name} is a language model and the data set gives "
                              f"images of shape {tuple(input_shape)}; use a token data set "
                              "(stdlib-text, textfile, tokens, synthetic-tokens)")
        if input_shape[0] < 1 or num_classes < 2:
            raise ConfigError("input_shape", input_shape, "a context of at least 1 token and a "
                              "vocabulary of at least 2")
        return spec.build(input_shape, num_classes)
    if len(input_shape) != 3:
        raise ConfigError("model", name, f"{name} classifies images and the data set gives "
                          f"{input_shape[0]}-token text; use a language model ({', '.join(lm)})")
    channels, height, width = input_shape
    if channels < 1:
        raise ConfigError("input_shape", input_shape, "(channels, height, width), channels >= 1")
    if min(height, width) < spec.min_size:
        fits = [n for n, s in MODELS.items() if s.task == "classify" and s.min_size <= min(height, width)]
        raise ConfigError(
            "model",
            name,
            f"{name} needs images at least {spec.min_size}x{spec.min_size}; the data set gives "
            f"{height}x{width}; choose a model that fits ({', '.join(fits) or 'none'}) "
            "or a data set with larger images",
        )
    if num_classes < 2:
        raise ConfigError("num_classes", num_classes, "a classifier needs at least 2 classes")
    return spec.build(input_shape, num_classes)


def register(name: str, build: Callable[[InputShape, int], nn.Module]) -> str:
    """Give your model function (``(input_shape, num_classes) -> nn.Module``, e.g. defined in a
    notebook cell) a name that ``TrainConfig(model=...)`` and a cluster's engines accept."""
    return user_code.register("model", name, build, MODELS)


def _build_users(name: str, input_shape: InputShape, num_classes: int) -> nn.Module:
    from torch import nn

    model = user_code.resolve("model", name)(tuple(input_shape), num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError("model", name, f"it returned {type(model).__name__}, not a "
                                         "torch.nn.Module; a model function takes (input_shape, "
                                         "num_classes) and returns the module")
    return model


def check_fits(name: str, model: nn.Module, example, num_classes: int,
               build_real: Callable[[], nn.Module] | None = None) -> None:
    """Your model's forward on two samples of the data set (on the meta device where it was built
    there: nothing is computed) gives logits of the data's shape: ``(2, classes)``, or
    ``(2, T, vocabulary)`` for next-token targets ``(2, T)``. ConfigError names what came out and
    what was expected. A forward the meta device cannot run (one that reads its data: an
    ``.item()``, a branch on a value) is run on the CPU, on ``build_real()``'s model; without
    it, it is checked when it trains."""
    import torch

    x, y = example
    expected = (*y.shape, num_classes)
    device = next(model.parameters(), torch.empty(0)).device  # meta, or the CPU where it was built
    try:
        with torch.no_grad():
            out = model(x.to(device))
    except Exception as exc:  # noqa: BLE001 - the user's forward, in one line
        if device.type == "meta":  # its data has no values there: the CPU answers
            if build_real is not None:
                check_fits(name, build_real(), example, num_classes)
            return
        raise ConfigError("model", name, f"its forward fails on the data set's samples of shape "
                                         f"{tuple(x.shape[1:])} ({type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0]}); build it for that input "
                                         "shape (the function's first argument)") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError("model", name, f"on 2 samples it returns {got}; the data set needs "
                                         f"logits of shape {expected} ({num_classes} classes)")


def build_shaped(name: str, input_shape: InputShape, num_classes: int) -> nn.Module:
    """``name`` as ``build_model`` builds it, on the meta device: its shapes and dtypes, no
    memory and no random draws (a GPT-2 or a ResNet-152 in a fraction of a second). A model of
    yours whose constructor computes on tensors (an ``.item()``, which the meta device cannot
    answer) is built for real instead."""
    import torch

    try:
        with torch.device("meta"):
            return build_model(name, input_shape, num_classes)
    except (RuntimeError, NotImplementedError):
        if not user_code.is_user_code("model", name):
            raise
    # built outside the handler: an error of the constructor's own is its one traceback, not a
    # second one "during handling of" the meta device's
    return build_model(name, input_shape, num_classes)


def parameter_count(model: nn.Module) -> int:
    """The number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "MODELS",
    "InputShape",
    "ModelSpec",
    "build_model",
    "build_shaped",
    "check_fits",
    "model_names",
    "register",
    "parameter_count",
]
