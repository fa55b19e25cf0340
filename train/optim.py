"""Optimizers and learning-rate schedules.

Weight decay on BatchNorm scales and biases only fights the normalisation (and would
fight network slimming's own L1 penalty on BN scales later), so those parameters get
none. Schedules are pure functions of the step, so a resumed run lands on the same lr.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "wsd", "step", "constant")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            is_norm = isinstance(module, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm))
            (no_decay if is_norm or name == "bias" or param.ndim <= 1 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, momentum: float = 0.9,
                   nesterov: bool = True) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def lr_factor(schedule: str, total_steps: int, warmup_steps: int = 0, decay_fraction: float = 0.2,
              milestones: tuple[float, ...] = (0.5, 0.75), gamma: float = 0.1,
              min_factor: float = 0.0) -> Callable[[int], float]:
    """Multiplier of the base lr at optimizer step ``step`` (0-based).

    Cosine and WSD reach ``min_factor`` on the last step (``total_steps - 1``), not one step
    after the run has ended: a schedule whose floor is never trained at is not the schedule
    the settings describe.
    """
    total_steps = max(1, total_steps)
    warmup_steps = min(warmup_steps, total_steps - 1) if total_steps > 1 else 0
    decay_start = int(total_steps * (1 - decay_fraction))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        if schedule == "cosine":
            progress = (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps)
            return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        if schedule == "wsd":
            # Warmup-stable-decay: hold the peak lr, then decay linearly over the last fraction.
            if step < max(decay_start, warmup_steps):
                return 1.0
            span = max(1, total_steps - max(decay_start, warmup_steps))
            progress = (step + 1 - max(decay_start, warmup_steps)) / span  # the last step is at the floor
            return min_factor + (1 - min_factor) * max(0.0, 1 - progress)
        if schedule == "step":
            passed = sum(step >= int(m * total_steps) for m in milestones)
            return gamma ** passed
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, factor: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
