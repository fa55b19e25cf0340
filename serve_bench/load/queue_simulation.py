"""The serving loop's batching policy on a fake clock: latency under traffic with answers that do not depend on
how busy the machine is.

Why: a claim such as "the p99 rises with the load and the queue is where it goes" or "a stall once a second
hides in a closed loop" is a claim about queueing and the batching policy, not about this machine's timer.
Measured with real sleeps it holds only as far as the machine wakes threads on time, and a busy neighbour
that delays a wake-up moves a p99. On a fake clock the same policy gives the same figures every time, and
queueing theory (M/M/1, M/D/1, Erlang C) checks them exactly. The same claims on real time are a benchmark
(``python -m serve_bench.load.traffic_check``) that prints its figures beside these.

The policy is :class:`~serve_bench.load.serving_loop.ServingLoop`'s: one FIFO queue shared by ``instances``
servers; an idle instance takes the oldest request, then waits until that request's arrival plus
``max_queue_delay_us`` for more, up to ``max_batch``, starting as soon as the batch is full (with no delay it
takes what has already arrived, up to ``max_batch``). Where the threads race, one rule is chosen: while an
instance waits for its batch to fill, an arrival joins that batch rather than waking another idle instance
(the loop's condition may wake either). With one instance, or ``max_batch`` 1, nothing races.
A service time is a function ``service(batch_size, start_s) -> seconds``, so a stall on a timer or random
draws from a seeded generator are expressed the same way; it is called once per batch, in start order.
"""
from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from serve_bench.load.percentiles import percentiles_ms
from serve_bench.load.serving_loop import ServedRecords, ServingSettings
from serve_bench.load.queue_growth import bounded

log = logging.getLogger(__name__)

ServiceTime = Callable[[int, float], float]


@dataclass
class SimulatedRun:
    """Per request, in arrival order: when it arrived, when its batch started and finished (s on the fake clock)
    and its batch's size; per batch, in start order, how long its instance was busy."""

    arrival_s: np.ndarray
    start_s: np.ndarray
    completion_s: np.ndarray
    batch: np.ndarray
    busy_s: np.ndarray

    @property
    def queue_s(self) -> np.ndarray:
        return self.start_s - self.arrival_s

    @property
    def compute_s(self) -> np.ndarray:
        return self.completion_s - self.start_s

    @property
    def latency_ms(self) -> np.ndarray:
        """Completion minus arrival, as LoadGen's server scenario counts it (from the scheduled send time)."""
        return (self.completion_s - self.arrival_s) * 1e3

    def records(self) -> ServedRecords:
        """The serving loop's own record of the same requests (ns; in arrival order, not completion order, which
        no summary of it depends on), so its summary reads a simulation unchanged."""
        def ns(seconds: np.ndarray) -> np.ndarray:
            return np.rint(seconds * 1e9).astype(np.int64)

        return ServedRecords(ns(self.queue_s), ns(self.compute_s), self.batch.astype(np.int64), ns(self.busy_s))

    def summary(self) -> dict:
        """The figures a LoadGen run reports (latency percentiles, the loop's split, whether the queue kept up)."""
        latency = self.latency_ms
        out = {"queries": int(len(latency)), **self.records().summary()}
        out["latency_ms"] = percentiles_ms(latency)
        out["latency_ms"]["mean"] = round(float(latency.mean()), 6)
        out["sustainable"], out["sustainable_reason"] = self.keeps_up()
        span = float(self.completion_s.max() - self.arrival_s.min()) if len(latency) else 0.0
        out["completed_qps"] = round(len(latency) / span, 3) if span > 0 else None
        return out

    def keeps_up(self) -> tuple[bool | None, str]:
        """The LoadGen runs' verdict on whether the queue stayed bounded, from the same kind of schedule."""
        return bounded(self.arrival_s, self.latency_ms)


def simulate(arrivals_s: np.ndarray, service: ServiceTime, settings: ServingSettings) -> SimulatedRun:
    """Serve requests arriving at ``arrivals_s`` (sorted, s) as the serving loop would, on a fake clock.

    Batches are formed one after another in queue order: the next batch's head is the oldest request not yet
    taken, and the instance free soonest takes it, so no event queue is needed beyond the instances' free times.
    """
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    if arrivals.ndim != 1:
        raise ValueError("arrival times must be a 1-d array")
    if len(arrivals) > 1 and np.any(np.diff(arrivals) < 0):
        raise ValueError("arrival times must be sorted")
    times = arrivals.tolist()  # Python floats: indexing a list is far cheaper than a numpy array in this loop
    n, limit, delay = len(times), settings.max_batch, settings.max_queue_delay_us * 1e-6
    free = [-math.inf] * settings.instances  # when each instance is next idle; a heap
    starts, finishes, sizes = [], [], []
    head = 0
    while head < n:
        ready, arrived = heapq.heappop(free), times[head]
        at = ready if ready > arrived else arrived
        last = min(head + limit, n) - 1
        if delay > 0:
            # it waits for the batch to fill, but not past the head's deadline; a late instance waits no more
            fills = times[last] if last - head + 1 == limit else math.inf
            at = max(at, min(arrived + delay, fills))
        end = head + 1
        while end <= last and times[end] <= at:
            end += 1
        took = end - head
        seconds = float(service(took, at))
        if seconds < 0:
            raise ValueError(f"service time {seconds} s < 0 for a batch of {took}")
        starts.append(at)
        finishes.append(at + seconds)
        sizes.append(took)
        heapq.heappush(free, at + seconds)
        head = end
    counts = np.array(sizes, dtype=np.int64)
    log.debug("simulated %d requests in %d batches on %d instance(s)", n, len(sizes), settings.instances)
    return SimulatedRun(arrivals, np.repeat(np.array(starts), counts), np.repeat(np.array(finishes), counts),
                        np.repeat(counts, counts), np.array(finishes) - np.array(starts))


