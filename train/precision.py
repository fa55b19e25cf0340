"""Mixed precision as two objects handed to the loop: an autocast factory and a scaler.

The loop never asks which precision it runs in; it enters ``precision.autocast()`` and
calls the scaler, which is a no-op when disabled. That keeps one code path for fp32,
bf16 and fp16 and makes a precision bug impossible to hide behind a branch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

AMP_MODES = ("auto", "off", "bf16", "fp16")


@dataclass
class Precision:
    name: str  # "fp32", "bf16" or "fp16"
    autocast: Callable[[], ContextManager]
    scaler: torch.amp.GradScaler

    @property
    def uses_scaler(self) -> bool:
        return self.scaler.is_enabled()


def resolve_amp(mode: str, device: torch.device) -> str:
    """auto: bf16 on CPU; on CUDA bf16 where the GPU supports it, else fp16 with a scaler."""
    if mode not in AMP_MODES:
        raise ValueError(f"amp must be one of {', '.join(AMP_MODES)}, got {mode!r}")
    if mode == "off":
        return "fp32"
    if mode == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16"
    return mode


def make_precision(mode: str, device: torch.device) -> Precision:
    name = resolve_amp(mode, device)
    if name == "fp32":
        factory: Callable[[], ContextManager] = contextlib.nullcontext
    else:
        dtype = torch.bfloat16 if name == "bf16" else torch.float16

        def factory() -> ContextManager:
            return torch.autocast(device_type=device.type, dtype=dtype)

    # fp16 has a narrow exponent range: gradients underflow without loss scaling.
    scaler = torch.amp.GradScaler(device.type, enabled=(name == "fp16"))
    return Precision(name=name, autocast=factory, scaler=scaler)
