"""An open-loop client independent of LoadGen, to check LoadGen's figures against.

Its own Poisson schedule (exponential gaps from numpy's generator), one sender thread that
submits each request at its scheduled time whatever the server is doing, and each latency
counted from the scheduled time to the answer: the same definition as LoadGen's server
scenario, reached by other code. One point measured both ways should agree within noise.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from serve_bench.load.percentiles import percentiles_ms
from serve_bench.load.serving_loop import ServingLoop


def poisson_schedule(qps: float, duration_s: float, seed: int) -> np.ndarray:
    """Send times (s from the start) of a Poisson process at ``qps`` over ``duration_s``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / qps, size=int(qps * duration_s * 1.2) + 16)
    times = np.cumsum(gaps)
    return times[times < duration_s]


def run_open_loop(loop: ServingLoop, sample_count: int, qps: float, duration_s: float, seed: int = 1,
                  keep_raw: bool = False) -> dict:
    """Latency percentiles (ms, from the scheduled send time) of ``loop`` under its own Poisson schedule;
    ``keep_raw`` adds each query's latency (``latencies_ms``, in schedule order)."""
    schedule = poisson_schedule(qps, duration_s, seed)
    if not len(schedule):  # else it would wait its whole timeout for answers to no query
        raise ValueError(f"an open-loop check at {qps:g}/s over {duration_s:g} s schedules no query: raise the rate "
                         "or the duration")
    done_at = np.zeros(len(schedule), dtype=np.int64)
    finished = threading.Event()
    remaining = [len(schedule)]
    lock = threading.Lock()

    def done(tags: list) -> None:
        now = time.perf_counter_ns()
        for tag in tags:
            done_at[tag] = now
        with lock:
            remaining[0] -= len(tags)
            if remaining[0] == 0:
                finished.set()

    loop.done = done
    loop.start()
    start_ns = time.perf_counter_ns()
    scheduled_ns = start_ns + (schedule * 1e9).astype(np.int64)
    try:
        for i, at in enumerate(scheduled_ns):
            wait = (at - time.perf_counter_ns()) / 1e9
            if wait > 0.0005:
                time.sleep(wait - 0.0003)  # sleep most of the gap, then spin to the scheduled instant
            while time.perf_counter_ns() < at:
                pass
            loop.submit([(i, i % sample_count)])
        finished.wait(timeout=max(60.0, 10 * duration_s))
    finally:
        served = loop.stop()
    if not finished.is_set():
        raise TimeoutError(f"the open-loop check at {qps:g}/s did not get every answer back within its timeout")
    latencies = (done_at - scheduled_ns) / 1e6
    return {"qps": qps, "queries": len(schedule),
            "latency_ms": percentiles_ms(latencies),
            "mean_ms": round(float(latencies.mean()), 6), **served.summary(),
            **({"latencies_ms": latencies} if keep_raw else {})}
