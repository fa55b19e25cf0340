"""The per-image predictions file: top-k order, a pickle-free round trip, and the split digest."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.accuracy.predictions import Predictions, hits, load_predictions, digest_of_test_split, top_k


def test_top_k_is_best_first_and_capped_at_the_class_count():
    logits = np.array([[0.1, 0.9, 0.3, 0.5, 0.0, 0.2, 0.8], [5, 4, 3, 2, 1, 0, -1]], dtype=np.float32)
    assert top_k(logits).tolist() == [[1, 6, 3, 2, 5], [0, 1, 2, 3, 4]]
    assert top_k(logits[:, :3]).shape == (2, 3)
    assert hits(top_k(logits), np.array([6, 4]), "top1").tolist() == [False, False]
    assert hits(top_k(logits), np.array([6, 4]), "top5").tolist() == [True, True]
    with pytest.raises(ValueError, match="top5 needs 5 predictions"):
        hits(top_k(logits[:, :3]), np.array([0, 0]), "top5")


def test_round_trip_without_pickle(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(50, 1, 4, 4)).astype(np.float32), rng.integers(0, 10, 50)
    saved = Predictions(labels=labels, test_digest=digest_of_test_split(images, labels))
    saved.add("a", rng.normal(size=(50, 10)).astype(np.float32))
    saved.add("b", rng.normal(size=(50, 10)).astype(np.float32))
    path = saved.save(tmp_path)
    with np.load(path, allow_pickle=False) as raw:  # plain arrays: readable with pickle refused
        assert raw["topk1"].dtype == np.int32
    loaded = load_predictions(tmp_path)
    assert loaded.test_digest == saved.test_digest and set(loaded.topk) == {"a", "b"}
    assert np.array_equal(loaded.topk["b"], saved.topk["b"]) and np.array_equal(loaded.logits["a"], saved.logits["a"])
    assert np.array_equal(loaded.hits("a", "top1"), saved.hits("a", "top1"))
    with pytest.raises(ValueError, match="49 predictions for 50 test images"):
        saved.add("c", np.zeros((49, 10), np.float32))
    assert load_predictions(tmp_path / "nowhere") is None


def test_the_digest_changes_with_the_images_their_order_or_a_label():
    rng = np.random.default_rng(1)
    images, labels = rng.normal(size=(20, 1, 4, 4)).astype(np.float32), rng.integers(0, 10, 20)
    digest = digest_of_test_split(images, labels)
    assert digest == digest_of_test_split(images.copy(), labels.copy())
    assert digest != digest_of_test_split(images[::-1], labels[::-1])
    changed = labels.copy()
    changed[3] = (changed[3] + 1) % 10
    assert digest != digest_of_test_split(images, changed)
