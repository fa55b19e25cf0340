"""Latency intervals that respect how the samples were taken: in interleaved blocks.

Requests inside one block run back to back, and the machine drifts between blocks (another
tenant, a frequency change): the same ResNet-20's torch p99 moved from 1.8 to 5.8 ms between
runs on a shared 2-core VM. A bootstrap that resamples single requests treats them as
independent and gives an interval as if the drift did not exist. Resampling whole blocks keeps
each block's state together, so the interval widens by as much as blocks differ.

Blocks of the artifacts were measured in rounds (each round runs one block of every artifact,
one after the other), so two artifacts' blocks of the same round saw the same machine state.
The ratio of their percentiles is bootstrapped over rounds, both artifacts drawing the same
rounds: drift common to both cancels, which is why a ratio can be certain when the two
intervals overlap.

The interval is the expanded percentile bootstrap (Hesterberg, "What teachers should know
about the bootstrap", Am. Stat. 2015): the percentile interval taken at the tail probability
Φ(√(k/(k−1)) · t_{α/2, k−1}) instead of α/2, for k rounds or blocks. A p99 over about a dozen
rounds is decided by its slowest block or two, and a plain percentile bootstrap over so few
groups is too narrow (it divides by k, not k−1, and uses z, not t). Simulated with a known
true ratio (the scenario of tests/test_latency_intervals.py), 8 / 12 / 20 rounds, 300 runs each: plain
percentile covered 93 / 94 / 95% with common drift and 84 / 94 / 94% with stalls that hit single
blocks; expanded 98 / 97 / 96% and 92 / 95 / 95%. BCa (scipy's ``stats.bootstrap``) was tried
first and covered only 85 / 88 / 92% and 84% at 12 rounds: its bias and acceleration, estimated
from a dozen jackknife values, are too noisy here. Where the point still falls outside the
interval (a lopsided resample distribution), the interval is widened to the point and its
``method`` says so. Point and interval are always one estimator on the same groups: the
percentile of the pooled samples of those groups (for a ratio, of the same rounds).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

log = logging.getLogger(__name__)

RESAMPLES, LEVEL = 2000, 0.95
MIN_BLOCKS = 10  # below this a bootstrap over blocks has too few distinct resamples to trust its ends


@dataclass
class BlockedSamples:
    """One artifact's latencies (ms) as measured: one array per block and the round it ran in."""

    blocks: list[np.ndarray]
    rounds: list[int]

    def __post_init__(self) -> None:
        if len(self.blocks) != len(self.rounds):
            raise ValueError(f"{len(self.blocks)} blocks but {len(self.rounds)} round numbers")
        if not self.blocks:
            raise ValueError("no latency blocks")

    @property
    def flat(self) -> np.ndarray:
        return np.concatenate(self.blocks)

    def by_round(self) -> dict[int, np.ndarray]:
        out: dict[int, list[np.ndarray]] = {}
        for r, block in zip(self.rounds, self.blocks):
            out.setdefault(r, []).append(block)
        return {r: np.concatenate(b) for r, b in out.items()}


def _resampled_percentiles(groups: list[np.ndarray], qs: list[float], draws: np.ndarray) -> np.ndarray:
    """Percentiles ``qs`` of the concatenation of ``groups[draws[i]]`` for each row i: shape (rows, len(qs)).

    Numpy's (linear) percentile of each pooled resample (to the last bit, or one unit in it), without pooling
    it: a resample is a count per group, so its t-th smallest value is found by a binary search over the
    groups' values sorted once, where the number of resampled values at or below a sorted position is the
    counts times each group's prefix counts (groups × values int32 numbers: 80 MB at 200 blocks of 100,000).
    That is O(rows × groups × log values) instead of partitioning rows × values numbers (seconds per bench)."""
    draws = np.atleast_2d(np.asarray(draws, dtype=np.intp))
    if any(not 0.0 <= q <= 100.0 for q in qs):
        raise ValueError(f"percentiles must lie in [0, 100], got {qs}")
    k = len(groups)
    values = np.concatenate(groups)
    if np.isnan(values).any():
        raise ValueError("a latency block holds NaN: the percentiles would be meaningless")
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    owner = np.repeat(np.arange(k), [len(g) for g in groups])[order]
    # prefix[j, i]: how many of group j's values sit among the first i sorted ones
    prefix = np.zeros((k, len(ordered) + 1), dtype=np.int32)
    prefix[owner, np.arange(1, len(ordered) + 1)] = 1
    np.cumsum(prefix, axis=1, out=prefix)
    counts = np.zeros((len(draws), k), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(len(draws)), draws.shape[1]), draws.ravel()), 1)
    total = counts @ prefix[:, -1]

    def order_statistic(t: np.ndarray) -> np.ndarray:
        """The t-th smallest (0-based) pooled value of each row: the first sorted position whose prefix holds > t."""
        low, high = np.zeros(len(t), dtype=np.intp), np.full(len(t), len(ordered), dtype=np.intp)
        while np.any(low < high):
            mid = (low + high) // 2
            held = np.einsum("rk,kr->r", counts, prefix[:, mid + 1])
            above = held > t
            high = np.where(above, mid, high)
            low = np.where(above, low, mid + 1)
        return ordered[np.minimum(low, len(ordered) - 1)]

    out = np.empty((len(draws), len(qs)))
    for column, q in enumerate(qs):
        h = (total - 1) * (q / 100.0)
        below = np.floor(h).astype(np.int64)
        first = order_statistic(below)
        second = order_statistic(np.minimum(below + 1, total - 1))
        out[:, column] = first + (h - below) * (second - first)
    return out


