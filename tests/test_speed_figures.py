"""The speed-up and its interval are one statistic: every artifact runs in every round, and the point and
the interval both come from those rounds."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from serve_bench.bench import speed_figures
from serve_bench.latency.harness import HarnessSettings, measure_interleaved
from serve_bench.stats.latency_intervals import BlockedSamples
from tests.report_invariants import points_outside_intervals


class _FakeWorker:
    """A worker whose requests take a fixed time: one artifact is 10× faster than the other."""

    def __init__(self, ms: float):
        self.ms, self.process = ms, SimpleNamespace(pid=os.getpid())

    def call(self, what, *args):
        if what == "warmup":
            return args[0], args[0] * self.ms / 1000
        n = args[0]
        return np.full(n, int(self.ms * 1e6), dtype=np.int64), n * self.ms / 1000


def test_every_artifact_is_measured_in_every_round_even_after_it_has_enough():
    settings = HarnessSettings(warmup_iters=1, warmup_s=0.0, min_iters=100, min_duration_s=0.5, block_iters=10,
                               block_s=0.0, settle_s=0.0)
    measured = measure_interleaved({"fast": _FakeWorker(1.0), "slow": _FakeWorker(10.0)}, settings)
    fast, slow = measured["fast"].blocked, measured["slow"].blocked
    # the slow one needs 5 rounds for 0.5 s; the fast one had its 100 requests after 10... and still ran in all
    assert slow.rounds == fast.rounds and len(slow.rounds) >= 10
    assert measured["fast"].requests == measured["slow"].requests


def test_the_hard_cap_ends_the_measurement_for_all_with_a_warning(caplog):
    settings = HarnessSettings(warmup_iters=1, warmup_s=0.0, min_iters=10, min_duration_s=1.0, block_iters=10,
                               block_s=0.0, settle_s=0.0, max_iters=50)
    measured = measure_interleaved({"fast": _FakeWorker(1.0), "slow": _FakeWorker(10.0)}, settings)
    assert measured["fast"].blocked.rounds == measured["slow"].blocked.rounds == [0, 1, 2, 3, 4]
    assert "max_iters=50" in caplog.text
    assert measured["fast"].short_of_floors and measured["slow"].short_of_floors  # 1.0 s of time asked, 0.05/0.5 had
    from serve_bench.latency.harness import short_of_floors_flag

    flag = short_of_floors_flag([{"name": "slow", "latency_ms": {"short_of_floors": True}}, {"name": "ok"}])
    assert "before slow had min_iters" in flag and short_of_floors_flag([{"name": "ok", "latency_ms": {}}]) is None


def _quickstart_shape(seed: int = 0) -> dict[str, BlockedSamples]:
    """The shape of the quickstart report the speed-up was wrong in: the torch baseline in 16 blocks, the INT8
    file in the first 13 of those rounds only (the old harness stopped an artifact once it had enough)."""
    rng = np.random.default_rng(seed)
    drift = rng.uniform(1.0, 1.6, 16)
    base = [level * rng.lognormal(np.log(1.6), 0.15, 150) for level in drift]
    for late in base[13:]:
        late[:12] *= 3.0  # slow requests in rounds the INT8 file did not run in
    int8 = [level * rng.lognormal(np.log(0.15), 0.25, 1500) for level in drift[:13]]
    return {"train.model": BlockedSamples(base, list(range(16))), "quantize.onnx_cpu": BlockedSamples(int8,
                                                                                                      list(range(13)))}


def test_the_speed_up_is_the_inverse_of_the_paired_ratio_and_lies_inside_its_interval():
    blocked = _quickstart_shape()
    pooled = np.percentile(blocked["train.model"].flat, 99) / np.percentile(blocked["quantize.onnx_cpu"].flat, 99)
    figures = speed_figures("quantize.onnx_cpu", "train.model", blocked, wall_s=3.0, requests=19_500, batch_size=1)
    low, high = figures["speedup_p99_ci"]
    ratio = figures["latency_ratio"]["p99"]
    # the old figure, baseline p99 over all 16 blocks, is not what the interval (13 shared rounds) is about
    assert not low <= round(pooled, 4) <= high
    assert low <= figures["speedup_p99"] <= high
    assert figures["speedup_p99"] == pytest.approx(1 / ratio["ratio"], rel=1e-3)
    assert (low, high) == pytest.approx((1 / ratio["ci"][1], 1 / ratio["ci"][0]), rel=1e-3)
    assert ratio["rounds"] == 13


def test_the_baseline_is_its_own_reference():
    figures = speed_figures("train.model", "train.model", _quickstart_shape(), wall_s=2.0, requests=1000, batch_size=4)
    assert figures == {"throughput": 2000.0, "speedup_p99": 1.0, "speedup_p99_ci": [1.0, 1.0], "latency_ratio": None}


def test_the_invariant_check_catches_a_point_outside_its_interval():
    entry = {"name": "x", "speedup_p99": 10.55, "speedup_p99_ci": [6.80, 10.53],
             "latency_ratio": {"p99": {"ratio": 0.1007, "ci": [0.095, 0.147]}},
             "latency_ms": {"p50": 1.0, "p99": 2.0, "p50_ci_blocks": [0.9, 1.1], "p99_ci_blocks": [1.9, 2.2]}}
    problems = points_outside_intervals({"artifacts": [entry]})
    assert any("speedup_p99 10.55 outside [6.8, 10.53]" in p for p in problems)
    assert any("1/latency_ratio.p99" in p for p in problems)


def test_progress_follows_the_slowest_artifacts_floors_and_the_cap():
    """After each round, how far the measurement is: every file needs 0.04 s of measured time, which the fast one
    (1 ms a request, 10 a round) reaches last, in 4 rounds, so progress climbs in quarters to 1; with a cap of 30
    requests, the cap ends it at 1 in 3 rounds."""
    settings = HarnessSettings(warmup_iters=1, warmup_s=0.0, min_iters=10, min_duration_s=0.04, block_iters=10,
                               block_s=0.0, settle_s=0.0)
    seen: list[float] = []
    measure_interleaved({"fast": _FakeWorker(1.0), "slow": _FakeWorker(10.0)}, settings, progress=seen.append)
    assert seen == pytest.approx([0.25, 0.5, 0.75, 1.0])
    capped: list[float] = []
    measure_interleaved({"fast": _FakeWorker(1.0), "slow": _FakeWorker(10.0)},
                        settings.model_copy(update={"min_duration_s": 5.0, "max_iters": 30}), progress=capped.append)
    assert capped == pytest.approx([1 / 3, 2 / 3, 1.0])

