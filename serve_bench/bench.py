"""Measure a set of deployed artifacts against the baseline, in one run: latency and accuracy.

Every artifact, the fp32 torch baseline included, runs in its own worker process; latency
blocks are interleaved across them, then each computes its own accuracy on the test split
through the same runner that was timed, so the numbers describe the file that ships.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from serve_bench.accuracy import accuracy
from serve_bench.harness import HarnessSettings, measure_interleaved
from serve_bench.stats import summarize
from serve_bench.worker import BenchWorker


@dataclass
class ArtifactSpec:
    name: str
    stage: str
    backend: str  # torch | onnxruntime | tensorrt
    path: str
    format: str
    precision: str
    size_bytes: int
    params: int | None = None
    macs: int | None = None
    max_batch: int | None = None
    options: dict = field(default_factory=dict)
    source_model: str | None = None  # the float model a converted artifact came from
    refused: str | None = None  # why the gate must not release it, decided before measuring
    quantization: dict | None = None  # how an INT8 artifact was made (ladder rungs)


@dataclass
class BenchSettings:
    harness: HarnessSettings
    batch_size: int = 1
    threads: int | None = None
    device: str = "cpu"
    device_only: bool = False
    min_samples: int = 1000
    per_class: bool = False
    eval_batch: int = 64


def run_benchmark(specs: list[ArtifactSpec], baseline: str, pool: np.ndarray, test_images: np.ndarray,
                  test_labels: np.ndarray, settings: BenchSettings, metric: str = "top1",
                  progress=None) -> tuple[list[dict], dict[str, np.ndarray], dict[str, dict]]:
    """Returns report entries, raw latencies (ms) per artifact and each runner's info."""
    if baseline not in {s.name for s in specs}:
        raise ValueError(f"baseline {baseline!r} is not among the measured artifacts")
    with contextlib.ExitStack() as stack:
        workers = {}
        for spec in specs:
            options = {"threads": settings.threads, "device": "cuda" if spec.backend == "tensorrt" else settings.device,
                       **spec.options}
            workers[spec.name] = stack.enter_context(BenchWorker(
                spec.name, spec.backend, spec.path, options, pool, settings.batch_size, settings.device_only))
        measured = measure_interleaved(workers, settings.harness, progress)
        accuracies = {}
        for spec in specs:
            eval_batch = min(settings.eval_batch, spec.max_batch or settings.eval_batch)
            logits = workers[spec.name].call("predict", test_images, eval_batch)
            accuracies[spec.name] = accuracy(logits, test_labels, settings.per_class)
        infos = {name: worker.info for name, worker in workers.items()}

    summaries = {name: summarize(m.latencies_ms, settings.batch_size, settings.min_samples) for name, m in measured.items()}
    base_p99 = summaries[baseline].percentiles["p99"]
    base_acc = accuracies[baseline][metric]
    entries = []
    for spec in specs:
        s, m = summaries[spec.name], measured[spec.name]
        entries.append({
            "name": spec.name, "stage": spec.stage, "backend": spec.backend, "precision": spec.precision,
            "format": spec.format, "path": spec.path, "size_bytes": spec.size_bytes, "params": spec.params,
            "macs": spec.macs, "accuracy": accuracies[spec.name],
            "accuracy_drop": round(base_acc - accuracies[spec.name][metric], 4),
            "latency_ms": s.as_dict(), "throughput": round(settings.batch_size * m.requests / m.wall_s, 2),
            "speedup_p99": round(base_p99 / s.percentiles["p99"], 4), "runner": infos[spec.name],
            "source_model": spec.source_model,
            **({"refused": spec.refused} if spec.refused else {}),
            **({"quantization": spec.quantization} if spec.quantization else {}),
        })
    return entries, {name: m.latencies_ms for name, m in measured.items()}, infos
