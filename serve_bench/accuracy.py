"""Accuracy of what ships, computed from the logits the deployed artifact itself produced."""
from __future__ import annotations

import numpy as np
import torch

from train.evaluate import topk_hits


def accuracy(logits: np.ndarray, labels: np.ndarray, per_class: bool = False) -> dict:
    labels = np.asarray(labels)
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"{logits.shape[0]} predictions for {labels.shape[0]} labels")
    hits = topk_hits(torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32)),
                     torch.from_numpy(labels.astype(np.int64)))
    result = {name: round(100.0 * float(h.float().mean()), 4) for name, h in hits.items()}
    result["n"] = int(len(labels))
    if per_class:
        top1 = hits["top1"].numpy()
        result["per_class"] = {int(c): round(100.0 * float(top1[labels == c].mean()), 2) for c in np.unique(labels)}
    return result
