"""Latency under traffic on a fake clock: the serving loop's batching policy simulated, checked against queueing
theory and against hand-computed schedules. These are the timing claims of the traffic harness with known
answers; the same claims on real time are a benchmark (python -m serve_bench.load.traffic_check), since a busy
machine's late wake-ups move a measured p99 and cannot be asserted on.

Tolerances of the random runs are about 4 standard deviations of the figure over seeds at the run length used
(measured over 20 to 40 seeds, and for the mean sojourn in line with the M/M/1 asymptotic variance); every run
is seeded, so the margins say how far another seed could move a figure, not that the test is random."""
from __future__ import annotations

import math

import numpy as np
import pytest

from serve_bench.load.queue_growth import bounded
from serve_bench.load.queue_simulation import (closed_loop, exponential_service, fixed_service, poisson_arrivals,
                                               runner_service, simulate)
from serve_bench.load.serving_loop import ServingSettings

ONE = ServingSettings()
BATCHED = ServingSettings(max_batch=8, max_queue_delay_us=2000)


def md1_wait(rho: float, service_s: float) -> float:
    """Pollaczek–Khinchine for a fixed service time s: the mean wait in the queue is ρs / (2(1 − ρ))."""
    return rho * service_s / (2 * (1 - rho))


# --- queueing theory -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho, count, mean_tol, p99_tol", [(0.5, 50_000, 0.05, 0.10), (0.75, 100_000, 0.07, 0.14),
                                                           (0.9, 400_000, 0.10, 0.20)])
def test_mm1_sojourn_is_exponential_with_rate_mu_minus_lambda(rho, count, mean_tol, p99_tol):
    """M/M/1 (Poisson arrivals λ, exponential service μ, one server, no batching): the time in the system is
    exponential with rate μ − λ, so its mean is 1/(μ − λ) and its p99 ln(100)/(μ − λ). A busier queue is more
    correlated in time, so it needs a longer run for the same precision: over seeds the relative spread of the
    mean was 1.2%, 1.6%, 2.6% and of the p99 2.2%, 3.4%, 5.0% at these loads and lengths (this seed: the mean
    within 1.1% of theory, the p99 within 3.7%)."""
    mu, lam = 1000.0, rho * 1000.0
    run = simulate(poisson_arrivals(lam, count=count, seed=11), exponential_service(1 / mu, seed=12), ONE)
    latency_s = run.latency_ms / 1e3
    assert latency_s.mean() == pytest.approx(1 / (mu - lam), rel=mean_tol)
    assert np.percentile(latency_s, 99) == pytest.approx(math.log(100) / (mu - lam), rel=p99_tol)
    assert np.all(run.batch == 1) and np.all(run.queue_s >= 0)


def test_md1_mean_wait_is_pollaczek_khinchine():
    """M/D/1 at ρ 0.5 and 0.8 (2 ms fixed service): mean wait ρs/(2(1 − ρ)), 1 and 4 ms (measured 0.96 and 3.64);
    over seeds its relative spread was 1.6% (50,000 requests) and 3.3% (100,000)."""
    for rho, count, tol in ((0.5, 50_000, 0.07), (0.8, 100_000, 0.14)):
        run = simulate(poisson_arrivals(rho / 2e-3, count=count, seed=21), fixed_service(2e-3), ONE)
        assert run.queue_s.mean() == pytest.approx(md1_wait(rho, 2e-3), rel=tol), rho


def test_p99_rises_with_load_and_the_queue_is_where_it_goes():
    """A fixed 2 ms service at ρ 0.1, 0.45, 0.66, 0.9: the p99 rises (measured 3.9, 7.8, 13.4, 54.9 ms) because the
    wait in the queue does (measured 0.11, 0.81, 1.94, 9.5 ms mean; M/D/1: 0.11, 0.82, 1.94, 9.0), while the time in
    the model stays 2 ms. Over seeds the mean wait's relative spread was 1.5-2.2% up to ρ 0.66 and 5.6% at 0.9."""
    runs = [simulate(poisson_arrivals(rho / 2e-3, count=50_000, seed=31), fixed_service(2e-3), ONE)
            for rho in (0.1, 0.45, 0.66, 0.9)]
    p99 = [np.percentile(r.latency_ms, 99) for r in runs]
    assert all(a < b for a, b in zip(p99, p99[1:])), p99
    assert p99[-1] > 5 * p99[0]
    for rho, tol, run in zip((0.1, 0.45, 0.66, 0.9), (0.1, 0.1, 0.1, 0.25), runs):
        summary = run.summary()  # the serving loop's own summary reads the simulation unchanged
        assert summary["compute_ms"]["mean"] == pytest.approx(2.0, abs=1e-6)
        assert summary["compute_ms"]["p99"] == pytest.approx(2.0, abs=1e-6)
        assert summary["queue_ms"]["mean"] == pytest.approx(md1_wait(rho, 2e-3) * 1e3, rel=tol), rho
        assert summary["sustainable"] and summary["mean_batch"] == 1.0


