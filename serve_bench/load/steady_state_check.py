"""Known answers for the server scenario's p99: M/M/1 and M/D/1 queues on a fake clock through the project's own
estimator, with the bench's own precision rule (``python -m serve_bench.load.steady_state_check``).

M/M/1's sojourn time is exponential with rate μ − λ, so its p99 is ln(100)/(μ − λ) exactly; M/D/1's steady-state
p99 comes from one long simulation (4 million requests). Each run starts from an empty queue, as a LoadGen test
does, and is measured again with more requests (:func:`~serve_bench.load.steady_state.queries_wanted`) until
:func:`~serve_bench.load.steady_state.steady_p99` calls it precise or the cap is reached: the same loop as
``run_scenario``. Printed per load: how often the interval's upper end is at or above the true p99 (it claims
97.5%, one-sided), the median error of the point, and how many requests the runs took.

``--budget-at-truth`` puts the p99 budget exactly at the true p99, so the loop also stops as soon as the interval
lies on one side of the budget (the bench's "decided by the budget" stop): a run whose upper end falls below the
true p99 is then a server at its budget judged within it, and the table's coverage is one minus that rate.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import brentq

from serve_bench.load.queue_simulation import single_server_fifo
from serve_bench.load.rounds import (RATIO_LEVEL, RoundsRule, busy_period_lengths, in_rounds, paired_p99_ratio,
                                    size_for_busy_periods)
from serve_bench.load.steady_state import DRIFT_P, queries_wanted, steady_p99

SERVICE_S = 0.002  # 2 ms: the issue's and the LoadGen tests' scale


@dataclass(frozen=True)
class Coverage:
    queue: str
    rho: float
    true_p99_ms: float
    runs: int
    covered: float  # share of runs whose upper end is ≥ the true p99
    median_error: float  # median of point / true − 1
    median_queries: float
    capped: float  # share of runs that reached the cap before the rule called them precise
    flagged: float | None = None  # share of runs in rounds whose rounds differed (permutation test p < DRIFT_P)
    mixture_p99_ms: float | None = None  # on a drifting machine: the p99 of a server loaded without pause
    covered_mixture: float | None = None  # share of runs whose upper end is ≥ that one


def true_p99_ms(queue: str, rho: float, seed: int = 12345) -> float:
    lam, mu = rho / SERVICE_S, 1 / SERVICE_S
    if queue == "M/M/1":
        return math.log(100) / (mu - lam) * 1e3
    rng = np.random.default_rng(seed)
    n = 4_000_000
    run = single_server_fifo(np.cumsum(rng.standard_exponential(n)) / lam, np.full(n, SERVICE_S))
    return float(np.percentile(run.latency_ms[n // 100:], 99))


@dataclass(frozen=True)
class Drift:
    """A machine that is not the same from one round to the next: each round's service times are scaled by a
    factor drawn uniformly from 1 ± ``spread``; every round holds ``round_queries`` queries, started empty, and a
    run measures at least ``min_rounds`` of them."""

    spread: float = 0.2
    round_queries: int = 2000
    min_rounds: int = 5
    most: int | None = None  # rounds grown toward this where busy periods are long, as the bench's (round_size)

    def size(self, lengths: Sequence[int]) -> int:
        """The next round's queries, given the earlier rounds' busy-period lengths (the open ones too)."""
        return self.round_queries if self.most is None else size_for_busy_periods(self.round_queries, self.most,
                                                                                    lengths)

    def factor(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(1 - self.spread, 1 + self.spread)) if self.spread else 1.0


def _round(queue: str, lam: float, n: int, rng: np.random.Generator, factor: float = 1.0):
    arrivals = np.cumsum(rng.standard_exponential(n)) / lam
    services = (rng.standard_exponential(n) if queue == "M/M/1" else np.ones(n)) * SERVICE_S * factor
    return single_server_fifo(arrivals, services)


def drifting_true_p99_ms(queue: str, rho: float, drift: Drift, rounds: int = 2000, seed: int = 12345) -> float:
    """The time-averaged p99 of rounds on a drifting machine: the p99 of every query of ``rounds`` rounds, each
    drawn as the runs draw theirs (4 million queries at the defaults)."""
    rng = np.random.default_rng(seed)
    lam = rho / SERVICE_S
    latencies, lengths = [], []
    for r in range(rounds):  # runs of 20 rounds, each sized as a run sizes its own, from its earlier rounds
        if r % 20 == 0:
            lengths = []
        run = _round(queue, lam, drift.size(lengths), rng, rng.uniform(1 - drift.spread, 1 + drift.spread))
        latencies.append(run.latency_ms)
        if drift.most is not None:
            lengths += list(busy_period_lengths(run.arrival_s, run.latency_ms))
    return float(np.percentile(np.concatenate(latencies), 99))


def mixture_p99_ms(queue: str, rho: float, spread: float, factors: int = 41, seed: int = 12345) -> float:
    """The p99 a server loaded without pause would show on the drifting machine: the stationary latency of each
    service scale f of 1 ± ``spread``, mixed uniformly over f (for M/M/1 exactly, P(T > x) = mean over f of
    exp(−(1/(f·S) − λ)·x); for M/D/1 from a long run at each of ``factors`` scales). The rounds' truth above is
    what rounds started empty deliver, which near load is less: both are stated."""
    lam = rho / SERVICE_S
    scales = 1 - spread + 2 * spread * (np.arange(factors) + 0.5) / factors  # midpoints: the uniform's integral
    if queue == "M/M/1":
        fine = 1 - spread + 2 * spread * (np.arange(4001) + 0.5) / 4001
        rates = 1 / (fine * SERVICE_S) - lam
        return float(brentq(lambda x: float(np.mean(np.exp(-rates * x))) - 0.01, 0.0, 100.0 / rates.min())) * 1e3
    rng = np.random.default_rng(seed)
    n = 400_000
    pooled = [single_server_fifo(np.cumsum(rng.standard_exponential(n)) / lam, np.full(n, SERVICE_S * f))
              .latency_ms[n // 100:] for f in scales]
    return float(np.percentile(np.concatenate(pooled), 99))


def one_run(queue: str, rho: float, rng: np.random.Generator, first: int, cap: int, min_tail_cycles: int,
            precision: float, budget_ms: float | None = None, drift: Drift | None = None):
    """One measurement until precise: back to back (``drift`` None, as the bench's sweep probes), or in rounds of a
    drifting machine through the bench's own loop (serve_bench.load.rounds)."""
    lam = rho / SERVICE_S
    if drift is not None:
        rule = RoundsRule(min_rounds=drift.min_rounds, max_queries=cap, min_tail_cycles=min_tail_cycles,
                          precision=precision, budget_ms=budget_ms)

        lengths: list[int] = []

        def one_round(active: list[str], index: int) -> dict:
            run = _round(queue, lam, drift.size(lengths), rng, drift.factor(rng))
            lengths.extend(busy_period_lengths(run.arrival_s, run.latency_ms))
            return {key: (run.arrival_s, run.latency_ms) for key in active}

        measured = in_rounds(["run"], one_round, lambda segment: segment, rule)["run"]
        return measured.estimate, sum(len(latencies) for _, latencies in measured.tests)
    segments, done, want = [], 0, first
    while True:
        run = _round(queue, lam, want, rng)
        segments.append((run.arrival_s, run.latency_ms))
        done += want
        estimate = steady_p99(segments, budget_ms=budget_ms, min_tail_cycles=min_tail_cycles, precision=precision)
        if estimate.precise or done >= cap:
            return estimate, done
        want = min(queries_wanted(estimate, min_tail_cycles), cap - done)


def coverage(queue: str, rho: float, runs: int, *, first: int = 1000, cap: int = 20000, min_tail_cycles: int = 20,
             precision: float = 0.25, seed: int = 0, truth: float | None = None,
             budget_at_truth: bool = False, drift: Drift | None = None) -> Coverage:
    if truth is None:
        truth = drifting_true_p99_ms(queue, rho, drift) if drift and drift.spread else true_p99_ms(queue, rho)
    mixture = mixture_p99_ms(queue, rho, drift.spread) if drift and drift.spread else None
    rng = np.random.default_rng(seed)
    covered, errors, sizes, capped, flagged, covered_mixture = 0, [], [], 0, 0, 0
    for _ in range(runs):
        estimate, done = one_run(queue, rho, rng, first, cap, min_tail_cycles, precision,
                                 truth if budget_at_truth else None, drift)
        if estimate.point is None:
            errors.append(-1.0)
        else:
            covered += estimate.ci is not None and estimate.ci[1] >= truth
            covered_mixture += mixture is not None and estimate.ci is not None and estimate.ci[1] >= mixture
            errors.append(estimate.point / truth - 1)
        sizes.append(done)
        capped += not estimate.precise
        flagged += estimate.rounds_differ_p is not None and estimate.rounds_differ_p < DRIFT_P  # set by in_rounds
    return Coverage(queue, rho, truth, runs, covered / runs, float(np.median(errors)), float(np.median(sizes)),
                    capped / runs, flagged / runs if drift else None, mixture,
                    covered_mixture / runs if mixture is not None else None)


@dataclass(frozen=True)
class PairedCoverage:
    rho: tuple[float, float]  # the candidate's and the baseline's load (one arrival rate, two service times)
    true_ratio: float
    runs: int
    covered: float  # share of runs whose interval (at RATIO_LEVEL) holds the true ratio
    median_error: float
    median_width: float  # of the interval, relative to the true ratio
    median_rounds: float


def paired_coverage(rho: float, baseline_rho: float, runs: int, drift: Drift, *, cap: int = 20000,
                    min_tail_cycles: int = 20, precision: float = 0.25, seed: int = 0) -> PairedCoverage:
    """Two M/M/1 files at one arrival rate (the candidate's service time ``rho / baseline_rho`` times the
    baseline's), measured in the same rounds of one drifting machine (a round's factor applies to both, as a slow
    stretch does), stopping together by the bench's rule, then their p99 ratio paired round by round. Each file
    draws its own arrivals (the bench gives both the same ones, which only narrows the true spread of their ratio,
    so this is the harder case). The truth is the ratio of the two time-averaged p99s."""
    scale = {"candidate": rho / baseline_rho, "baseline": 1.0}
    truth = (scale["candidate"] * drifting_true_p99_ms("M/M/1", rho, drift)  # in the candidate's time unit
             / drifting_true_p99_ms("M/M/1", baseline_rho, drift))
    rng = np.random.default_rng(seed)
    lam = baseline_rho / SERVICE_S
    rule = RoundsRule(min_rounds=drift.min_rounds, max_queries=cap, min_tail_cycles=min_tail_cycles,
                      precision=precision)

    lengths: dict[str, list[int]] = {key: [] for key in scale}

    def one_round(active: list[str], index: int) -> dict:
        factor = drift.factor(rng)
        if index == 0:  # a new run: its rounds sized from its own busy periods
            for seen in lengths.values():
                seen.clear()
        size = max(drift.size(lengths[key]) for key in active)  # the pair's rounds alike, as the bench's
        runs_now = {key: _round("M/M/1", lam, size, rng, factor * scale[key]) for key in active}
        for key, run in runs_now.items():
            lengths[key].extend(busy_period_lengths(run.arrival_s, run.latency_ms))
        return {key: (run.arrival_s, run.latency_ms) for key, run in runs_now.items()}

    covered, errors, widths, rounds = 0, [], [], []
    for _ in range(runs):
        measured = in_rounds(["candidate", "baseline"], one_round, lambda segment: segment, rule,
                             group=lambda key: 0)  # as the bench's files at one rate: they stop together
        ratio = paired_p99_ratio(measured["candidate"].tests, measured["baseline"].tests)
        if ratio is None:
            errors.append(-1.0)
            continue
        covered += ratio.ci[0] <= truth <= ratio.ci[1]
        errors.append(ratio.ratio / truth - 1)
        widths.append((ratio.ci[1] - ratio.ci[0]) / truth)
        rounds.append(ratio.rounds)
    return PairedCoverage((rho, baseline_rho), truth, runs, covered / runs, float(np.median(errors)),
                          float(np.median(widths)), float(np.median(rounds)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cap", type=int, default=20000, help="requests per measurement at most (the bench's "
                                                                "max_queries)")
    parser.add_argument("--budget-at-truth", action="store_true", help="the budget at the true p99: the loop also "
                                                                       "stops when the budget decides")
    parser.add_argument("--rounds", action="store_true", help="measure in rounds even without drift (--drift 0)")
    parser.add_argument("--drift", type=float, default=0.0, help="each round's service times scaled by 1 ± this "
                                                                    "(uniform), rounds of 2,000 queries, 5 at least")
    parser.add_argument("--paired", type=float, nargs=2, metavar=("RHO", "BASELINE_RHO"),
                        help="in rounds: the p99 ratio of two M/M/1 files measured in the same rounds at one arrival "
                             "rate (e.g. 0.5 0.25), paired round by round, against the true ratio")
    parser.add_argument("--round-queries", type=int, default=Drift.round_queries, help="queries per round")
    parser.add_argument("--round-most", type=int, help="rounds grown toward this many queries where busy periods "
                                                       "are long, as the bench grows its (its min_queries: 1000)")
    args = parser.parse_args(argv)
    if args.paired:
        drift = Drift(spread=args.drift, round_queries=args.round_queries, most=args.round_most)
        c = paired_coverage(*args.paired, args.runs, drift, cap=args.cap)
        print(f"paired p99 ratio, ρ {c.rho[0]} over {c.rho[1]}, drift ±{args.drift:.0%}: true {c.true_ratio:.3f}, "
              f"{RATIO_LEVEL:.0%} interval covers it in {c.covered:.1%} of {c.runs} runs, median error "
              f"{c.median_error:+.1%}, "
              f"median width {c.median_width:.1%} of the truth, median {c.median_rounds:.0f} rounds paired")
        return
    drift = (Drift(spread=args.drift, round_queries=args.round_queries, most=args.round_most)
             if args.drift or args.rounds else None)
    print("| queue | ρ | true p99 ms | upper end ≥ true p99 | median error of the point | median requests | "
          "capped | rounds flagged as different | loaded without pause: p99 ms | upper end ≥ it |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for queue in ("M/M/1", "M/D/1"):
        for rho in ((0.5, 0.75) if drift else (0.5, 0.75, 0.9)):
            c = coverage(queue, rho, args.runs, cap=args.cap, budget_at_truth=args.budget_at_truth, drift=drift)
            print(f"| {queue} | {rho} | {c.true_p99_ms:.2f} | {c.covered:.1%} | {c.median_error:+.1%} | "
                  f"{c.median_queries:,.0f} | {c.capped:.0%} | "
                  f"{'—' if c.flagged is None else f'{c.flagged:.1%}'} | "
                  f"{'—' if c.mixture_p99_ms is None else f'{c.mixture_p99_ms:.2f}'} | "
                  f"{'—' if c.covered_mixture is None else f'{c.covered_mixture:.1%}'} |", flush=True)


if __name__ == "__main__":
    main()
