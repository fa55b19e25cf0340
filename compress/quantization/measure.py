"""What each rung of the INT8 ladder is judged by: the quantized file itself, run by the runtimes that ship it.

Accuracy goes through serve_bench's runners (the same code that later measures the deployed
artifact: onnxruntime, and OpenVINO where the CPU file may be released on it), never through a
torch simulation of the quantized model.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serve_bench.accuracy.classification import accuracy
from serve_bench.latency.harness import HarnessSettings, Measurement, measure_interleaved
from serve_bench.runners import RUNNER_OF_KIND, make_runner, predict
from serve_bench.stats.summary import percentile
from serve_bench.latency.worker import BenchWorker, all_ready
from serve_bench.stats.latency_intervals import paired_ratio

log = logging.getLogger(__name__)

ONNX_RUNTIME = RUNNER_OF_KIND["onnx"]  # the runtime that loads an ONNX file unless another is named


def logits(path: Path, images: np.ndarray, batch_size: int = 64, threads: int | None = None,
           runtime: str = ONNX_RUNTIME, options: dict | None = None) -> np.ndarray:
    with make_runner(runtime, path, threads=threads, **(options or {})) as runner:
        return predict(runner, images, batch_size)


def split_accuracy(path: Path, images: np.ndarray, labels: np.ndarray, batch_size: int = 64,
                   runtime: str = ONNX_RUNTIME, options: dict | None = None, threads: int | None = None) -> dict:
    """Accuracy of the file as ``runtime`` runs it (the same bytes can answer differently in another runtime),
    with the runner ``options`` and ``threads`` the bench runs it with."""
    return accuracy(logits(path, images, batch_size, threads=threads, runtime=runtime, options=options), labels)


def output_error(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean squared logit error relative to the logits' variance: comparable across layers and models."""
    return float(np.mean((reference - candidate) ** 2) / max(float(np.var(reference)), 1e-12))


@contextlib.contextmanager
def _workers(paths: dict[str, Path], pool: np.ndarray, runtime: str | dict[str, str], batch_size: int,
             options: dict | None) -> Iterator[dict[str, BenchWorker]]:
    """Each file in its own worker process, loaded and ready; stopped on leaving."""
    runtimes = runtime if isinstance(runtime, dict) else dict.fromkeys(paths, runtime)
    with contextlib.ExitStack() as stack:
        yield all_ready({name: stack.enter_context(BenchWorker(name, runtimes[name], str(path),
                                                               {"device": "cpu", **(options or {})}, pool,
                                                               batch_size, wait=False))
                         for name, path in paths.items()})


def interleaved(paths: dict[str, Path], pool: np.ndarray, settings: HarnessSettings,
                runtime: str | dict[str, str] = ONNX_RUNTIME, batch_size: int = 1,
                options: dict | None = None) -> dict[str, Measurement]:
    """The files measured with the benchmark's own harness: each in its own worker process, taking turns in
    blocks, as in the bench stage (two onnxruntime sessions in one process disturb each other's tail: measured
    here, the same pair of files swapped order in p50 from one in-process run to the next). ``runtime``: one for
    every file, or each file's by name."""
    with _workers(paths, pool, runtime, batch_size, options) as workers:
        return measure_interleaved(workers, settings)


@dataclass(frozen=True)
class RoundPlan:
    """How a ratio's timing is sized: by the rounds its interval rests on, not by a request count. A fixed count of
    requests gives a slow file few rounds (300 requests of a 60-ms file in blocks of 50: 6 rounds, never a
    verdict); a fixed count of rounds, each block as many requests as fit ``round_s`` (at least ``min_block``),
    reaches the verdict for every file up to ``budget_s``'s reach."""

    rounds: int
    round_s: float
    min_block: int
    settle_s: float = 0.2  # the harness's pause before each block (the previous runtime's threads go quiet)
    warmup_iters: int = 5
    budget_s: float | None = None  # what one run may take: a plan past it is said before it runs (it still runs)

    def block(self, per_request_s: float) -> int:
        return max(self.min_block, math.ceil(self.round_s / max(per_request_s, 1e-9)))

    def seconds(self, per_request_s: list[float], block: int) -> float:
        """What the timing costs: a warm-up per file, then every round a settle pause and a block per file."""
        return sum((self.warmup_iters + self.rounds * block) * t + self.rounds * self.settle_s for t in per_request_s)


