"""Measure a set of deployed artifacts against the baseline, in one run: latency and accuracy.

Every artifact, the fp32 torch baseline included, runs in its own worker process; latency
blocks are interleaved across them, then each computes its own predictions on the test split
through the same runner that was timed, so the numbers describe the file that ships. Each
number a release is gated on leaves here with its interval: accuracy (Wilson), the drop against the baseline
(paired, image by image), each percentile (over single requests and whole blocks), each latency ratio (over
shared rounds).

Three notions of speed leave here, each answering another question (see :func:`speed_figures`):
- ``latency_ms`` — service time of one request on a quiet machine: percentiles, their intervals,
  and ``latency_ms.throughput`` = batch / mean service time (what one idle worker could sustain);
- ``throughput`` — items per second of wall time (with ``concurrency`` > 1 the clients' rate, not 1 / latency);
- ``speedup_p99`` and ``latency_ratio`` — this artifact against the baseline, both from the
  same rounds (the harness runs every artifact in every round) and the same estimator:
  ``speedup_p99`` is exactly 1 / ``latency_ratio.p99.ratio`` and ``speedup_p99_ci`` its interval
  inverted, so the main table and the ratio table always agree.
"""
from __future__ import annotations

from serve_bench.bench.batches import eval_batch_of, served_batch, served_batch_accuracy
from serve_bench.bench.measure import operator_profile, speed_figures
from serve_bench.bench.run import run_benchmark
from serve_bench.bench.specs import ArtifactSpec, BenchResult, BenchSettings, TestSet, on_runtimes

__all__ = ["ArtifactSpec", "BenchResult", "BenchSettings", "TestSet", "eval_batch_of", "on_runtimes",
           "operator_profile", "run_benchmark", "served_batch", "served_batch_accuracy", "speed_figures"]
