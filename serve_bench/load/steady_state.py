"""A server run's p99 from steady state, its interval, and whether the queue stayed bounded: busy periods as blocks.

Why not the queries as they come: every LoadGen test starts from an empty queue, and near load one slow
stretch delays every query behind it, so consecutive latencies are correlated over hundreds or thousands of
queries. Cutting the schedule into 20 fixed blocks of consecutive queries treats blocks shorter than that
correlation as independent, and its interval covered the steady-state p99 of a simulated queue in 15% of runs
at ρ 0.9 where it claimed 97.5%.

Why busy periods: a server fed by Poisson arrivals starts afresh each time a query arrives to an empty system
(nothing queued, every instance idle): nothing after that arrival depends on what came before it (a
regeneration point; Crane and Iglehart, "Simulating stable stochastic systems", J. ACM 1975). The stretches
between two such arrivals, a busy period and the idle time after it, are independent and alike however long
the correlation inside them, so:

- the fill-up from an empty queue is no bias to cut: the run *starts* at a regeneration point and each complete
  cycle counts like any other. What is discarded is the cycle still open when the schedule ends (cut at an
  arbitrary point of a busy period that could have run much longer), and said;
- the interval is Woodruff's (JASA 1952; for regenerative runs, Iglehart, J. ACM 1976): the latencies at the
  percentiles p ± z·SE, where SE is the standard error of the fraction of queries above the p99, from the
  cycles' ratio-estimator variance (each cycle's count above the p99 against 1% of its length). Cycles are
  the independent units, so their variance holds however long the correlation inside them. A block
  bootstrap over groups of cycles was tried first: against known answers its 97.5% upper end covered only
  88-93% of runs at ρ 0.5 (a resampled p99 is an order statistic of few distinct tails); Woodruff's 96%;
- runs of one configuration pool exactly: each LoadGen test starts empty, so its cycles join the others'.

How much is enough: a p99 at load rests on the few long busy periods that reach it. A run is ``precise`` when
at least ``min_tail_cycles`` cycles hold a query above the p99 and the interval's upper end is within
``precision`` of the point, or the interval already lies wholly on one side of the budget (the gate needs no
more). Otherwise the caller measures again (:func:`queries_wanted`) up to its cap, and says where it stopped.

Time: cycles are independent within a stretch of the machine, not across stretches. A machine that is slower in
one stretch than another (another process, the clock, a runtime's thread pool) moves every cycle of that
stretch, which the cycles' variance cannot see. Measured in rounds (``min_rounds`` > 1: tests of a file taken
in turns with other work, each started empty), the variance between the rounds' fractions above the point,
beyond what their cycles explain, joins the interval (:func:`between_rounds_var`, widened for its few degrees
of freedom). Known answers on a drifting fake machine (each round's service times × 1 ± 20%):
``python -m serve_bench.load.steady_state_check --drift 0.2`` and docs/pages/measured.md.

A queue that grows without bound has no steady state: :func:`bounded` says so (or "unknown" below
``MIN_QUERIES``), and such a run's p99 is reported but not judged within any budget.

Measured against known answers (M/M/1 and M/D/1 at ρ 0.5, 0.75 and 0.9 on a fake clock, each run started
empty and measured until precise; ``python -m serve_bench.load.steady_state_check``, tests/test_steady_state.py,
the README's table): the upper end is at 99.5% one-sided but covers the true p99 in 95.5-99.7% of runs, so a
claim resting on it is about 95%, not 99.5%. Under the bench's default cap of 20,000 queries the runs at ρ 0.9
(and most at 0.75) stop at the cap and say so (``capped``); their coverage is in the table.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace
from typing import Sequence

import numpy as np
from scipy import stats

from serve_bench.stats.latency_intervals import MIN_BLOCKS

log = logging.getLogger(__name__)

MIN_QUERIES = 100  # below this a run says nothing about whether its queue stayed bounded
MAX_DISCARDED = 0.05  # a p99 whose runs' open busy periods held more of the queries is not precise
# Two-sided level of the interval, each end 0.5%: a run measured until precise stops sooner when its data look
# narrow (optional stopping), and at 95% the upper end covered 92-94.5% of known-answer runs; at 99% it covers
# at least 95% (the module's docstring, the README's table).
LEVEL = 0.99
METHOD = "regenerative: complete busy periods as independent units, Woodruff interval"
DRIFT_P = 0.01  # rounds this unlikely (permutation test) on a machine that did not change: it drifted
TAIL_FROM, TAIL_STEP = 95.0, 0.05  # the stored tail: enough to put the upper end at another level afterwards
Segment = tuple[np.ndarray, np.ndarray]  # (scheduled time s, latency ms) per query, in schedule order


def cycle_starts(schedule_s: np.ndarray, latencies_ms: np.ndarray) -> np.ndarray:
    """Indices of the queries that arrived to an empty system: scheduled no earlier than every earlier query's
    completion (its scheduled time plus its latency). The first query always does."""
    schedule = np.asarray(schedule_s, dtype=np.float64)
    if not len(schedule):
        return np.zeros(0, dtype=np.intp)
    done = schedule + np.asarray(latencies_ms, dtype=np.float64) / 1e3
    busy_until = np.concatenate([[-np.inf], np.maximum.accumulate(done)[:-1]])
    return np.flatnonzero(schedule >= busy_until)


def complete_cycles(schedule_s: np.ndarray, latencies_ms: np.ndarray) -> tuple[list[np.ndarray], int]:
    """The latencies of each complete cycle of one run, and how many queries the open last cycle held."""
    latencies = np.asarray(latencies_ms, dtype=np.float64)
    starts = cycle_starts(schedule_s, latencies)
    if not len(starts):
        return [], 0
    ends = np.append(starts[1:], len(latencies))
    # slices, not np.split: a run at load holds thousands of busy periods, and np.split's per-piece overhead was
    # most of the estimator's time
    cycles = [latencies[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    return cycles[:-1], len(cycles[-1])


def counts_above(cycles: Sequence[np.ndarray], threshold: float) -> np.ndarray:
    """How many queries of each busy period lie above ``threshold`` (as floats, for the variance sums): one pass
    over all of them instead of one per busy period."""
    if not len(cycles):
        return np.zeros(0, dtype=np.float64)
    lengths = np.fromiter(map(len, cycles), dtype=np.intp, count=len(cycles))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.add.reduceat(np.concatenate(cycles) > threshold, offsets, dtype=np.intp).astype(np.float64)


@dataclass(frozen=True)
class SteadyP99:
    """A p99 from the complete cycles of one or more runs, and what it rests on."""

    point: float | None
    ci: tuple[float, float] | None
    queries: int  # all queries of the runs
    discarded: int  # queries of the runs' open last cycles
    cycles: int
    tail_cycles: int  # cycles holding a query above the point
    precise: bool
    reason: str
    level: float = LEVEL
    method: str = METHOD
    se: float | None = None  # standard error of the fraction of queries above the point
    tail: list[float] | None = None  # the latencies at percentiles TAIL_FROM..100 in steps of TAIL_STEP (for upper_at)
    upper_among: dict[str, float | None] | None = None  # the upper end at 1 − (1 − level)/F, F of 1..8 candidates
    values: np.ndarray | None = field(default=None, repr=False, compare=False)  # the complete cycles' latencies
    rounds: int = 1  # tests (each started empty) pooled
    se_within: float | None = None  # the part of se from the cycles' variance
    se_between: float | None = None  # the part from the differences between rounds (√ of its variance share)
    round_p99: list[float] | None = None  # min and max of the rounds' own p99s
    rounds_differ_p: float | None = None  # a permutation test that the rounds are alike (set by the rounds loop)

    @property
    def leaves_out_too_much(self) -> bool:
        """Whether the busy periods still open when the tests ended hold more than ``MAX_DISCARDED`` of the
        queries: then this is not yet steady state, and a report gives every query's p99 instead."""
        return self.discarded > MAX_DISCARDED * self.queries

    def of_every_query(self, point: float) -> "SteadyP99":
        """This record where the open busy periods hold too many queries to leave out (``MAX_DISCARDED``): the p99
        is then every query's, and no interval goes with it (the cycles' interval is about another figure, and
        queries inside one long busy period are not independent), so neither a report nor a gate reads one."""
        return replace(self, point=point, ci=None, se=None, se_within=None, se_between=None, tail=None,
                       upper_among=None, precise=False, round_p99=None, rounds_differ_p=None)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "values"}
        out["ci"] = None if self.ci is None else [round(v, 6) for v in self.ci]
        out["point"] = None if self.point is None else round(self.point, 6)
        return out


