"""A slow end-to-end check of the traffic harness: a sweep through the worker processes (tens of seconds of real
traffic on a simulated model). Queueing theory and the agreement of LoadGen with an independent open-loop client
are timing claims: tested on a fake clock (tests/test_queue_simulation.py) and measured on real time by the
benchmark python -m serve_bench.load.traffic_check."""
from __future__ import annotations

import numpy as np
import pytest

from serve_bench.load.serving_loop import ServingSettings
from serve_bench.latency.traffic import TrafficSettings, measure_traffic
from serve_bench.latency.worker import BenchWorker
from serve_bench.report_model import EntryTraffic, Traffic
from tests.report_invariants import untyped_keys

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # real traffic timed: alone on the machine
POOL = np.zeros((32, 1, 2, 2), dtype=np.float32)


def test_a_sweep_finds_more_load_within_the_budget_with_dynamic_batching():
    """The sweep's plumbing through a worker: per configuration an offline ceiling, server probes at fractions of
    it in rising order and a bisection, a capacity for each, the best configuration and the batching gain, the
    at-target run and the harness overhead. Its timing claims are only those a 2× slowdown cannot overturn: a
    batch of 8 costs 3.4 ms against 16 one by one, an ideal gain of 4.7×, so even a neighbour that slowed only the
    batched runs twice over leaves about 2.3×, and batched > plain holds (the gain's size is the fake clock's to
    test: tests/test_queue_simulation.py). Three rates, short probes and a short precision loop (400
    queries at most) keep it to the structure it checks."""
    model = {"service_ms": 2.0, "per_item_ms": 0.2}
    settings = TrafficSettings(duration_s=0.5, min_queries=100, sweep_min_queries=150, sweep=True, refine=1,
                               rates=[0.25, 0.5, 0.85], warmup_s=0.2, max_queries=400, sweep_max_queries=400,
                               configs=[ServingSettings(), ServingSettings(max_batch=8, max_queue_delay_us=2000)])
    with BenchWorker("sim", "simulated", "-", model, POOL, 1) as worker:
        entries, facts = measure_traffic({"sim": worker}, scenario="server", target_qps=200, budget_ms=20.0,
                                         decision="point", settings=settings, settle_s=0.05,
                                         expected_ms={"sim": 2.0}, null_pool=POOL[:8])
    sweep = entries["sim"]["sweep"]
    plain, batched = (c["capacity"] for c in sweep["configs"])
    assert plain["qps"] and batched["qps"] and batched["qps"] > plain["qps"], (plain, batched)
    assert sweep["best"]["serving"]["max_batch"] == 8 and sweep["batching_gain"]["ratio"] > 1
    for config in sweep["configs"]:
        rates = [r["offered_qps"] for r in config["curve"]]
        assert rates == sorted(rates) and len(rates) >= 3
        assert config["offline"]["completed_qps"] >= max(r["completed_qps"] for r in config["curve"]) * 0.9
    assert entries["sim"]["at_target"]["offered_qps"] == 200
    assert facts["sut_overhead"]["server"]["latency_ms"]["p50"] < 2.0
    # every key of the sweep, its capacities and probes is a field of the report model (and so in the reference)
    assert untyped_keys(EntryTraffic, entries["sim"]) == [] and untyped_keys(Traffic, facts) == []
