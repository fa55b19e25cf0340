"""Accuracy with its uncertainty, and the drop of one artifact against the baseline on the same images.

Two artifacts judged on one test set are paired: on most images both are right, and the
drop is decided by the few images where they disagree. Comparing two unpaired accuracy
intervals throws that away (their intervals overlap long after the pair is known to
differ), so the drop gets its own paired interval.

Method: Tango's asymptotic score interval for a difference of paired proportions (Tango,
Stat. Med. 1998; among the intervals Fagerland, Lydersen and Laake, Stat. Med. 2014,
recommend for paired binomial data). It is built by inverting the score test, the
unconditional form of McNemar's test, so it is what McNemar's statistic says about the
size of the drop. Chosen over the two obvious alternatives because of the case that matters
most here, a compressed model that disagrees with its baseline on very few images:

- a paired bootstrap and the exact conditional (Clopper-Pearson on the discordant split)
  interval both collapse to zero width when the two agree on every image, so 0 of 1,000
  disagreements would certify any red line, even 0.01 point; Tango's interval keeps the
  uncertainty of the disagreement rate itself (0 of 1,000: the drop may still be up to
  0.38 point), like the "rule of three";
- it needs no resampling seed, so a report re-gated with another red line gives the same
  answer every time.

Alongside it the report gives McNemar's exact test (binomial on the discordant pairs) for
"do they differ at all". The non-inferiority verdict is one-sided: the artifact is shown
within the red line when the upper bound of the two-sided 95% interval (a one-sided 97.5%
bound, the usual convention for non-inferiority) is at most the red line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95
_LARGEST_TEST_SET = 10**9  # above this a "needed test size" is no longer an actionable number


@dataclass(frozen=True)
class PairedCounts:
    """Per-image agreement of an artifact with the baseline: ``baseline_only`` images the baseline
    gets right and the artifact wrong, ``artifact_only`` the other way round."""

    n: float
    baseline_only: float
    artifact_only: float

    @property
    def discordant(self) -> float:
        return self.baseline_only + self.artifact_only

    @property
    def drop(self) -> float:
        """Accuracy drop as a fraction (positive = the artifact is worse)."""
        return (self.baseline_only - self.artifact_only) / self.n

    def scaled(self, n: float) -> "PairedCounts":
        """The same disagreement rates on a test set of ``n`` images."""
        f = n / self.n
        return PairedCounts(n, self.baseline_only * f, self.artifact_only * f)


def paired_counts(baseline_hits: np.ndarray, artifact_hits: np.ndarray) -> PairedCounts:
    base, art = np.asarray(baseline_hits, dtype=bool), np.asarray(artifact_hits, dtype=bool)
    if base.shape != art.shape:
        raise ValueError(f"paired results need the same images: {base.shape} vs {art.shape}")
    return PairedCounts(int(base.size), int(np.sum(base & ~art)), int(np.sum(~base & art)))


def _z(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2))


def wilson_interval(hits: float, n: float, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of an accuracy, in percent: unlike the normal approximation it stays
    inside [0, 100] and keeps a width at 100% accuracy."""
    if n <= 0:
        raise ValueError("an accuracy interval needs at least one image")
    z, p = _z(level), hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def score_statistic(counts: PairedCounts, delta: float) -> float:
    """Tango's score statistic for H0: drop = ``delta`` (a fraction), Tango (1998) eq. (3)-(4).

    Notation: n images; b of them only the baseline gets right, c only the artifact; under H0 the
    baseline-only rate exceeds the artifact-only rate by ``delta``. The nuisance parameter is q, the
    artifact-only rate under H0, set to its maximum-likelihood value: the positive root of
    ``2n·q² + (−(b + c) + (2n − b + c)·delta)·q − c·delta·(1 − delta) = 0``. The statistic is then
    (b − c − n·delta) / sqrt(n·(2q + delta·(1 − delta))): observed minus expected excess of
    baseline-only images, over its standard deviation under H0.
    """
    n, b, c = counts.n, counts.baseline_only, counts.artifact_only
    quad_q2 = 2 * n  # coefficient of q²
    quad_q1 = -(b + c) + (2 * n - b + c) * delta  # coefficient of q
    quad_q0 = -c * delta * (1 - delta)  # constant term
    discriminant = max(quad_q1 * quad_q1 - 4 * quad_q2 * quad_q0, 0.0)
    artifact_only_rate = (math.sqrt(discriminant) - quad_q1) / (2 * quad_q2)
    excess = b - c - n * delta  # observed minus expected (under H0) baseline-only surplus
    variance = n * (2 * artifact_only_rate + delta * (1 - delta))
    if variance <= 0:
        return 0.0 if excess == 0 else math.copysign(math.inf, excess)
    return excess / math.sqrt(variance)


