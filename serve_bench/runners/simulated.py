"""A model with a known service time, for testing the harness against queueing theory."""
from __future__ import annotations

import threading
import time

import numpy as np

from serve_bench.runners.base import Runner


class SimulatedRunner(Runner):
    """A model with a known service time (sleeping, so other threads run meanwhile), for the harness itself.

    Queueing theory gives the latency such a model must show under a given load (M/D/1 for a fixed
    service time under Poisson arrivals), so it tests the load generator, the serving loop and every
    rule built on them; with ``service_ms=0`` it measures the harness's own overhead per query.
    Options: ``service_ms`` per batch, ``per_item_ms`` added per input after the first (what batching
    saves), ``stall_every_s``/``stall_ms`` (a pause of ``stall_ms`` once per period, like a garbage
    collector), ``classes`` (width of the zero logits it answers).
    """

    runtime = "simulated"

    def _load(self) -> None:
        self._service_s = float(self.options.get("service_ms", 0.0)) / 1e3
        self._per_item_s = float(self.options.get("per_item_ms", 0.0)) / 1e3
        self._stall_every_s = float(self.options.get("stall_every_s", 0.0))
        self._stall_s = float(self.options.get("stall_ms", 0.0)) / 1e3
        self._classes = int(self.options.get("classes", 10))
        self._next_stall = time.perf_counter() + self._stall_every_s
        self._lock = threading.Lock()
        self._precise = threading.local()

    def _run(self, staged):
        if not getattr(self._precise, "done", False):
            _tight_timer_slack()
            self._precise.done = True
        pause = self._service_s + self._per_item_s * (len(staged) - 1)
        if self._stall_every_s > 0:
            with self._lock:
                now = time.perf_counter()
                if now >= self._next_stall:
                    pause += self._stall_s
                    self._next_stall = now + self._stall_every_s
        if pause > 0:
            time.sleep(pause)
        return np.zeros((len(staged), self._classes), dtype=np.float32)

    def info(self) -> dict:
        return {**super().info(), "simulated": {k: self.options.get(k) for k in
                                                ("service_ms", "per_item_ms", "stall_every_s", "stall_ms")}}


def _tight_timer_slack() -> None:
    """Let this thread's sleeps end within ~1 µs of their time instead of Linux's default 50 µs slack, so a
    simulated service time is close to fixed (measured here: sleep(1 ms) took 1.16 ± 0.20 ms by default,
    1.08 ± 0.09 ms with 1 µs slack). Elsewhere than Linux nothing changes and the service time is measured."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns; per thread
    except (OSError, AttributeError):
        pass


