"""Latency under traffic on real time, beside the fake clock's answer. A benchmark of the machine, not a test.

    python -m serve_bench.load.traffic_check [--seconds 3] [--json OUT]

Every line is one claim measured with MLPerf LoadGen driving the real serving loop in front of the simulated
model (a sleep of known length), and in brackets the figure the fake-clock simulation of the same policy
(serve_bench.load.queue_simulation) or queueing theory gives, fed the service time this run measured:
- ``load``: at 50, 225 and 330/s on a 2 ms service (ρ ≈ 0.1, 0.45, 0.66), the p99, the mean wait in the queue
  and the mean time in the model. The p99 should rise with the load, the queue taking all of the rise.
- ``stall``: 0.5 ms service with a 50 ms stall once a second (the first one second after loading, so runs last
  3 × ``--seconds``). The closed-loop (single-stream) p99 should stay near the service time, the open-loop
  (server, 500/s) p99 near 43 ms, since every request arriving during a stall waits for it.
- ``offline``: throughput at batch 1 and batch ≤ 8 when a batch costs 2 ms + 0.2 ms per extra input; theory
  500/s and 8 / 3.4 ms = 2,353/s, 4.7×.
- ``md1``: the mean wait at ρ ≈ 0.5 (4 ms service, the rate set from a single-stream calibration) against
  Pollaczek–Khinchine, ρs / (2(1 − ρ)), with the run's own ρ and service time. Over 4 × ``--seconds`` of
  traffic a mean wait spreads by chance by about 9% (one standard deviation, 1,500 queries at the default),
  more for shorter runs.
- ``agree``: LoadGen against the independent open-loop client (serve_bench.load.open_loop) at 150/s on a 2 ms
  service, in alternating stretches so that a drift of the machine hits both alike; p50/p90/p99 of each.

Why a benchmark: a sleep overshoots by the machine's wake-up delay, and on a shared machine a busy neighbour
delays wake-ups by milliseconds at random, so these figures move with the machine and cannot be asserted on.
The claims themselves are tested with known answers on the fake clock (tests/test_queue_simulation.py); the
gap between a line's two figures is what this machine adds. ``--seconds`` scales every run.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from serve_bench.load.loadgen_scenarios import ScenarioSettings, run_scenario
from serve_bench.load.open_loop import run_open_loop
from serve_bench.load.queue_simulation import (closed_loop, fixed_service, poisson_arrivals, runner_service,
                                               simulate)
from serve_bench.load.serving_loop import ServingLoop, ServingSettings
from serve_bench.load.steady_state import steady_p99
from serve_bench.runners import SimulatedRunner, make_runner
from train.atomic_io import atomic_write_text

POOL = np.zeros((32, 1, 2, 2), dtype=np.float32)
ONE = ServingSettings()
BATCHED = ServingSettings(max_batch=8, max_queue_delay_us=2000)
STALL = {"service_ms": 0.5, "stall_every_s": 1.0, "stall_ms": 50.0}
QUANTILES = (50, 90, 99)


def loop_of(serving: ServingSettings = ONE, **model) -> ServingLoop:
    """The simulated model (options ``model``) behind a serving loop, one copy per instance, in this process."""
    copies = [make_runner(SimulatedRunner.runtime, "-", **model).load() for _ in range(serving.instances)]
    return ServingLoop([c.infer for c in copies], POOL, serving, done=lambda tags: None)


def server(qps: float, seconds: float, seed: int = 0) -> ScenarioSettings:
    return ScenarioSettings(scenario="server", target_qps=qps, duration_s=seconds, min_queries=1,
                            target_latency_ms=100.0, seed=seed)


def percentiles(latencies_ms: np.ndarray) -> list[float]:
    return [round(float(np.percentile(latencies_ms, q)), 3) for q in QUANTILES]


def load_claim(seconds: float) -> list[dict]:
    rows = []
    for qps in (50, 225, 330):
        run = run_scenario(loop_of(service_ms=2.0), len(POOL), server(qps, seconds))
        s_ms = run["service_ms"]["mean"]
        simulated = simulate(poisson_arrivals(qps, count=50_000, seed=1), fixed_service(s_ms / 1e3), ONE)
        fake = simulated.summary()  # its p99 by the measured run's own estimator (complete busy periods)
        fake["latency_ms"]["p99"] = steady_p99([(simulated.arrival_s, simulated.latency_ms)]).point
        row = {"qps": qps, "service_ms": s_ms, "rho": round(qps * s_ms / 1e3, 3), "sustainable": run["sustainable"]}
        for key, real, sim in (("p99_ms", run["latency_ms"]["p99"], fake["latency_ms"]["p99"]),
                               ("queue_ms", run["queue_ms"]["mean"], fake["queue_ms"]["mean"]),
                               ("model_ms", run["compute_ms"]["mean"], fake["compute_ms"]["mean"])):
            row[key] = {"measured": real, "fake_clock": sim}
        rows.append(row)
        queue = {True: "", False: ", NOT sustainable", None: ", sustainability unknown"}[run["sustainable"]]
        print(f"load   {qps:>4}/s (ρ {row['rho']:.2f}, service {s_ms:.3f} ms): p99 {row['p99_ms']['measured']:.3f} "
              f"ms [{row['p99_ms']['fake_clock']:.3f}], queue mean {row['queue_ms']['measured']:.3f} ms "
              f"[{row['queue_ms']['fake_clock']:.3f}], model mean {row['model_ms']['measured']:.3f} ms "
              f"[{row['model_ms']['fake_clock']:.3f}]{queue}",
              flush=True)
    return rows


def stall_claim(seconds: float) -> dict:
    length = 3 * seconds
    closed = run_scenario(loop_of(**STALL), len(POOL), ScenarioSettings(
        scenario="single-stream", duration_s=length, min_queries=1, expected_latency_ms=0.6))
    opened = run_scenario(loop_of(**STALL), len(POOL), server(500, length))
    service = {**STALL, "service_ms": closed["latency_ms"]["p50"]}  # the service time as this machine sleeps it
    fake_closed = closed_loop(runner_service(**service), duration_s=length)
    fake_open = simulate(poisson_arrivals(500, duration_s=length, seed=1), runner_service(**service), ONE)
    out = {"closed_p99_ms": {"measured": closed["latency_ms"]["p99"],
                             "fake_clock": round(float(np.percentile(fake_closed.latency_ms, 99)), 3)},
           "closed_max_ms": closed["loadgen"]["max_ms"],
           "open_p99_ms": {"measured": opened["latency_ms"]["p99"],
                           "fake_clock": round(float(np.percentile(fake_open.latency_ms, 99)), 3)}}
    print(f"stall  closed-loop p99 {out['closed_p99_ms']['measured']:.3f} ms [{out['closed_p99_ms']['fake_clock']:.3f}]"
          f" (max {out['closed_max_ms']:.1f} ms: the stalls happened); open loop at 500/s p99 "
          f"{out['open_p99_ms']['measured']:.3f} ms [{out['open_p99_ms']['fake_clock']:.3f}]; stall 50 ms",
          flush=True)
    return out


def offline_claim(seconds: float) -> dict:
    model = {"service_ms": 2.0, "per_item_ms": 0.2}
    one = run_scenario(loop_of(**model), len(POOL), ScenarioSettings(
        scenario="offline", target_qps=500, duration_s=seconds, min_queries=1))
    eight = run_scenario(loop_of(BATCHED, **model), len(POOL), ScenarioSettings(
        scenario="offline", target_qps=2353, duration_s=seconds, min_queries=1))
    out = {"batch1_qps": {"measured": one["completed_qps"], "theory": 500.0},
           "batch8_qps": {"measured": eight["completed_qps"], "theory": round(8 / 3.4e-3, 1)},
           "mean_batch": eight["mean_batch"]}
    ratio = eight["completed_qps"] / one["completed_qps"]
    out["ratio"] = {"measured": round(ratio, 3), "theory": round(16 / 3.4, 3)}
    print(f"offline batch 1: {one['completed_qps']:,.0f}/s [500]; batch ≤ 8: {eight['completed_qps']:,.0f}/s "
          f"[2,353], mean batch {eight['mean_batch']:.2f} [8]; ratio {ratio:.2f} [4.71]", flush=True)
    return out


def md1_claim(seconds: float) -> dict:
    loop = loop_of(service_ms=4.0)
    calibration = run_scenario(loop, len(POOL), ScenarioSettings(
        scenario="single-stream", duration_s=max(0.5, seconds / 3), min_queries=50, expected_latency_ms=4.0))
    qps = 0.5 / (calibration["service_ms"]["mean"] / 1e3)  # ρ = 0.5 for the server as measured
    run = run_scenario(loop, len(POOL), server(qps, 4 * seconds))
    s_ms = run["service_ms"]["mean"]
    rho = run["scheduled_qps"] * s_ms / 1e3
    theory = rho * s_ms / (2 * (1 - rho))
    out = {"qps": round(qps, 3), "rho": round(rho, 4), "service_ms": s_ms, "queries": run["queries"],
           "queue_ms": {"measured": run["queue_ms"]["mean"], "theory": round(theory, 4)}}
    print(f"md1    at {qps:.1f}/s (ρ {rho:.3f}, service {s_ms:.3f} ms, {run['queries']} queries): mean wait "
          f"{run['queue_ms']['mean']:.3f} ms [Pollaczek–Khinchine {theory:.3f}]", flush=True)
    return out


def agree_claim(seconds: float, stretches: int = 4) -> dict:
    theirs, ours, service = [], [], []
    for stretch in range(stretches):
        run = run_scenario(loop_of(service_ms=2.0), len(POOL), server(150, seconds, seed=stretch), keep_raw=True)
        theirs.append(run["latencies_ms"])
        service.append(run["service_ms"]["mean"])
        ours.append(run_open_loop(loop_of(service_ms=2.0), len(POOL), qps=150, duration_s=seconds,
                                  seed=100 + stretch, keep_raw=True)["latencies_ms"])
    theirs, ours = np.concatenate(theirs), np.concatenate(ours)
    s_ms = float(np.mean(service))
    fake = simulate(poisson_arrivals(150, count=50_000, seed=1), fixed_service(s_ms / 1e3), ONE)
    out = {"loadgen_ms": percentiles(theirs), "open_loop_ms": percentiles(ours), "fake_clock_ms":
           percentiles(fake.latency_ms), "queries": [len(theirs), len(ours)], "service_ms": round(s_ms, 4)}
    words = "/".join(f"p{q}" for q in QUANTILES)
    print(f"agree  at 150/s, {words}: LoadGen {out['loadgen_ms']} ms ({len(theirs)} queries), open-loop client "
          f"{out['open_loop_ms']} ms ({len(ours)}) [{out['fake_clock_ms']}, service {s_ms:.3f} ms]", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_bench.load.traffic_check", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run, s (the stall, M/D/1 and "
                                                                   "agreement runs are multiples of it)")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        print("error: --seconds must be > 0", file=sys.stderr)
        return 2
    print("measured [fake clock or theory, with this run's service time]", flush=True)
    figures = {"seconds": args.seconds, "load": load_claim(args.seconds), "stall": stall_claim(args.seconds),
               "offline": offline_claim(args.seconds), "md1": md1_claim(args.seconds),
               "agree": agree_claim(args.seconds)}
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