def test_saturation_is_not_sustainable_and_half_load_is():
    """ρ 1.7 (850/s at 2 ms): the server completes 500/s at most, so the queue grows for as long as arrivals last
    and the latency climbs linearly from zero: hundreds of queries are still in the system when the last arrives,
    where Little's law allows a stable queue a handful. At ρ 0.5 the queue is bounded and the rule says so."""
    arrivals = poisson_arrivals(850, duration_s=1.0, seed=41)
    over = simulate(arrivals, fixed_service(2e-3), ONE)
    ok, why = bounded(over.arrival_s, over.latency_ms)
    assert ok is False and why.startswith("not sustainable")
    assert over.summary()["completed_qps"] < 0.8 * len(arrivals) / arrivals[-1]
    half = simulate(poisson_arrivals(250, duration_s=10.0, seed=42), fixed_service(2e-3), ONE)
    assert bounded(half.arrival_s, half.latency_ms) == (True, "sustainable")


def test_a_stall_once_a_second_hides_in_the_closed_loop_and_shows_under_open_loop_traffic():
    """A 50 ms stall once a second on a 0.5 ms service. Closed loop: 10 stalls among ~19,000 requests (0.05%),
    so the p99 is the service time, 0.5 ms. Open loop at 500/s: each stall holds back the arrivals of the next
    50 ms and the queue takes 50 × 500/1500 ≈ 17 ms more to drain, so ~7% of requests are held back; an arrival
    u s into a stall waits about 50.5 ms − 0.75u, which puts the p99 near 43 ms (measured 42.4; asserted > 40% of
    the stall, and within 10% of 43 ms)."""
    model = {"service_ms": 0.5, "stall_every_s": 1.0, "stall_ms": 50.0}
    closed = closed_loop(runner_service(**model), duration_s=10.0)
    assert np.percentile(closed.latency_ms, 99) == pytest.approx(0.5)
    assert closed.latency_ms.max() == pytest.approx(50.5)  # the stalls happened; a closed loop counts each once
    opened = simulate(poisson_arrivals(500, duration_s=10.0, seed=51), runner_service(**model), ONE)
    p99 = np.percentile(opened.latency_ms, 99)
    assert p99 > 0.4 * model["stall_ms"] and p99 == pytest.approx(43.0, rel=0.1)


def highest_rate_within(settings: ServingSettings, budget_ms: float, ceiling: float) -> float:
    """The highest Poisson rate whose p99 is within the budget with the queue bounded, by bisection (in ratio)
    below ``ceiling``. One seeded schedule compressed to each rate, so the p99 moves with the rate alone."""
    low, high = 1.0, ceiling
    for _ in range(10):
        rate = math.sqrt(low * high)
        run = simulate(poisson_arrivals(rate, count=20_000, seed=61), fixed_service(2e-3, 2e-4), settings)
        good = np.percentile(run.latency_ms, 99) <= budget_ms and run.keeps_up()[0]
        low, high = (rate, high) if good else (low, rate)
    return low


def test_dynamic_batching_carries_more_load_within_the_budget():
    """A batch of b costs 2 + 0.2(b − 1) ms: 8 one by one take 16 ms, a batch of 8 takes 3.4 ms, so the
    ceilings are 500/s and 2,353/s (4.7×). Within a 20 ms p99 the plain server stops well short of its ceiling
    (M/D/1's tail grows as ρ → 1): measured 392/s against 2,283/s, 5.8× (asserted > 2.5×)."""
    plain = highest_rate_within(ONE, 20.0, 500.0)
    batched = highest_rate_within(BATCHED, 20.0, 8 / 3.4e-3)
    assert 350 < plain < 500 and batched > 2.5 * plain, (plain, batched)


def test_under_heavy_load_the_batches_are_nearly_full():
    """At 2,000/s a server whose batch of b takes 1.8 + 0.2b ms keeps up only if its batches average at least
    6 (busy time per second 2000 × (1.8/b + 0.2) ms ≤ 1 s); per request the mean is larger still (a request
    is more likely to sit in a big batch). Measured 6.8; light load leaves batches small (1,000/s: 3.8)."""
    heavy = simulate(poisson_arrivals(2000, count=20_000, seed=71), fixed_service(2e-3, 2e-4), BATCHED)
    light = simulate(poisson_arrivals(1000, count=20_000, seed=71), fixed_service(2e-3, 2e-4), BATCHED)
    assert heavy.summary()["mean_batch"] > 6 and heavy.keeps_up()[0]
    assert light.batch.mean() < heavy.batch.mean() - 1


