"""One artifact's runner in its own process, driven block by block over a pipe.

Two runtimes in one process distort each other's tail latency (torch's OpenMP threads
keep spinning after each call and steal the cores onnxruntime needs), so every artifact
gets its own process and only one of them runs at a time while the others wait.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback
from typing import Any

import numpy as np

from serve_bench.errors import BenchError


class WorkerError(BenchError):
    """A worker process failed to load or run its artifact, or stopped answering."""


def batches_of(pool: np.ndarray, batch_size: int) -> list[np.ndarray]:
    count = max(1, len(pool) // batch_size)
    return [pool[i * batch_size:(i + 1) * batch_size] for i in range(count)]


def timed_block(runner, batches: list, staged: list | None, n: int, start: int, concurrency: int) -> tuple[np.ndarray, float]:
    """n requests, inputs rotated from ``start``; returns per-request latencies (ns) and wall time (s)."""
    latencies = np.empty(n, dtype=np.int64)

    def one(i: int) -> None:
        k = (start + i) % len(batches)
        t0 = time.perf_counter_ns()
        if staged is not None:
            runner.run_prepared(staged[k])
        else:
            runner.infer(batches[k])
        latencies[i] = time.perf_counter_ns() - t0

    wall = time.perf_counter()
    if concurrency <= 1:
        for i in range(n):
            one(i)
    else:
        def client(c: int) -> None:
            for i in range(c, n, concurrency):
                one(i)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return latencies, time.perf_counter() - wall


def worker_main(conn, backend: str, path: str, options: dict, pool: np.ndarray, batch_size: int,
                device_only: bool) -> None:
    from serve_bench.runners import make_runner, predict

    try:
        runner = make_runner(backend, path, **options).load()
        batches = batches_of(pool, batch_size)
        staged = [runner.prepare(b) for b in batches] if device_only else None
        conn.send(("ready", runner.info()))
    except Exception as exc:  # report any load failure to the parent instead of dying silently
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        command, *args = conn.recv()
        try:
            if command == "warmup":
                iters, seconds = args
                start = time.perf_counter()
                deadline, done = start + seconds, 0
                while done < iters or time.perf_counter() < deadline:
                    timed_block(runner, batches, staged, 1, done, 1)
                    done += 1
                conn.send(("ok", (done, time.perf_counter() - start)))
            elif command == "block":
                n, start, concurrency = args
                conn.send(("ok", timed_block(runner, batches, staged, n, start, concurrency)))
            elif command == "predict":
                images, eval_batch = args
                conn.send(("ok", predict(runner, images, eval_batch)))
            elif command == "close":
                runner.close()
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


class BenchWorker:
    """Parent-side handle of a worker process; every call waits for its answer."""

    def __init__(self, name: str, backend: str, path: str, options: dict, pool: np.ndarray, batch_size: int,
                 device_only: bool = False, timeout_s: float = 600.0) -> None:
        ctx = mp.get_context("spawn")
        self.name, self.timeout_s = name, timeout_s
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, daemon=True,
                                   args=(child, backend, str(path), options, pool, batch_size, device_only))
        self.process.start()
        self.info = self._answer()

    def _answer(self) -> Any:
        if not self._conn.poll(self.timeout_s):
            self.process.kill()
            raise WorkerError(f"{self.name}: the benchmark worker did not answer within {self.timeout_s:.0f}s")
        status, payload = self._conn.recv()
        if status != "ready" and status != "ok":
            raise WorkerError(f"{self.name}: {payload}")
        return payload

    def call(self, *command: Any) -> Any:
        self._conn.send(command)
        return self._answer()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.call("close")
            except (WorkerError, OSError, EOFError):
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()

    def __enter__(self) -> "BenchWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
