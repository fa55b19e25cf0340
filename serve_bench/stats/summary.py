"""Latency statistics a release can be gated on.

A p99 from a few hundred samples is mostly noise, so a p99 is refused below a sample
floor, and every p99 carries a bootstrap 95% confidence interval: two artifacts whose
intervals overlap are not known to differ, whatever their point estimates say.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serve_bench.errors import BenchError

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}


class TooFewSamples(BenchError):
    """Fewer latency samples than the floor for a trustworthy p99 (the settings ask for too few)."""

    bad_input = True


@dataclass
class LatencySummary:
    n: int
    mean: float
    std: float
    min: float
    max: float
    percentiles: dict[str, float]
    p99_ci: tuple[float, float]
    throughput: float  # items per second: batch size / mean latency

    def as_dict(self) -> dict:
        out = {k: round(v, 6) for k, v in self.percentiles.items()}
        out.update(p99_ci=[round(self.p99_ci[0], 6), round(self.p99_ci[1], 6)], mean=round(self.mean, 6),
                   std=round(self.std, 6), min=round(self.min, 6), max=round(self.max, 6), n=self.n)
        return out


def percentile(samples: np.ndarray, q: float) -> float:
    """Linear-interpolated percentile (numpy's default), the definition most tools report."""
    return float(np.percentile(samples, q))


def bootstrap_ci(samples: np.ndarray, q: float = 99.0, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the q-th percentile."""
    rng = np.random.default_rng(seed)
    n = len(samples)
    estimates = np.empty(resamples)
    for start in range(0, resamples, 200):  # chunks keep memory at 200 × n
        count = min(200, resamples - start)
        draws = samples[rng.integers(0, n, size=(count, n))]
        estimates[start:start + count] = np.percentile(draws, q, axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(estimates, alpha)), float(np.quantile(estimates, 1 - alpha))


def summarize(latencies_ms: np.ndarray | list[float], batch_size: int = 1, min_samples: int = 1000) -> LatencySummary:
    samples = np.asarray(latencies_ms, dtype=np.float64)
    if len(samples) < min_samples:
        raise TooFewSamples(f"{len(samples)} latency samples are fewer than the {min_samples} needed for a p99 "
                            "(raise the measurement count or duration, or lower the floor knowingly)")
    mean = float(samples.mean())
    return LatencySummary(
        n=len(samples), mean=mean, std=float(samples.std(ddof=1)) if len(samples) > 1 else 0.0,
        min=float(samples.min()), max=float(samples.max()),
        percentiles={k: percentile(samples, q) for k, q in PERCENTILES.items()},
        p99_ci=bootstrap_ci(samples), throughput=batch_size * 1000.0 / mean if mean > 0 else 0.0,
    )
