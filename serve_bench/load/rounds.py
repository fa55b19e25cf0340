"""The server scenario measured in rounds: each file's tests take turns with the other files', round after round.

Why: a file measured in one stretch (its tests back to back) carries that stretch of the machine into its p99, and
the interval, built from the busy periods inside the stretch, cannot know it. On a 2-core machine one file's p99 at
200/s read 3.59 [3.12, 4.30] ms at the start of a bench and 1.92 [1.81, 2.32] later in the same bench. In rounds,
every file is tested once per round, so a slow stretch falls on one round of every file instead of on all of one
file's, and the differences between a file's rounds join its interval (``steady_p99(min_rounds=…)``). A file
stops as soon as its interval is precise or decided against the budget (never before ``min_rounds``), when its
queue grew without bound, or at its cap of queries; the others go on.

Two files' rounds of the same index ran minutes apart at most, in the same order, so their p99s pair round by round
like the closed-loop blocks: :func:`paired_p99_ratio` takes each round's share of both files' errors together, so
a drift common to both cancels from their ratio.

The same loop runs on a fake clock (``python -m serve_bench.load.steady_state_check --drift 0.2``), so the rule
the bench stops by is the rule the known answers test.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Sequence, TypeVar

import numpy as np
from scipy import stats

from serve_bench.load.queue_growth import bounded
from serve_bench.load.steady_state import (MIN_QUERIES, Segment, SteadyP99, complete_cycles, counts_above, cycle_starts,
                                           few_rounds_factor, rounds_differ_p, steady_p99)
from serve_bench.stats.latency_intervals import Ratio

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
# Two-sided level of the paired ratio's interval: 99%, as for the steady-state p99 (its LEVEL), because the files
# are measured until precise and a claim resting on the interval is then about 95%. Known answers (±20% drift,
# docs/pages/measured.md): 99.0% of runs at ρ 0.5 over 0.25; 83% at ρ 0.75 over 0.5, where the slower file's p99
# itself runs 12% low. An earlier form at 95% (whole-variance t over rounds, each file stopping alone) held 88.5%.
RATIO_LEVEL = 0.99


@dataclass(frozen=True)
class RoundsRule:
    """When one file's measurement at one rate is done: its steady-state p99 precise (the module's rule in
    serve_bench.load.steady_state) after ``min_rounds`` rounds at least; its queue grown without bound in most of
    ``min_rounds`` rounds or more, or in each of two or more (one round of a stable queue near load can look
    grown: M/M/1 at ρ 0.85 in 4-5% of 1,000-query rounds, at 0.95 in 24%); or ``max_queries`` queries measured,
    with no room left for another round as long as the last."""

    min_rounds: int = 5
    max_queries: int = 20000
    min_tail_cycles: int = 20
    precision: float = 0.25
    budget_ms: float | None = None

    def estimate(self, segments: Sequence[Segment]) -> SteadyP99:
        return steady_p99(segments, budget_ms=self.budget_ms, min_tail_cycles=self.min_tail_cycles,
                          precision=self.precision, min_rounds=self.min_rounds)

    def done(self, segments: Sequence[Segment], estimate: SteadyP99) -> str | None:
        """Why this measurement stops after its last round, or None to measure another."""
        if estimate.precise:
            return PRECISE
        grown, rounds = sum(bounded(*segment)[0] is False for segment in segments), len(segments)
        if (rounds >= self.min_rounds and 2 * grown > rounds) or (rounds >= 2 and grown == rounds):
            return "not sustainable"
        used = sum(len(latencies) for _, latencies in segments)
        if self.max_queries - used < max(MIN_QUERIES, len(segments[-1][1])):
            return "capped"
        return None


PRECISE = "precise"


@dataclass
class Measured:
    """One file's tests at one rate, round by round, and the estimate they gave."""

    tests: list
    estimate: SteadyP99
    stopped: str | None = None  # why it stopped ("precise", "not sustainable", "capped")


