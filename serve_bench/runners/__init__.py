"""Backends behind one interface (load, infer, close), one module per runtime.

Optional runtimes' libraries (TensorRT, OpenVINO) are imported inside their runners' ``load``,
so importing this package never needs them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from serve_bench.runners.availability import ONNX_RUNTIMES, runtime_status, runtime_versions, usable_onnx_runtimes
from serve_bench.runners.base import PerThread, Runner, RunnerError, physical_cores, predict
from serve_bench.runners.onnxruntime_runner import OnnxRuntimeRunner
from serve_bench.runners.openvino_runner import OpenVinoRunner
from serve_bench.runners.simulated import SimulatedRunner
from serve_bench.runners.tensorrt_runner import TensorRTRunner
from serve_bench.runners.torch_runner import TorchRunner

RUNNERS: dict[str, type[Runner]] = {r.backend: r for r in (TorchRunner, OnnxRuntimeRunner, OpenVinoRunner,
                                                          TensorRTRunner, SimulatedRunner)}
# the runtime that loads each kind of artifact the pipeline makes (an ONNX file may also run on others)
RUNNER_OF_KIND: dict[str, str] = {"torch-model": "torch", "onnx": "onnxruntime", "trt-engine": "tensorrt"}

__all__ = ["ONNX_RUNTIMES", "OnnxRuntimeRunner", "OpenVinoRunner", "PerThread", "RUNNERS", "RUNNER_OF_KIND", "Runner", "RunnerError",
           "SimulatedRunner", "TensorRTRunner", "TorchRunner", "make_runner", "physical_cores", "predict",
           "runtime_status", "runtime_title", "runtime_versions", "usable_onnx_runtimes"]


def make_runner(backend: str, path: str | Path, **kwargs: Any) -> Runner:
    if backend not in RUNNERS:
        raise RunnerError(f"unknown backend {backend!r}; known: {', '.join(RUNNERS)}")
    return RUNNERS[backend](path, **kwargs)


def runtime_title(backend: str) -> str:
    """The runtime's name as messages write it (its runner's ``title``, else its backend name)."""
    runner = RUNNERS.get(backend)
    return (runner.title if runner is not None else "") or backend
