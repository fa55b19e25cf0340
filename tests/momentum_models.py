"""Models whose BatchNorm keeps TensorFlow's momentum, for the tests of BatchNorm re-estimation after surgery."""
from __future__ import annotations

from torch import nn


def slow_batchnorm_resnet20(num_classes: int = 10, in_channels: int = 1, width: int = 8) -> nn.Module:
    """ResNet-20 whose BatchNorm layers keep their running statistics at momentum 0.01, as TensorFlow ports
    (EfficientNet-Lite, MobileNet) do: after surgery a short finetune leaves them stale."""
    from train.cifar_resnet import resnet20

    model = resnet20(num_classes=num_classes, in_channels=in_channels, width=width)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = 0.01
    return model
