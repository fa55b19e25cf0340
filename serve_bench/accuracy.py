"""Accuracy of what ships, computed from the logits the deployed artifact itself produced."""
from __future__ import annotations

import numpy as np


def accuracy(logits: np.ndarray, labels: np.ndarray, per_class: bool = False) -> dict:
    labels = np.asarray(labels)
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"{logits.shape[0]} predictions for {labels.shape[0]} labels")
    top = np.argsort(-logits, axis=1)
    result = {"top1": round(100.0 * float((top[:, 0] == labels).mean()), 4), "n": int(len(labels))}
    if logits.shape[1] > 5:
        result["top5"] = round(100.0 * float((top[:, :5] == labels[:, None]).any(axis=1).mean()), 4)
    if per_class:
        result["per_class"] = {int(c): round(100.0 * float((top[labels == c, 0] == c).mean()), 2)
                               for c in np.unique(labels)}
    return result
