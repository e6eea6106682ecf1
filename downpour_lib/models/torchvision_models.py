"""ImageNet architectures from torchvision: ResNet-18/50/152 and VGG-11/16.

ResNets from He, Zhang, Ren & Sun 2016, "Deep Residual Learning for Image Recognition"; VGG from
Simonyan & Zisserman 2015, "Very Deep Convolutional Networks for Large-Scale Image Recognition".
Built untrained (weights=None, nothing is downloaded), with the first convolution replaced when
the images do not have three channels.
"""

from __future__ import annotations

from torch import nn


def _replace_first_conv(model: nn.Module, in_channels: int) -> None:
    """Swap the model's first Conv2d for one reading in_channels, with the same other settings."""
    name, old = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    new = nn.Conv2d(
        in_channels,
        old.out_channels,
        old.kernel_size,
        stride=old.stride,
        padding=old.padding,
        bias=old.bias is not None,
    )
    # The same initialisation torchvision gives the convolutions of both families.
    nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, new)


def torchvision_model(arch: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """torchvision.models.<arch>, untrained, for input_shape's channel count and num_classes."""
    # here, not at the top: importing torchvision imports torch._dynamo (1.2 s of CPU here), and
    # every rank imports this registry whichever model it trains
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    if input_shape[0] != 3:
        _replace_first_conv(model, input_shape[0])
    return model
