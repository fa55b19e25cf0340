"""Does an accuracy measured on new images agree with the model card's, given that both are samples?

The card's figure is itself an estimate from its own test images (1,000 of them, say: ±0.9
point at 98%). Asking only whether the card's figure lies in the new images' interval ignores
that error: the more new images, the narrower their interval and the more often a correct
bundle is called wrong (a correct 98% bundle with a 1,000-image card: 17% of the time on
1,000 new images, 56% on 10,000, 79% on 50,000).

The two accuracies are independent binomial samples, so the question is about their
difference. Its interval is Newcombe's hybrid score interval (method 10 of Newcombe, Stat. Med.
1998, "Interval estimation for the difference between independent proportions"), built from
the two Wilson intervals the card and the report already use; the new images agree with the
card when that interval contains 0. Its level is 99%: a correct bundle is called wrong about 1
time in 100 (a false alarm costs a deployer an investigation of a bundle that is fine), while a
card 3 points off is still caught nearly always on 10,000 new images (both measured by
simulation in ``tests/test_verify_agreement.py``). Images shared by the two sets only make the
rule more lenient toward agreement (positively correlated samples), never a false alarm more likely.

Vectorised over numpy arrays so that a simulation can judge many draws at once.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

AGREEMENT_LEVEL = 0.99


def wilson_bounds(hits, n, level: float = AGREEMENT_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of ``hits`` of ``n`` as fractions, element-wise (the same formula as
    ``serve_bench.stats.paired.wilson_interval``, which works in percent on one value)."""
    hits, n = np.asarray(hits, dtype=float), np.asarray(n, dtype=float)
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return np.maximum(0.0, centre - half), np.minimum(1.0, centre + half)


def difference_interval(new_hits, new_n, card_hits, card_n,
                        level: float = AGREEMENT_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe's hybrid score interval of (new accuracy − card accuracy), in percentage points."""
    new_p = np.asarray(new_hits, dtype=float) / np.asarray(new_n, dtype=float)
    card_p = np.asarray(card_hits, dtype=float) / np.asarray(card_n, dtype=float)
    new_low, new_high = wilson_bounds(new_hits, new_n, level)
    card_low, card_high = wilson_bounds(card_hits, card_n, level)
    difference = new_p - card_p
    lower = difference - np.sqrt((new_p - new_low) ** 2 + (card_high - card_p) ** 2)
    upper = difference + np.sqrt((new_high - new_p) ** 2 + (card_p - card_low) ** 2)
    return 100.0 * lower, 100.0 * upper


def agrees(new_hits, new_n, card_hits, card_n, level: float = AGREEMENT_LEVEL) -> np.ndarray:
    """True where the difference's interval contains 0: the new images do not show the card wrong."""
    lower, upper = difference_interval(new_hits, new_n, card_hits, card_n, level)
    return (lower <= 0.0) & (0.0 <= upper)


def hits_of(percent: float, n: int) -> int:
    """The count of hits a recorded percentage of ``n`` images stands for (reports keep 4 decimals)."""
    return int(round(percent * n / 100.0))