def steady_p99(segments: Sequence[Segment], *, q: float = 99.0, budget_ms: float | None = None,
               min_tail_cycles: int = 20, precision: float = 0.25, level: float = LEVEL,
               min_rounds: int = 1) -> SteadyP99:
    """The q-th percentile of the latencies of every complete cycle of ``segments`` (runs of one configuration,
    each a round: a test started from an empty system), its Woodruff interval with the cycles' variance and the
    variance between rounds where it is measured in rounds (``min_rounds`` > 1: :func:`between_rounds_var`), and
    whether it is precise enough to stop measuring (see the module's rule; never before ``min_rounds`` rounds).
    With ``min_rounds`` 1 (a file's tests back to back, as the bench measures today) the interval is the cycles'
    alone, as before: tests run back to back share one stretch of the machine, so their differences say little
    about time."""
    cycles: list[np.ndarray] = []
    by_round: list[list[np.ndarray]] = []
    queries = discarded = 0
    for schedule, latencies in segments:
        kept, left_open = complete_cycles(schedule, latencies)
        cycles += kept
        by_round.append(kept)
        queries += len(latencies)
        discarded += left_open
    if not cycles:
        return SteadyP99(None, None, queries, discarded, 0, 0, False,
                         "no busy period ended: no steady state to measure (the queue never emptied)", level)
    values = np.concatenate(cycles)
    point = float(np.percentile(values, q))
    above = counts_above(cycles, point)
    tail = int(np.count_nonzero(above))
    if len(cycles) < MIN_BLOCKS:
        return SteadyP99(point, None, queries, discarded, len(cycles), tail, False,
                         f"{len(cycles)} complete busy periods: fewer than the {MIN_BLOCKS} an interval needs", level,
                         values=values)
    within = exceedance_se(cycles, above)
    rounds_mode = min_rounds > 1
    raw_between, used = between_rounds_var(by_round, point) if rounds_mode else (0.0, 0)

    def se_at(at_level: float) -> float:  # the between part widened for its degrees of freedom at this level
        return float(np.sqrt(within ** 2 + raw_between * few_rounds_factor(used, len(cycles), at_level)))

    se = se_at(level)
    low, high = woodruff_bounds(values, q, se, len(cycles), level)
    spread = round_spread(by_round, q) if rounds_mode else None
    tail_table = [round(float(v), 6) for v in np.percentile(values, np.arange(TAIL_FROM, 100.0 + 1e-9, TAIL_STEP))]
    among = {}
    for f in range(1, 9):  # exact upper ends for a gate that corrects over up to 8 candidates
        at = 1 - (1 - level) / f
        corrected = woodruff_bounds(values, q, se_at(at), len(cycles), at)[1]
        among[str(f)] = None if corrected >= values.max() else round(corrected, 6)
    over = (share_above_low(cycles, by_round, budget_ms, level, rounds_mode)
            if budget_ms is not None and point > budget_ms else None)
    if rounds_mode and used < min_rounds:
        precise, reason = False, (f"{used} rounds with {MIN_QUERIES} queries in complete busy periods, of the "
                                  f"{min_rounds} wanted ({len(segments)} measured)")
    elif discarded > MAX_DISCARDED * queries:
        precise, reason = False, (f"the busy periods still open when the tests ended hold {discarded / queries:.0%} "
                                  f"of the queries (more than {MAX_DISCARDED:.0%}): not yet steady state")
    elif over is not None and over[1] >= min_tail_cycles and over[0] > 1 - q / 100 and low > budget_ms:
        precise, reason = True, (f"more than {100 - q:g}% of the queries lie above the {budget_ms:g} ms budget "
                                 f"(their share's lower end {over[0]:.1%}, {over[1]} busy periods hold one): "
                                 "the p99 is over it")
    elif tail < min_tail_cycles:
        precise, reason = False, (f"the p99 rests on {tail} busy periods that reach it, fewer than "
                                  f"{min_tail_cycles}")
    elif budget_ms is not None and low > budget_ms:  # above the budget whatever the upper end: the gate refuses
        precise, reason = True, (f"the interval lies above the {budget_ms:g} ms budget"
                                 + (" (its upper end is the slowest query measured: unknown)"
                                    if high >= values.max() else ""))
    elif high >= values.max():
        precise, reason = False, "the interval's upper end is the slowest query measured"
    elif budget_ms is not None and high <= budget_ms:
        precise, reason = True, f"the interval lies below the {budget_ms:g} ms budget"
    elif high - point <= precision * point:
        precise, reason = True, f"the upper end is within {precision:.0%} of the point"
    else:
        precise, reason = False, f"the upper end is {high / point - 1:.0%} above the point (wanted {precision:.0%})"
    return SteadyP99(point, (low, high), queries, discarded, len(cycles), tail, precise, reason, level,
                     se=round(se, 9), tail=tail_table, upper_among=among, values=values, rounds=len(segments),
                     se_within=round(within, 9), round_p99=spread,
                     se_between=round(float(np.sqrt(se ** 2 - within ** 2)), 9) if rounds_mode else None)


