"""Whether a server test's queue stayed bounded: the verdict "not sustainable" rests on, from each query's scheduled
time and latency alone. Apart from the steady-state p99 (serve_bench.load.steady_state), whose busy periods it reads:
a p99 says how long the queries took, this says whether the queue would have kept growing had the test gone on."""
from __future__ import annotations

import numpy as np

from serve_bench.load.steady_state import MIN_QUERIES, complete_cycles


def bounded(schedule_s: np.ndarray, latencies_ms: np.ndarray) -> tuple[bool | None, str]:
    """Whether the queue stayed bounded: ``True``, ``False``, or ``None`` (unknown, under ``MIN_QUERIES``).

    A stable queue keeps emptying; one that grows does not, and holds more and more queries. Two signs:
    - when the last query is scheduled, far more queries are still in the system than Little's law allows a
      stable queue (arrival rate × the mean latency of the complete cycles, ×3, and at least 20);
    - the server never emptied again after the first half of the schedule: the open last busy period holds
      more than half of the queries and its latency climbed through it (its last quarter's median at least
      twice its first quarter's). Where it holds more than a quarter without that, the verdict is unknown.
    Neither compares the end of the run with its start (the fill-up from an empty queue), which flagged stable
    queues near load.
    """
    schedule = np.asarray(schedule_s, dtype=np.float64)
    latencies = np.asarray(latencies_ms, dtype=np.float64)
    n = len(latencies)
    if n < MIN_QUERIES:
        return None, f"unknown: {n} queries, fewer than the {MIN_QUERIES} a verdict on the queue needs"
    cycles, open_queries = complete_cycles(schedule, latencies)
    end = schedule[-1]
    if end > schedule[0]:
        rate = (n - 1) / (end - schedule[0])
        steady_mean = float(np.mean(np.concatenate(cycles))) if cycles else float(np.mean(latencies))
        stable = 3 * rate * steady_mean / 1e3
        waiting = int(np.sum(schedule + latencies / 1e3 > end))
        if waiting > max(20.0, stable):
            return False, (f"not sustainable: {waiting} queries were still in the system when the last one was "
                           f"scheduled, where a stable queue holds about {stable / 3:.1f} (the queue grows "
                           "without bound)")
    if open_queries > n / 4:
        tail = latencies[n - open_queries:]
        quarter = max(len(tail) // 4, 1)
        early, late = float(np.median(tail[:quarter])), float(np.median(tail[-quarter:]))
        if open_queries > n / 2 and late >= 2 * early:
            return False, (f"not sustainable: the server never emptied after query {n - open_queries + 1} of {n}, "
                           f"and latency climbed through that busy period from a median {early:.3f} ms to "
                           f"{late:.3f} ms (the queue grows without bound)")
        return None, (f"unknown: the server never emptied in the last {open_queries} of {n} queries, so the run "
                      "cannot tell a long busy period from a queue that grows")
    return True, "sustainable"
