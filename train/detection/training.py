"""What the shared training loop needs to train a detector: the loss hook and the mAP validation hook.

The loop itself is the classification loop (AMP, accumulation, clipping, checkpoint/resume); a
detector differs only in its loss (on the raw maps, against the boxes of the batch's images) and in
how validation scores it (COCO mAP after decode and NMS).
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn

from train.data import BatchStream
from train.detection.coco_map import match, mean_ap
from train.detection.loss import detection_loss
from train.detection.postprocess import detections


def loss_hook(bundle, model: nn.Module) -> Callable:
    """``Hooks.loss`` for a detector: the batch's labels are row numbers into ``bundle.targets``. A detector with
    its own ``loss(outputs, targets)`` (torchvision's, anchor-based) is trained by it; any other by the FCOS loss
    at its ``stride``."""
    if callable(getattr(model, "loss", None)):
        own = model.loss
        return lambda x, outputs, rows: own(outputs, bundle.boxes_of(rows.cpu()))
    stride = model.stride

    def loss(x: torch.Tensor, outputs, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        if not (isinstance(outputs, (tuple, list)) and len(outputs) in (2, 3)):
            raise TypeError("a detector's training-mode forward must return (class_logits, box_distances[, "
                            f"features]); got {type(outputs).__name__}")
        return detection_loss(outputs[0], outputs[1], bundle.boxes_of(rows.cpu()), stride)

    return loss


@torch.no_grad()
def decoded_outputs(model: nn.Module, stream: BatchStream,
                    autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
    """The eval-mode (decoded) outputs over ``stream`` and the rows they belong to."""
    was_training = model.training
    model.eval()
    outs, rows = [], []
    try:
        for x, y in stream.epoch(0):
            with autocast():
                outs.append(model(x).float().cpu())
            rows.append(y.cpu())
    finally:
        model.train(was_training)
    return torch.cat(outs), torch.cat(rows)


def evaluate_detector(model: nn.Module, stream: BatchStream,
                      autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, float]:
    """COCO mAP@0.5:0.95 and mAP@0.5 (points) of ``model`` on the stream's images, after the run's NMS."""
    decoded, rows = decoded_outputs(model, stream, autocast)
    bundle = stream.bundle
    table = match(bundle.boxes_of(rows), detections(decoded.numpy(), bundle.nms), bundle.num_classes)
    return {**mean_ap(table), "n": len(rows)}
