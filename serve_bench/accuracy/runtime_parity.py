"""The same file on two runtimes: on which test images do they answer differently?

An INT8 file rounds differently in onnxruntime and OpenVINO (other kernels, other fusions, bf16 where
OpenVINO picks it), so the two can disagree on some images even though the bytes are the same. The
report shows that paired, image by image, on the test split both were judged on: the share of images
whose top-1 class differs (with its Wilson interval), and the accuracy difference with the paired
interval the red line uses (this runtime's drop against the reference runtime's answers).
"""
from __future__ import annotations

import numpy as np

from serve_bench.stats.paired import paired_counts, paired_summary, wilson_interval
from serve_bench.accuracy.predictions import hits, top_k


def runtime_parity(reference: str, reference_logits: np.ndarray, logits: np.ndarray, labels: np.ndarray,
                   metric: str) -> dict:
    """``logits`` (this runtime) against ``reference_logits`` (the same file on the reference runtime)."""
    if reference_logits.shape != logits.shape:
        raise ValueError(f"the two runtimes answered in different shapes: {reference_logits.shape} vs {logits.shape}")
    n = int(len(labels))
    first_ref, first = reference_logits.argmax(axis=1), logits.argmax(axis=1)
    differ = int((first_ref != first).sum())
    scale = float(np.abs(reference_logits).max()) or 1.0
    ref_hits = hits(top_k(np.asarray(reference_logits, np.float32)), labels, metric)
    own_hits = hits(top_k(np.asarray(logits, np.float32)), labels, metric)
    lower, upper = wilson_interval(differ, n)
    return {"reference": reference, "n": n, "top1_differs": differ,
            "top1_differs_pct": round(100.0 * differ / n, 4), "top1_differs_ci": [round(lower, 4), round(upper, 4)],
            "max_abs_logit_diff": round(float(np.abs(reference_logits - logits).max()), 6),
            "max_abs_logit_diff_relative": round(float(np.abs(reference_logits - logits).max()) / scale, 6),
            "accuracy_vs_reference": paired_summary(paired_counts(ref_hits, own_hits))}


def same_file_pairs(specs: list) -> dict[str, str]:
    """Artifact name → the name of the first artifact that runs the same file on another runtime (the same file
    twice on one runtime, as a run compared with itself, is not a runtime pair)."""
    first: dict[str, object] = {}
    pairs = {}
    for spec in specs:
        seen = first.setdefault(spec.path, spec)
        if seen.name != spec.name and seen.runtime != spec.runtime:
            pairs[spec.name] = seen.name
    return pairs


def runtime_choice_note(entries: list[dict], release: str | None) -> str | None:
    """A note where the released file's runtime was not told apart from another runtime's at p99: which runtime the
    card names is then the noise's choice, and either serves the file as fast."""
    chosen = next((e for e in entries if e["name"] == release), None)
    if chosen is None:
        return None
    for other in entries:
        if other is chosen or other.get("artifact") != chosen.get("artifact") or other["runtime"] == chosen["runtime"]:
            continue
        pair = chosen if (chosen.get("runtime_parity") or {}).get("reference") == other["name"] else other
        ratio = ((pair.get("runtime_parity") or {}).get("latency_ratio") or {}).get("p99")
        if ratio and ratio["ci"][0] <= 1.0 <= ratio["ci"][1] and not other.get("refused"):
            return (f"{release} was released on {chosen['runtime']}, but the same file on {other['runtime']} "
                    f"({other['name']}) is not told apart from it at p99 (ratio {ratio['ratio']:.3f} "
                    f"[{ratio['ci'][0]:.3f}, {ratio['ci'][1]:.3f}]): either runtime serves it as fast")
    return None
