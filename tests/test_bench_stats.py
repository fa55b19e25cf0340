"""Percentiles, the bootstrap interval and the sample floor, on samples with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.stats.summary import TooFewSamples, bootstrap_ci, percentile, summarize


def test_percentiles_on_a_known_sample():
    samples = np.arange(1, 1001, dtype=float)  # 1..1000 ms
    assert percentile(samples, 50) == pytest.approx(500.5)
    assert percentile(samples, 99) == pytest.approx(990.01)
    summary = summarize(samples, batch_size=4)
    assert summary.percentiles["p90"] == pytest.approx(900.1) and summary.percentiles["p99.9"] == pytest.approx(999.001)
    assert (summary.min, summary.max, summary.n) == (1.0, 1000.0, 1000)
    assert summary.mean == pytest.approx(500.5) and summary.throughput == pytest.approx(4 * 1000 / 500.5)


def test_bootstrap_interval_brackets_the_p99_and_narrows_with_more_samples():
    rng = np.random.default_rng(1)
    small = rng.lognormal(0.0, 0.5, 1000)
    large = rng.lognormal(0.0, 0.5, 20000)
    lo, hi = bootstrap_ci(small)
    assert lo <= percentile(small, 99) <= hi
    true_p99 = float(np.exp(0.5 * 2.3263))  # lognormal(0, 0.5) 99th percentile
    lo_l, hi_l = bootstrap_ci(large)
    assert lo_l <= true_p99 <= hi_l
    assert (hi_l - lo_l) < (hi - lo)


def test_constant_samples_have_a_zero_width_interval():
    assert bootstrap_ci(np.full(1000, 2.5)) == (2.5, 2.5)


def test_a_p99_from_too_few_samples_is_refused_with_the_count():
    with pytest.raises(TooFewSamples, match=r"999 latency samples are fewer than the 1000 needed for a p99"):
        summarize(np.ones(999))
    assert summarize(np.ones(50), min_samples=50).n == 50
