"""Knowledge distillation (Hinton et al. 2015) as a loss object the training loop calls.

loss = α · T² · KL(softmax(teacher/T) ‖ softmax(student/T)) + (1 − α) · CE(student, labels)

The hard term is the same loss the student's training settings describe (label smoothing included;
a segmenter's pixel loss with its ignored pixels and auxiliary head): a distilled run must differ
from a plain one by the teacher term only. The KL is taken over the class dimension at every output
position and averaged over positions, so a segmenter is distilled pixel by pixel, and a classifier
(one position per image) exactly as ``batchmean`` would.

T² keeps the soft term's gradients on the same scale as the hard term's when T changes
(the soft gradients shrink as 1/T²). The parts are returned separately so every epoch's
record shows how much of the loss came from the teacher.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from compress.config import Strict
from train.segmentation.training import main_logits


class DistillationMismatch(Exception):
    """Teacher and student do not solve the same task on the same inputs."""

    bad_input = True


class LossSettings(Strict):
    """The distillation loss's own settings, shared by every stage that distils."""

    temperature: float = Field(4.0, gt=0, description="softens both models' outputs before the KL term (higher: "
                                                     "more of the teacher's view of the wrong classes)")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the soft (teacher) term; 0 = plain cross-entropy")
    cache_teacher: bool = Field(False, description="compute teacher logits once per image (only without "
                                "augmentation: augment.pad 0, no flips)")
    feature_weight: float = Field(1.0, ge=0, description="task: detection: weight of the neck-feature term "
                                                         "(attention transfer); classifiers have none")


class DistillSettings(LossSettings):
    """Distillation inside another stage's training (a pruned model's finetune, QAT): the teacher is required."""

    teacher: str = Field(..., description="an earlier stage or artifact, e.g. train or train.model")


def soft_term(student: torch.Tensor, teacher: torch.Tensor, temperature: float,
              scored: torch.Tensor | None = None) -> torch.Tensor:
    """T² · KL(teacher ‖ student) over the class dimension (1), averaged over images and output positions (over the
    ``scored`` positions only where given: a segmenter's letterbox border and void pixels are not learnt from, as
    its hard loss does not learn from them)."""
    kl = F.kl_div(F.log_softmax(student.float() / temperature, dim=1), F.log_softmax(teacher.float() / temperature, dim=1),
                  reduction="none", log_target=True).sum(1)
    if scored is not None:
        return (kl * scored).sum() / scored.sum().clamp_min(1) * temperature**2
    return kl.mean() * temperature**2


def distillation_terms(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float,
                       alpha: float, label_smoothing: float = 0.0) -> dict[str, torch.Tensor]:
    kd = soft_term(student, teacher, temperature)
    ce = F.cross_entropy(student.float(), labels, label_smoothing=label_smoothing)
    return {"loss": alpha * kd + (1 - alpha) * ce, "kd": kd, "ce": ce}


class DistillationLoss:
    """A ``Hooks.loss`` for the loop: the teacher runs frozen, in eval mode, in the loop's precision."""

    def __init__(self, teacher: nn.Module, temperature: float = 4.0, alpha: float = 0.5,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext, cache: bool = False,
                 label_smoothing: float = 0.0, hard_loss: Callable | None = None,
                 ignore_index: int | None = None) -> None:
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.temperature, self.alpha, self.autocast = temperature, alpha, autocast
        self.label_smoothing, self.hard_loss = label_smoothing, hard_loss  # hard_loss: the task's (x, outputs, labels)
        self.ignore_index = ignore_index  # dense labels: the value whose positions the soft term leaves out
        self.cache: dict[bytes, torch.Tensor] | None = {} if cache else None

    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            return self._run_teacher(x)
        keys = [bytes(row.detach().cpu().numpy().tobytes()) for row in x]
        missing = [i for i, k in enumerate(keys) if k not in self.cache]
        if missing:
            fresh = self._run_teacher(x[missing])
            for i, row in zip(missing, fresh):
                self.cache[keys[i]] = row
        return torch.stack([self.cache[k] for k in keys])

    def _run_teacher(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self.autocast():
            return main_logits(self.teacher(x)).float()

    def __call__(self, x: torch.Tensor, student_logits, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.hard_loss is None:
            return distillation_terms(student_logits, self.teacher_logits(x), labels, self.temperature, self.alpha,
                                      self.label_smoothing)
        scored = (labels != self.ignore_index).float() if self.ignore_index is not None and labels.dim() > 1 else None
        kd = soft_term(main_logits(student_logits), self.teacher_logits(x), self.temperature, scored)
        hard = self.hard_loss(x, student_logits, labels)["loss"]
        return {"loss": self.alpha * kd + (1 - self.alpha) * hard, "kd": kd, "ce": hard}


def check_pair(teacher_desc: dict, student_desc: dict, teacher_name: str, student_name: str) -> None:
    """Teacher and student must see the same classes and the same preprocessed images."""
    t_arch, s_arch = teacher_desc["architecture"], student_desc["architecture"]
    if t_arch["num_classes"] != s_arch["num_classes"]:
        raise DistillationMismatch(f"teacher {teacher_name} has {t_arch['num_classes']} classes but student {student_name} "
                          f"has {s_arch['num_classes']}; distill between models of the same task")
    t_pre, s_pre = teacher_desc.get("preprocessing") or {}, student_desc.get("preprocessing") or {}
    keys = ("channels", "height", "width", "mean", "std")
    if t_pre and s_pre and any(t_pre.get(k) != s_pre.get(k) for k in keys):
        differ = ", ".join(f"{k} {t_pre.get(k)} vs {s_pre.get(k)}" for k in keys if t_pre.get(k) != s_pre.get(k))
        raise DistillationMismatch(f"teacher {teacher_name} and student {student_name} expect different inputs ({differ})")
