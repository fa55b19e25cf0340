"""Accuracy of what ships, computed from the logits the deployed artifact itself produced.

Hits come from the same top-k indices the predictions file keeps, so an accuracy in the
report and a paired comparison made later from that file always count the same images.
"""
from __future__ import annotations

import numpy as np

from serve_bench.stats.paired import wilson_interval
from serve_bench.accuracy.predictions import hits, top_k
from train.evaluate import meaningful_metrics


def accuracy(logits: np.ndarray, labels: np.ndarray, per_class: bool = False) -> dict:
    labels = np.asarray(labels)
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"{logits.shape[0]} predictions for {labels.shape[0]} labels")
    topk = top_k(np.asarray(logits, dtype=np.float32))
    per_image = {name: hits(topk, labels, name) for name in meaningful_metrics(logits.shape[1])}
    result = {name: round(100.0 * float(h.mean()), 4) for name, h in per_image.items()}
    result["n"] = int(len(labels))
    if per_class:
        top1 = per_image["top1"]
        result["per_class"] = {int(c): round(100.0 * float(top1[labels == c].mean()), 2) for c in np.unique(labels)}
    return result


def accuracy_intervals(result: dict) -> dict[str, list[float]]:
    """Wilson 95% interval of each top-k accuracy in ``result`` (percent)."""
    n = result["n"]
    return {name: [round(v, 4) for v in wilson_interval(round(result[name] * n / 100.0), n)]
            for name in result if name.startswith("top")}
