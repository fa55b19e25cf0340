"""The detection loss: FCOS-style assignment, sigmoid focal loss on the class map, GIoU on the boxes.

A cell is a positive of a ground-truth box when its centre lies inside the box and within
``radius`` strides of the box's centre (FCOS's centre sampling); a cell claimed by several boxes
takes the smallest. Every box also claims the cell holding its centre, so small objects are never
without a positive. Crowd boxes are never targets. Both losses come from torchvision's ops.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F
from torchvision.ops import generalized_box_iou_loss, sigmoid_focal_loss


def cell_centres(h: int, w: int, stride: int, device: torch.device) -> torch.Tensor:
    ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) * stride
    xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) * stride
    cy, cx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([cx.reshape(-1), cy.reshape(-1)], dim=1)  # A×2


def distance_boxes(box_distances: torch.Tensor, stride: int) -> torch.Tensor:
    """N×4×H×W raw distances → N×A×4 boxes (x1, y1, x2, y2) around the cell centres, as the decode makes them."""
    n, _, h, w = box_distances.shape
    centres = cell_centres(h, w, stride, box_distances.device)
    d = F.softplus(box_distances.float()).permute(0, 2, 3, 1).reshape(n, h * w, 4) * stride
    return torch.cat([centres - d[..., :2], centres + d[..., 2:]], dim=-1)


def assign(targets: dict, centres: torch.Tensor, stride: int, radius: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Per cell: the index of its box (-1: background) and that box (A×4)."""
    keep = ~targets["crowd"]
    boxes = targets["boxes"][keep].to(centres.device)
    a = centres.shape[0]
    if len(boxes) == 0:
        return torch.full((a,), -1, dtype=torch.long, device=centres.device), torch.zeros(a, 4, device=centres.device)
    cx, cy = centres[:, 0:1], centres[:, 1:2]  # A×1
    inside = (cx > boxes[:, 0]) & (cx < boxes[:, 2]) & (cy > boxes[:, 1]) & (cy < boxes[:, 3])
    bx, by = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    near = ((cx - bx).abs() <= radius * stride) & ((cy - by).abs() <= radius * stride)
    own = (cx - bx).abs().le(stride / 2) & (cy - by).abs().le(stride / 2)  # the cell holding the centre
    candidate = (inside & near) | own
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).expand(a, -1)
    area = torch.where(candidate, area, torch.full_like(area, float("inf")))
    best_area, best = area.min(dim=1)
    index = torch.where(torch.isfinite(best_area), best, torch.full_like(best, -1))
    kept = torch.nonzero(keep).squeeze(1).to(centres.device)
    return torch.where(index >= 0, kept[index.clamp_min(0)], index), boxes[best]


def detection_loss(class_logits: torch.Tensor, box_distances: torch.Tensor, targets: list[dict], stride: int,
                   box_weight: float = 2.0) -> dict[str, torch.Tensor]:
    """Focal + GIoU over a batch, each normalised by the number of positive cells (at least 1)."""
    n, c, h, w = class_logits.shape
    centres = cell_centres(h, w, stride, class_logits.device)
    logits = class_logits.float().permute(0, 2, 3, 1).reshape(n, h * w, c)
    decoded = distance_boxes(box_distances, stride)
    cls_target = torch.zeros_like(logits)
    pred_boxes, true_boxes = [], []
    for i, t in enumerate(targets):
        index, boxes = assign(t, centres, stride)
        pos = index >= 0
        if pos.any():
            classes = t["classes"].to(logits.device)[index[pos]]
            cls_target[i, pos.nonzero().squeeze(1), classes] = 1.0
            pred_boxes.append(decoded[i, pos])
            true_boxes.append(boxes[pos])
    positives = max(1, sum(len(b) for b in true_boxes))
    cls_loss = sigmoid_focal_loss(logits, cls_target, reduction="sum") / positives
    if true_boxes:
        box_loss = generalized_box_iou_loss(torch.cat(pred_boxes), torch.cat(true_boxes), reduction="sum") / positives
    else:
        box_loss = logits.sum() * 0.0
    return {"loss": cls_loss + box_weight * box_loss, "cls": cls_loss.detach(), "box": box_loss.detach()}
