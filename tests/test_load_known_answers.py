"""Slow known-answer checks of the traffic harness: queueing theory, an independent open-loop client, and a
sweep through the worker processes (each tens of seconds of real traffic on a simulated model)."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.load.loadgen_scenarios import ScenarioSettings, run_scenario
from serve_bench.load.open_loop import run_open_loop
from serve_bench.load.serving_loop import ServingLoop, ServingSettings
from serve_bench.load.traffic import TrafficSettings, measure_traffic
from serve_bench.runners import make_runner
from serve_bench.worker import BenchWorker

pytestmark = pytest.mark.slow
POOL = np.zeros((32, 1, 2, 2), dtype=np.float32)


def loop_of(**model) -> ServingLoop:
    runner = make_runner("simulated", "-", **model).load()
    return ServingLoop([runner.infer], POOL, ServingSettings(), done=lambda tags: None)


def test_a_fixed_service_time_under_poisson_load_at_half_utilisation_waits_as_md1_says():
    """M/D/1: mean wait in the queue ρs / (2(1 − ρ)), s the server's time per request (model and answering)."""
    loop = loop_of(service_ms=4.0)
    calibration = run_scenario(loop, len(POOL), ScenarioSettings(scenario="single-stream", duration_s=1.0,
                                                                 min_queries=100, expected_latency_ms=4.0))
    qps = 0.5 / (calibration["service_ms"]["mean"] / 1e3)  # ρ = 0.5 for the server as measured
    run = run_scenario(loop, len(POOL), ScenarioSettings(scenario="server", target_qps=qps, duration_s=20.0,
                                                         min_queries=100, target_latency_ms=100.0))
    s = run["service_ms"]["mean"]
    rho = run["scheduled_qps"] * s / 1e3
    expected = rho * s / (2 * (1 - rho))
    assert 0.42 < rho < 0.58, rho
    assert run["queue_ms"]["mean"] == pytest.approx(expected, rel=0.15), (run["queue_ms"], expected, rho, s)


def test_loadgen_agrees_with_an_independent_open_loop_client_at_one_rate():
    """The same rate through LoadGen and through our own Poisson client, alternating in short stretches so the
    machine's drift (a 2.2 against 2.4 ms service time from one minute to the next) hits both alike."""
    model, theirs, ours = {"service_ms": 2.0}, [], []
    for stretch in range(8):
        theirs.append(run_scenario(loop_of(**model), len(POOL), ScenarioSettings(
            scenario="server", target_qps=150, duration_s=2.5, min_queries=100, seed=stretch), keep_raw=True)
            ["latencies_ms"])
        ours.append(run_open_loop(loop_of(**model), len(POOL), qps=150, duration_s=2.5, seed=100 + stretch,
                                  keep_raw=True)["latencies_ms"])
    theirs, ours = np.concatenate(theirs), np.concatenate(ours)
    assert len(theirs) > 2400 and len(ours) > 2400
    # Two samples of the same queue differ by chance, most at the tail: in an M/D/1 simulation at this load (2.2 ms
    # service, 150/s), the p99s of two runs of 1,250 queries differed by more than 15% 18% of the time, of 2,500
    # queries by more than 30% 0.3% of the time; p50 and p90 stayed within 15%. On two shared cores the machine's
    # own stalls add to the tail (a CI run measured p99 9.9 ms here against LoadGen's 15.8 with p50 and p90 alike),
    # so agreement rests on p50 and p90; the p99 is held to the same order (within 2×).
    for q in (50, 90):
        assert np.percentile(ours, q) == pytest.approx(np.percentile(theirs, q), rel=0.15), q
    assert 0.5 < np.percentile(ours, 99) / np.percentile(theirs, 99) < 2.0
    assert ours.mean() == pytest.approx(theirs.mean(), rel=0.2)


def test_a_sweep_finds_more_load_within_the_budget_with_dynamic_batching():
    model = {"service_ms": 2.0, "per_item_ms": 0.2}  # a batch of 8: 3.4 ms instead of 16
    settings = TrafficSettings(duration_s=1.0, min_queries=100, sweep=True, refine=1,
                               configs=[ServingSettings(), ServingSettings(max_batch=8, max_queue_delay_us=2000)])
    with BenchWorker("sim", "simulated", "-", model, POOL, 1) as worker:
        entries, facts = measure_traffic({"sim": worker}, scenario="server", target_qps=200, budget_ms=20.0,
                                         decision="point", settings=settings, settle_s=0.05,
                                         expected_ms={"sim": 2.0}, null_pool=POOL[:8])
    sweep = entries["sim"]["sweep"]
    plain, batched = (c["capacity"] for c in sweep["configs"])
    assert plain["qps"] and batched["qps"] and batched["qps"] > 1.5 * plain["qps"], (plain, batched)
    assert sweep["best"]["serving"]["max_batch"] == 8 and sweep["batching_gain"]["ratio"] > 1.5
    for config in sweep["configs"]:
        rates = [r["offered_qps"] for r in config["curve"]]
        assert rates == sorted(rates) and len(rates) >= 3
        assert config["offline"]["completed_qps"] >= max(r["completed_qps"] for r in config["curve"]) * 0.9
    assert entries["sim"]["at_target"]["offered_qps"] == 200
    assert facts["sut_overhead"]["server"]["latency_ms"]["p50"] < 2.0
