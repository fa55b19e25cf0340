"""A segmenter's accuracy in the report: mIoU, pixel accuracy and per-class IoU of each deployed file on the
test images, with intervals paired image by image.

Each file's answers are its argmax masks (reduced in its worker, at the input's resolution). Every file is
scored by one per-image confusion matrix; the interval of each figure and of each file's drop below the
baseline come from one set of seeded bootstrap resamples of the test images, shared by all files, so a
drop's interval is paired image by image (a pixel is not an independent sample). The figure is the
full-set one, the interval the percentile interval of the same estimator over those resamples.
"""
from __future__ import annotations

import numpy as np

from train.image_bootstrap import bootstrap_weights, paired_fields, percentile_interval, rare_classes
from train.segmentation.metric import bootstrap_scores, confusions, summary

DRAWS = 1000
SEED = 0
MOST_LOST = 5  # the per-class table lists the classes that lose the most IoU against the baseline


def segmentation_entries(names: list[str], masks: dict[str, np.ndarray], labels: np.ndarray, num_classes: int,
                         ignore_index: int, class_names: list[str], baseline: str, metric: str,
                         max_drop: float | None, draws: int = DRAWS, seed: int = SEED) -> dict[str, dict]:
    """Report fields per file: accuracy (miou, pixel_acc), their intervals, per-class IoU with the classes that
    lose the most, the drop and its paired interval."""
    per_image = {n: confusions(masks[n], labels, num_classes, ignore_index) for n in names}
    weights = bootstrap_weights(len(labels), draws, seed)
    values = {n: bootstrap_scores(per_image[n], weights) for n in names}  # the same resamples for every file
    points = {n: summary(per_image[n].sum(0), class_names) for n in names}
    out = {}
    for name in names:
        acc = {k: round(points[name][k], 4) for k in ("miou", "pixel_acc")}
        entry = {"accuracy": acc,
                 "accuracy_ci": {k: [round(v, 4) for v in percentile_interval(values[name][k])] for k in acc},
                 "per_class_iou": points[name]["per_class_iou"],
                 **({"answered_only": points[name]["answered_only"]} if "answered_only" in points[name] else {})}
        entry.update(paired_fields(name, baseline, {n: points[n][metric] for n in names},
                                   {n: values[n][metric] for n in names}, len(labels), max_drop))
        if name != baseline:
            entry["per_class_loss"] = most_lost(points[baseline]["per_class_iou"], points[name]["per_class_iou"])
        out[name] = entry
    return out


def most_lost(baseline: dict, candidate: dict, top: int = MOST_LOST) -> list[dict]:
    """The classes whose IoU falls the most below the baseline's (points), largest first."""
    losses = [{"class": c, "baseline_iou": b, "iou": candidate.get(c), "drop": round(b - candidate[c], 4)}
              for c, b in baseline.items() if b is not None and candidate.get(c) is not None]
    return sorted((x for x in losses if x["drop"] > 0), key=lambda x: -x["drop"])[:top]


def thin_classes(labels: np.ndarray, class_names: list[str], ignore_index: int, minimum: int = 5) -> str | None:
    """A flag when a class is in fewer than ``minimum`` test images: resamples then often miss it, its IoU is
    undefined there, and the bootstrap's mIoU averages over fewer classes than the figure does."""
    flat = labels.reshape(len(labels), -1)
    counts = np.zeros(len(class_names), dtype=int)
    for row in flat:
        present = np.unique(row[row != ignore_index])
        counts[present[present < len(class_names)]] += 1
    return rare_classes(counts, class_names, minimum, "in", "mIoU")