def test_two_instances_more_than_halve_the_wait():
    """M/M/2 against M/M/1 (μ 1,000/s each, Erlang C): at the same load per instance (ρ 0.8: 800/s on one,
    1,600/s on two) the mean wait is ρ²/(μ(1 − ρ²)) = 1.78 ms against ρ/(μ − λ) = 4 ms, a ratio ρ/(1 + ρ) = 0.44;
    at the same arrival rate (800/s) two instances wait 0.19 ms. Measured 3.96, 1.76 and 0.19 ms; over seeds each
    mean spread 1.3-2.3%."""
    one = simulate(poisson_arrivals(800, count=100_000, seed=81), exponential_service(1e-3, seed=82), ONE)
    two = simulate(poisson_arrivals(1600, count=100_000, seed=81), exponential_service(1e-3, seed=82),
                   ServingSettings(instances=2))
    same_rate = simulate(poisson_arrivals(800, count=100_000, seed=81), exponential_service(1e-3, seed=82),
                         ServingSettings(instances=2))
    assert one.queue_s.mean() == pytest.approx(4e-3, rel=0.1)
    assert two.queue_s.mean() == pytest.approx(0.64 / (1000 * (1 - 0.64)), rel=0.1)
    assert same_rate.queue_s.mean() == pytest.approx(0.16 / (1000 * 1.4 * 0.6), rel=0.1)
    assert two.queue_s.mean() < 0.5 * one.queue_s.mean()


# --- the policy on hand-computed schedules ---------------------------------------------------------------------

def served(arrivals: list[float], settings: ServingSettings, per_item_s: float = 0.0):
    run = simulate(np.array(arrivals), fixed_service(1.0, per_item_s), settings)
    return run.start_s.tolist(), run.batch.tolist(), run.completion_s.tolist()


def test_with_no_delay_an_idle_instance_takes_what_has_arrived():
    # 0 starts alone at once; 0.5 and 0.6 wait for it and go together at 1.0 (1.1 s for two); 2.5 finds it idle
    starts, batches, done = served([0.0, 0.5, 0.6, 2.5], ServingSettings(max_batch=8), per_item_s=0.1)
    assert starts == pytest.approx([0.0, 1.0, 1.0, 2.5]) and batches == [1, 2, 2, 1]
    assert done == pytest.approx([1.0, 2.1, 2.1, 3.5])


def test_with_a_delay_the_oldest_waits_for_company_until_its_deadline():
    # 0 waits until 0.3 (its arrival + 0.3 s) and takes 0.1 and 0.2 with it; 0.35 and 0.5 are past their own
    # deadlines (0.65, 0.8) when the instance frees at 1.3, so they go at once with what has arrived
    starts, batches, _ = served([0.0, 0.1, 0.2, 0.35, 0.5], ServingSettings(max_batch=4, max_queue_delay_us=300_000))
    assert starts == pytest.approx([0.3, 0.3, 0.3, 1.3, 1.3]) and batches == [3, 3, 3, 2, 2]


def test_a_full_batch_starts_at_once_and_no_batch_exceeds_the_cap():
    # delay 10 s: the batch of two is full when 0.1 arrives and starts then, not at the deadline
    starts, batches, _ = served([0.0, 0.1, 0.2, 0.3], ServingSettings(max_batch=2, max_queue_delay_us=10_000_000))
    assert starts == pytest.approx([0.1, 0.1, 1.1, 1.1]) and batches == [2, 2, 2, 2]
    # no delay: three are waiting at 1.0 but only two go
    starts, batches, _ = served([0.0, 0.1, 0.2, 0.3], ServingSettings(max_batch=2))
    assert starts == pytest.approx([0.0, 1.0, 1.0, 2.0]) and batches == [1, 2, 2, 1]


def test_two_instances_share_one_queue_in_order():
    # one at a time: A takes 0 (to 1.0), B takes 0.1 (to 1.1), then A takes 0.2 at 1.0 and B 0.3 at 1.1
    starts, _, done = served([0.0, 0.1, 0.2, 0.3], ServingSettings(instances=2))
    assert starts == pytest.approx([0.0, 0.1, 1.0, 1.1]) and done == pytest.approx([1.0, 1.1, 2.0, 2.1])
    # batches of two, delay 0.5 s: A's batch fills at 0.2 and starts; B takes 0.3, which fills at 0.4
    starts, batches, _ = served([0.0, 0.2, 0.3, 0.4], ServingSettings(instances=2, max_batch=2,
                                                                      max_queue_delay_us=500_000))
    assert starts == pytest.approx([0.2, 0.2, 0.4, 0.4]) and batches == [2, 2, 2, 2]


def test_the_simulation_reads_as_the_serving_loops_records():
    run = simulate(np.array([0.0, 0.0005, 0.004]), fixed_service(1e-3), ONE)
    records = run.records()
    assert records.queue_ns.tolist() == [0, 500_000, 0] and records.compute_ns.tolist() == [1_000_000] * 3
    assert records.busy_ns.tolist() == [1_000_000] * 3
    assert run.latency_ms.tolist() == pytest.approx([1.0, 1.5, 1.0])
    closed = closed_loop(fixed_service(2e-3), count=5)
    assert closed.latency_ms.tolist() == pytest.approx([2.0] * 5)
    assert closed.arrival_s.tolist() == pytest.approx([0.0, 0.002, 0.004, 0.006, 0.008])
    with pytest.raises(ValueError, match="sorted"):
        simulate(np.array([1.0, 0.5]), fixed_service(1e-3), ONE)
    assert np.allclose(poisson_arrivals(200, count=100, seed=1), poisson_arrivals(100, count=100, seed=1) / 2)
    assert poisson_arrivals(100, duration_s=2.0, seed=1)[-1] < 2.0
