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

import numpy as np

from serve_bench.load.queue_simulation import single_server_fifo
from serve_bench.load.steady_state import queries_wanted, steady_p99

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


def _round(queue: str, lam: float, n: int, rng: np.random.Generator, factor: float = 1.0):
    arrivals = np.cumsum(rng.standard_exponential(n)) / lam
    services = (rng.standard_exponential(n) if queue == "M/M/1" else np.ones(n)) * SERVICE_S * factor
    return single_server_fifo(arrivals, services)


def drifting_true_p99_ms(queue: str, rho: float, drift: Drift, rounds: int = 2000, seed: int = 12345) -> float:
    """The time-averaged p99 of rounds on a drifting machine: the p99 of every query of ``rounds`` rounds, each
    drawn as the runs draw theirs (4 million queries at the defaults)."""
    rng = np.random.default_rng(seed)
    lam = rho / SERVICE_S
    latencies = [_round(queue, lam, drift.round_queries, rng, rng.uniform(1 - drift.spread, 1 + drift.spread))
                 .latency_ms for _ in range(rounds)]
    return float(np.percentile(np.concatenate(latencies), 99))


def one_run(queue: str, rho: float, rng: np.random.Generator, first: int, cap: int, min_tail_cycles: int,
            precision: float, budget_ms: float | None = None, drift: Drift | None = None):
    lam = rho / SERVICE_S
    segments, done = [], 0
    want = drift.round_queries if drift else first
    while True:
        factor = rng.uniform(1 - drift.spread, 1 + drift.spread) if drift else 1.0
        run = _round(queue, lam, want, rng, factor)
        segments.append((run.arrival_s, run.latency_ms))
        done += want
        estimate = steady_p99(segments, budget_ms=budget_ms, min_tail_cycles=min_tail_cycles, precision=precision,
                              min_rounds=drift.min_rounds if drift else 1)
        if estimate.precise or done >= cap:
            return estimate, done
        want = min(drift.round_queries if drift else queries_wanted(estimate, min_tail_cycles), cap - done)


def coverage(queue: str, rho: float, runs: int, *, first: int = 1000, cap: int = 20000, min_tail_cycles: int = 20,
             precision: float = 0.25, seed: int = 0, truth: float | None = None,
             budget_at_truth: bool = False, drift: Drift | None = None) -> Coverage:
    if truth is None:
        truth = drifting_true_p99_ms(queue, rho, drift) if drift else true_p99_ms(queue, rho)
    rng = np.random.default_rng(seed)
    covered, errors, sizes, capped = 0, [], [], 0
    for _ in range(runs):
        estimate, done = one_run(queue, rho, rng, first, cap, min_tail_cycles, precision,
                                 truth if budget_at_truth else None, drift)
        if estimate.point is None:
            errors.append(-1.0)
        else:
            covered += estimate.ci is not None and estimate.ci[1] >= truth
            errors.append(estimate.point / truth - 1)
        sizes.append(done)
        capped += not estimate.precise
    return Coverage(queue, rho, truth, runs, covered / runs, float(np.median(errors)), float(np.median(sizes)),
                    capped / runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cap", type=int, default=20000, help="requests per measurement at most (the bench's "
                                                                "max_queries)")
    parser.add_argument("--budget-at-truth", action="store_true", help="the budget at the true p99: the loop also "
                                                                       "stops when the budget decides")
    parser.add_argument("--drift", type=float, default=0.0, help="each round's service times scaled by 1 ± this "
                                                                    "(uniform), rounds of 2,000 queries, 5 at least")
    args = parser.parse_args(argv)
    drift = Drift(spread=args.drift) if args.drift else None
    print("| queue | ρ | true p99 ms | upper end ≥ true p99 | median error of the point | median requests | "
          "capped |")
    print("|---|---|---|---|---|---|---|")
    for queue in ("M/M/1", "M/D/1"):
        for rho in ((0.5, 0.75) if drift else (0.5, 0.75, 0.9)):
            c = coverage(queue, rho, args.runs, cap=args.cap, budget_at_truth=args.budget_at_truth, drift=drift)
            print(f"| {queue} | {rho} | {c.true_p99_ms:.2f} | {c.covered:.1%} | {c.median_error:+.1%} | "
                  f"{c.median_queries:,.0f} | {c.capped:.0%} |", flush=True)


if __name__ == "__main__":
    main()
