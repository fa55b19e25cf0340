"""Activation checkpointing of chosen blocks: trade recomputation for activation memory.

The block's ``forward`` is wrapped in place rather than the module replaced, so the
state dict keeps its names and a checkpointed model saves and loads like any other.
"""
from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_blocks(model: nn.Module, names: list[str]) -> None:
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        top = [n for n in modules if n and "." not in n]
        raise ValueError(f"checkpoint_blocks: no module named {', '.join(missing)}; top-level modules: {', '.join(top)}")
    for name in names:
        module = modules[name]
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)
