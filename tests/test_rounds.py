"""The server scenario in rounds across files, on a fake clock: who is tested in which round and when each stops,
the ratio of two files' p99s paired round by round against a known answer, and the test that rounds differ."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.latency.traffic_rounds import groups_of, measure_in_rounds, pair_runs, round_queries
from serve_bench.load.rounds import RoundsRule, in_rounds, paired_p99_ratio, round_size
from serve_bench.load.steady_state import DRIFT_P, rounds_differ_p, steady_p99
from serve_bench.load.steady_state_check import SERVICE_S, Drift, coverage, paired_coverage
from serve_bench.load.queue_simulation import single_server_fifo
from tests.test_steady_state import _simulated_test


def _segment(rng: np.random.Generator, rho: float, n: int = 2000, factor: float = 1.0):
    run = single_server_fifo(np.cumsum(rng.standard_exponential(n)) * SERVICE_S / rho,
                             rng.standard_exponential(n) * SERVICE_S * factor)
    return run.arrival_s, run.latency_ms


def test_each_file_stops_by_itself_and_the_rounds_go_on_without_it():
    """A light queue is precise first, after the least number of rounds or soon after; a heavier one takes more;
    one that grows without bound stops after two rounds. Every round tests the files still measuring, in order."""
    rng = np.random.default_rng(0)
    loads = {"light": 0.3, "heavy": 0.75, "overloaded": 1.3}
    seen: list[list[str]] = []

    def one_round(active: list[str], index: int) -> dict:
        assert index == len(seen)
        seen.append(list(active))
        return {key: _segment(rng, loads[key]) for key in active}

    measured = in_rounds(list(loads), one_round, lambda segment: segment, RoundsRule(min_rounds=5))
    assert measured["overloaded"].stopped == "not sustainable" and len(measured["overloaded"].tests) == 2
    light = len(measured["light"].tests)
    assert measured["light"].stopped == "precise" and 5 <= light < len(measured["heavy"].tests)
    assert measured["heavy"].stopped in ("precise", "capped")
    assert seen[1] == ["light", "heavy", "overloaded"] and seen[2] == ["light", "heavy"]
    assert all(round_ == ["heavy"] for round_ in seen[light:])
    assert measured["light"].estimate.rounds == light and measured["light"].estimate.round_p99 is not None


def test_files_compared_at_one_rate_stop_together_but_a_grown_queue_leaves_at_once():
    rng = np.random.default_rng(0)
    loads = {"light": 0.3, "heavy": 0.75, "overloaded": 1.3}
    measured = in_rounds(list(loads), lambda active, i: {k: _segment(rng, loads[k]) for k in active},
                         lambda segment: segment, RoundsRule(min_rounds=5), group=lambda key: "one rate")
    assert len(measured["light"].tests) == len(measured["heavy"].tests) > 5
    assert measured["light"].stopped == "precise" and len(measured["overloaded"].tests) == 2
    assert measured["light"].estimate.rounds_differ_p is not None  # the drift test, once, at the end


def test_the_cap_stops_a_file_that_never_gets_precise():
    rng = np.random.default_rng(1)
    measured = in_rounds(["near saturation"], lambda active, i: {k: _segment(rng, 0.85) for k in active},
                         lambda segment: segment, RoundsRule(min_rounds=5, max_queries=12000))["near saturation"]
    assert measured.stopped == "capped" and len(measured.tests) == 6 and not measured.estimate.precise


def test_a_paired_ratio_rests_on_the_rounds_both_files_measured():
    rng = np.random.default_rng(2)
    a = [_segment(rng, 0.5) for _ in range(8)]
    b = [_segment(rng, 0.5) for _ in range(5)]
    ratio = paired_p99_ratio(a, b)
    assert ratio.rounds == 5
    pooled_a = steady_p99(a[:5]).point
    assert ratio.ratio == pytest.approx(pooled_a / steady_p99(b).point)  # the point is of the same five rounds
    assert ratio.ci[0] <= ratio.ratio <= ratio.ci[1]
    assert paired_p99_ratio(a[:1], b[:1]) is None  # one round: nothing to pair


def test_a_drift_common_to_both_files_cancels_from_their_paired_ratio():
    """Each round's service times × 1 ± 30% for both files at once (the machine), at one arrival rate, the candidate
    1.3× slower per query: the interval of the ratio paired round by round is far narrower than the same
    estimator's with the baseline's rounds reordered, slowest against fastest (the pairing broken)."""
    rng = np.random.default_rng(3)
    factors = rng.uniform(0.7, 1.3, 10)
    a = [_segment(rng, 0.4, factor=1.3 * f) for f in factors]
    b = [_segment(rng, 0.4, factor=f) for f in factors]
    paired = paired_p99_ratio(a, b)
    shuffled = paired_p99_ratio(a, [b[i] for i in np.argsort(factors)[::-1]])  # slowest rounds against fastest
    assert (paired.ci[1] - paired.ci[0]) < 0.6 * (shuffled.ci[1] - shuffled.ci[0])
    assert paired.ci[0] <= paired.ratio <= paired.ci[1]


def test_rounds_that_differ_are_told_apart_from_rounds_that_do_not():
    """The permutation test on the rounds' shares above the pooled p99 (199 permutations here, 999 in the bench):
    100 runs of five rounds of 2,000 queries (M/M/1, ρ 0.5). A machine that never changed is flagged at p < 0.01 in
    at most 4% of runs (measured 2%); one whose rounds differ by ±40% in at least 30% (measured 41%: five rounds
    tell only a large drift apart from the busy periods' own noise)."""
    rng = np.random.default_rng(4)

    def flagged(spread: float) -> float:
        hits = 0
        for _ in range(100):
            segments = [_segment(rng, 0.5, factor=rng.uniform(1 - spread, 1 + spread)) for _ in range(5)]
            p = rounds_differ_p(segments, steady_p99(segments).point, permutations=199)
            hits += p is not None and p < DRIFT_P
        return hits / 100

    assert flagged(0.0) <= 0.04 and flagged(0.4) >= 0.3


def test_the_bench_loop_warms_each_turn_once_seeds_each_round_and_pairs_the_same_rate():
    """Two files at two rates: one worker turn per file per round, the warm-up only on a turn's first test, a
    seed of its own for every round and rate, and each file's p99 over the baseline's at the same rate."""
    turns: list[tuple[str, list[dict]]] = []

    def turn(name: str, asked: list[dict]) -> list:
        turns.append((name, asked))
        return [_simulated_test(0.3 if name == "base" else 0.2, s["seed"], 600) for s in asked]

    scenarios = [{"scenario": "server", "target_qps": qps, "seed": 0, "warmup_s": 1.0, "min_queries": 600, "duration_s": 2.0}
                 for qps in (150.0, 100.0)]
    measured = measure_in_rounds(turn, ["base", "fast"], scenarios, RoundsRule(min_rounds=3),
                                 together=groups_of({"fast": {"baseline": "base"}}), round_s=3.0)
    assert [name for name, _ in turns[:4]] == ["base", "fast", "fast", "base"]  # the order turns each round
    first = {s["target_qps"]: s["min_queries"] for _, asked in turns[:2] for s in asked}
    assert first == {150.0: 600, 100.0: 600}  # LoadGen's verdict is a first round's: min_queries
    later = {(s["seed"], s["target_qps"]): set() for _, asked in turns[2:] for s in asked}
    for _, asked in turns[2:]:
        for s in asked:
            later[(s["seed"], s["target_qps"])].add(s["min_queries"])
    assert all(len(sizes) == 1 for sizes in later.values())  # a pair's round i alike at each rate
    assert {min(sizes) for (_, qps), sizes in later.items() if qps == 100.0} <= set(range(300, 601))  # 3 s, grown
    assert all([s["warmup_s"] for s in asked] == [1.0] + [0.0] * (len(asked) - 1) for _, asked in turns)
    for name in ("base", "fast"):  # each (round, rate) its own arrivals; the two files' round i draw the same ones
        seeds = [s["seed"] for n, asked in turns if n == name for s in asked]
        assert len(set(seeds)) == len(seeds)
    assert turns[0][1] == turns[1][1]
    assert measured[("base", 0)][0]["tests"] == measured[("fast", 0)][0]["tests"]  # a pair stops together
    run, _ = measured[("fast", 1)]
    assert run["offered_qps"] == 100.0 and run["steady_state"]["rounds"] >= 3 and run["steady_state"]["stopped"]
    pair_runs(measured, {"fast": {"baseline": "base"}, "base": {"baseline": "base"}})
    paired = measured[("fast", 1)][0]["paired"]["baseline"]
    assert paired["reference"] == "base" and paired["rounds"] >= 3 and paired["ratio"] < 1
    assert "paired" not in measured[("base", 0)][0]  # a file is not paired with itself
    every = measured[("fast", 0)][0]
    every.pop("paired", None)
    every["steady_state"]["percentiles_of"] = "every query (the open busy periods hold too many to leave out)"
    pair_runs(measured, {"fast": {"baseline": "base"}})
    assert "paired" not in every  # no busy periods' figure to pair with


def test_a_rounds_test_holds_its_seconds_of_queries_between_two_hundred_and_min_queries():
    assert [round_queries(qps, 1000, 2.0) for qps in (50, 100, 300, 1000, 5000)] == [200, 200, 600, 1000, 1000]
    assert round_queries(300, 1000, float("inf")) == 1000 and round_queries(300, 50, float("inf")) == 200


def test_a_round_grows_where_its_busy_periods_are_long_so_the_one_left_open_is_a_small_part():
    """M/M/1: a query's busy period holds (1 + ρ²)/(1 − ρ)² queries on average: 1.6 at ρ 0.2, 25 at ρ 0.75. A light
    queue keeps its 200-query rounds; at ρ 0.75 the next round holds 20 such busy periods (about 500, read from the
    first round's, the open one too), and no more than ``most``."""
    rng = np.random.default_rng(5)
    assert round_size(200, 1000, []) == 1000  # a first round: LoadGen's verdict needs its min_queries
    assert round_size(200, 1000, [_segment(rng, 0.2, n=400)]) == 200
    grown = [round_size(200, 5000, [_segment(rng, 0.75, n=2000)]) for _ in range(20)]
    assert 350 < np.median(grown) < 900 and min(grown) > 200
    assert round_size(200, 400, [_segment(rng, 0.9, n=4000)]) == 400  # ρ 0.9: 190 per busy period


@pytest.mark.slow  # 100 runs of up to 20,000 requests each, and two long truths: about 2 min on a 2-core AVX2 EPYC
def test_the_paired_ratio_covers_the_known_ratio_on_a_drifting_machine():
    """Two M/M/1 files at one arrival rate (ρ 0.5 and 0.25), each round's service times × 1 ± 20% for both, each
    pair stopping together by the bench's rule: the 99% interval of their p99 ratio, paired round by round, holds
    the true ratio (of the two time-averaged p99s) in at least 93% of runs (measured 99.0% over 200 runs, median
    error −0.5%, median 20 rounds; at 99% true coverage, 100 runs fall under 93 with a chance near 10⁻⁵). At ρ
    0.75 over 0.5 it holds it in 83%: there the candidate's p99 runs 12% low (docs/pages/measured.md)."""
    result = paired_coverage(0.5, 0.25, 100, Drift(spread=0.2, round_queries=1000))
    assert result.covered >= 0.93 and abs(result.median_error) <= 0.05


@pytest.mark.slow  # 100 runs of up to 20,000 requests: about a minute
def test_in_rounds_of_the_bench_size_the_drift_is_covered():
    """The bench's round (1,000 queries at least) on the drifting machine (M/M/1, ρ 0.5, ±20%): the upper end
    covers the time-averaged p99 in at least 93% of runs (measured 95.0%), as with rounds of 2,000 (94.0%)."""
    result = coverage("M/M/1", 0.5, 100, drift=Drift(round_queries=1000))
    assert result.covered >= 0.93 and abs(result.median_error) <= 0.10