def in_rounds(keys: Sequence[K], one_round: Callable[[list[K], int], dict[K, T]], segment_of: Callable[[T], Segment],
              rule: RoundsRule | Callable[[K], RoundsRule], group: Callable[[K], Hashable] | None = None,
              said: Callable[[K, Measured], None] | None = None) -> dict[K, Measured]:
    """Measure every key (a file at a rate) in rounds until each is done by ``rule`` (one for all, or per key).

    ``one_round(active, index)`` runs round ``index`` (0, 1, …): one test of each active key, and returns them by
    key. A key whose queue grew, or that reached its cap, stops by itself. A precise key goes on while a key of its
    ``group`` (the files compared with it at the same rate) is still measuring, so files paired round by round
    hold the same rounds: each file's stopping, which favours a point that looks precise, then cannot bias their
    ratio one way, and the ratio is the quotient of the p99s beside it. ``said(key, measured)`` is told each stop.
    The last estimate of each key carries :func:`rounds_differ_p` (computed once, at its end)."""
    rule_of = rule if callable(rule) else (lambda key: rule)
    group_of = group or (lambda key: key)
    out: dict[K, Measured] = {}
    active, index = list(keys), 0
    while active:
        tests = one_round(active, index)
        for key in active:
            measured = out.setdefault(key, Measured([], None))  # type: ignore[arg-type]
            measured.tests.append(tests[key])
            segments = [segment_of(t) for t in measured.tests]
            measured.estimate = rule_of(key).estimate(segments)
            measured.stopped = rule_of(key).done(segments, measured.estimate)
        waiting = {group_of(k) for k in active if not out[k].stopped}
        for key in list(active):
            measured = out[key]
            if measured.stopped and (measured.stopped != PRECISE or group_of(key) not in waiting):
                active.remove(key)
                segments = [segment_of(t) for t in measured.tests]
                if measured.estimate.point is not None and len(segments) > 1:
                    measured.estimate = replace(measured.estimate,
                                                rounds_differ_p=rounds_differ_p(segments, measured.estimate.point))
                log.debug("%s: %s after %d rounds", key, measured.stopped, len(measured.tests))
                if said is not None:
                    said(key, measured)
        index += 1
    return out


# A round holds this many times the busy period its queries fall in (length-biased mean, from earlier rounds), so
# the busy period still open when its schedule ends, which the estimate leaves out, holds about 5% of its queries.
BUSY_PERIODS_PER_ROUND = 20


def round_size(planned: int, most: int, earlier: Sequence[Segment]) -> int:
    """How many queries the next round of one file at one rate holds: ``planned`` (the rate's seconds of queries),
    grown to ``BUSY_PERIODS_PER_ROUND`` times the mean busy period a query falls in (Σn²/Σn over the busy
    periods of the ``earlier`` rounds), and ``most`` at most; a first round (nothing earlier) holds ``most``:
    LoadGen's verdict on a file at a rate is its first test's, and its early stopping needs about 700 queries.

    Why: each round starts empty and its last busy period is cut by the end of the schedule and left out. Near
    load a query's busy period holds dozens of queries (M/M/1 at ρ 0.75: Σn²/Σn = (1 + ρ²)/(1 − ρ)² = 25), so
    in a short round the part left out is the slow part: rounds of 200 queries read the p99 of a drifting M/M/1 at
    ρ 0.75 26% low (known answers, docs/pages/measured.md). A light queue keeps its short rounds."""
    return size_for_busy_periods(planned, most, [n for segment in earlier for n in busy_period_lengths(*segment)])


def busy_period_lengths(schedule_s: np.ndarray, latencies_ms: np.ndarray) -> np.ndarray:
    """Queries in each busy period of one round, the one still open at its end too (its length so far: a lower
    bound). Complete ones alone would miss the longest, which the end of a round cuts most often, and so size the
    next round too short (M/M/1 at ρ 0.75 it is 25; five rounds of 200 read a median 19.5 with the open one,
    17.9 without)."""
    starts = cycle_starts(schedule_s, latencies_ms)
    return np.diff(np.append(starts, len(latencies_ms)))


def size_for_busy_periods(planned: int, most: int, lengths: Sequence[int]) -> int:
    """:func:`round_size` from the earlier rounds' busy-period lengths (:func:`busy_period_lengths`); none: a
    first round, ``most``."""
    n = np.asarray(lengths, dtype=np.float64)
    if not len(n):
        return max(most, planned)
    size = max(planned, int(np.ceil(BUSY_PERIODS_PER_ROUND * float((n ** 2).sum() / n.sum()))))
    return min(size, max(most, planned))


