"""What each rung of the INT8 ladder is judged by: the quantized file itself, run by onnxruntime.

Accuracy goes through serve_bench's onnxruntime runner (the same code that later measures
the deployed artifact), never through a torch simulation of the quantized model.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from serve_bench.accuracy import accuracy
from serve_bench.runners import OnnxRuntimeRunner
from serve_bench.stats import percentile


def logits(path: Path, images: np.ndarray, batch_size: int = 64, threads: int | None = None) -> np.ndarray:
    with OnnxRuntimeRunner(path, threads=threads) as runner:
        return np.concatenate([runner.infer(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def split_accuracy(path: Path, images: np.ndarray, labels: np.ndarray, batch_size: int = 64) -> dict:
    return accuracy(logits(path, images, batch_size), labels)


def output_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean squared logit error relative to the logits' variance: comparable across layers and models."""
    return float(np.mean((reference - candidate) ** 2) / max(float(np.var(reference)), 1e-12))


def quick_latency(paths: dict[str, Path], sample: np.ndarray, blocks: int = 6, per_block: int = 40) -> dict[str, dict]:
    """Batch-1 p50/p99 of a few ONNX files, interleaved in blocks within this process.

    A first look recorded per rung; the bench stage's separate-process harness gives the
    figures the gate uses.
    """
    runners = {name: OnnxRuntimeRunner(path).load() for name, path in paths.items()}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for runner in runners.values():
            for _ in range(10):
                runner.infer(sample)
        for _ in range(blocks):
            for name, runner in runners.items():
                time.sleep(0.02)  # let the previous session's spinning threads go idle
                for _ in range(per_block):
                    start = time.perf_counter_ns()
                    runner.infer(sample)
                    samples[name].append((time.perf_counter_ns() - start) / 1e6)
    finally:
        for runner in runners.values():
            runner.close()
    out = {}
    for name, values in samples.items():
        arr = np.asarray(values)
        out[name] = {"p50_ms": round(percentile(arr, 50), 4), "p99_ms": round(percentile(arr, 99), 4), "n": len(arr)}
    return out
