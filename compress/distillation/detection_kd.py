"""Distilling a detector: the student's own detection loss plus what the teacher knows, cell by cell.

loss = (1 − α) · detection loss + α · (T² · KD on the class maps + box term) + β · feature term

- **Class maps**: each cell and class is a Bernoulli (sigmoid) prediction, so the soft term is the
  Bernoulli KL between teacher and student at temperature T, summed over every cell and class and
  divided by the cells the teacher finds something in (as the focal loss is divided by the positive
  cells; T² keeps its gradients on the hard term's scale, as for classifiers).
- **Boxes**: where the teacher is confident (its best score ≥ ``box_threshold``), the student's decoded
  box in that cell is pulled to the teacher's by GIoU: the locations the teacher found, not only the
  labelled ones.
- **Neck features**: attention transfer (Zagoruyko & Komodakis 2017): each feature map reduced to its
  spatial attention (mean of squared channels, L2-normalised), compared by squared distance. It needs
  no learned adapter, so a pruned student with fewer channels than its teacher distils from it as is.

Teacher and student must put their cells at the same places: the same stride and the same map size,
checked on the first batch (a pruned student keeps both; a student with another stride cannot be
paired cell by cell and is refused).
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import generalized_box_iou_loss

from compress.distillation.loss import DistillationMismatch
from train.detection.loss import detection_loss, distance_boxes


def bernoulli_kd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
                 per: float | None = None) -> torch.Tensor:
    """KL(teacher ‖ student) of per-cell, per-class sigmoids at ``temperature``, × T², summed and divided by
    ``per`` (default: every cell); 0 when they agree."""
    s, t = student_logits.float() / temperature, teacher_logits.float() / temperature
    p = torch.sigmoid(t)
    kl = p * (F.logsigmoid(t) - F.logsigmoid(s)) + (1 - p) * (F.logsigmoid(-t) - F.logsigmoid(-s))
    n, c, h, w = kl.shape
    return kl.sum() / (per if per is not None else n * h * w) * temperature ** 2


def attention(features: torch.Tensor) -> torch.Tensor:
    a = features.float().pow(2).mean(dim=1).flatten(1)
    return F.normalize(a, dim=1)


def attention_transfer(student_features: torch.Tensor, teacher_features: torch.Tensor) -> torch.Tensor:
    return (attention(student_features) - attention(teacher_features)).pow(2).sum(dim=1).mean()


class DetectionDistillation:
    """A ``Hooks.loss`` for a detector student; the teacher runs frozen, in eval mode, in the loop's precision.
    ``targets_of(rows)`` gives the boxes of the batch's images (the bundle's rows)."""

    def __init__(self, teacher: nn.Module, targets_of: Callable, stride: int, temperature: float = 2.0,
                 alpha: float = 0.5, feature_weight: float = 1.0, box_threshold: float = 0.3,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> None:
        if not callable(getattr(teacher, "maps", None)):
            raise DistillationMismatch(f"the teacher {type(teacher).__name__} has no maps(x) method returning its raw "
                                       "class map, box map and neck features; a detector teacher needs one")
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.targets_of, self.stride = targets_of, stride
        self.temperature, self.alpha, self.feature_weight = temperature, alpha, feature_weight
        self.box_threshold, self.autocast = box_threshold, autocast
        self.checked = False

    def _check(self, student: tuple, teacher: tuple) -> None:
        if student[0].shape != teacher[0].shape:
            raise DistillationMismatch(f"the student's class map is {tuple(student[0].shape)} and the teacher's "
                                       f"{tuple(teacher[0].shape)}: their cells are not at the same places (stride "
                                       "or input size differ); distil between detectors of the same stride")
        if getattr(self.teacher, "stride", None) != self.stride:
            raise DistillationMismatch(f"teacher stride {getattr(self.teacher, 'stride', None)} ≠ student stride "
                                       f"{self.stride}")
        if len(student) < 3:
            raise DistillationMismatch("the student's training-mode forward returns no neck features (a third "
                                       "output); the feature term needs them")
        self.checked = True

    def __call__(self, x: torch.Tensor, outputs: tuple, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.no_grad(), self.autocast():
            teacher = self.teacher.maps(x)
        if not self.checked:
            self._check(outputs, teacher)
        hard = detection_loss(outputs[0], outputs[1], self.targets_of(rows.cpu()), self.stride)
        confident = torch.sigmoid(teacher[0].float()).amax(dim=1).flatten(1) >= self.box_threshold  # N×A
        # per cell the teacher finds something in, as the hard loss is per positive cell: averaged over every cell,
        # the soft term would weigh (cells / objects) times less than alpha says
        kd_cls = bernoulli_kd(outputs[0], teacher[0], self.temperature, per=max(1.0, float(confident.sum())))
        if confident.any():
            kd_box = generalized_box_iou_loss(distance_boxes(outputs[1], self.stride)[confident],
                                              distance_boxes(teacher[1], self.stride)[confident], reduction="mean")
        else:
            kd_box = outputs[1].sum() * 0.0
        feature = attention_transfer(outputs[2], teacher[2])
        total = (1 - self.alpha) * hard["loss"] + self.alpha * (kd_cls + kd_box) + self.feature_weight * feature
        return {"loss": total, "det": hard["loss"].detach(), "kd_cls": kd_cls.detach(), "kd_box": kd_box.detach(),
                "feature": feature.detach()}
