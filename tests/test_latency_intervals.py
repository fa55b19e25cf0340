"""Block bootstrap and block-paired ratios, on samples whose drift between blocks is known."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.stats.latency_intervals import BlockedSamples, block_bootstrap_ci, paired_ratio, repeat_spread
from serve_bench.stats.summary import bootstrap_ci


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
    from serve_bench.report.files import SAMPLES_FILE, load_blocked, save_samples

    blocked = BlockedSamples([np.arange(3.0), np.arange(5.0), np.arange(2.0)], [0, 1, 3])
    save_samples(tmp_path, {"a": blocked})
    again = load_blocked(tmp_path)["a"]
    assert again.rounds == [0, 1, 3] and [len(b) for b in again.blocks] == [3, 5, 2]
    old = tmp_path / "old"
    old.mkdir()
    np.savez_compressed(old / SAMPLES_FILE, a0=np.ones(7), names=np.array(["a"]))  # before blocks were kept
    assert [len(b) for b in load_blocked(old)["a"].blocks] == [7]


def _drifting_pair(rng, rounds, size=100):
    """An artifact exactly half as slow as the baseline in distribution, both on the same drifting machine
    (common drift per round) with a heavy tail: the true p99 ratio is 0.5."""
    drift = rng.uniform(1.0, 2.0, rounds)

    def block(level):
        x = rng.lognormal(0.0, 0.2, size) * level
        tail = rng.random(size) < 0.02
        x[tail] *= rng.uniform(1.5, 4.0, tail.sum())
        return x

    return (BlockedSamples([0.5 * block(d) for d in drift], list(range(rounds))),
            BlockedSamples([block(d) for d in drift], list(range(rounds))))


def test_the_p99_ratio_interval_over_a_dozen_rounds_covers_the_known_ratio():
    """Known answer 0.5; nominal 95%. The plain percentile interval over 12 rounds is too narrow for so few
    groups; the expanded one is not (300 runs in the module docstring: 97% expanded; BCa 88%)."""
    runs, covered, inside = 200, 0, 0
    for seed in range(runs):
        fast, slow = _drifting_pair(np.random.default_rng(1000 + seed), 12)
        ratio = paired_ratio(fast, slow, 99.0, resamples=500, seed=seed)
        covered += ratio.ci[0] <= 0.5 <= ratio.ci[1]
        inside += ratio.ci[0] <= ratio.ratio <= ratio.ci[1]
    assert inside == runs
    assert covered / runs >= 0.91  # expected ≈0.965; 0.91 is 3.5 standard errors below it


def test_an_interval_that_misses_its_point_is_widened_to_it_and_says_so():
    from serve_bench.stats.latency_intervals import WIDENED, bootstrap_over_groups

    rng = np.random.default_rng(8)
    groups = [rng.lognormal(0, 0.3, 50) for _ in range(6)]
    estimate = bootstrap_over_groups(groups, 99.0, resamples=1, seed=1)  # one resample: it cannot be the point
    assert estimate.method == WIDENED and estimate.low <= estimate.point <= estimate.high
    assert bootstrap_over_groups(groups, 99.0).method != WIDENED


def test_the_expanded_tail_is_wider_for_fewer_groups_and_tends_to_the_plain_one():
    from serve_bench.stats.latency_intervals import expanded_tail

    assert expanded_tail(8) < expanded_tail(12) < expanded_tail(100) < 0.025
    assert expanded_tail(10_000) == pytest.approx(0.025, abs=1e-4)


def test_the_resampled_percentiles_equal_numpys_percentile_of_each_pooled_resample():
    """The bootstrap finds each resample's percentile by counting, not by pooling; it must give numpy's
    linear percentile of the pooled values exactly: equal and unequal block sizes, ties, one block, the ends."""
    from serve_bench.stats.latency_intervals import _resampled_percentiles

    rng = np.random.default_rng(7)
    qs = [0.0, 37.3, 50.0, 99.0, 100.0]
    for case in range(40):
        k = int(rng.integers(1, 25))
        sizes = [50] * k if case % 2 else [int(n) for n in rng.integers(1, 80, size=k)]
        groups = [rng.exponential(1.0, size=n) for n in sizes]
        if case % 3 == 0:
            groups = [np.round(g, 1) for g in groups]  # many ties
        draws = rng.integers(0, k, size=(int(rng.integers(1, 60)), k))
        pooled = np.array([np.percentile(np.concatenate([groups[j] for j in row]), qs) for row in draws])
        assert np.allclose(_resampled_percentiles(groups, qs, draws), pooled, rtol=1e-12, atol=1e-12), case
