"""COCO mAP and the paired bootstrap of a detector's drop: the figure is pycocotools' own, the interval covers
a known drop at its stated rate, and the gate's confident rule reads the bootstrap bound."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
from pycocotools.cocoeval import COCOeval

from serve_bench.limits import Limits
from tests.report_entries import as_entries
from serve_bench.gate import evaluate
from train.detection.coco_map import (_coco_objects, bootstrap_weights, match, mean_ap, needed_for_bootstrap,
                                      paired_drop)


def scene(rng, n_images: int, jitter: float, n_classes: int = 3):
    """Ground truth and one detector's answers: every object found with box noise ``jitter``, plus false alarms."""
    targets, dets = [], []
    for _ in range(n_images):
        k = int(rng.integers(1, 4))
        xy = rng.uniform(0, 80, (k, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(10, 40, (k, 2))], 1)
        classes = rng.integers(0, n_classes, k)
        targets.append({"boxes": boxes, "classes": classes, "crowd": np.zeros(k, bool)})
        false = rng.uniform(0, 90, (2, 2))
        dets.append({"boxes": np.concatenate([boxes + rng.normal(0, jitter, boxes.shape),
                                              np.concatenate([false, false + 15], 1)]),
                     "scores": np.concatenate([rng.uniform(0.3, 1, k), rng.uniform(0, 0.6, 2)]),
                     "classes": np.concatenate([classes, rng.integers(0, n_classes, 2)])})
    return targets, dets


def test_the_point_figure_is_pycocotools_own():
    targets, dets = scene(np.random.default_rng(0), 60, jitter=3.0)
    ours = mean_ap(match(targets, dets, 3))
    gt = _coco_objects(targets, 3)
    rows = [[i + 1, *b[:2], b[2] - b[0], b[3] - b[1], s, c + 1] for i, d in enumerate(dets)
            for b, s, c in zip(d["boxes"], d["scores"], d["classes"])]
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(np.array(rows)), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert ours["map"] == pytest.approx(100 * ev.stats[0], abs=1e-9)
    assert ours["map50"] == pytest.approx(100 * ev.stats[1], abs=1e-9)


def test_the_paired_interval_covers_a_known_drop_at_about_its_level():
    """A population of 600 images and two detectors (the second with noisier boxes); the true drop is the one
    on the whole population. Test sets of 150 images drawn from it, each with its own bootstrap interval."""
    rng = np.random.default_rng(1)
    targets, good = scene(rng, 600, jitter=1.0)
    rng2 = np.random.default_rng(1)
    _, worse = scene(rng2, 600, jitter=3.5)  # the same scenes (same seed), boxes noisier
    a, b = match(targets, good, 3), match(targets, worse, 3)
    truth = mean_ap(a)["map"] - mean_ap(b)["map"]
    assert truth > 5  # a real drop, so coverage is not trivially about zero
    covered, sims = 0, 30
    for s in range(sims):
        chosen = rng.choice(600, 150, replace=False)
        inner = bootstrap_weights(150, 150, seed=s)
        weights = np.zeros((150, 600))
        weights[:, chosen] = inner
        drops = np.array([mean_ap(a, w)["map"] - mean_ap(b, w)["map"] for w in weights])
        lo, hi = np.percentile(drops, [2.5, 97.5])
        covered += lo <= truth <= hi
    assert covered >= 25  # 95% nominal: 24 or fewer of 30 happens 1.6% of the time at 0.95 (7% even at 0.90)


def test_identical_detectors_drop_nothing_and_a_worse_one_is_not_shown_within():
    targets, dets = scene(np.random.default_rng(2), 120, jitter=1.0)
    _, noisy = scene(np.random.default_rng(2), 120, jitter=4.0)
    a, b = match(targets, dets, 3), match(targets, noisy, 3)
    w = bootstrap_weights(120, 300, seed=0)
    same = paired_drop(a, a, w, "map", max_drop=1.0)
    assert same["drop"] == 0 and same["drop_ci"] == [0, 0] and same["non_inferior"]
    worse = paired_drop(a, b, w, "map", max_drop=1.0)
    assert worse["drop"] > 3 and worse["drop_ci"][0] > 1.0 and not worse["non_inferior"]
    assert worse["needed_test_images"] is None  # past the red line: no test size shows it within


def _entry(name, drop, ci, **paired):
    return {"name": name, "runtime": "onnxruntime", "precision": "int8", "accuracy": {"map": 80 - drop},
            "accuracy_drop": drop, "latency_ms": {"p50": 1.0, "p99": 2.0, "p99_ci_blocks": [1.5, 2.5]},
            "accuracy_paired": {"n": 300, "drop": drop, "drop_ci": ci, "method": "paired-bootstrap", "sd": 0.4,
                                **paired}}


def test_the_confident_gate_reads_the_bootstrap_bound_and_says_which_test_size_would_show_it():
    base = _entry("base", 0.0, [0.0, 0.0], reference=True)
    base["precision"] = "fp32"
    shown = _entry("shown", 0.2, [-0.3, 0.8], needed_test_images=None)
    shown["latency_ms"] = {"p50": 0.5, "p99": 1.0, "p99_ci_blocks": [0.8, 1.2]}
    unshown = _entry("unshown", 0.6, [0.1, 1.4], needed_test_images=1234)
    unshown["latency_ms"] = {"p50": 0.7, "p99": 1.5, "p99_ci_blocks": [1.2, 1.8]}
    gate = evaluate(as_entries([base, unshown, shown]), Limits(max_drop=1.0, p99_budget_ms=None, decision="confident"))
    assert gate["release"] == "shown"
    why = " ".join(gate["reasons"])
    assert "unshown: accuracy drop 0.60 points, 95% upper bound 1.40 > red line 1" in why
    # the test size is worked out at the red line the gate is asked about, from the bootstrap's spread:
    # 300 · ((1.96 + 0.84) · 0.4 / (1.0 − 0.6))² ≈ 2,355
    assert f"≈ {needed_for_bootstrap(300, 0.6, 0.4, 1.0):,} test images" in why and "2,35" in why
    wider = evaluate(as_entries([base, unshown]), Limits(max_drop=1.2, p99_budget_ms=None, decision="confident"))
    assert any(f"≈ {needed_for_bootstrap(300, 0.6, 0.4, 1.2):,} test images" in r for r in wider["reasons"])
    point = evaluate(as_entries([base, unshown]), Limits(max_drop=1.0, p99_budget_ms=None, decision="point"))
    assert point["release"] == "unshown"
