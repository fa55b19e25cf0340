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


class ServingCopies:
    """The model copies a serving configuration needs, made once per (instances, threads) and reused.

    The runner the closed-loop blocks time is the first copy whenever its thread count matches, so
    a one-instance configuration serves with the very session that was timed.
    """

    def __init__(self, runner, runtime: str, path: str, options: dict) -> None:
        self.runner, self.runtime, self.path, self.options = runner, runtime, path, options
        self._key: tuple | None = None
        self._extra: list = []

    def get(self, instances: int, threads: int | None) -> list:
        from serve_bench.runners import make_runner

        threads = threads or serving_threads()
        key = (instances, threads)
        reuse = threads == self.runner.threads  # the timed runner serves as the first copy
        if key != self._key:
            self.close()
            self._extra = [make_runner(self.runtime, self.path, **{**self.options, "threads": threads}).load()
                           for _ in range(instances - 1 if reuse else instances)]
            self._key = key
        copies = ([self.runner] if reuse else []) + self._extra
        self.runner.use_threads(threads)  # a process-wide pool (torch's): the copies share it, sized as asked
        return [copy.infer for copy in copies]

    def restore(self) -> None:
        """Give the closed-loop runner back its own thread count (torch's is process-wide)."""
        self.runner.use_threads(self.runner.threads)

    def close(self) -> None:
        for copy in self._extra:
            copy.close()
        self._extra, self._key = [], None


def serving_threads() -> int:
    """Intra-op threads per model copy under traffic when the configuration does not say: the physical cores
    but one, which the load generator, the batcher and the answers need. Measured on 2 cores (AVX2), pruned
    ResNet-18 at 64×64 in torch: 4.7 ms per request closed loop with 2 threads, but 14.8 ms inside the
    serving loop (its threads time-sliced against LoadGen's), so 100 queries/s never drained; with 1 thread
    7.4 ms closed loop and 7.3 ms inside the loop."""
    from serve_bench.runners import physical_cores

    return max(1, physical_cores() - 1)


def serve(copies: ServingCopies, pool: np.ndarray, serving: dict, drive) -> dict:
    """One test of this artifact behind a serving loop configured by ``serving``: the copies warmed at every
    batch size first, ``drive(loop)`` (LoadGen, or the open-loop client) run, torch's threads given back."""
    from serve_bench.load.serving_loop import ServingLoop, ServingSettings

    settings = ServingSettings(**serving)
    infer = copies.get(settings.instances, settings.threads)
    warm(infer, pool, settings.max_batch)
    try:
        result = drive(ServingLoop(infer, pool, settings, done=lambda tags: None))
    finally:
        copies.restore()
    return {**result, "serving": {**settings.model_dump(), "threads": settings.threads or serving_threads()}}


def warm(infer: list, pool: np.ndarray, max_batch: int, rounds: int = 2) -> None:
    """Run every copy at every batch size the batcher may form before LoadGen starts: a first call at a new
    shape (a fresh session, oneDNN's kernels for that batch) can take 100 ms, and at 500 queries/s that alone
    queues 50 of them and moves the p99 the gate reads."""
    for fn in infer:
        for size in range(1, max_batch + 1):
            for _ in range(rounds):
                fn(pool[:size])


def worker_main(conn, runtime: str, path: str, options: dict, pool: np.ndarray, batch_size: int,
                device_only: bool) -> None:
    from serve_bench.runners import make_runner, predict

    try:
        options = dict(options)
        nms = options.pop("postprocess", None)
        predict_as = options.pop("predict_as", "logits")
        model = make_runner(runtime, path, **options).load()
        runner = WithNms(model, nms) if nms is not None else model
        batches = batches_of(pool, batch_size)
        model.warm(batches[0])  # a compile, where the runtime has one, before anything is timed (info reports it)
        staged = [runner.prepare(b) for b in batches] if device_only else None
        copies = ServingCopies(model, runtime, path, options)  # traffic copies serve the model alone
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
                conn.send(("ok", predict(model, images, eval_batch, predict_as)))
            elif command == "serve":
                from serve_bench.load.loadgen_scenarios import ScenarioSettings, run_scenario

                serving, scenario = args
                conn.send(("ok", serve(copies, pool, serving, lambda loop: run_scenario(
                    loop, len(pool), ScenarioSettings(**scenario)))))
            elif command == "turn":  # one round's tests of this file (serve_bench.load.rounds)
                from serve_bench.load.loadgen_scenarios import ScenarioSettings, one_turn

                serving, scenarios = args
                conn.send(("ok", serve(copies, pool, serving, lambda loop: one_turn(
                    loop, len(pool), [ScenarioSettings(**s) for s in scenarios]))))
            elif command == "open-loop":
                from serve_bench.load.open_loop import run_open_loop

                serving, qps, seconds, seed = args
                conn.send(("ok", serve(copies, pool, serving, lambda loop: run_open_loop(
                    loop, len(pool), qps, seconds, seed))))
            elif command == "profile":
                from serve_bench.latency.operator_profile import profile_artifact

                iters, threads = args
                conn.send(("ok", profile_artifact(runtime, path, batches[0], threads=threads or runner.threads,
                                                  iters=iters, options=options)))
            elif command == "close":
                copies.close()
                runner.close()
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


class WithNms:
    """A detector's runner whose request ends after NMS: the latency a detection service answers in.
    Everything but ``infer`` and ``run_prepared`` is the model runner's own."""

    def __init__(self, runner, nms: dict) -> None:
        from train.detection.postprocess import NmsSettings, detections

        self._runner, self._settings, self._detections = runner, NmsSettings(**nms), detections

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def infer(self, x: np.ndarray):
        return self._detections(self._runner.infer(x), self._settings)

    def run_prepared(self, staged):
        return self._detections(self._runner._to_host(self._runner.run_prepared(staged)), self._settings)


class BenchWorker:
    """Parent-side handle of a worker process; every call waits for its answer."""

    def __init__(self, name: str, runtime: str, path: str, options: dict, pool: np.ndarray, batch_size: int,
                 device_only: bool = False, timeout_s: float = 600.0, wait: bool = True) -> None:
        """``wait=False`` returns once the process is started; :meth:`ready` then waits for it to load its artifact,
        so several workers start side by side (each one's interpreter, runtime import and model load is seconds
        of one core, and a bench starts one per candidate)."""
        self._spawn(name, timeout_s, worker_main, (runtime, str(path), options, pool, batch_size, device_only))
        if wait:
            self.ready()

    def _spawn(self, name: str, timeout_s: float, target, args: tuple) -> None:
        """Start ``target(conn, *args)`` in a fresh interpreter, its end of the pipe first."""
        ctx = mp.get_context("spawn")
        self.name, self.timeout_s = name, timeout_s
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, daemon=True, args=(child, *args))
        self.process.start()
        self.info: Any = None

    def ready(self) -> "BenchWorker":
        """Wait for the worker's artifact to load (once); its description is then :attr:`info`."""
        if self.info is None:
            self.info = self._answer()
        return self

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


def all_ready(workers: dict[str, BenchWorker]) -> dict[str, BenchWorker]:
    """Wait for workers started with ``wait=False`` (side by side) to load their artifacts; none is timed yet."""
    for worker in workers.values():
        worker.ready()
    return workers