def share_above_low(cycles: list[np.ndarray], by_round: list[list[np.ndarray]], threshold: float, level: float,
                    rounds_mode: bool) -> tuple[float, int]:
    """The lower end (at ``level``, two-sided) of the share of queries above ``threshold``, and how many busy
    periods hold one: the same estimator as the p99's (cycles' ratio variance, plus the rounds' excess widened),
    read at the budget instead of at the p99.

    Why: a file far over its budget (p50 past it, say) has its top 1% in a few long busy periods, so its p99's
    interval needs many rounds before 20 of them reach it, while the queries above the budget fill hundreds of
    busy periods from the first rounds. Its p99 is over the budget exactly when that share is over 1%."""
    above = counts_above(cycles, threshold)
    lengths = sum(len(c) for c in cycles)
    var = exceedance_se(cycles, above) ** 2
    if rounds_mode:
        between, used = between_rounds_var(by_round, threshold)
        var += between * few_rounds_factor(used, len(cycles), level)
    t = float(stats.t.ppf(1 - (1 - level) / 2, len(cycles) - 1))
    return float(above.sum() / lengths - t * np.sqrt(var)), int(np.count_nonzero(above))


def between_rounds_var(by_round: list[list[np.ndarray]], point: float) -> tuple[float, int]:
    """The variance the differences between rounds add to the pooled fraction of queries above ``point``.

    Within a round, cycles are independent and alike; between rounds the machine may not be (another process,
    the clock, a runtime's thread pool): a round measured in a slow stretch has more queries above the point
    than its cycles' variance allows. One-way random effects, by moments: the rounds' fractions above the point
    vary by S² (unweighted, ddof 1) where their within-round variances alone would give the mean v̄ of each
    round's ratio-estimator variance, so the between-round variance is σ² = max(0, S² − v̄), and the pooled
    fraction (weighted by queries) carries σ²·Σn²/(Σn)² of it. A round counts with two complete cycles and
    ``MIN_QUERIES`` queries in them at least (a handful of queries would make S² noise). Returned with the number
    of rounds it rests on; zero below two: then nothing is known about time."""
    usable = usable_rounds(by_round)
    if len(usable) < 2:
        return 0.0, len(usable)
    sizes = np.array([sum(len(c) for c in cycles) for cycles in usable], dtype=np.float64)
    aboves = [counts_above(cycles, point) for cycles in usable]
    fractions = np.array([a.sum() for a in aboves]) / sizes
    within = np.array([exceedance_se(cycles, a) ** 2 for cycles, a in zip(usable, aboves)])
    sigma2 = max(0.0, float(np.var(fractions, ddof=1)) - float(within.mean()))
    return sigma2 * float(np.sum(sizes ** 2)) / float(sizes.sum()) ** 2, len(usable)


