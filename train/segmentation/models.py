"""Segmenters by name: torchvision's (LRASPP, DeepLabV3, FCN), segmentation-models-pytorch's over any encoder
(``smp:<Arch>``), and the project's own small one for the reference pipeline.

Every segmenter here returns one tensor in eval mode, the class logits N×C×H×W at the input's
resolution, which is what the ONNX file, the runtimes and the metric take. In training mode a model
with an auxiliary head returns (out, aux) so the loss can weigh both. torchvision's own forward runs
the auxiliary head in eval mode too and returns a dict; the wrappers below keep its submodules under
the same names (so its published checkpoints load key for key) and skip that head when deploying.
Each names its final class convolutions (``head_convs``): the layers pruning keeps whole, since their
outputs are the classes.
"""
from __future__ import annotations

from torch import nn
from torch.nn import functional as F

TORCHVISION_SEGMENTERS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50",
                          "deeplabv3_resnet101", "fcn_resnet50", "fcn_resnet101")
SMP_PREFIX = "smp:"


def _class_convs(model: nn.Module, heads: tuple[str, ...], num_classes: int) -> tuple[str, ...]:
    """The Conv2d layers inside ``heads`` whose outputs are the classes."""
    return tuple(name for name, m in model.named_modules()
                 if isinstance(m, nn.Conv2d) and m.out_channels == num_classes and name.split(".")[0] in heads)


class TorchvisionSegmenter(nn.Module):
    """torchvision's DeepLabV3 / FCN (backbone, classifier, optional aux_classifier), deploying the main head only."""

    def __init__(self, built: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.backbone, self.classifier = built.backbone, built.classifier
        self.aux_classifier = built.aux_classifier
        self.num_classes = num_classes
        self.head_convs = _class_convs(self, ("classifier", "aux_classifier"), num_classes)

    def forward(self, x):
        size = x.shape[-2:]
        features = self.backbone(x)
        out = F.interpolate(self.classifier(features["out"]), size=size, mode="bilinear", align_corners=False)
        if self.training and self.aux_classifier is not None:
            aux = F.interpolate(self.aux_classifier(features["aux"]), size=size, mode="bilinear", align_corners=False)
            return out, aux
        return out


class LrasppSegmenter(nn.Module):
    """torchvision's LRASPP (backbone, classifier) returning its logits tensor."""

    def __init__(self, built: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.backbone, self.classifier = built.backbone, built.classifier
        self.num_classes = num_classes
        self.head_convs = _class_convs(self, ("classifier",), num_classes)

    def forward(self, x):
        out = self.classifier(self.backbone(x))
        return F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=False)


def set_batchnorm_momentum(model: nn.Module, momentum: float) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = momentum


def torchvision_segmenter(name: str, num_classes: int, bn_momentum: float | None = None, **args) -> nn.Module:
    """``bn_momentum``: torchvision builds its MobileNetV3 backbones with BatchNorm momentum 0.01, right for its
    recipe of tens of thousands of steps from ImageNet weights. Trained from scratch for a few hundred steps, the
    running statistics are then still mostly their initial values and eval mode answers one class; 0.1
    (PyTorch's default) follows the data within a few dozen steps."""
    from torchvision.models import segmentation

    args.setdefault("weights", None)
    args.setdefault("weights_backbone", None)  # never a download: weights come from model.weights
    if not name.startswith("lraspp"):
        args.setdefault("aux_loss", True)
    built = getattr(segmentation, name)(num_classes=num_classes, **args)
    if bn_momentum is not None:
        set_batchnorm_momentum(built, bn_momentum)
    return LrasppSegmenter(built, num_classes) if name.startswith("lraspp") else TorchvisionSegmenter(built, num_classes)


def smp_segmenter(spec: str, num_classes: int, in_channels: int, **args) -> nn.Module:
    """``smp:<Arch>`` (Unet, FPN, DeepLabV3Plus, …) over ``encoder_name`` (default resnet18; ``tu-<timm name>`` for
    any timm encoder), never with downloaded encoder weights."""
    try:
        import segmentation_models_pytorch as smp
    except ImportError as exc:
        raise ImportError(f"model.name {spec!r} needs segmentation-models-pytorch ({exc}); pip install "
                          "segmentation-models-pytorch") from exc
    if args.get("encoder_weights") not in (None,):
        raise ValueError("encoder_weights: weights are never downloaded; give a local state dict as model.weights")
    args.pop("encoder_weights", None)
    model = smp.create_model(spec[len(SMP_PREFIX):], encoder_name=args.pop("encoder_name", "resnet18"),
                             encoder_weights=None, in_channels=in_channels, classes=num_classes, **args)
    model.head_convs = _class_convs(model, ("segmentation_head",), num_classes)
    return model


def _block(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class TinySegmenter(nn.Module):
    """A small LRASPP-shaped segmenter: an encoder to stride 8, a low-level branch at stride 4, the high branch
    upsampled onto it, and the logits upsampled to the input. Small enough to train in a minute on two cores;
    every convolution but the class one is followed by BatchNorm, so BN-scale slimming reaches all of them."""

    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 16) -> None:
        super().__init__()
        self.stem = _block(in_channels, width, 2)
        self.low = _block(width, 2 * width, 2)
        self.high = _block(2 * width, 4 * width, 2)
        self.context = nn.Sequential(nn.Conv2d(4 * width, 2 * width, 1, bias=False), nn.BatchNorm2d(2 * width),
                                     nn.ReLU(inplace=True))
        self.fuse = nn.Sequential(nn.Conv2d(2 * width, 2 * width, 3, 1, 1, bias=False), nn.BatchNorm2d(2 * width),
                                  nn.ReLU(inplace=True))
        self.classifier = nn.Conv2d(2 * width, num_classes, 1)
        self.num_classes = num_classes
        self.head_convs = ("classifier",)

    def forward(self, x):
        low = self.low(self.stem(x))
        high = self.context(self.high(low))
        fused = self.fuse(low + F.interpolate(high, size=low.shape[-2:], mode="bilinear", align_corners=False))
        return F.interpolate(self.classifier(fused), size=x.shape[-2:], mode="bilinear", align_corners=False)


def tiny_segmenter(num_classes: int, in_channels: int = 3, width: int = 16) -> TinySegmenter:
    return TinySegmenter(num_classes, in_channels, width)
