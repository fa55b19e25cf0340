"""Latency measurement of several artifacts in one run, interleaved so noise hits all alike.

Each artifact is warmed up (by iterations and by time), then measured in round-robin
blocks until every artifact has both a minimum number of requests and a minimum measured
duration. Every round runs one block of EVERY artifact, also of those that already have
enough: a ratio of two artifacts is paired round by round, so a block measured in a round
the other artifact skipped would be unpaired, and the ratio's point (over all blocks) and its
interval (over the shared rounds) would be two different statistics. The order within a round
rotates, so no artifact always follows the same one: the runtime that ran the block before may
still have its threads winding down (``settle_s`` is the pause for that), and with a fixed order
the same artifact would pay for it in every round.
Inputs are real images, rotated so no cache sees the same input twice in a row.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.stats.latency_intervals import BlockedSamples
from serve_bench.latency.machine_load import LoadSampler
from serve_bench.latency.worker import BenchWorker

log = logging.getLogger(__name__)


class HarnessSettings(BaseModel):
    """How long and in what pattern each artifact is measured (the bench stage's settings reuse these)."""

    model_config = ConfigDict(extra="forbid")
    warmup_iters: int = Field(50, ge=0, description="warm-up requests before measuring...")
    warmup_s: float = Field(0.5, ge=0, description="...and at least this long")
    min_iters: int = Field(1000, ge=1, description="measured requests per artifact, at least...")
    # 3 s of 0.25-s blocks: about 12 blocks per artifact, the least the block bootstrap of the p99
    # (serve_bench.stats.latency_intervals) should rest on; 2 s gave 8.
    min_duration_s: float = Field(3.0, ge=0, description="...and at least this much measured time")
    block_iters: int = Field(100, ge=1, description="minimum requests per interleaved block")
    block_s: float = Field(0.25, ge=0, description="target duration of a block, so the settle pause stays a "
                           "small share of the run")
    max_iters: int = Field(100_000, ge=1, description="end the measurement once any artifact has this many "
                           "requests (every artifact runs in every round, so the fastest one reaches it first)")
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
    short_of_floors: bool = False  # the max_iters cap ended the measurement before this one met min_iters/duration


def measure_interleaved(workers: dict[str, BenchWorker], settings: HarnessSettings, progress=None,
                        first_round: int = 0) -> dict[str, Measurement]:
    """Rounds of one block per artifact until every artifact has enough (or one reached ``max_iters``);
    rounds are numbered from ``first_round`` so a repeated measurement's blocks never pair with another
    repeat's. ``progress`` is called after each round with how far the measurement is (0 to 1)."""
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

    def enough(name: str) -> bool:
        return counts[name] >= settings.min_iters and spent[name] >= settings.min_duration_s

    def capped() -> bool:
        return any(count >= settings.max_iters for count in counts.values())

    names = list(workers)
    while not all(enough(n) for n in workers) and not capped():
        shift = (current - first_round) % len(names)
        for name in names[shift:] + names[:shift]:  # each artifact takes every place in the round in turn
            worker = workers[name]
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
            progress(_done(counts, spent, settings))
    short = [n for n in workers if not enough(n)]
    if short:
        log.warning("measurement ended at max_iters=%d before %s met min_iters/min_duration_s: raise max_iters or "
                    "lower the floors", settings.max_iters, ", ".join(short))
    return {name: Measurement(np.concatenate(samples[name]), spent[name], counts[name],
                              BlockedSamples(samples[name], rounds[name]), loads[name], name in short)
            for name in workers}


def _done(counts: dict[str, int], spent: dict[str, float], settings: HarnessSettings) -> float:
    """How far the measurement is, 0 to 1: it ends when every artifact has its floors (requests and measured
    time), or when one reaches ``max_iters``; the slowest artifact's share of its floors decides."""
    def share(name: str) -> float:
        by_count = counts[name] / settings.min_iters if settings.min_iters else 1.0
        by_time = spent[name] / settings.min_duration_s if settings.min_duration_s else 1.0
        return min(1.0, by_count, by_time)

    floors = min(share(n) for n in counts) if counts else 1.0
    cap = max(counts.values(), default=0) / settings.max_iters if settings.max_iters else 0.0
    return min(1.0, max(floors, cap))


def short_of_floors_flag(entries: list[dict]) -> str | None:
    """A flag for the report when the max_iters cap ended a measurement before some artifact met its floors:
    their figures rest on fewer requests or less time than the settings ask for."""
    short = [e["name"] for e in entries if (e.get("latency_ms") or {}).get("short_of_floors")]
    if not short:
        return None
    return (f"the measurement ended at max_iters (the fastest artifact's request count) before {', '.join(short)} "
            "had min_iters requests and min_duration_s of measured time: raise max_iters or lower the floors")
