"""A small single-stage, anchor-free detector (FCOS-style, one stride) and the decode tail every detector shares.

The detector contract, which a user's ``package.module:callable`` detector follows too:

- ``maps(x)`` returns the raw maps, ``class_logits`` (N×C×H×W) and ``box_distances`` (N×4×H×W, the
  left/top/right/bottom distances from each cell centre before the positive transform), and the
  neck's features (N×F×H×W); in training mode ``forward(x)`` returns the same three, so the loss
  sees the maps, distillation sees the features and pruning sees two separate heads;
- in eval mode it returns ``decode(class_logits, box_distances)``: N×A×(4+C), boxes as x1, y1, x2, y2
  in input pixels followed by per-class scores in 0..1, which is what the ONNX file outputs;
- it has ``stride`` (input pixels per cell) and ``head_convs`` (the names of the two final convolutions,
  which pruning must leave alone and quantization may keep in INT8).

The decode is the part that must stay in float when the rest is quantized: it puts pixel
coordinates (0..size) and probabilities (0..1) into one tensor, so a single per-tensor INT8 scale
for that output rounds every score to 0 or to a step of ~size/255.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class DecodeTail(nn.Module):
    """Raw maps → boxes in pixels and class scores, one row per cell (``stride`` pixels per cell)."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, class_logits: torch.Tensor, box_distances: torch.Tensor) -> torch.Tensor:
        n, c, h, w = class_logits.shape
        ys = (torch.arange(h, device=class_logits.device, dtype=torch.float32) + 0.5) * self.stride
        xs = (torch.arange(w, device=class_logits.device, dtype=torch.float32) + 0.5) * self.stride
        cy, cx = torch.meshgrid(ys, xs, indexing="ij")
        dist = F.softplus(box_distances.float()) * self.stride  # N×4×H×W, positive
        boxes = torch.stack([cx - dist[:, 0], cy - dist[:, 1], cx + dist[:, 2], cy + dist[:, 3]], dim=-1)
        # clipped to the input, as the ground truth is (a box running off the canvas would lose IoU at the border)
        boxes = torch.minimum(boxes.clamp_min(0.0), torch.tensor([w, h, w, h], dtype=boxes.dtype,
                                                                device=boxes.device) * float(self.stride))
        scores = torch.sigmoid(class_logits.float()).permute(0, 2, 3, 1)
        return torch.cat([boxes, scores], dim=-1).reshape(n, h * w, 4 + c)


class TinyFCOS(nn.Module):
    """Backbone of stride-2 conv-BN-ReLU blocks to stride 8, a neck block, and separate class and box
    towers, each ending in one plain convolution (the heads). ``width`` scales every channel count."""

    stride = 8
    head_convs = ("cls_head", "box_head")

    def __init__(self, num_classes: int, in_channels: int = 3, width: int = 32, prior: float = 0.01) -> None:
        super().__init__()
        w = width
        self.backbone = nn.Sequential(conv_bn(in_channels, w // 2, 2), conv_bn(w // 2, w, 2), conv_bn(w, w),
                                      conv_bn(w, 2 * w, 2), conv_bn(2 * w, 2 * w))
        self.neck = conv_bn(2 * w, 2 * w)
        self.cls_tower = conv_bn(2 * w, 2 * w)
        self.box_tower = conv_bn(2 * w, 2 * w)
        self.cls_head = nn.Conv2d(2 * w, num_classes, 3, 1, 1)
        self.box_head = nn.Conv2d(2 * w, 4, 3, 1, 1)
        self.decode = DecodeTail(self.stride)
        nn.init.normal_(self.cls_head.weight, std=0.01)
        nn.init.constant_(self.cls_head.bias, -float(torch.log(torch.tensor((1 - prior) / prior))))
        nn.init.normal_(self.box_head.weight, std=0.01)
        nn.init.constant_(self.box_head.bias, 1.0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The neck's output: what a feature-distillation term compares."""
        return self.neck(self.backbone(x))

    def maps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.features(x)
        return self.cls_head(self.cls_tower(f)), self.box_head(self.box_tower(f)), f

    def forward(self, x: torch.Tensor):
        class_logits, box_distances, features = self.maps(x)
        if self.training:
            return class_logits, box_distances, features
        return self.decode(class_logits, box_distances)


def tiny_fcos(num_classes: int, in_channels: int = 3, width: int = 32) -> TinyFCOS:
    return TinyFCOS(num_classes, in_channels, width)
