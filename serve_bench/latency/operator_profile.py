"""Where the time goes: per-operator profiles of a deployed artifact.

A latency number says how slow an artifact is, not why. When an INT8 file is no faster than its
float ONNX, or a pruned model barely moves, the answer is in the operators: which op types take
the time, which single nodes or layers dominate, and which QuantizeLinear/DequantizeLinear nodes
the runtime did not fold into integer kernels (each one a float conversion paid on every run).
Each runtime is profiled by its own profiler, on the artifact file itself, after a warm-up:
onnxruntime's kernel times, torch's self time per op, TensorRT's per-layer times. Profiling adds
overhead, so the totals here exceed the un-profiled latency; read them as shares, not as latency.
"""
from __future__ import annotations

import numpy as np

from serve_bench.runners import RUNNERS, RunnerError


def profile_artifact(runtime: str, path: str, batch: np.ndarray, *, threads: int, iters: int = 50,
                     options: dict | None = None, top: int = 15) -> dict:
    """Profile one artifact with its runtime's own profiler (its runner's ``profile``); see the module docstring."""
    if iters < 1:
        raise RunnerError(f"operator profile: iters must be at least 1, got {iters}")
    if runtime not in RUNNERS:
        raise RunnerError(f"operator profile: unknown runtime {runtime!r}; known: {', '.join(RUNNERS)}")
    # The bench puts its thread count into every worker's runner options (bench/run.py) and hands the profile the
    # same count: passed on as it is, it reached a runner's constructor twice (the inductor runner's profile failed).
    # The profile runs on the threads it is given; options that ask for another count are refused, not dropped.
    options = dict(options or {})
    asked = options.pop("threads", None)
    if asked is not None and asked != threads:
        raise RunnerError(f"operator profile: the runner's options ask for {asked} threads, the profile for {threads}; "
                          "it would not measure what the bench measured")
    return RUNNERS[runtime].profile(path, batch, threads=threads, iters=iters, options=options, top=top)
