"""The paired image bootstrap every task whose metric is not a mean over images (mAP, mIoU) is judged by.

A pixel or a box is not an independent sample: the images are. So each draw weights every test image
by how often it was drawn, the same draw for every file compared (the images pair), and the metric is
recomputed from per-image tallies. The figure is the metric on the whole set, the interval the
percentile interval of the same estimator over the draws, and a drop's interval comes from the draws'
differences.
"""
from __future__ import annotations

import numpy as np

LEVEL = 0.95
POWER = 0.8


def bootstrap_weights(n: int, draws: int, seed: int) -> np.ndarray:
    """``draws``×``n`` image counts of seeded resamples with replacement (the same for every file compared)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(float)


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> list[float]:
    values = values[np.isfinite(values)]
    return [float(v) for v in np.percentile(values, [50 * (1 - level), 50 * (1 + level)])]


def drop_summary(drop: float, draws: np.ndarray, n: int, max_drop: float | None = None, level: float = LEVEL) -> dict:
    """A drop with the percentile interval of its paired bootstrap ``draws`` (the same resamples of the same
    images for both files), and (where it is not shown within ``max_drop``) roughly how many test images
    would show it: the interval's half-width shrinks as 1/√n, so at the observed drop and spread
    n' = n · ((z_level + z_power) · sd / (max_drop − drop))² puts the upper bound below the red line with
    ``POWER`` probability."""
    finite = draws[np.isfinite(draws)]
    lower, upper = percentile_interval(finite, level)
    sd = float(finite.std())
    out = {"n": n, "drop": round(drop, 4), "drop_ci": [round(lower, 4), round(upper, 4)], "level": level,
           "method": "paired-bootstrap", "draws": int(len(finite)), "draws_undefined": int(len(draws) - len(finite)),
           "sd": round(sd, 4)}
    if max_drop is not None:
        out["max_drop"] = max_drop
        out["non_inferior"] = bool(upper <= max_drop)
        out["needed_test_images"] = None if upper <= max_drop else needed_for_bootstrap(n, drop, sd, max_drop, level)
        out["needed_test_images_power"] = POWER
    return out


def needed_for_bootstrap(n: int, drop: float, sd: float, max_drop: float, level: float = LEVEL,
                         power: float = POWER) -> int | None:
    """Test images that would put a drop's upper bound under ``max_drop`` with ``power`` probability, from the
    bootstrap spread ``sd`` at ``n`` images scaled as 1/√n (more than ``n``: this set did not show it). None
    when the drop is itself at or past the line, or the bootstrap had no spread."""
    from statistics import NormalDist

    if drop >= max_drop or sd <= 0:
        return None
    z = NormalDist().inv_cdf(1 - (1 - level) / 2) + NormalDist().inv_cdf(power)
    return max(n + 1, int(np.ceil(n * (z * sd / (max_drop - drop)) ** 2)))


def paired_fields(name: str, baseline: str, point: dict[str, float], draws: dict[str, np.ndarray], n: int,
                  max_drop: float | None) -> dict:
    """A file's drop below the baseline and its paired interval, as the report's entry holds them: ``point`` and
    ``draws`` give every file's full-set figure and its bootstrap values (the same draws for every file)."""
    if name == baseline:
        return {"accuracy_drop": 0.0, "accuracy_paired": {"reference": True, "n": n, "drop": 0.0, "drop_ci": [0.0, 0.0],
                                                          "method": "paired-bootstrap"}}
    paired = drop_summary(point[baseline] - point[name], draws[baseline] - draws[name], n, max_drop)
    return {"accuracy_drop": paired["drop"], "accuracy_paired": paired}


def rare_classes(images_per_class: np.ndarray, class_names: list[str], minimum: int, held: str,
                 metric: str) -> str | None:
    """A flag when a class is in fewer than ``minimum`` test images: resamples then often miss it, its score is
    undefined there, and a draw's ``metric`` averages over fewer classes than the figure does."""
    thin = [f"{class_names[c]} ({images_per_class[c]})" for c in range(len(class_names))
            if images_per_class[c] < minimum]
    if not thin:
        return None
    return (f"classes {held} fewer than {minimum} test images: {', '.join(thin)}; the {metric} intervals and the "
            "paired drops are unreliable for them (a resample that misses a class averages over the others): add "
            "test images of those classes")
