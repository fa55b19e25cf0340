"""User models given to the pipeline as 'tests.user_models:NAME', for behaviours the registry's models lack."""
from __future__ import annotations

import time

import torch
from torch import nn


class SmallNet(nn.Module):
    """A user architecture with a residual add and a channel concatenation."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.branch_a = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.branch_b = nn.Sequential(nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        a = self.branch_a(x) + x
        merged = torch.cat([a, self.branch_b(x)], dim=1)
        return self.head(merged.mean(dim=(2, 3)))


class ExplodingNet(SmallNet):
    """Returns infinite logits from its ``explode_at``-th training forward on."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, explode_at: int = 5) -> None:
        super().__init__(num_classes, in_channels)
        self.explode_at, self.calls = explode_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if self.training:
            self.calls += 1
            if self.calls >= self.explode_at:
                return logits * float("inf")
        return logits


class SlowNet(SmallNet):
    """Sleeps in every training forward so a test can kill a run reliably mid-stage."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, delay_s: float = 0.05) -> None:
        super().__init__(num_classes, in_channels)
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(self.delay_s)
        return super().forward(x)


def not_a_module(num_classes: int = 10) -> str:
    return "not a model"


class DiffersWhenExported(SmallNet):
    """Adds 1 to its logits only while being exported: an ONNX file that must fail parity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits + 1.0 if torch.compiler.is_exporting() else logits


class NoBatchNorm(nn.Module):
    """A model network slimming cannot rank: no BatchNorm anywhere."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class NearTies(nn.Module):
    """A linear classifier whose logits ride on a large constant: bf16 (8 significant bits) rounds
    them all to the same value, fp32 keeps them apart. Accuracy under bf16 autocast is that of
    ties; accuracy in fp32 is the classifier's."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, offset: float = 1000.0) -> None:
        super().__init__()
        self.head = nn.Linear(in_channels * 64, num_classes)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(x, 8).flatten(1)
        return self.head(x) * 0.01 + self.offset
