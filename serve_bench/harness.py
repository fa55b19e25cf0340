"""Latency measurement of several artifacts in one run, interleaved so noise hits all alike.

Each artifact is warmed up (by iterations and by time), then measured in round-robin
blocks until it has both a minimum number of requests and a minimum measured duration.
Inputs are real images, rotated so no cache sees the same input twice in a row.
"""
from __future__ import annotations

import time
import os
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.latency_intervals import BlockedSamples
from serve_bench.machine_load import LoadSampler
from serve_bench.worker import BenchWorker


class HarnessSettings(BaseModel):
    """How long and in what pattern each artifact is measured (the bench stage's settings reuse these)."""

    model_config = ConfigDict(extra="forbid")
    warmup_iters: int = Field(50, ge=0, description="warm-up requests before measuring...")
    warmup_s: float = Field(0.5, ge=0, description="...and at least this long")
    min_iters: int = Field(1000, ge=1, description="measured requests per artifact, at least...")
    # 3 s of 0.25-s blocks: about 12 blocks per artifact, the least the block bootstrap of the p99
    # (serve_bench.latency_intervals) should rest on; 2 s gave 8.
    min_duration_s: float = Field(3.0, ge=0, description="...and at least this much measured time")
    block_iters: int = Field(100, ge=1, description="minimum requests per interleaved block")
    block_s: float = Field(0.25, ge=0, description="target duration of a block, so the settle pause stays a "
                           "small share of the run")
    max_iters: int = Field(100_000, ge=1, description="stop an artifact after this many requests")
    concurrency: int = Field(1, ge=1, description="closed-loop client threads per artifact")
    # Pause before each block: the runtime that ran the previous block keeps its worker threads
    # spinning after its last call, and on a small machine they steal this block's cores. Measured
    # on 2 cores (torch eager after onnxruntime): with no pause 40-67% of the first ten requests of
    # a block took > 3 ms (p50 1.1 ms); 20 ms cleared positions 6-10 only; 200 ms cleared them all.
    settle_s: float = Field(0.2, ge=0, description="pause before each block so the previous runtime's threads sleep")


@dataclass
class Measurement:
    latencies_ms: np.ndarray
    wall_s: float  # wall time of the measured blocks (throughput under concurrency)
    requests: int
    blocked: BlockedSamples  # the same samples as measured: per block, with its round
    other_load: list[float | None] = field(default_factory=list)  # other processes' share of the cores, per block


def measure_interleaved(workers: dict[str, BenchWorker], settings: HarnessSettings, progress=None,
                        first_round: int = 0) -> dict[str, Measurement]:
    """Round-robin blocks until every artifact has enough; rounds are numbered from ``first_round`` so a
    repeated measurement's blocks never pair with another repeat's."""
    block = {}
    for name, worker in workers.items():
        done, seconds = worker.call("warmup", max(1, settings.warmup_iters), settings.warmup_s)
        block[name] = max(settings.block_iters, int(settings.block_s / max(seconds / done, 1e-9)))
    samples: dict[str, list[np.ndarray]] = {name: [] for name in workers}
    spent = {name: 0.0 for name in workers}  # measured wall time: the minimum-duration condition and throughput
    counts = {name: 0 for name in workers}
    rounds: dict[str, list[int]] = {name: [] for name in workers}
    loads: dict[str, list[float | None]] = {name: [] for name in workers}
    sampler = LoadSampler([os.getpid(), *(w.process.pid for w in workers.values())])
    current = first_round

    def done(name: str) -> bool:
        return counts[name] >= settings.max_iters or (
            counts[name] >= settings.min_iters and spent[name] >= settings.min_duration_s)

    while not all(done(n) for n in workers):
        for name, worker in workers.items():
            if done(name):
                continue
            time.sleep(settings.settle_s)
            before = sampler.snapshot()
            latencies_ns, block_wall = worker.call("block", block[name], counts[name], settings.concurrency)
            loads[name].append(sampler.other_share(before))
            samples[name].append(latencies_ns.astype(np.float64) / 1e6)
            rounds[name].append(current)
            counts[name] += len(latencies_ns)
            spent[name] += block_wall
        current += 1
        if progress is not None:
            progress(dict(counts))
    return {name: Measurement(np.concatenate(samples[name]), spent[name], counts[name],
                              BlockedSamples(samples[name], rounds[name]), loads[name])
            for name in workers}
