"""Does the exported file compute what the torch model computes? Measured, not assumed.

The ONNX model runs in onnxruntime on real validation images at batch 1 and at a larger
batch (dynamic-batch bugs show only there), and is compared with the torch model on the
same images: the largest logit difference relative to the logits' own scale, and how often
the top-1 class agrees. A miss is an error with the numbers, never a warning.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from export.errors import ExportLibraryError


class ParityError(ExportLibraryError):
    """The exported model's outputs differ from torch's beyond the tolerance."""


@dataclass
class ParityResult:
    batch_size: int
    n: int
    max_abs_diff: float
    logit_scale: float
    rel_diff: float
    top1_agreement: float  # percent (a detector: images whose best-scoring cell and class agree; a segmenter: pixels)
    box_max_abs_diff: float | None = None  # a detector's output (N×A×(4+C)): boxes in pixels
    score_max_abs_diff: float | None = None  # … and its 0..1 class scores

    def passes(self, tolerance: float, min_agreement: float) -> bool:
        return self.rel_diff <= tolerance and self.top1_agreement >= min_agreement


def ort_session(path: str | Path, threads: int | None = None):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ParityError("onnxruntime is not installed: pip install 'compress[cpu]' (or [gpu])") from exc
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    if session.get_providers()[0] != "CPUExecutionProvider":
        raise ParityError(f"onnxruntime used {session.get_providers()} instead of the CPU provider")
    return session


def measure(session, model: nn.Module, images: torch.Tensor, batch_size: int, io_dtype: str = "fp32") -> ParityResult:
    input_name = session.get_inputs()[0].name
    feed_dtype = np.float16 if io_dtype == "fp16" else np.float32
    model = model.eval()
    max_diff, scale, agree, n = 0.0, 0.0, 0.0, 0
    box_diff = score_diff = None
    with torch.no_grad():
        for start in range(0, len(images) - batch_size + 1, batch_size):
            x = images[start:start + batch_size]
            expected = model(x).float().numpy()
            got = session.run(None, {input_name: x.numpy().astype(feed_dtype)})[0].astype(np.float32)
            if got.shape != expected.shape:
                raise ParityError(f"batch {batch_size}: ONNX output shape {got.shape} ≠ torch {expected.shape}")
            if expected.ndim == 3:  # a detector's decoded boxes and scores: each on its own scale
                box_diff = max(box_diff or 0.0, float(np.abs(got[..., :4] - expected[..., :4]).max()))
                score_diff = max(score_diff or 0.0, float(np.abs(got[..., 4:] - expected[..., 4:]).max()))
                got, expected = got[..., 4:].reshape(len(x), -1), expected[..., 4:].reshape(len(x), -1)
            max_diff = max(max_diff, float(np.abs(got - expected).max()))
            scale = max(scale, float(np.abs(expected).max()))
            # a classifier's images, or a segmenter's pixels (N×C×H×W), whose top class agrees
            agree += float((got.argmax(1) == expected.argmax(1)).mean()) * len(x)
            n += len(x)
    rel = max_diff / scale if scale > 0 else max_diff
    if box_diff is not None:  # boxes relative to the image scale they live in, scores relative to 1
        rel = max(rel, box_diff / max(float(images.shape[-1]), 1.0))
    return ParityResult(batch_size, n, max_diff, scale, rel, 100.0 * agree / max(n, 1), box_diff, score_diff)


def check_parity(path: str | Path, model: nn.Module, images: torch.Tensor, batch_sizes: list[int], *,
                 tolerance: float, min_agreement: float, io_dtype: str = "fp32",
                 max_single: int = 64) -> list[ParityResult]:
    """Measure every batch size; raise ParityError listing all of them if any misses."""
    session = ort_session(path)
    results = []
    for b in batch_sizes:
        subset = images[:max_single] if b == 1 else images
        if len(subset) < b:
            raise ParityError(f"parity at batch {b} needs at least {b} validation images, there are {len(subset)}")
        results.append(measure(session, model, subset, b, io_dtype))
    if not all(r.passes(tolerance, min_agreement) for r in results):
        rows = "; ".join(f"batch {r.batch_size}: max |Δ| {r.max_abs_diff:.3g} = {r.rel_diff:.3g} of the logit scale "
                         f"{r.logit_scale:.3g} (tolerance {tolerance:g}), top-1 agreement {r.top1_agreement:.2f}% "
                         f"(minimum {min_agreement:g}%) over {r.n} images" for r in results)
        raise ParityError(f"{path} does not match the torch model: {rows}")
    return results


def as_dicts(results: list[ParityResult]) -> list[dict]:
    return [{k: (round(v, 8) if isinstance(v, float) else v) for k, v in asdict(r).items()} for r in results]
