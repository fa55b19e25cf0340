"""Top-1 / top-5 accuracy of a torch model over a batch stream."""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn
from torch.nn import functional as F

from train.data import BatchStream


@torch.no_grad()
def evaluate(model: nn.Module, stream: BatchStream,
             autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> dict[str, float]:
    was_training = model.training
    model.eval()
    correct1 = correct5 = seen = 0
    loss_sum = 0.0
    try:
        for x, y in stream.epoch(0):
            with autocast():
                logits = model(x)
            logits = logits.float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            k = min(5, logits.shape[1])
            top = logits.topk(k, dim=1).indices
            hits = top.eq(y.view(-1, 1))
            correct1 += hits[:, 0].sum().item()
            correct5 += hits.any(dim=1).sum().item()
            seen += len(y)
    finally:
        model.train(was_training)
    seen = max(seen, 1)
    return {"top1": 100.0 * correct1 / seen, "top5": 100.0 * correct5 / seen, "loss": loss_sum / seen, "n": seen}