def paired_p99_ratio(a: Sequence[Segment], b: Sequence[Segment], q: float = 99.0,
                     level: float = RATIO_LEVEL) -> Ratio | None:
    """``a``'s steady-state p99 over ``b``'s, both pooled over the rounds both measured (round i of each ran in the
    same round of the bench), with an interval that counts the busy periods and the differences between rounds.

    Each file's p99 moves with the share of its queries above it: log p̂ − log p ≈ (share − 1%) · (dQ/dF) / Q
    (dQ/dF, the quantile's slope, read from the pooled latencies at q ± 0.5). A busy period j adds
    e_j = (its queries above the point − 1% of its queries) · slope / (N·Q) to that error, and round i adds
    d_i = Σe^a − Σe^b over its busy periods of both files. Within a round the busy periods are independent
    (the regenerative variance, as for each p99): Var_w(d_i) = k_a·s²_a + k_b·s²_b. Between rounds, the d_i
    vary by S² where their within-round variances alone give the mean of Var_w: the excess, max(0, S² − mean),
    is the rounds' own part, widened for its R − 1 degrees of freedom as the p99's is
    (serve_bench.load.steady_state.few_rounds_factor). A slow stretch that moves both files in round i moves
    both sums alike and cancels from d_i: the pairing. A round counts where both files have ``MIN_QUERIES``
    queries in complete busy periods; None below two such rounds. Chosen over a bootstrap of whole rounds (the
    closed-loop ratios' estimator), which held a known ratio in only 85.5% of runs at 95%, and over t with R − 1
    degrees of freedom on the whole variance, too wide to tell an INT8 file 1.25× faster from its float file in
    five rounds (16 of 40 simulated runs; docs/pages/measured.md)."""
    pairs = [(complete_cycles(*x)[0], complete_cycles(*y)[0]) for x, y in zip(a, b)]
    pairs = [(x, y) for x, y in pairs if sum(map(len, x)) >= MIN_QUERIES and sum(map(len, y)) >= MIN_QUERIES]
    if len(pairs) < 2:
        return None
    (qa, ea), (qb, eb) = (_linearised([p[k] for p in pairs], q) for k in (0, 1))
    d = np.array([x.sum() - y.sum() for x, y in zip(ea, eb)])
    within = np.array([_sum_var(x) + _sum_var(y) for x, y in zip(ea, eb)])
    rounds, cycles = len(pairs), min(sum(map(len, ea)), sum(map(len, eb)))
    between = max(0.0, float(np.var(d, ddof=1)) - float(within.mean())) * rounds
    se = float(np.sqrt(within.sum() + between * few_rounds_factor(rounds, cycles, level)))
    t = float(stats.t.ppf(1 - (1 - level) / 2, cycles - 1))
    ratio = qa / qb
    return Ratio(ratio, (ratio * float(np.exp(-t * se)), ratio * float(np.exp(t * se))), rounds, LINEARISED)


LINEARISED = ("rounds paired: the log ratio linearised in each busy period's share above the p99, the rounds' "
              "excess variance widened for their few degrees of freedom")


def _sum_var(e: np.ndarray) -> float:
    """The variance of a sum of independent, alike terms, from the terms: k · s²."""
    return float(len(e) * np.var(e, ddof=1)) if len(e) > 1 else 0.0


def _linearised(rounds: list[list[np.ndarray]], q: float) -> tuple[float, list[np.ndarray]]:
    """One file's pooled p99, and per round each busy period's share of the error of its log."""
    values = np.concatenate([np.concatenate(cycles) for cycles in rounds])
    point = float(np.percentile(values, q))
    step = 0.5
    low, high = np.percentile(values, [max(q - step, 0.0), min(q + step, 100.0)])
    slope = float(high - low) / (2 * step / 100)  # dQ/dF: latency per unit of probability
    scale = slope / (len(values) * point)
    return point, [(counts_above(cycles, point) - (1 - q / 100) * np.fromiter(map(len, cycles), dtype=np.float64))
                   * scale for cycles in rounds]
