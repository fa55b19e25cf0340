"""How each task passes a teacher's knowledge on, as the loop's loss: the stages look the way up by the task's
``distillation`` (train.tasks) instead of branching on the task.

- ``logits``: KL at temperature over the class dimension (per image for a classifier, per pixel for a
  segmenter) beside the task's own hard loss;
- ``detection``: class maps, boxes and neck features of a single-stride detector (``DetectionDistillation``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from compress.distillation.detection_kd import DetectionDistillation
from compress.distillation.loss import DistillationLoss, DistillationMismatch, LossSettings
from compress.errors import ConfigError


@dataclass(frozen=True)
class Training:
    """The plain facts of the student's training a distillation loss depends on."""

    device: torch.device
    autocast: Callable
    channels_last: bool = False
    augmenting: bool = False
    label_smoothing: float = 0.0


def detector_stride(model: nn.Module, field: str) -> int:
    stride = getattr(model, "stride", None)
    if not isinstance(stride, int):
        raise ConfigError(f"{field}: a detector must have an integer `stride` (input pixels per cell of its maps); "
                          f"{type(model).__name__} has {stride!r}")
    return stride


class LogitDistillation:
    @staticmethod
    def check(model: nn.Module, hooks, field: str) -> None:
        if isinstance(hooks.loss, DetectionDistillation):
            raise ConfigError(f"{field}: this stage's loss distils a detector's maps, but the model is judged on "
                              "logits; drop the distill section")

    @staticmethod
    def make(teacher: nn.Module, kd: LossSettings, field: str, hard_loss: Callable | None, student: nn.Module | None,
             data, training: Training):
        """``hard_loss``: makes the task's own loss (None: cross-entropy on class labels)."""
        if kd.cache_teacher and training.augmenting:
            raise ConfigError(f"{field}: cache_teacher needs training without augmentation (augment: {{pad: 0}}): "
                              "augmented images differ every epoch, so cached teacher logits would be wrong")
        teacher = teacher.to(training.device, memory_format=torch.channels_last if training.channels_last
                             else torch.preserve_format)
        return DistillationLoss(teacher, temperature=kd.temperature, alpha=kd.alpha, autocast=training.autocast,
                                cache=kd.cache_teacher, label_smoothing=training.label_smoothing,
                                hard_loss=hard_loss() if hard_loss is not None else None,
                                ignore_index=getattr(data, "ignore_index", None))


class DetectorDistillation:
    @staticmethod
    def check(model: nn.Module, hooks, field: str) -> None:
        if not callable(getattr(model, "loss", None)):
            detector_stride(model, field)  # the FCOS loss needs it
        if hooks.loss is not None and not isinstance(hooks.loss, DetectionDistillation):
            raise ConfigError(f"{field}: this stage's loss is a classifier's (distillation of logits); a detector "
                              "distils through teacher_loss with its data")

    @staticmethod
    def make(teacher: nn.Module, kd: LossSettings, field: str, hard_loss: Callable | None, student: nn.Module | None,
             data, training: Training):
        if student is None:
            raise ValueError("a detector's distillation needs the student (its stride)")
        if callable(getattr(student, "loss", None)):
            raise ConfigError(f"{field}: {type(student).__name__} trains with its own (anchor-based) loss; "
                              "distillation is written for single-stride detectors with sigmoid class maps "
                              "(tiny_fcos): drop the distill section")
        try:
            return DetectionDistillation(teacher.to(training.device), data.boxes_of, detector_stride(student, field),
                                         temperature=kd.temperature, alpha=kd.alpha, feature_weight=kd.feature_weight,
                                         autocast=training.autocast)
        except DistillationMismatch as exc:
            raise ConfigError(f"{field}: {exc}") from exc


DISTILLATION = {"logits": LogitDistillation, "detection": DetectorDistillation}
