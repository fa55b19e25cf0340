"""The batch each candidate's accuracy is measured at, and its accuracy at the batch a serving configuration forms."""
from __future__ import annotations

import numpy as np

from serve_bench.accuracy.classification import accuracy, accuracy_intervals
from serve_bench.accuracy.predictions import hits, top_k
from serve_bench.bench.specs import ArtifactSpec, BenchSettings
from serve_bench.runners import RUNNERS
from serve_bench.stats.paired import paired_counts, paired_summary


def eval_batch_of(spec: ArtifactSpec, settings: BenchSettings) -> int:
    """The batch an artifact's test-split predictions are made in. OpenVINO's answers depend on it (with 2 threads,
    measured here on an INT8 file: logits of batches of 8 differ from batch 1 by up to 0.64, while batch 1 matched
    across thread counts), so its accuracy is measured at the batch it serves, the latency batch; the other
    runtimes answer alike at any batch and use ``eval_batch``, capped by what the file accepts."""
    if RUNNERS[spec.runtime].answers_depend_on_batch:
        return settings.batch_size
    return min(settings.eval_batch, spec.max_batch or settings.eval_batch)


def served_batch(spec: ArtifactSpec, traffic: dict | None, measured_at: int) -> int | None:
    """The largest batch the sweep's recommended serving configuration forms for an OpenVINO file, where it is
    larger than the batch its accuracy was measured at (None otherwise). OpenVINO answers differently at another
    batch (see :func:`eval_batch_of`), so the card that recommends batching must state the accuracy at it."""
    if not RUNNERS[spec.runtime].answers_depend_on_batch or not traffic:
        return None
    best = (traffic.get("sweep") or {}).get("best") or {}
    served = [best.get("serving"), (traffic.get("at_target") or {}).get("serving")]  # recommended, and gated
    batch = max(int((s or {}).get("max_batch") or 1) for s in served)
    return batch if batch > measured_at else None


def served_batch_accuracy(batch: int, served: np.ndarray, reference: np.ndarray, labels: np.ndarray,
                          metric: str, baseline_hits: np.ndarray | None = None, max_drop: float | None = None) -> dict:
    """The accuracy of the same test images answered in batches of ``batch``, with its Wilson interval, and how
    many of its top-1 answers differ from those the report's accuracy came from. Dynamic batching forms batches
    of every size up to the largest, so the largest is the one furthest from the measured batch."""
    acc = accuracy(served, labels)
    changed = int(np.count_nonzero(served.argmax(axis=1) != reference.argmax(axis=1)))
    out = {"batch": batch, metric: acc[metric], "ci": accuracy_intervals(acc)[metric], "n": acc["n"],
           "changed_answers": changed, "difference": round(acc[metric] - accuracy(reference, labels)[metric], 4)}
    if baseline_hits is not None:  # its drop against the baseline at that batch, paired image by image
        out["paired"] = paired_summary(paired_counts(baseline_hits, hits(top_k(served), labels, metric)), max_drop)
    return out
