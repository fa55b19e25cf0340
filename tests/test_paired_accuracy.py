"""Accuracy intervals and the paired drop, on cases with answers worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from serve_bench.limits import Limits
from tests.report_entries import as_entries
from serve_bench.gate import evaluate
from serve_bench.stats.paired import (PairedCounts, drop_interval, mcnemar_exact_p, needed_test_images, paired_counts,
                                paired_summary, score_statistic, smallest_certifiable_drop, wilson_interval)

Z = 1.959963984540054  # the two-sided 95% normal quantile


def _profile_score(n, b, c, delta):
    """The score statistic the long way: maximise the multinomial likelihood under drop = delta numerically,
    then divide the observed difference by its standard error at that restricted estimate."""
    def negative_loglik(q):
        p10, p01 = q + delta, q
        rest = 1 - p10 - p01
        return -(b * math.log(p10) + c * math.log(p01) + (n - b - c) * math.log(rest))

    low, high = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12
    q = optimize.minimize_scalar(negative_loglik, bounds=(low, high), method="bounded",
                                 options={"xatol": 1e-14}).x
    return (b - c - n * delta) / math.sqrt(n * (2 * q + delta - delta * delta))


def test_the_hand_case_1000_images_12_discordant_9_to_3():
    counts = PairedCounts(1000, 9, 3)
    assert counts.drop == pytest.approx(0.006)  # (9 - 3) / 1000: 0.6 point
    # McNemar exact: 2 × P(X ≥ 9 | X ~ Bin(12, ½)) = 2 × (C(12,9)+C(12,10)+C(12,11)+C(12,12)) / 2^12
    assert mcnemar_exact_p(counts) == pytest.approx(2 * (220 + 66 + 12 + 1) / 4096)
    lower, upper = drop_interval(counts)
    assert lower == pytest.approx(-0.0932, abs=5e-4) and upper == pytest.approx(1.4376, abs=5e-4)
    # At each end the score statistic, computed from the likelihood directly, is exactly ∓1.96.
    assert _profile_score(1000, 9, 3, upper / 100) == pytest.approx(-Z, abs=1e-4)
    assert _profile_score(1000, 9, 3, lower / 100) == pytest.approx(Z, abs=1e-4)
    # The interval is wider than the Wald one (0.6 ± 1.96·sqrt(12/1000² − 6²/1000³) = −0.078 … 1.278) on the
    # side that matters: a score interval does not pretend 12 discordant pairs pin the drop down.
    assert upper > 1.278 and lower < 0.6


def test_no_disagreement_still_leaves_the_rate_of_disagreement_uncertain():
    lower, upper = drop_interval(PairedCounts(1000, 0, 0))
    # Solved by hand: with no discordant pair the score equation is nΔ/(1 − Δ) = z², so Δ = z² / (n + z²).
    assert upper == pytest.approx(100 * Z * Z / (1000 + Z * Z), rel=1e-6) and lower == pytest.approx(-upper)
    assert smallest_certifiable_drop(1000) == pytest.approx(upper)
    assert score_statistic(PairedCounts(1000, 0, 0), 0.0) == 0.0


def test_wilson_interval_by_hand():
    lo, hi = wilson_interval(980, 1000)
    p, n = 0.98, 1000
    centre, half = (p + Z * Z / (2 * n)) / (1 + Z * Z / n), Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    assert (lo, hi) == pytest.approx((100 * (centre - half), 100 * (centre + half)))
    assert hi - lo > 1.7  # ±0.9 point around 98% on 1,000 images
    assert wilson_interval(1000, 1000)[1] == 100.0 and wilson_interval(1000, 1000)[0] < 99.7


def test_the_interval_covers_the_true_drop_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    n, p10, p01 = 1000, 0.009, 0.003
    draws = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=3000)[:, :2]
    intervals = {}
    for b, c in {tuple(d) for d in draws}:
        intervals[(b, c)] = drop_interval(PairedCounts(n, b, c))
    covered = np.mean([intervals[tuple(d)][0] <= 0.6 <= intervals[tuple(d)][1] for d in draws])
    assert 0.93 <= covered <= 0.975
    # One-sided: with the true drop exactly at a 0.6-point red line, "shown within" must be rare (≤ 2.5%).
    wrongly_certified = np.mean([intervals[tuple(d)][1] <= 0.6 for d in draws])
    assert wrongly_certified <= 0.04
    # The point rule passes that artifact about half the time (observed drop at or under the line).
    assert np.mean([(b - c) / 10 <= 0.6 for b, c in draws]) > 0.4


def test_counts_from_per_image_hits():
    base = np.array([1, 1, 1, 0, 0, 1], dtype=bool)
    art = np.array([1, 0, 0, 1, 0, 1], dtype=bool)
    assert paired_counts(base, art) == PairedCounts(6, 2, 1)
    with pytest.raises(ValueError, match="same images"):
        paired_counts(base, art[:5])


def test_needed_test_size_at_even_odds_is_where_the_expected_bound_meets_the_red_line():
    counts = PairedCounts(1000, 3, 2)  # a 0.1-point drop, 5 disagreements in 1,000
    needed = needed_test_images(counts, 0.3, power=0.5)
    assert needed == 5750
    assert drop_interval(counts.scaled(needed))[1] <= 0.3 < drop_interval(counts.scaled(needed - 1))[1]
    assert needed_test_images(PairedCounts(1000, 8, 2), 0.6) is None  # observed drop 0.6: no size shows it within
    assert needed_test_images(PairedCounts(1000, 2, 2), 2.0) == 1000  # already enough


def _entry(name, counts, p99=1.0, p99_ci=(0.9, 1.1)):
    paired = paired_summary(counts, 0.3) if counts else {"reference": True, "n": 1000}
    drop = 100 * counts.drop if counts else 0.0
    return {"name": name, "accuracy_drop": drop, "accuracy_paired": paired,
            "latency_ms": {"p99": p99, "p99_ci_blocks": list(p99_ci)}}


def test_confident_refuses_a_01_point_drop_against_a_03_point_red_line_on_1000_images():
    artifacts = [_entry("torch", None, p99=4.0, p99_ci=(3.5, 4.5)), _entry("int8", PairedCounts(1000, 3, 2))]
    point = evaluate(as_entries(artifacts), Limits(max_drop=0.3, p99_budget_ms=5.0, decision="point"))
    assert point["release"] == "int8"  # 0.1 < 0.3 on the point estimate...
    assert any("int8 is within the red line on the point estimate" in n and "≥ 10,808 test images for an 80% chance" in n
               for n in point["notes"])  # ...and the report says the test set cannot back that up
    confident = evaluate(as_entries(artifacts), Limits(max_drop=0.3, p99_budget_ms=5.0, decision="confident"))
    assert confident["release"] == "torch" and confident["decision"] == "confident"
    reason = next(r for r in confident["reasons"] if r.startswith("int8:"))
    assert "95% upper bound 0.70 > red line 0.3" in reason and "≥ 10,808 test images for an 80% chance" in reason
    assert "5 of 1,000 images" in reason
    note = confident["notes"][0]  # no artifact but the baseline can be shown within 0.3 on 1,000 images
    assert "cannot show any artifact but the baseline within a red line of 0.3" in note and "0.38" in note
    alone = evaluate(as_entries(artifacts[1:]), Limits(max_drop=0.3, p99_budget_ms=5.0, decision="confident"))
    assert not alone["passed"] and alone["reasons"][0].endswith("at 95% confidence")  # exit 1, with the reason


def test_confident_gates_the_p99_on_its_upper_bound():
    artifacts = [_entry("onnx", PairedCounts(20000, 3, 2), p99=1.8, p99_ci=(1.5, 2.6))]
    assert evaluate(as_entries(artifacts), Limits(max_drop=0.3, p99_budget_ms=2.0, decision="point"))["passed"]
    confident = evaluate(as_entries(artifacts), Limits(max_drop=0.3, p99_budget_ms=2.0, decision="confident"))
    assert not confident["passed"]
    assert "p99 1.800 ms, 95% upper bound 2.600 ms (block bootstrap) > budget 2 ms" in confident["reasons"][1]


def test_confident_on_a_report_without_intervals_says_what_to_do():
    old = [{"name": "onnx", "accuracy_drop": 0.1, "latency_ms": {"p99": 1.0}}]
    gate = evaluate(as_entries(old), Limits(max_drop=0.5, p99_budget_ms=2.0, decision="confident"))
    assert not gate["passed"] and "written by an older version" in gate["reasons"][1]
    assert evaluate(as_entries(old), Limits(max_drop=0.5, p99_budget_ms=2.0, decision="point"))["passed"]
    with pytest.raises(ValueError, match="choose one of point, confident"):
        evaluate(as_entries(old), Limits(max_drop=0.5, p99_budget_ms=2.0, decision="strict"))


def _shown_within_rate(n: int, counts: PairedCounts, max_drop: float, runs: int = 4000, seed: int = 0) -> float:
    """Share of simulated test sets of ``n`` images (true disagreement rates those of ``counts``) on which the
    upper bound of the drop is at most ``max_drop``: by the score test at the red line, the same decision as
    comparing Tango's upper bound, without a root search per draw."""
    from serve_bench.stats.paired import LEVEL, _z

    rates = [counts.baseline_only / counts.n, counts.artifact_only / counts.n]
    draws = np.random.default_rng(seed).multinomial(n, [*rates, 1 - sum(rates)], size=runs)
    z = _z(LEVEL)
    return float(np.mean([score_statistic(PairedCounts(n, b, c), max_drop / 100) <= -z for b, c, _ in draws]))


def test_the_needed_test_size_shows_the_artifact_within_the_line_with_the_stated_power():
    """The README's example: 3:2 disagreements in 1,000, red line 0.3. The expected-bound size (5,750) is a
    coin flip; the reported size gives the stated 80%."""
    from serve_bench.stats.paired import POWER

    counts = PairedCounts(1000, 3, 2)
    needed = needed_test_images(counts, 0.3)
    assert POWER == 0.8 and 1.7 < needed / 5750 < 2.2
    assert abs(_shown_within_rate(needed, counts, 0.3) - POWER) < 0.03  # 4,000 draws: SE 0.006
    assert _shown_within_rate(5750, counts, 0.3) < 0.56  # measured 0.50: what the old figure promised
    assert paired_summary(counts, 0.3)["needed_test_images_power"] == POWER
