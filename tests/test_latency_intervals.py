"""Block bootstrap and block-paired ratios, on samples whose drift between blocks is known."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.latency_intervals import BlockedSamples, block_bootstrap_ci, paired_ratio, repeat_spread
from serve_bench.stats import bootstrap_ci


def _blocks(rng, levels, size=100, sigma=0.2):
    return BlockedSamples([level * rng.lognormal(0.0, sigma, size) for level in levels], list(range(len(levels))))


def test_block_interval_is_wider_than_the_per_request_one_when_the_machine_drifts_between_blocks():
    rng = np.random.default_rng(3)
    drifting = _blocks(rng, rng.uniform(1.0, 3.0, 20))  # each block on a machine 1-3× slower
    lo_r, hi_r = bootstrap_ci(drifting.flat)
    lo_b, hi_b = block_bootstrap_ci(drifting)
    assert (hi_b - lo_b) > 2 * (hi_r - lo_r)
    assert lo_b <= np.percentile(drifting.flat, 99) <= hi_b


def test_without_drift_the_block_interval_is_about_the_per_request_one():
    rng = np.random.default_rng(4)
    steady = _blocks(rng, np.ones(20))
    width_r = np.subtract(*bootstrap_ci(steady.flat)[::-1])
    width_b = np.subtract(*block_bootstrap_ci(steady)[::-1])
    assert 0.5 < width_b / width_r < 2.0


def test_ratio_from_shared_rounds_cancels_common_drift():
    rng = np.random.default_rng(5)
    levels = rng.uniform(1.0, 3.0, 24)  # drift both artifacts saw, round by round
    slow = _blocks(rng, levels, sigma=0.05)
    fast = _blocks(rng, 0.8 * levels, sigma=0.05)
    # Alone, their median intervals overlap: the drift hides the difference...
    assert block_bootstrap_ci(fast, 50.0)[1] > block_bootstrap_ci(slow, 50.0)[0]
    # ...paired by round, the 20% is certain, for the median and for the p99.
    assert paired_ratio(fast, slow, 50.0).ci[1] < 0.9
    ratio = paired_ratio(fast, slow, 99.0)
    assert ratio.ratio == pytest.approx(0.8, rel=0.05) and ratio.ci[1] < 0.9 and ratio.verdict == "faster"
    assert ratio.rounds == 24
    same = paired_ratio(_blocks(rng, levels, sigma=0.05), slow, 50.0)
    assert same.verdict == "not distinguishable" and same.ci[0] < 1.0 < same.ci[1]
    assert paired_ratio(slow, fast, 50.0).verdict == "slower"


def test_artifacts_measured_in_no_common_round_cannot_be_paired():
    a = BlockedSamples([np.ones(10)], [0])
    b = BlockedSamples([np.ones(10)], [1])
    with pytest.raises(ValueError, match="share no measurement round"):
        paired_ratio(a, b, 50.0)


def test_ragged_blocks_are_resampled_whole():
    rng = np.random.default_rng(6)
    blocks = BlockedSamples([rng.lognormal(0, 0.2, n) for n in (50, 80, 120, 60)] * 3, list(range(12)))
    lo, hi = block_bootstrap_ci(blocks, 50.0, resamples=300)
    assert lo <= np.percentile(blocks.flat, 50) <= hi


def test_spread_across_repeats():
    spread = repeat_spread([{"p50": 1.0, "p99": 2.0}, {"p50": 1.2, "p99": 6.0}, {"p50": 1.1, "p99": 3.0}])
    assert spread["p99"]["min"] == 2.0 and spread["p99"]["max"] == 6.0 and spread["p99"]["max_over_min"] == 3.0
    assert spread["p50"]["std"] == pytest.approx(0.1)


def test_saved_samples_keep_their_blocks_and_old_files_still_read(tmp_path):
    from serve_bench.report import SAMPLES_FILE, load_blocked, save_samples

    blocked = BlockedSamples([np.arange(3.0), np.arange(5.0), np.arange(2.0)], [0, 1, 3])
    save_samples(tmp_path, {"a": blocked})
    again = load_blocked(tmp_path)["a"]
    assert again.rounds == [0, 1, 3] and [len(b) for b in again.blocks] == [3, 5, 2]
    old = tmp_path / "old"
    old.mkdir()
    np.savez_compressed(old / SAMPLES_FILE, a0=np.ones(7), names=np.array(["a"]))  # before blocks were kept
    assert [len(b) for b in load_blocked(old)["a"].blocks] == [7]
