"""A detector's accuracy in the report: COCO mAP of each deployed file on the test images, with intervals.

Every file's decoded outputs go through the same NMS and the same pycocotools matching; the
interval of each mAP and of each file's drop below the baseline come from one set of seeded
bootstrap resamples of the test images, shared by all files, so a drop's interval is paired image by
image (mAP has no closed-form variance). The figure is the full-set mAP, the interval the
percentile interval of the same estimator over those resamples.
"""
from __future__ import annotations

import time

import numpy as np

from train.detection.coco_map import bootstrap_values, bootstrap_weights, match, mean_ap, percentile_interval
from train.image_bootstrap import paired_fields, rare_classes
from train.detection.postprocess import NmsSettings, detections

DRAWS = 1000
SEED = 0


def nms_latency(outputs: np.ndarray, nms: NmsSettings, repeats: int = 3) -> dict:
    """NMS alone per request (batch 1) on each test image's decoded output, in this process: the part of
    a request's latency that follows the model."""
    times = []
    for _ in range(repeats):
        for row in outputs:
            t0 = time.perf_counter_ns()
            detections(row[None], nms)
            times.append((time.perf_counter_ns() - t0) / 1e6)
    values = np.asarray(times)
    return {"p50": round(float(np.percentile(values, 50)), 4), "p99": round(float(np.percentile(values, 99)), 4),
            "n": len(values), "what": "score threshold, top-k and class-wise NMS of one image's decoded output"}


def thin_classes(targets: list[dict], class_names: list[str], minimum: int = 5) -> str | None:
    """A flag when a class has boxes in fewer than ``minimum`` test images: resamples then often miss it, its
    AP is undefined there, and the bootstrap's mAP averages over fewer classes than the figure does."""
    counts = np.zeros(len(class_names), dtype=int)
    for t in targets:
        present = np.unique(np.asarray(t["classes"])[~np.asarray(t["crowd"], dtype=bool)])
        counts[present] += 1
    return rare_classes(counts, class_names, minimum, "with boxes in", "mAP")


def detection_entries(names: list[str], outputs: dict[str, np.ndarray], targets: list[dict], num_classes: int,
                      baseline: str, metric: str, max_drop: float | None, nms: NmsSettings = NmsSettings(),
                      draws: int = DRAWS, seed: int = SEED) -> dict[str, dict]:
    """Report fields per file: accuracy (map, map50), their intervals, the drop and its paired interval."""
    tables = {n: match(targets, detections(outputs[n], nms), num_classes) for n in names}
    weights = bootstrap_weights(len(targets), draws, seed)
    values = {n: bootstrap_values(tables[n], weights) for n in names}  # the same resamples for every file
    points = {n: mean_ap(tables[n]) for n in names}
    out = {}
    for name in names:
        acc = {k: round(v, 4) for k, v in points[name].items()}
        entry = {"accuracy": acc,
                 "accuracy_ci": {k: [round(v, 4) for v in percentile_interval(values[name][k])] for k in acc},
                 "postprocess_ms": nms_latency(outputs[name][: min(100, len(targets))], nms)}
        entry.update(paired_fields(name, baseline, {n: points[n][metric] for n in names},
                                   {n: values[n][metric] for n in names}, len(targets), max_drop))
        out[name] = entry
    return out
