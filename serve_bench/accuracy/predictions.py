"""Each artifact's answer for every test image, kept beside the report (predictions.npz).

A drop is decided by the few images where two artifacts disagree, so every comparison,
in this run or a later `compress compare`, is made image by image. The file holds plain
arrays only (numpy's npz, read with ``allow_pickle=False``): the labels, each artifact's top-k
class indices, its logits where they are small, and the digest of the test split, which says
whether two files describe the same images in the same order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PREDICTIONS_FILE = "predictions.npz"
TOP_K = 5
_LOGITS_LIMIT = 200_000  # values per artifact: 1,000 images × 200 classes; beyond that the top-k alone


def digest_of_test_split(images: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of the test images and labels, in order: equal digests mean the results pair image by image."""
    h = hashlib.sha256()
    for array in (np.ascontiguousarray(images), np.ascontiguousarray(labels, dtype=np.int64)):
        h.update(str(array.dtype).encode() + str(array.shape).encode())
        h.update(array.tobytes())
    return h.hexdigest()


def top_k(logits: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """The k highest-scoring classes per image, best first (k capped at the class count).

    Tied scores go to the lower class index first, as ``argmax`` (what a deployer's code calls) breaks them:
    an INT8 file's logits are quantized, so exact ties happen (OpenVINO gave two classes 2.631 on a digits
    image), and the recorded answer must be the one the served file gives."""
    k = min(k, logits.shape[1])
    return np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int32)


def hits(topk: np.ndarray, labels: np.ndarray, metric: str) -> np.ndarray:
    """Per image: is the label among the first k predictions (``top1``, ``top5``)."""
    k = int(metric.removeprefix("top"))
    if k > topk.shape[1]:
        raise ValueError(f"{metric} needs {k} predictions per image; {topk.shape[1]} were kept")
    return (topk[:, :k] == np.asarray(labels)[:, None]).any(axis=1)


@dataclass
class Predictions:
    labels: np.ndarray
    test_digest: str
    topk: dict[str, np.ndarray] = field(default_factory=dict)
    logits: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, name: str, logits: np.ndarray) -> None:
        if logits.shape[0] != len(self.labels):
            raise ValueError(f"{name}: {logits.shape[0]} predictions for {len(self.labels)} test images")
        self.topk[name] = top_k(logits)
        if logits.size <= _LOGITS_LIMIT:
            self.logits[name] = np.asarray(logits, dtype=np.float32)

    def hits(self, name: str, metric: str) -> np.ndarray:
        return hits(self.topk[name], self.labels, metric)

    def save(self, folder: Path) -> Path:
        names = list(self.topk)
        arrays = {f"topk{i}": self.topk[n] for i, n in enumerate(names)}
        arrays.update({f"logits{i}": self.logits[n] for i, n in enumerate(names) if n in self.logits})
        path = folder / PREDICTIONS_FILE
        np.savez_compressed(path, names=np.array(names), labels=np.asarray(self.labels, dtype=np.int64),
                            test_digest=np.array(self.test_digest), **arrays)
        return path


def load_predictions(folder: Path) -> Predictions | None:
    path = folder / PREDICTIONS_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        names = [str(n) for n in data["names"]]
        out = Predictions(labels=data["labels"], test_digest=str(data["test_digest"]))
        for i, name in enumerate(names):
            out.topk[name] = data[f"topk{i}"]
            if f"logits{i}" in data:
                out.logits[name] = data[f"logits{i}"]
    return out