def usable_rounds(by_round: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The rounds that say something about time: two complete busy periods and ``MIN_QUERIES`` queries in them at
    least (a handful of queries would make a round's share above the point noise)."""
    return [cycles for cycles in by_round if len(cycles) >= 2 and sum(len(c) for c in cycles) >= MIN_QUERIES]


def rounds_differ_p(segments: Sequence[Segment], point: float, permutations: int = 999,
                    seed: int = 0) -> float | None:
    """How likely rounds as different as these are on a machine that did not change between them: a permutation
    test. On such a machine every complete busy period of every round comes from one process, so which round a
    busy period fell in is arbitrary. The statistic, Σ_i (A_i − f̄·N_i)² / N_i over rounds (A_i the round's queries
    above the pooled ``point``, N_i its queries, f̄ the pooled share), is compared with its values when the busy
    periods are dealt to the rounds at random, each round keeping its number of them. Exact for any busy-period
    distribution: Cochran's Q against χ², tried first, flagged a steady machine in 12% of runs of 15 rounds at
    ρ 0.85 (heavy-tailed busy periods) and 32% of 20 rounds at ρ 0.9. Why not "the spread of the rounds' p99s
    exceeds the interval": one round's p99 is far noisier than the pool's, and that spread exceeded the interval in
    15 of 50 runs of a machine that never drifted. None below two rounds with ``MIN_QUERIES`` queries in two
    complete busy periods or more (the rule of :func:`between_rounds_var`). Seeded: a report reads the same twice."""
    usable = usable_rounds([complete_cycles(*segment)[0] for segment in segments])
    if len(usable) < 2:
        return None
    counts = np.array([len(cycles) for cycles in usable])
    above = np.concatenate([counts_above(cycles, point) for cycles in usable])
    lengths = np.concatenate([[len(c) for c in cycles] for cycles in usable]).astype(np.float64)
    share = above.sum() / lengths.sum()
    rounds = len(counts)

    def statistic(labels: np.ndarray) -> float:  # each busy period's round → the statistic
        a = np.bincount(labels, weights=above, minlength=rounds)
        n = np.bincount(labels, weights=lengths, minlength=rounds)
        return float(np.sum((a - share * n) ** 2 / n))

    labels = np.repeat(np.arange(rounds), counts)
    observed = statistic(labels)
    rng = np.random.default_rng(seed)
    # one shuffle of the labels at a time: a shuffle is linear and memory stays one round's worth (a matrix of
    # every permutation at once, sorted or shuffled by rows, was four times slower at 15,000 busy periods)
    exceed = sum(statistic(rng.permutation(labels)) >= observed - 1e-12 for _ in range(permutations))
    return round(float((1 + exceed) / (permutations + 1)), 6)


def few_rounds_factor(rounds: int, cycles: int, level: float) -> float:
    """How much wider the between-round part must be, since it is estimated from ``rounds`` − 1 degrees of freedom
    while the interval's quantile is taken at ``cycles`` − 1: (t_{R−1} / t_{C−1})² at the interval's level."""
    if rounds < 2 or cycles < 2:
        return 1.0
    tail = 1 - (1 - level) / 2
    return float((stats.t.ppf(tail, rounds - 1) / stats.t.ppf(tail, cycles - 1)) ** 2)


def round_spread(by_round: list[list[np.ndarray]], q: float = 99.0) -> list[float] | None:
    """The lowest and highest p99 of the rounds on their own (rounds with at least 100 queries in complete
    cycles), beside the pooled interval. Even on a steady machine it is often wider than the interval (one round's
    p99 is far less precise than the pool's: 15 of 50 stationary runs of five rounds), so it is a figure to read,
    not a verdict of drift on its own."""
    own = [float(np.percentile(np.concatenate(cycles), q)) for cycles in by_round
           if cycles and sum(len(c) for c in cycles) >= MIN_QUERIES]
    return [round(min(own), 6), round(max(own), 6)] if len(own) >= 2 else None


def exceedance_se(cycles: list[np.ndarray], above: np.ndarray) -> float:
    """The standard error of the fraction of queries above the point: a ratio over independent cycles (above_i
    against the fraction × length_i)."""
    lengths = np.array([len(c) for c in cycles], dtype=np.float64)
    fraction = above.sum() / lengths.sum()
    residual = above - fraction * lengths
    k = len(cycles)
    return float(np.sqrt(np.sum(residual ** 2) / (k - 1) / k) / lengths.mean())


def woodruff_bounds(values: np.ndarray, q: float, se: float, cycles: int, level: float) -> tuple[float, float]:
    """The latencies at percentiles ``q`` ∓ z·SE (in percent), z from t with ``cycles`` − 1 degrees of freedom."""
    z = float(stats.t.ppf(1 - (1 - level) / 2, cycles - 1))
    low, high = np.percentile(values, [max(q - 100 * z * se, 0.0), min(q + 100 * z * se, 100.0)])
    return float(low), float(high)


def upper_at(steady: dict, candidates: int, q: float = 99.0) -> float | None:
    """The upper end of a stored steady-state p99 interval corrected over ``candidates`` (Bonferroni: two-sided
    1 − (1 − level)/candidates): exact for up to 8 (stored at measurement time), else read from the stored tail at
    the percentile q + z·SE. None where the record lacks them or the end reaches the slowest query measured."""
    stored = (steady.get("upper_among") or {}).get(str(candidates), "absent")
    if stored != "absent":
        return stored
    se, tail = steady.get("se"), steady.get("tail")
    if se is None or not tail or steady.get("cycles", 0) < 2 or not TAIL_FROM <= q < 100:
        return None
    level = 1 - (1 - steady.get("level", LEVEL)) / candidates
    z = float(stats.t.ppf(1 - (1 - level) / 2, steady["cycles"] - 1))
    at = q + 100 * z * se
    if at >= 100:
        return None
    grid = TAIL_FROM + TAIL_STEP * np.arange(len(tail))
    return float(np.interp(at, grid, tail))


def queries_wanted(estimate: SteadyP99, min_tail_cycles: int) -> int:
    """How many queries the next run should hold: enough, at the rate the tail cycles came so far, for the ones
    still missing (doubling what was measured when none came), and never fewer than were measured."""
    have = estimate.queries
    if estimate.tail_cycles <= 0:
        return max(have, 1)
    per_tail = have / estimate.tail_cycles
    missing = max(min_tail_cycles - estimate.tail_cycles, 0)
    return int(max(have, np.ceil(per_tail * missing * 1.2)))