def drop_interval(counts: PairedCounts, level: float = LEVEL) -> tuple[float, float]:
    """Two-sided score interval of the drop, in percentage points."""
    z, d, eps = _z(level), counts.drop, 1e-12
    upper = optimize.brentq(lambda x: score_statistic(counts, x) + z, min(d + eps, 1 - 2 * eps), 1 - eps,
                            xtol=1e-12) if d < 1 - 2 * eps else 1.0
    lower = optimize.brentq(lambda x: score_statistic(counts, x) - z, -1 + eps, max(d - eps, -1 + 2 * eps),
                            xtol=1e-12) if d > -1 + 2 * eps else -1.0
    return 100.0 * lower, 100.0 * upper


def mcnemar_exact_p(counts: PairedCounts) -> float:
    """Two-sided exact McNemar test: do the two differ at all (binomial on the discordant pairs)."""
    m = int(round(counts.discordant))
    if m == 0:
        return 1.0
    return float(stats.binomtest(int(round(counts.baseline_only)), m, 0.5).pvalue)


POWER = 0.80  # the chance a "needed test images" figure promises: the usual planning power


def _shifted(counts: PairedCounts, n: float, drop: float) -> PairedCounts:
    """``counts``' disagreement rate on ``n`` images with the drop moved to ``drop`` (a fraction): how a
    test set of that size may come out. The artifact-only share cannot go below zero."""
    discordant = counts.discordant / counts.n
    baseline_only = max((discordant + drop) / 2, drop)
    return PairedCounts(n, n * baseline_only, n * max(baseline_only - drop, 0.0))


def needed_test_images(counts: PairedCounts, max_drop: float, level: float = LEVEL, power: float = POWER) -> int | None:
    """Smallest test set on which an artifact with the same disagreement rates as ``counts`` is shown within
    ``max_drop`` points with probability ``power``; None where no size can (the observed drop is already at or
    past the red line, or the size would exceed a billion images).

    The upper bound a future test set gives is random: its observed drop scatters around the true one with
    standard deviation σ/√n, σ² = p_b + p_a − (p_b − p_a)² per image. The size where the *expected* bound meets
    the red line is therefore met only about half the time (the README's example: 5,750 images, 50% by
    simulation). Here the bound must meet the line even when the observed drop comes out at its ``power``
    quantile, drop + z_power·σ/√n; the interval itself stays Tango's. ``power=0.5`` gives the old figure."""
    if counts.drop * 100.0 >= max_drop:
        return None
    base_only, art_only = counts.baseline_only / counts.n, counts.artifact_only / counts.n
    sigma = math.sqrt(max(base_only + art_only - (base_only - art_only) ** 2, 0.0))
    z_power = float(stats.norm.ppf(power))

    def upper_at(n: float) -> float:
        return drop_interval(_shifted(counts, n, counts.drop + z_power * sigma / math.sqrt(n)), level)[1]

    if upper_at(counts.n) <= max_drop:
        return int(counts.n)
    low, high = counts.n, counts.n * 2
    while upper_at(high) > max_drop:
        low, high = high, high * 2
        if high > _LARGEST_TEST_SET:
            return None
    while high - low > 1:  # the bound shrinks as the test set grows
        mid = math.floor((low + high) / 2)
        low, high = (mid, high) if upper_at(mid) > max_drop else (low, mid)
    return int(math.ceil(high))


def smallest_certifiable_drop(n: int, level: float = LEVEL) -> float:
    """The tightest red line ``n`` test images can certify at all: the upper bound for an artifact that
    agrees with the baseline on every image."""
    return drop_interval(PairedCounts(n, 0, 0), level)[1]


def paired_summary(counts: PairedCounts, max_drop: float | None = None, level: float = LEVEL) -> dict:
    """What the report records for one artifact against the baseline (points, rounded for reading)."""
    lower, upper = drop_interval(counts, level)
    out = {"n": int(counts.n), "baseline_only": int(counts.baseline_only), "artifact_only": int(counts.artifact_only),
           "discordant": int(counts.discordant), "drop": round(100.0 * counts.drop, 4),
           "drop_ci": [round(lower, 4), round(upper, 4)], "level": level, "method": "tango-score",
           "mcnemar_p": round(mcnemar_exact_p(counts), 6)}
    if max_drop is not None:
        out["max_drop"] = max_drop
        out["non_inferior"] = upper <= max_drop
        out["needed_test_images"] = None if upper <= max_drop else needed_test_images(counts, max_drop, level)
        out["needed_test_images_power"] = POWER
    return out


def counts_of(summary: dict) -> PairedCounts:
    return PairedCounts(summary["n"], summary["baseline_only"], summary["artifact_only"])