def p50_ratios_in_rounds(reference: Path, candidates: dict[str, Path], pool: np.ndarray, plan: RoundPlan,
                         runtime: str = ONNX_RUNTIME, threads: int | None = None, options: dict | None = None,
                         batch_size: int = 1, level: float = 0.95) -> tuple[dict[str, dict], dict]:
    """Each candidate's p50 over ``reference``'s, paired by round in one interleaved run of exactly
    ``plan.rounds`` rounds, and what the run cost: the block size (from the reference's time per request after a
    warm-up: every file runs the same block, the reference being the slowest as a rule), the seconds it was
    planned to take and took."""
    started = time.perf_counter()
    with _workers({"reference": reference, **candidates}, pool, runtime, batch_size,
                  {**({"threads": threads} if threads else {}), **(options or {})}) as workers:
        workers["reference"].call("warmup", plan.warmup_iters, 0.0)  # first calls pay for kernels and caches
        done, seconds = workers["reference"].call("warmup", plan.warmup_iters, 0.0)
        per_request = seconds / max(done, 1)
        block = plan.block(per_request)
        planned = plan.seconds([per_request] * (1 + len(candidates)), block)
        if plan.budget_s is not None and planned > plan.budget_s:
            log.warning("timing %s on %s: %d rounds of %d requests a file at %.1f ms a request take about %.0f s, "
                        "over the %.0f s budget; it runs them all (fewer rounds would give no verdict)",
                        ", ".join(candidates), runtime, plan.rounds, block, per_request * 1e3, planned, plan.budget_s)
        settings = HarnessSettings(warmup_iters=plan.warmup_iters, warmup_s=0.0, min_iters=plan.rounds * block,
                                   min_duration_s=0.0, block_iters=block, block_s=0.0, settle_s=plan.settle_s,
                                   max_iters=plan.rounds * block + 1)  # the cap never cuts a round off
        measured = measure_interleaved(workers, settings)
    ratios = {name: paired_ratio(measured[name].blocked, measured["reference"].blocked, 50, level=level).as_dict()
              for name in candidates}
    cost = {"rounds": plan.rounds, "block": block, "reference_ms": round(per_request * 1e3, 3),
            "planned_s": round(planned, 1),
            "took_s": round(time.perf_counter() - started, 1)}
    return ratios, cost


def quick_latency(paths: dict[str, Path], pool: np.ndarray, min_iters: int = 300) -> dict[str, dict]:
    """Batch-1 p50/p99 of several ONNX files on onnxruntime, kept short: a first look recorded per rung; the bench
    stage's longer run is what the gate uses."""
    settings = HarnessSettings(warmup_iters=20, warmup_s=0.1, min_iters=min_iters, min_duration_s=0.3,
                               block_iters=50, block_s=0.05, settle_s=0.05)
    return {name: {"p50_ms": round(percentile(m.latencies_ms, 50), 4), "p99_ms": round(percentile(m.latencies_ms, 99), 4),
                   "n": len(m.latencies_ms)} for name, m in interleaved(paths, pool, settings).items()}


def p50_ratios(reference: Path, candidates: dict[str, Path], pool: np.ndarray, runtime: str = ONNX_RUNTIME,
               min_iters: int = 300, threads: int | None = None, options: dict | None = None, batch_size: int = 1,
               level: float = 0.95, seconds: float = 1.0) -> dict[str, dict]:
    """Each candidate's p50 over ``reference``'s on ``runtime`` at ``batch_size``, paired by round in one
    interleaved run, with its ``level`` interval over the rounds. The settle pause is the harness's own (0.2 s:
    shorter left the previous worker's threads spinning into the next block)."""
    settings = HarnessSettings(warmup_iters=20, warmup_s=0.1, min_iters=min_iters, min_duration_s=seconds,
                               block_iters=50, block_s=0.1)
    measured = interleaved({"reference": reference, **candidates}, pool, settings, runtime, batch_size,
                           {**({"threads": threads} if threads else {}), **(options or {})})
    return {name: paired_ratio(measured[name].blocked, measured["reference"].blocked, 50, level=level).as_dict()
            for name in candidates}
