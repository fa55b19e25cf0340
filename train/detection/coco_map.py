"""COCO mAP of a detector's answers, and the paired bootstrap interval of one detector's mAP drop against another's.

The matching of detections to ground truth is pycocotools' ``COCOeval.evaluate`` (area "all", at
most 100 detections per image, IoU 0.50:0.05:0.95), run once per detector. mAP has no closed-form
variance, so the interval of a drop comes from resampling test images: each bootstrap draw
weights every image by how often it was drawn, the same draw for both detectors (the images are
paired), and recomputes both APs from the recorded matches exactly as ``COCOeval.accumulate`` does
(precision envelope, 101 recall points). With every weight 1 the figure is pycocotools' own.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np

from train.image_bootstrap import (LEVEL, POWER, bootstrap_weights, drop_summary,  # noqa: F401 (re-exported)
                                   needed_for_bootstrap, percentile_interval)

RECALL_POINTS = np.linspace(0.0, 1.0, 101)


@dataclass
class MatchTable:
    """Per category: each detection's image, and whether it matched (T×D) or is ignored; gt counts per image."""

    n_images: int
    iou_thresholds: np.ndarray
    det_image: list[np.ndarray]  # per category, D (sorted by descending score, pycocotools' mergesort order)
    matched: list[np.ndarray]  # per category, T×D bool
    ignored: list[np.ndarray]  # per category, T×D bool
    gt_per_image: list[np.ndarray]  # per category, n_images (non-ignored ground truths)


def _coco_objects(targets: list[dict], num_classes: int):
    from pycocotools.coco import COCO

    gt = {"images": [{"id": i + 1} for i in range(len(targets))],
          "categories": [{"id": c + 1} for c in range(num_classes)], "annotations": []}
    for i, t in enumerate(targets):
        for box, cls, crowd in zip(np.asarray(t["boxes"], dtype=float), np.asarray(t["classes"]),
                                   np.asarray(t["crowd"])):
            w, h = box[2] - box[0], box[3] - box[1]
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i + 1, "category_id": int(cls) + 1,
                                      "bbox": [box[0], box[1], w, h], "area": w * h, "iscrowd": int(crowd)})
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
    return coco_gt


def match(targets: list[dict], dets: list[dict], num_classes: int) -> MatchTable:
    """``targets``: per image boxes (xyxy), classes, crowd; ``dets``: per image boxes, scores, classes (same order)."""
    from pycocotools.cocoeval import COCOeval

    if len(targets) != len(dets):
        raise ValueError(f"{len(dets)} images of detections for {len(targets)} images of ground truth")
    coco_gt = _coco_objects(targets, num_classes)
    rows = [[i + 1, *box[:2], box[2] - box[0], box[3] - box[1], float(s), int(c) + 1]
            for i, d in enumerate(dets) for box, s, c in zip(np.asarray(d["boxes"], dtype=float), d["scores"],
                                                             d["classes"])]
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(np.array(rows, dtype=float).reshape(-1, 7)) if rows else _no_detections(coco_gt)
        ev = COCOeval(coco_gt, coco_dt, iouType="bbox")
        ev.params.imgIds = list(range(1, len(targets) + 1))
        ev.params.areaRng, ev.params.areaRngLbl = [[0, 1e10]], ["all"]
        ev.params.maxDets = [100]
        ev.evaluate()
    n, t = len(targets), len(ev.params.iouThrs)
    table = MatchTable(n, np.asarray(ev.params.iouThrs), [], [], [], [])
    for k in range(num_classes):
        records = [(i, e) for i, e in enumerate(ev.evalImgs[k * n:(k + 1) * n]) if e is not None]
        gt_counts = np.zeros(n, dtype=np.int64)
        for i, e in records:
            gt_counts[i] = int(np.count_nonzero(np.asarray(e["gtIgnore"]) == 0))
        if records:
            scores = np.concatenate([np.asarray(e["dtScores"][:100]) for _, e in records])
            image = np.concatenate([np.full(len(e["dtScores"][:100]), i) for i, e in records])
            m = np.concatenate([np.asarray(e["dtMatches"])[:, :100] for _, e in records], axis=1).reshape(t, -1) > 0
            ig = np.concatenate([np.asarray(e["dtIgnore"])[:, :100] for _, e in records], axis=1).reshape(t, -1) > 0
            order = np.argsort(-scores, kind="mergesort")
            table.det_image.append(image[order].astype(np.int64))
            table.matched.append(m[:, order])
            table.ignored.append(ig[:, order])
        else:
            table.det_image.append(np.zeros(0, dtype=np.int64))
            table.matched.append(np.zeros((t, 0), dtype=bool))
            table.ignored.append(np.zeros((t, 0), dtype=bool))
        table.gt_per_image.append(gt_counts)
    return table


