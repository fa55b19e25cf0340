"""What the shared training loop needs to train a segmenter: the pixel loss hook and the mIoU validation hook.

The loop is the classification loop (AMP, accumulation, clipping, checkpoint/resume); a segmenter differs
in its loss (cross-entropy over every scored pixel, ``ignore_index`` left out, plus the auxiliary head's
where the model has one, weighted as torchvision's reference recipe does) and in how validation scores it.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from train.data import BatchStream
from train.distributed import SINGLE, ProcessGroupInfo
from train.segmentation.metric import confusions, scores

AUX_WEIGHT = 0.5  # torchvision's segmentation reference: loss = out + 0.5 · aux


def main_logits(outputs) -> torch.Tensor:
    """The class logits of what a forward returned: the tensor itself, the first of a training-mode (out, aux)
    pair, or torchvision's {"out": …} dict (distillation reads every task's logits through this too)."""
    if isinstance(outputs, dict):
        return outputs["out"]
    if isinstance(outputs, (tuple, list)):
        return outputs[0]
    return outputs


def pixel_loss(outputs, masks: torch.Tensor, ignore_index: int, label_smoothing: float = 0.0) -> dict[str, torch.Tensor]:
    """Cross-entropy over the scored pixels of the main output, plus ``AUX_WEIGHT`` × the auxiliary head's."""
    target = masks.long()
    main = F.cross_entropy(main_logits(outputs).float(), target, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
    aux = None
    if isinstance(outputs, dict) and outputs.get("aux") is not None:
        aux = outputs["aux"]
    elif isinstance(outputs, (tuple, list)) and len(outputs) > 1:
        aux = outputs[1]
    if aux is None:
        return {"loss": main}
    aux_term = F.cross_entropy(aux.float(), target, ignore_index=ignore_index, label_smoothing=label_smoothing)
    return {"loss": main + AUX_WEIGHT * aux_term, "out": main, "aux": aux_term}


def loss_hook(bundle, model: nn.Module, label_smoothing: float = 0.0) -> Callable:
    """``Hooks.loss`` for a segmenter: the batch's labels are its masks."""
    ignore = bundle.ignore_index
    return lambda x, outputs, masks: pixel_loss(outputs, masks, ignore, label_smoothing)


@torch.no_grad()
def confusion_of(model: nn.Module, stream: BatchStream,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> np.ndarray:
    """The per-image confusion matrices of ``model`` over ``stream`` (N×C×C), in eval mode."""
    was_training = model.training
    model.eval()
    bundle = stream.bundle
    parts = []
    try:
        for x, masks in stream.epoch(0):
            with autocast():
                logits = main_logits(model(x))
            parts.append(confusions(logits.float().argmax(1).cpu().numpy(), masks.cpu().numpy(), bundle.num_classes,
                                    bundle.ignore_index))
    finally:
        model.train(was_training)
    c = bundle.num_classes
    return np.concatenate(parts) if parts else np.zeros((0, c, c), dtype=np.int64)


def evaluate_segmenter(model: nn.Module, stream: BatchStream,
                       autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                       group: ProcessGroupInfo = SINGLE) -> dict[str, float]:
    """mIoU and pixel accuracy (points) of ``model`` on the stream's images; with several processes each scores
    its shard and the matrices are summed, so every rank returns the figures of the whole split."""
    per_image = confusion_of(model, stream, autocast)
    c = stream.bundle.num_classes
    total = per_image.sum(0) if len(per_image) else np.zeros((c, c), dtype=np.int64)
    seen = len(per_image)
    if group.active:
        summed = group.sum([*total.reshape(-1).tolist(), seen])
        total, seen = np.asarray(summed[:-1], dtype=np.float64).reshape(c, c), int(summed[-1])
    out = scores(total)
    return {"miou": float(out["miou"]), "pixel_acc": float(out["pixel_acc"]), "n": seen}
