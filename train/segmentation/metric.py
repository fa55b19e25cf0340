"""mIoU, per-class IoU and pixel accuracy from confusion matrices kept per image, so the paired image bootstrap
can reweight images (a pixel is not an independent sample; an image is).

The figure is the PASCAL VOC / Cityscapes one: one confusion matrix summed over every scored pixel of the
set, IoU per class = TP / (TP + FP + FN), averaged over the classes present in the masks. Which classes
count is decided by the labels alone, so it is the same for every file judged on the same images and in
every bootstrap draw (the drops pair class for class); a class a file answers but no mask holds is not
averaged in (it would add a 0 for that file only) and is reported apart as ``answered_only``. Where every
class is in the masks this is torchmetrics' and mmsegmentation's figure. Pixels whose label is
``ignore_index`` are not scored. A bootstrap draw weights each image's matrix by how often it was drawn,
and recomputes the same figures.
"""
from __future__ import annotations

import numpy as np


def confusions(predicted: np.ndarray, labels: np.ndarray, num_classes: int, ignore_index: int) -> np.ndarray:
    """Per image, the C×C count of (label row, predicted column) over its scored pixels: N×C×C int64."""
    predicted = np.asarray(predicted).reshape(len(predicted), -1).astype(np.int64)
    labels = np.asarray(labels).reshape(len(labels), -1).astype(np.int64)
    if predicted.shape != labels.shape:
        raise ValueError(f"predictions {predicted.shape} and masks {labels.shape} differ in size; a segmenter's "
                         "output must be at its input's resolution")
    n, c = len(labels), num_classes
    scored = labels != ignore_index
    if (predicted[scored] >= c).any() or (predicted[scored] < 0).any():
        raise ValueError(f"a prediction is outside the {c} classes")
    image = np.broadcast_to(np.arange(n)[:, None], labels.shape)
    flat = image[scored] * c * c + labels[scored] * c + predicted[scored]
    return np.bincount(flat, minlength=n * c * c).reshape(n, c, c)


def scores(confusion: np.ndarray) -> dict:
    """miou and pixel_acc (points, 0–100) and the per-class IoU (NaN where no mask holds the class) of one C×C
    matrix, or of a stack D×C×C (then arrays over D)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    tp = np.diagonal(confusion, axis1=-2, axis2=-1)
    union = confusion.sum(-1) + confusion.sum(-2) - tp
    present = confusion.sum(-1) > 0  # in the masks (rows are labels): the same set for every file
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(present, tp / np.where(present, union, 1), np.nan)
        miou = 100.0 * np.nanmean(iou, axis=-1) if iou.ndim > 1 else 100.0 * float(np.nanmean(iou))
        total = confusion.sum((-2, -1))
        pixel_acc = 100.0 * tp.sum(-1) / np.where(total > 0, total, np.nan)
    return {"miou": miou, "pixel_acc": pixel_acc, "iou": iou}


def summary(confusion: np.ndarray, class_names: list[str]) -> dict:
    """The figures a report shows for one matrix: miou, pixel_acc and per-class IoU (points)."""
    out = scores(confusion)
    confusion = np.asarray(confusion)
    answered_only = {name: int(confusion[:, i].sum()) for i, name in enumerate(class_names)
                     if confusion[i].sum() == 0 and confusion[:, i].sum() > 0}
    return {"miou": float(out["miou"]), "pixel_acc": float(out["pixel_acc"]),
            "per_class_iou": {name: (None if np.isnan(v) else round(100.0 * float(v), 4))
                              for name, v in zip(class_names, out["iou"])},
            **({"answered_only": answered_only} if answered_only else {})}


def bootstrap_scores(per_image: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """miou and pixel_acc of every resample (``weights``: draws × images counts), the same draws for every file."""
    c = per_image.shape[-1]
    stacked = (weights @ per_image.reshape(len(per_image), c * c).astype(np.float64)).reshape(len(weights), c, c)
    out = scores(stacked)
    return {"miou": out["miou"], "pixel_acc": out["pixel_acc"]}
