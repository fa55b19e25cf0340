"""The segmentation metric on known answers: mIoU, per-class IoU and pixel accuracy against a hand-counted
confusion matrix and against torchmetrics on the same predictions, and the paired image bootstrap's interval
against the true spread of the figure over repeated test sets (a pixel is not an independent sample)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from serve_bench.accuracy.segmentation import segmentation_entries
from train.image_bootstrap import bootstrap_weights
from train.segmentation.metric import bootstrap_scores, confusions, scores, summary


def test_a_hand_counted_matrix():
    labels = np.array([[[0, 0, 1, 1], [2, 2, 255, 255]]])  # one 2×4 image, two ignored pixels
    predicted = np.array([[[0, 1, 1, 1], [2, 0, 2, 0]]])
    matrix = confusions(predicted, labels, 3, 255)[0]
    assert matrix.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    out = summary(matrix, ["a", "b", "c"])
    # IoU: a 1/(2+2-1)=1/3, b 2/(2+3-2)=2/3, c 1/(2+1-1)=1/2 → mean 0.5; pixels right 4 of 6
    assert out["per_class_iou"] == {"a": pytest.approx(33.3333, abs=1e-4), "b": pytest.approx(66.6667, abs=1e-4),
                                    "c": 50.0}
    assert out["miou"] == pytest.approx(50.0) and out["pixel_acc"] == pytest.approx(400 / 6)


def test_a_class_in_neither_masks_nor_answers_is_left_out_of_the_mean():
    labels = np.zeros((1, 4, 4), dtype=np.uint8)
    labels[0, :2] = 1
    out = summary(confusions(labels, labels, 5, 255).sum(0), list("abcde"))
    assert out["miou"] == 100.0 and out["per_class_iou"]["c"] is None


def test_the_figures_equal_torchmetrics_on_the_same_predictions_to_the_last_digit():
    from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

    rng = np.random.default_rng(3)
    c, n = 6, 24
    labels = rng.integers(0, c, size=(n, 32, 40)).astype(np.uint8)
    labels[rng.random(labels.shape) < 0.1] = 255
    predicted = np.where(rng.random(labels.shape) < 0.7, np.minimum(labels, c - 1), rng.integers(0, c, labels.shape))
    ours = summary(confusions(predicted, labels, c, 255).sum(0), [str(i) for i in range(c)])
    jaccard = MulticlassJaccardIndex(num_classes=c, ignore_index=255, average="none")
    per_class = 100.0 * jaccard(torch.from_numpy(predicted).long(), torch.from_numpy(labels).long()).double().numpy()
    assert np.allclose([ours["per_class_iou"][str(i)] for i in range(c)], per_class, atol=5e-5)  # ours rounds to 4
    macro = MulticlassJaccardIndex(num_classes=c, ignore_index=255, average="macro")
    assert ours["miou"] == pytest.approx(100.0 * float(macro(torch.from_numpy(predicted).long(),
                                                              torch.from_numpy(labels).long())), abs=1e-4)
    micro = MulticlassAccuracy(num_classes=c, ignore_index=255, average="micro")
    assert ours["pixel_acc"] == pytest.approx(100.0 * float(micro(torch.from_numpy(predicted).long(),
                                                                   torch.from_numpy(labels).long())), abs=1e-4)


def _test_set(rng: np.random.Generator, n: int, size: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Images of two classes where the answer's error rate varies from image to image (some images are hard):
    pixels within an image are correlated, which is why the bootstrap resamples images."""
    labels = (rng.random((n, size, size)) < 0.4).astype(np.uint8)
    hardness = rng.beta(1.0, 6.0, size=n)[:, None, None]
    wrong = rng.random(labels.shape) < hardness
    return np.where(wrong, 1 - labels, labels), labels


def test_the_image_bootstrap_spread_matches_the_true_spread_and_a_pixel_count_would_not():
    rng = np.random.default_rng(0)
    n = 120
    repeated = [float(scores(confusions(*_test_set(rng, n), 2, 255).sum(0))["miou"]) for _ in range(200)]
    true_sd = float(np.std(repeated))
    predicted, labels = _test_set(rng, n)
    per_image = confusions(predicted, labels, 2, 255)
    boot_sd = float(np.std(bootstrap_scores(per_image, bootstrap_weights(n, 1000, 1))["miou"]))
    assert 0.7 * true_sd < boot_sd < 1.4 * true_sd, (boot_sd, true_sd)
    # treating the 69,120 pixels as independent would claim a spread several times too small
    acc = scores(per_image.sum(0))["pixel_acc"] / 100
    pixel_sd = 100 * np.sqrt(acc * (1 - acc) / labels.size)
    assert pixel_sd < 0.3 * true_sd


def test_a_file_worse_on_some_images_shows_a_paired_drop_and_an_identical_one_none():
    rng = np.random.default_rng(5)
    predicted, labels = _test_set(rng, 80)
    worse = predicted.copy()
    worse[:12] = 0  # twelve images answered all background
    entries = segmentation_entries(["base", "same", "worse"], {"base": predicted, "same": predicted.copy(),
                                                               "worse": worse},
                                   labels, 2, 255, ["bg", "fg"], "base", "miou", 1.0)
    same, bad = entries["same"]["accuracy_paired"], entries["worse"]["accuracy_paired"]
    assert same["drop"] == 0 and same["drop_ci"] == [0.0, 0.0] and same["non_inferior"]
    assert bad["drop"] > 3 and bad["drop_ci"][0] > 1.0 and not bad["non_inferior"]
    assert entries["worse"]["per_class_loss"][0]["class"] == "fg"  # the class it lost most
    lo, hi = entries["base"]["accuracy_ci"]["miou"]
    assert lo < entries["base"]["accuracy"]["miou"] < hi


def test_a_class_only_answered_is_reported_apart_and_does_not_sink_one_file_alone():
    labels = np.zeros((4, 8, 8), dtype=np.uint8)
    labels[:, :4] = 1  # classes 0 and 1 in the masks; class 2 in none
    stray = labels.copy()
    stray[0, 7, :3] = 2  # three pixels answered as a class no mask holds
    entries = segmentation_entries(["base", "stray"], {"base": labels.copy(), "stray": stray}, labels, 3, 255,
                                   ["bg", "fg", "other"], "base", "miou", 1.0)
    assert entries["base"]["accuracy"]["miou"] == 100.0
    assert entries["stray"]["answered_only"] == {"other": 3}
    # the two files are averaged over the same classes: the drop is the 3 pixels' cost in bg's IoU, not a third
    assert entries["stray"]["accuracy_drop"] == pytest.approx(100 * (1 - 125 / 128) / 2, abs=1e-3)  # bg: 125/128


def test_a_class_in_few_test_images_is_flagged_and_a_common_one_is_not():
    from serve_bench.accuracy.segmentation import thin_classes

    masks = np.zeros((12, 4, 4), dtype=np.uint8)
    masks[:, 0, 0] = 1  # fg in all 12 images
    masks[:2, 1, 1] = 2  # rare in 2
    masks[:, 3, 3] = 255
    flag = thin_classes(masks, ["bg", "fg", "rare"], 255)
    assert "rare (2)" in flag and "fg" not in flag and "mIoU intervals" in flag
    assert thin_classes(masks[:, :1], ["bg", "fg"], 255) is None
