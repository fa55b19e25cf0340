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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES, LEVEL = 2000, 0.95
MIN_BLOCKS = 10  # below this a bootstrap over blocks has too few distinct resamples to trust its ends
_CHUNK = 200  # resamples per vectorised step: memory stays at _CHUNK × samples


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
    """Percentiles ``qs`` of the concatenation of ``groups[draws[i]]`` for each row i: shape (rows, len(qs))."""
    lengths = {len(g) for g in groups}
    out = np.empty((len(draws), len(qs)))
    if len(lengths) == 1:  # the usual case: every block has the same request count
        stacked = np.stack(groups)
        for start in range(0, len(draws), _CHUNK):
            chosen = stacked[draws[start:start + _CHUNK]].reshape(len(draws[start:start + _CHUNK]), -1)
            out[start:start + _CHUNK] = np.percentile(chosen, qs, axis=1).T
    else:
        for i, row in enumerate(draws):
            out[i] = np.percentile(np.concatenate([groups[j] for j in row]), qs)
    return out


def _interval(estimates: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1 - level) / 2
    return float(np.quantile(estimates, alpha)), float(np.quantile(estimates, 1 - alpha))


def block_bootstrap_ci(samples: BlockedSamples, q: float = 99.0, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the q-th percentile, resampling whole blocks."""
    rng = np.random.default_rng(seed)
    k = len(samples.blocks)
    estimates = _resampled_percentiles(samples.blocks, [q], rng.integers(0, k, size=(resamples, k)))[:, 0]
    return _interval(estimates, level)


@dataclass
class Ratio:
    """``a`` over ``b`` of one percentile (below 1: ``a`` is faster), with its block-paired interval."""

    ratio: float
    ci: tuple[float, float]
    rounds: int  # rounds both were measured in: the pairs the interval rests on

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
                "rounds": self.rounds, "verdict": self.verdict}


def paired_ratio(a: BlockedSamples, b: BlockedSamples, q: float, resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = 0) -> Ratio:
    """Ratio of the q-th percentiles of ``a`` and ``b``, its interval from resampling the rounds they share."""
    ra, rb = a.by_round(), b.by_round()
    common = sorted(set(ra) & set(rb))
    if not common:
        raise ValueError("the two artifacts share no measurement round: a paired ratio needs one interleaved run")
    ga, gb = [ra[r] for r in common], [rb[r] for r in common]
    point = float(np.percentile(np.concatenate(ga), q) / np.percentile(np.concatenate(gb), q))
    draws = np.random.default_rng(seed).integers(0, len(common), size=(resamples, len(common)))
    ratios = _resampled_percentiles(ga, [q], draws)[:, 0] / _resampled_percentiles(gb, [q], draws)[:, 0]
    return Ratio(point, _interval(ratios, level), len(common))


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
