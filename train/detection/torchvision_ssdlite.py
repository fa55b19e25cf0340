"""torchvision's SSDlite (MobileNetV3-Large backbone, built without downloaded weights) behind the detector contract.

torchvision's detectors take a list of images, resize and normalise them themselves, compute their
loss inside ``forward`` when given targets, and return boxes after their own NMS: none of that can
be exported by ``torch.export`` (NMS and data-dependent shapes), and none of it fits a pipeline that
already resized and normalised its images. This wrapper keeps torchvision's network, anchors, box
coder, matcher and loss (``SSD.compute_loss``: smooth-L1 on the matched anchors and cross-entropy with
3:1 hard-negative mining), and drops its transform and postprocessing:

- training mode: ``forward`` returns the raw head outputs (class logits N×A×(C+1), box regression
  N×A×4), and ``loss(outputs, targets)`` is torchvision's;
- eval mode: the decoded N×A×(4+C) of the contract (anchors decoded by torchvision's box coder,
  clipped to the input; softmax scores without the background column), so the ONNX file ends where
  every other detector's does and NMS runs outside it;
- ``head_convs``: the last convolution of every level's class and box head (pruning keeps them whole;
  quantization keeps everything after them in float).

Anchors depend on the input size; they are made once per size from the feature maps, as torchvision's
anchor generator makes them. Distillation's class-map term is written for sigmoid maps at one stride,
so this detector is not distilled (the stage says so).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class SSDLite(nn.Module):
    stride = None  # many levels: the single-stride FCOS loss and distillation do not apply

    def __init__(self, num_classes: int, in_channels: int = 3, width_mult: float = 1.0) -> None:
        super().__init__()
        from torchvision.models.detection import ssdlite320_mobilenet_v3_large

        if in_channels != 3:
            raise ValueError("SSDlite reads 3-channel images")
        self.num_classes = num_classes
        self.ssd = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=num_classes + 1,
                                                 width_mult=width_mult)
        levels = len(self.ssd.head.classification_head.module_list)
        self.head_convs = tuple([f"ssd.head.classification_head.module_list.{i}.1" for i in range(levels)]
                                + [f"ssd.head.regression_head.module_list.{i}.1" for i in range(levels)])
        self._anchors: dict[tuple, torch.Tensor] = {}

    def anchors(self, x: torch.Tensor, features: list[torch.Tensor]) -> torch.Tensor:
        key = (tuple(x.shape[-2:]), tuple(tuple(f.shape[-2:]) for f in features), x.device)
        # made in float32 whatever the autocast: bf16 features would round the anchors by up to half a pixel at
        # 320 px, and the file exported later makes them in float32
        if key not in self._anchors:
            from torchvision.models.detection.image_list import ImageList

            with torch.no_grad():
                images = ImageList(x[:1].float(), [tuple(x.shape[-2:])])
                self._anchors[key] = self.ssd.anchor_generator(images, [f[:1].float() for f in features])[0].detach()
        return self._anchors[key]

    def maps(self, x: torch.Tensor):
        features = list(self.ssd.backbone(x).values())
        out = self.ssd.head(features)
        return out["cls_logits"], out["bbox_regression"], features, self.anchors(x, features)

    def prune_trace(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each level's class and box head outputs before torchvision's reshape and concatenation: what the pruner
        traces (through the reshapes, torch-pruning maps every anchor of every level to channel indices one by one
        and runs out of memory; the channels it may prune all lie before the head convolutions anyway)."""
        features = list(self.ssd.backbone(x).values())
        heads = self.ssd.head
        return [head.module_list[i](f) for head in (heads.classification_head, heads.regression_head)
                for i, f in enumerate(features)]

    def forward(self, x: torch.Tensor):
        cls_logits, regression, _, anchors = self.maps(x)
        if self.training:
            return cls_logits, regression, anchors
        return self.decode(cls_logits, regression, anchors, x.shape[-1], x.shape[-2])

    def decode(self, cls_logits: torch.Tensor, regression: torch.Tensor, anchors: torch.Tensor, width: int,
               height: int) -> torch.Tensor:
        """torchvision's ``BoxCoder.decode_single`` for a batch, then the contract's layout."""
        wx, wy, ww, wh = self.ssd.box_coder.weights
        widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
        cx, cy = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
        r = regression.float()
        clip = math.log(1000.0 / 16)
        pcx, pcy = r[..., 0] / wx * widths + cx, r[..., 1] / wy * heights + cy
        pw = torch.exp((r[..., 2] / ww).clamp(max=clip)) * widths
        ph = torch.exp((r[..., 3] / wh).clamp(max=clip)) * heights
        boxes = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], dim=-1)
        limit = torch.tensor([width, height, width, height], dtype=boxes.dtype, device=boxes.device)
        boxes = torch.minimum(boxes.clamp_min(0.0), limit)
        scores = F.softmax(cls_logits.float(), dim=-1)[..., 1:]
        return torch.cat([boxes, scores], dim=-1)

    def loss(self, outputs, targets: list[dict]) -> dict[str, torch.Tensor]:
        """torchvision's SSD loss on the batch's boxes (crowd boxes left out, classes shifted past background)."""
        from torchvision.ops import box_iou

        cls_logits, regression, anchors = outputs
        device = cls_logits.device
        tv_targets, matched = [], []
        for t in targets:
            keep = ~t["crowd"]
            boxes = t["boxes"][keep].to(device)
            tv_targets.append({"boxes": boxes, "labels": t["classes"][keep].to(device) + 1})
            if len(boxes) == 0:
                matched.append(torch.full((anchors.shape[0],), -1, dtype=torch.int64, device=device))
            else:
                matched.append(self.ssd.proposal_matcher(box_iou(boxes, anchors)))
        losses = self.ssd.compute_loss(tv_targets, {"cls_logits": cls_logits.float(),
                                                    "bbox_regression": regression.float()},
                                       [anchors] * len(targets), matched)
        return {"loss": losses["bbox_regression"] + losses["classification"],
                "box": losses["bbox_regression"].detach(), "cls": losses["classification"].detach()}


def ssdlite_mobilenet_v3(num_classes: int, in_channels: int = 3, width_mult: float = 1.0) -> SSDLite:
    return SSDLite(num_classes, in_channels, width_mult)
