"""Runtimes behind one interface (load, infer, close), one module or folder per runtime, named in the registry.

Each runner class holds what its runtime knows (the files it loads, its install hint and availability, its
profiler, what a card records of it); optional runtimes' libraries (TensorRT, OpenVINO) are imported inside their
runners, so importing this package never needs them.
"""
from __future__ import annotations

from serve_bench.runners.base import PerThread, Runner, RunnerError, physical_cores, predict
from serve_bench.runners.inductor import InductorRunner
from serve_bench.runners.onnxruntime_runner import OnnxRuntimeRunner
from serve_bench.runners.openvino_runner import OpenVinoRunner
from serve_bench.runners.registry import (ONNX_RUNTIMES, RUNNER_OF_KIND, RUNNERS, current_kind, format_of_kind, make_runner,
                                          runtime_status, runtime_title, runtime_versions, runtimes_of_kind,
                                          usable_onnx_runtimes)
from serve_bench.runners.simulated import SimulatedRunner
from serve_bench.runners.tensorrt_runner import TensorRTRunner
from serve_bench.runners.torch_runner import TorchRunner

__all__ = ["ONNX_RUNTIMES", "InductorRunner", "OnnxRuntimeRunner", "OpenVinoRunner", "PerThread", "RUNNERS",
           "RUNNER_OF_KIND", "Runner", "RunnerError", "SimulatedRunner", "TensorRTRunner", "TorchRunner",
           "current_kind", "format_of_kind", "make_runner", "physical_cores", "predict", "runtime_status", "runtime_title",
           "runtime_versions", "runtimes_of_kind", "usable_onnx_runtimes"]
