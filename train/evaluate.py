"""Top-1 / top-5 accuracy: the project's one definition of top-k, and a torch model over a batch stream.

Top-k is only a metric where the model has more than k classes: with k classes or fewer
every image is a top-k hit, so a "top-5 accuracy" of a five-class model is 100% whatever the
model does. Every evaluator (the training loop, the benchmark, the INT8 ladder) omits a
metric its class count makes meaningless, and a red line on one is refused at validation.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
from torch import nn
from torch.nn import functional as F

from train.data import BatchStream
from train.distributed import SINGLE, ProcessGroupInfo

TOP_K = {"top1": 1, "top5": 5}


def meaningful_metrics(num_classes: int) -> list[str]:
    """The top-k metrics a model with ``num_classes`` outputs has (top-1 always)."""
    return [name for name, k in TOP_K.items() if k == 1 or num_classes > k]


def topk_hits(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per image, whether its label is among the k highest logits, for each meaningful k."""
    names = meaningful_metrics(logits.shape[1])
    top = logits.topk(max(TOP_K[n] for n in names), dim=1).indices
    hits = top.eq(labels.view(-1, 1))
    return {name: hits[:, :TOP_K[name]].any(dim=1) for name in names}


@torch.no_grad()
def evaluate(model: nn.Module, stream: BatchStream,
             autocast: Callable[[], ContextManager] = contextlib.nullcontext,
             group: ProcessGroupInfo = SINGLE) -> dict[str, float]:
    """Accuracy and mean loss over ``stream``; with several processes, each evaluates its shard and the
    counts are summed over all of them, so every rank returns the figures of the whole split."""
    was_training = model.training
    model.eval()
    correct: dict[str, int] = {}
    seen = 0
    loss_sum = 0.0
    try:
        for x, y in stream.epoch(0):
            with autocast():
                logits = model(x)
            logits = logits.float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            for name, hits in topk_hits(logits, y).items():
                correct[name] = correct.get(name, 0) + int(hits.sum().item())
            seen += len(y)
    finally:
        model.train(was_training)
    names = list(correct) if not group.active else meaningful_metrics(stream.bundle.num_classes)
    totals = group.sum([loss_sum, seen, *(correct.get(n, 0) for n in names)])
    loss_sum, seen = totals[0], int(totals[1])
    correct = {n: int(v) for n, v in zip(names, totals[2:])}
    seen = max(seen, 1)
    return {**{name: 100.0 * count / seen for name, count in correct.items()}, "loss": loss_sum / seen, "n": seen}
