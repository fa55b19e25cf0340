"""A dynamic batcher in front of ``instances`` copies of one model, as an inference server runs it.

Requests wait in one shared queue; each instance takes the oldest request and waits at most
``max_queue_delay_us`` (counted from that request's arrival) for more, up to ``max_batch``,
then runs them as one batch: Triton's dynamic batcher and instance groups, in one process.
Each request's time is split in two and kept: the time it waited in the queue (arrival to the
start of its batch) and the time in the model (its batch's run). A closed-loop P99 hides the
first; under traffic it is usually most of the P99.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class ServingSettings(BaseModel):
    """One serving configuration: how requests are batched and how many model copies serve them."""

    model_config = ConfigDict(extra="forbid")
    max_batch: int = Field(1, ge=1, description="largest batch the dynamic batcher forms (1: no batching)")
    max_queue_delay_us: int = Field(0, ge=0, description="how long the oldest request may wait for others to "
                                                         "join its batch")
    instances: int = Field(1, ge=1, description="copies of the model serving the one queue (each its own session)")
    threads: int | None = Field(None, ge=1, description="intra-op threads per instance; default: the physical "
                                                        "cores but one (the load generator and batcher need one)")

    def label(self) -> str:
        threads = self.threads if self.threads is not None else "default"
        return (f"batch≤{self.max_batch}, delay {self.max_queue_delay_us} µs, {self.instances} instance"
                f"{'s' if self.instances > 1 else ''} × {threads} threads")


@dataclass
class ServedRecords:
    """Per served request, in completion order: queue wait and model time (ns), and its batch's size; per batch,
    how long its instance was busy with it (the model, then handing the answers back), i.e. the service time a
    queue model of this server needs."""

    queue_ns: np.ndarray
    compute_ns: np.ndarray
    batch: np.ndarray
    busy_ns: np.ndarray | None = None

    def summary(self) -> dict:
        def ms(values: np.ndarray) -> dict:
            if len(values) == 0:
                return {"mean": None, "p50": None, "p99": None}
            x = values.astype(np.float64) / 1e6
            return {"mean": round(float(x.mean()), 6), "p50": round(float(np.percentile(x, 50)), 6),
                    "p99": round(float(np.percentile(x, 99)), 6)}

        busy = self.busy_ns if self.busy_ns is not None else np.zeros(0)
        return {"queue_ms": ms(self.queue_ns), "compute_ms": ms(self.compute_ns),
                "service_ms": {**ms(busy), "mean_square": round(float(np.mean((busy / 1e6) ** 2)), 6)
                               if len(busy) else None},
                "mean_batch": mean_batch(self.batch)}


def mean_batch(batch_of_request: np.ndarray) -> float | None:
    """The mean size of a batch, each batch counted once: requests over batches. ``batch_of_request`` holds each
    request's batch size, so a batch of b is b entries of b and counts 1/b per entry (a batch of 1 and one of 7
    are 2 batches of mean 4; the per-request mean would read 6.25)."""
    if not len(batch_of_request):
        return None
    return round(float(len(batch_of_request) / np.sum(1.0 / batch_of_request)), 4)


class ServingLoop:
    """Serve requests ``(tag, sample_index)`` from ``pool`` with ``infer_fns`` (one per instance).

    ``done(tags)`` is called from the instance thread when a batch has its answers; it must be
    cheap (LoadGen's completion call). ``start``/``stop`` bound one measurement; ``records``
    returns what was served since ``start``.
    """

    def __init__(self, infer_fns: Sequence[Callable[[np.ndarray], object]], pool: np.ndarray,
                 settings: ServingSettings, done: Callable[[list], None]) -> None:
        if len(infer_fns) != settings.instances:
            raise ValueError(f"{len(infer_fns)} model copies for {settings.instances} instances")
        self.pool, self.settings, self.done = pool, settings, done
        self._infer = list(infer_fns)
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._running = False
        self._threads: list[threading.Thread] = []
        self._queue_ns: list[int] = []
        self._compute_ns: list[int] = []
        self._batch: list[int] = []
        self._busy_ns: list[int] = []
        self.errors: list[str] = []

    def start(self) -> None:
        self._queue_ns, self._compute_ns, self._batch, self._busy_ns, self.errors = [], [], [], [], []
        self._running = True
        self._threads = [threading.Thread(target=self._serve, args=(fn,), daemon=True, name=f"instance-{i}")
                         for i, fn in enumerate(self._infer)]
        for thread in self._threads:
            thread.start()

    def submit(self, requests: Sequence[tuple[object, int]]) -> None:
        now = time.perf_counter_ns()
        with self._cond:
            self._queue.extend((tag, index, now) for tag, index in requests)
            self._cond.notify(len(requests))

    def stop(self) -> ServedRecords:
        with self._cond:
            self._running = False
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=60)
        return ServedRecords(np.array(self._queue_ns, dtype=np.int64), np.array(self._compute_ns, dtype=np.int64),
                             np.array(self._batch, dtype=np.int64), np.array(self._busy_ns, dtype=np.int64))

    def _take(self) -> list | None:
        """The next batch: the oldest request, and others that arrive before its delay runs out."""
        limit, delay_ns = self.settings.max_batch, self.settings.max_queue_delay_us * 1000
        with self._cond:
            while not self._queue:
                if not self._running:
                    return None
                self._cond.wait(0.05)
            batch = [self._queue.popleft()]
            deadline = batch[0][2] + delay_ns
            while len(batch) < limit:
                if self._queue:
                    batch.append(self._queue.popleft())
                    continue
                left = deadline - time.perf_counter_ns()
                if left <= 0 or not self._running:
                    break
                self._cond.wait(left / 1e9)
            return batch

    def _serve(self, infer: Callable[[np.ndarray], object]) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            start = time.perf_counter_ns()
            try:
                infer(self.pool[[index for _, index, _ in batch]])
            except Exception as exc:  # answer the queries anyway so the load generator can finish and report
                log.error("serving instance failed: %s", exc)
                self.errors.append(f"{type(exc).__name__}: {exc}")
            end = time.perf_counter_ns()
            self._queue_ns.extend(start - arrived for _, _, arrived in batch)
            self._compute_ns.extend([end - start] * len(batch))
            self._batch.extend([len(batch)] * len(batch))
            self.done([tag for tag, _, _ in batch])
            self._busy_ns.append(time.perf_counter_ns() - start)
