"""A serialized TensorRT engine on the GPU (library imported lazily, as Polygraphy does)."""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from export.tensorrt_engine import ENGINE_FILE, ENGINE_KIND
from serve_bench.runners.base import PerThread, Runner, RunnerError
from serve_bench.runners.profile_common import WARMUP_RUNS, profile_result, rounded

logger = logging.getLogger(__name__)


class TensorRTRunner(Runner):
    """A serialized engine on the GPU; device buffers come from torch (pycuda is not needed)."""

    runtime = "tensorrt"
    title = "TensorRT"
    fixed_device = "cuda"
    formats = {ENGINE_KIND: ENGINE_KIND}
    former_kinds = {"trt-engine": ENGINE_KIND}
    bundle_folder, serving_file = "tensorrt", ENGINE_FILE
    library, smoke_tolerance = "tensorrt", 1e-2  # an fp32 engine may use TF32
    packages = ("tensorrt",)
    install_hint = "pip install 'compress[tensorrt]' (on a machine with an NVIDIA GPU)"
    profiler_device = "cuda"
    triton_backend = {"platform": "tensorrt_plan", "model_file": "model.plan", "kind": "KIND_GPU"}
    profile_note = ("TensorRT per-layer GPU time reported by IProfiler; profiling adds overhead (a synchronisation "
                    "per layer), so the totals exceed the un-profiled latency.")

    def _load(self) -> None:
        try:
            import tensorrt as trt
        except ImportError as exc:
            raise RunnerError(f"TensorRT is not installed: {self.install_hint}") from exc
        import torch

        if not torch.cuda.is_available():
            raise RunnerError("the TensorRT runner needs a CUDA device; none is visible")
        self._torch = torch
        from export.tensorrt_engine import EngineMismatch, TensorRTUnavailable, load_engine

        try:  # the one path that deserialises an engine, after checking it was built for this TensorRT and GPU
            self.engine, self.engine_meta = load_engine(self.path if self.path.is_dir() else self.path.parent)
        except (EngineMismatch, TensorRTUnavailable, OSError) as exc:
            raise RunnerError(f"TensorRT engine {self.path}: {exc}") from exc
        # One execution context and one stream per client thread (made lazily): see PerThread.
        self._per_thread = PerThread(lambda: (self.engine.create_execution_context(), torch.cuda.Stream()))
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_name = next(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        self.output_name = next(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT)
        self._trt = trt

    def _prepare(self, x: np.ndarray):
        dtype = self._torch.float16 if self.engine.get_tensor_dtype(self.input_name) == self._trt.DataType.HALF \
            else self._torch.float32
        return self._torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dtype=dtype)

    def _run(self, staged):
        context, stream = self._per_thread.get()
        context.set_input_shape(self.input_name, tuple(staged.shape))
        out_shape = tuple(context.get_tensor_shape(self.output_name))
        out_dtype = self._torch.float16 if self.engine.get_tensor_dtype(self.output_name) == self._trt.DataType.HALF \
            else self._torch.float32
        stream.wait_stream(self._torch.cuda.current_stream())  # the staged input's copy is complete
        with self._torch.cuda.stream(stream):
            output = self._torch.empty(out_shape, dtype=out_dtype, device="cuda")
        context.set_tensor_address(self.input_name, staged.data_ptr())
        context.set_tensor_address(self.output_name, output.data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise RunnerError("TensorRT execute_async_v3 failed")
        stream.synchronize()
        return output

    def _to_host(self, y) -> np.ndarray:
        return y.float().cpu().numpy()

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        from export.tensorrt_engine import unavailable_reason

        return unavailable_reason()

    @classmethod
    def version(cls) -> str | None:
        try:
            import tensorrt
        except ImportError:
            return None
        return tensorrt.__version__

    @classmethod
    def here(cls) -> dict:
        import tensorrt as trt

        reason = cls.unavailable("cuda")
        return {"version": trt.__version__, "devices": [] if reason else ["cuda"], "unusable": reason,
                "detail": reason or "engines build and run on this GPU"}

    @classmethod
    def smoke_file(cls, model_dir: Path, onnx_path: Path, folder: Path) -> tuple[Path, str]:
        """An fp32 engine built here from the tiny model's ONNX file."""
        from export.onnx_export import INPUT_NAME
        from export.tensorrt_engine import BuildSettings, build_engine

        engine_dir = folder / "engine"
        build_engine(onnx_path, engine_dir, BuildSettings(precision="fp32", max_batch=1), INPUT_NAME,
                     _input_shape(onnx_path))
        return engine_dir, "cuda"

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        return _profile(cls, path, batch, iters=iters, top=top)


def _layer_types(engine, trt) -> dict[str, str]:
    """Layer name → layer type from the engine inspector (engines are built with DETAILED verbosity)."""
    try:
        info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    except (RuntimeError, ValueError, AttributeError) as exc:
        logger.warning("TensorRT engine inspector gave no layer types: %s", exc)
        return {}
    return {layer["Name"]: str(layer.get("LayerType", "unknown")) for layer in info.get("Layers", [])
            if isinstance(layer, dict) and "Name" in layer}


def _profile(cls, path: str, batch: np.ndarray, *, iters: int, top: int = 15) -> dict:
    """GPU time per engine layer from an IProfiler, grouped by the inspector's layer type."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise RunnerError(f"TensorRT is not installed: {cls.install_hint}") from exc
    import torch

    if not torch.cuda.is_available():
        raise RunnerError("the TensorRT profiler needs a CUDA device; none is visible")
    from export.tensorrt_engine import EngineMismatch, TensorRTUnavailable, load_engine

    path = Path(path)
    try:  # as TensorRTRunner._load: the engine artifact is its folder or the engine file in it
        engine, _ = load_engine(path if path.is_dir() else path.parent)
    except (EngineMismatch, TensorRTUnavailable, OSError) as exc:
        raise RunnerError(f"TensorRT engine {path}: {exc}") from exc

    class LayerTimes(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)
            self.ms: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            self.ms[layer_name][0] += ms
            self.ms[layer_name][1] += 1

    dtypes = {"HALF": torch.float16, "FLOAT": torch.float32, "BF16": torch.bfloat16, "INT32": torch.int32,
              "INT64": torch.int64, "INT8": torch.int8, "BOOL": torch.bool}
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    if len(inputs) != 1:
        raise RunnerError(f"TensorRT engine {path}: expected one input tensor, found {inputs}")
    context, stream = engine.create_execution_context(), torch.cuda.Stream()
    in_dtype = dtypes[engine.get_tensor_dtype(inputs[0]).name]
    staged = torch.from_numpy(np.ascontiguousarray(batch)).to("cuda", dtype=in_dtype)
    context.set_input_shape(inputs[0], tuple(staged.shape))
    context.set_tensor_address(inputs[0], staged.data_ptr())
    outputs = []
    with torch.cuda.stream(stream):
        for name in names:
            if name not in inputs:
                outputs.append(torch.empty(tuple(context.get_tensor_shape(name)),
                                           dtype=dtypes[engine.get_tensor_dtype(name).name], device="cuda"))
                context.set_tensor_address(name, outputs[-1].data_ptr())
    stream.wait_stream(torch.cuda.current_stream())  # the staged input's copy is complete

    def run() -> None:
        if not context.execute_async_v3(stream.cuda_stream):
            raise RunnerError(f"TensorRT execute_async_v3 failed profiling {path}")
        stream.synchronize()

    for _ in range(WARMUP_RUNS):
        run()
    profiler = LayerTimes()
    context.profiler = profiler  # attached after the warm-up, so only the measured runs report
    start = time.perf_counter()
    for _ in range(iters):
        run()
    run_ms = (time.perf_counter() - start) * 1000.0 / iters
    if not profiler.ms:
        raise RunnerError(f"TensorRT reported no layer times profiling {path}")
    types = _layer_types(engine, trt)
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for layer, (ms, calls) in profiler.ms.items():
        per_op[types.get(layer, "unknown")][0] += ms
        per_op[types.get(layer, "unknown")][1] += calls
    layers = sorted(profiler.ms.items(), key=lambda kv: (-kv[1][0], kv[0]))
    top_nodes = [{"node": layer, "op": types.get(layer, "unknown"), "ms_per_run": rounded(ms / iters)}
                 for layer, (ms, _) in layers[:top]]
    result = profile_result(cls.runtime, cls.profile_note, batch, iters, None, run_ms, per_op, top_nodes)
    logger.info("profiled %s with TensorRT: %d runs, %d layers", path, iters, len(profiler.ms))
    return result


def _input_shape(onnx_path: Path) -> tuple[int, ...]:
    """C×H×W of an ONNX file's first input (the engine's optimisation profile is built for it)."""
    import onnx

    dims = onnx.load(str(onnx_path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return tuple(int(d.dim_value) for d in dims[1:])