def closed_loop(service: ServiceTime, count: int | None = None, duration_s: float | None = None) -> SimulatedRun:
    """One request at a time, each sent when the previous one answers (LoadGen's single-stream, a closed-loop
    client): nothing ever queues, so each latency is one service time and a stall delays one request only."""
    if (count is None) == (duration_s is None):
        raise ValueError("give exactly one of count and duration_s")
    sent, done, now = [], [], 0.0
    while (count is not None and len(sent) < count) or (duration_s is not None and now < duration_s):
        finish = now + float(service(1, now))
        sent.append(now)
        done.append(finish)
        now = finish
    arrivals = np.array(sent)
    return SimulatedRun(arrivals, arrivals.copy(), np.array(done), np.ones(len(sent), dtype=np.int64),
                        np.array(done) - arrivals)


def poisson_arrivals(rate: float, count: int | None = None, duration_s: float | None = None,
                     seed: int = 0) -> np.ndarray:
    """Arrival times (s) of a Poisson process at ``rate`` per second: ``count`` of them, or all before
    ``duration_s``. The gaps are one seeded unit-rate draw divided by the rate, so with the same seed and count
    a higher rate is the same schedule compressed (comparisons between rates are not blurred by new draws)."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if (count is None) == (duration_s is None):
        raise ValueError("give exactly one of count and duration_s")
    rng = np.random.default_rng(seed)
    if count is not None:
        return np.cumsum(rng.standard_exponential(count)) / rate
    times = np.cumsum(rng.standard_exponential(int(rate * duration_s * 1.2) + 64)) / rate
    while times[-1] < duration_s:  # rarely: the draw fell short of the duration
        times = np.concatenate([times, times[-1] + np.cumsum(rng.standard_exponential(len(times))) / rate])
    return times[times < duration_s]


def fixed_service(service_s: float, per_item_s: float = 0.0) -> ServiceTime:
    """A batch of ``b`` takes ``service_s + per_item_s × (b − 1)``: what batching saves is the per-batch part."""
    return lambda size, start: service_s + per_item_s * (size - 1)


def exponential_service(mean_s: float, seed: int) -> ServiceTime:
    """Exponentially distributed service times (an M/M/· server) from a seeded generator, drawn in blocks."""
    rng, block = np.random.default_rng(seed), []

    def draw(size: int, start: float) -> float:
        if not block:
            block.extend((rng.standard_exponential(4096) * mean_s).tolist()[::-1])
        return block.pop()

    return draw


def runner_service(service_ms: float = 0.0, per_item_ms: float = 0.0, stall_every_s: float = 0.0,
                   stall_ms: float = 0.0) -> ServiceTime:
    """The simulated runner's service time (its options, in its units) with its clock made fake: per batch
    ``service_ms`` plus ``per_item_ms`` per input after the first, and ``stall_ms`` more on the first batch that
    starts at least ``stall_every_s`` after the last stall (the first one that long after loading, at time 0)."""
    next_stall = [stall_every_s]

    def service(size: int, start: float) -> float:
        pause = (service_ms + per_item_ms * (size - 1)) / 1e3
        if stall_every_s > 0 and start >= next_stall[0]:
            pause += stall_ms / 1e3
            next_stall[0] = start + stall_every_s
        return pause

    return service


def single_server_fifo(arrivals_s: np.ndarray, services_s: np.ndarray) -> SimulatedRun:
    """One instance, batches of one: :func:`simulate` by Lindley's recursion in closed form, vectorised.

    Why: a known-answer check of a p99 estimator needs hundreds of runs of tens of thousands of requests;
    the event loop takes about a microsecond per request in Python, this a few nanoseconds. Each request starts
    at ``max(arrival, previous completion)``, so with ``d_i = completion_i − arrival_i`` the waiting time is
    ``W_i = C_i − min_{j≤i} C_j`` for the partial sums ``C`` of ``service_{i−1} − gap_i`` (C_0 = 0)."""
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    services = np.asarray(services_s, dtype=np.float64)
    if arrivals.shape != services.shape or arrivals.ndim != 1:
        raise ValueError("one service time per arrival, as 1-d arrays")
    steps = services[:-1] - np.diff(arrivals)
    partial = np.concatenate([[0.0], np.cumsum(steps)])
    wait = partial - np.minimum.accumulate(partial)
    start = arrivals + wait
    n = len(arrivals)
    return SimulatedRun(arrivals, start, start + services, np.ones(n, dtype=np.int64), services.copy())