EXPANDED, WIDENED = "expanded-percentile", "expanded-percentile, widened to its point"


@dataclass(frozen=True)
class GroupBootstrap:
    """A statistic over groups of samples (blocks, or rounds of two artifacts), its interval, and how the
    interval was made (``EXPANDED``, or ``WIDENED`` where it had to be stretched to contain its point)."""

    point: float
    low: float
    high: float
    method: str


def percentile_of_groups(groups_a: list[np.ndarray], q: float, draws: np.ndarray,
                         groups_b: list[np.ndarray] | None = None) -> np.ndarray:
    """The statistic every block interval is about, for each row of ``draws`` (indices into the groups):
    the q-th percentile of the chosen groups pooled, or, given ``groups_b``, its ratio to the same
    percentile of ``groups_b`` drawn at the same indices (the same rounds)."""
    draws = np.atleast_2d(np.asarray(draws, dtype=np.intp))
    values = _resampled_percentiles(groups_a, [q], draws)[:, 0]
    if groups_b is not None:
        values = values / _resampled_percentiles(groups_b, [q], draws)[:, 0]
    return values


def expanded_tail(groups: int, level: float = LEVEL) -> float:
    """Tail probability of the expanded percentile interval over ``groups`` resampled groups: the t
    quantile with groups − 1 degrees of freedom, scaled by √(groups/(groups − 1)), as a normal probability."""
    alpha = (1 - level) / 2
    if groups < 2:
        return alpha
    return float(stats.norm.cdf(math.sqrt(groups / (groups - 1)) * stats.t.ppf(alpha, groups - 1)))


def bootstrap_over_groups(groups_a: list[np.ndarray], q: float, groups_b: list[np.ndarray] | None = None,
                          resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> GroupBootstrap:
    """Point and expanded percentile interval of :func:`percentile_of_groups` over all the groups,
    resampling whole groups with replacement."""
    k = len(groups_a)
    point = float(percentile_of_groups(groups_a, q, np.arange(k), groups_b)[0])
    draws = np.random.default_rng(seed).integers(0, k, size=(resamples, k))
    estimates = percentile_of_groups(groups_a, q, draws, groups_b)
    tail = expanded_tail(k, level)
    low, high = float(np.quantile(estimates, tail)), float(np.quantile(estimates, 1 - tail))
    if low <= point <= high:
        return GroupBootstrap(point, low, high, EXPANDED)
    log.debug("bootstrap interval [%.6g, %.6g] over %d groups misses its point %.6g: widened", low, high, k, point)
    return GroupBootstrap(point, min(low, point), max(high, point), WIDENED)


def block_bootstrap_ci(samples: BlockedSamples, q: float = 99.0, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = 0) -> tuple[float, float]:
    """Expanded percentile bootstrap interval of the q-th percentile of all the samples, resampling whole
    blocks."""
    estimate = bootstrap_over_groups(samples.blocks, q, resamples=resamples, level=level, seed=seed)
    return estimate.low, estimate.high


@dataclass
class Ratio:
    """``a`` over ``b`` of one percentile (below 1: ``a`` is faster), with its block-paired interval."""

    ratio: float
    ci: tuple[float, float]
    rounds: int  # rounds both were measured in: the pairs the interval rests on
    method: str = EXPANDED

    @property
    def verdict(self) -> str:
        """faster / slower / not distinguishable, from the interval: 'faster' needs the whole interval below 1."""
        if self.ci[1] < 1.0:
            return "faster"
        if self.ci[0] > 1.0:
            return "slower"
        return "not distinguishable"

    def as_dict(self) -> dict:
        return {"ratio": round(self.ratio, 4), "ci": [round(self.ci[0], 4), round(self.ci[1], 4)],
                "rounds": self.rounds, "verdict": self.verdict, "method": self.method}


def paired_ratio(a: BlockedSamples, b: BlockedSamples, q: float, resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = 0) -> Ratio:
    """Ratio of the q-th percentiles of ``a`` and ``b`` over the rounds both ran in, and its expanded percentile
    interval from resampling those rounds (both artifacts draw the same rounds)."""
    ra, rb = a.by_round(), b.by_round()
    common = sorted(set(ra) & set(rb))
    if not common:
        raise ValueError("the two artifacts share no measurement round: a paired ratio needs one interleaved run")
    estimate = bootstrap_over_groups([ra[r] for r in common], q, [rb[r] for r in common], resamples, level, seed)
    return Ratio(estimate.point, (estimate.low, estimate.high), len(common), estimate.method)


def repeat_spread(per_repeat: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Spread of each percentile across whole repeated measurements: min, max, and the max/min ratio."""
    out = {}
    for key in per_repeat[0]:
        values = np.array([r[key] for r in per_repeat], dtype=np.float64)
        out[key] = {"min": round(float(values.min()), 6), "max": round(float(values.max()), 6),
                    "max_over_min": round(float(values.max() / values.min()), 4) if values.min() > 0 else None,
                    "std": round(float(values.std(ddof=1)), 6) if len(values) > 1 else 0.0}
    return out


def too_few_blocks(entries: list[dict]) -> str | None:
    """A flag for the report when the block intervals rest on fewer than MIN_BLOCKS blocks of one artifact."""
    counts = {e["name"]: (e.get("latency_ms") or {}).get("blocks") for e in entries}
    few = {name: k for name, k in counts.items() if k is not None and k < MIN_BLOCKS}
    if not few:
        return None
    listed = ", ".join(f"{name} {k}" for name, k in few.items())
    return (f"latency intervals over blocks rest on fewer than {MIN_BLOCKS} blocks ({listed}): their ends are rough; "
            "raise min_duration_s (each block lasts about block_s) or repeats")
