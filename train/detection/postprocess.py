"""Decoded outputs (N×A×(4+C)) → detections per image: score threshold, top-k, class-wise NMS.

This runs after the model on every runtime (the ONNX file ends at the decode, so a deployer's NMS
of choice can follow); the bench times it separately from the model so the report says what the
model costs and what the whole request costs.
"""
from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torchvision.ops import batched_nms


class NmsSettings(BaseModel):
    """What follows a detector's decode on every runtime (COCO evaluation's usual settings by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    score_threshold: float = Field(0.05, ge=0, lt=1, description="drop detections scoring below this")
    iou_threshold: float = Field(0.5, gt=0, le=1, description="suppress a box overlapping a better one of its class "
                                                             "by more than this IoU")
    pre_nms_top_k: int = Field(1000, ge=1, description="best-scoring candidates kept before NMS")
    max_detections: int = Field(100, ge=1, le=100, description="detections kept per image (COCO counts at most 100)")


def detections(decoded: np.ndarray | torch.Tensor, settings: NmsSettings = NmsSettings()) -> list[dict]:
    """Per image: boxes (k×4 xyxy), scores (k), classes (k), as numpy arrays, best score first."""
    out = torch.as_tensor(np.asarray(decoded, dtype=np.float32))
    results = []
    for row in out:
        boxes, scores = row[:, :4], row[:, 4:]
        score, cls = scores.flatten(), torch.arange(scores.shape[1]).repeat(scores.shape[0])
        cell = torch.arange(scores.shape[0]).repeat_interleave(scores.shape[1])
        keep = score > settings.score_threshold
        score, cls, cell = score[keep], cls[keep], cell[keep]
        if len(score) > settings.pre_nms_top_k:
            top = score.topk(settings.pre_nms_top_k).indices
            score, cls, cell = score[top], cls[top], cell[top]
        b = boxes[cell]
        kept = batched_nms(b, score, cls, settings.iou_threshold)[: settings.max_detections]
        results.append({"boxes": b[kept].numpy(), "scores": score[kept].numpy(), "classes": cls[kept].numpy()})
    return results