def _no_detections(coco_gt):
    """loadRes refuses an empty list: a copy of the ground truth without annotations is the same result."""
    from pycocotools.coco import COCO

    empty = COCO()
    empty.dataset = {"images": coco_gt.dataset["images"], "categories": coco_gt.dataset["categories"],
                     "annotations": []}
    empty.createIndex()
    return empty


def _ap_per_threshold(table: MatchTable, k: int, weights: np.ndarray) -> np.ndarray | None:
    """AP at every IoU threshold for category ``k`` with image ``weights`` (None: no ground truth drawn)."""
    npig = float(np.dot(weights, table.gt_per_image[k]))
    if npig == 0:
        return None
    w = weights[table.det_image[k]].astype(float)
    if len(w) == 0:
        return np.zeros(len(table.iou_thresholds))
    valid = ~table.ignored[k]
    tp = np.cumsum((table.matched[k] & valid) * w, axis=1)
    fp = np.cumsum((~table.matched[k] & valid) * w, axis=1)
    recall = tp / npig
    precision = tp / (tp + fp + np.spacing(1))
    envelope = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    ap = np.zeros(len(table.iou_thresholds))
    for t in range(len(ap)):
        idx = np.searchsorted(recall[t], RECALL_POINTS, side="left")
        ok = idx < recall.shape[1]
        ap[t] = envelope[t][idx[ok]].sum() / len(RECALL_POINTS)
    return ap


def mean_ap(table: MatchTable, weights: np.ndarray | None = None) -> dict[str, float]:
    """mAP@0.5:0.95 and mAP@0.5 in points (0..100), averaged over the categories with ground truth."""
    weights = np.ones(table.n_images) if weights is None else weights
    aps = [a for k in range(len(table.gt_per_image)) if (a := _ap_per_threshold(table, k, weights)) is not None]
    if not aps:
        return {"map": float("nan"), "map50": float("nan")}
    stacked = np.stack(aps)
    return {"map": 100.0 * float(stacked.mean()), "map50": 100.0 * float(stacked[:, 0].mean())}


def bootstrap_values(table: MatchTable, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Both mAPs of every resample (one pass per draw): what each interval and each paired drop is read from."""
    rows = [mean_ap(table, w) for w in weights]
    return {k: np.array([r[k] for r in rows]) for k in ("map", "map50")}


def paired_drop(baseline: MatchTable, candidate: MatchTable, weights: np.ndarray, metric: str,
                max_drop: float | None = None, level: float = LEVEL) -> dict:
    """The candidate's drop in ``metric`` points below the baseline on the same images (see ``drop_summary``)."""
    if baseline.n_images != candidate.n_images:
        raise ValueError("the two detectors were matched on different test sets")
    drop = mean_ap(baseline)[metric] - mean_ap(candidate)[metric]
    draws = bootstrap_values(baseline, weights)[metric] - bootstrap_values(candidate, weights)[metric]
    return drop_summary(drop, draws, baseline.n_images, max_drop, level)
