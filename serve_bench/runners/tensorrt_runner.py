"""A serialized TensorRT engine on the GPU (library imported lazily, as Polygraphy does)."""
from __future__ import annotations

import numpy as np

from serve_bench.runners.base import PerThread, Runner, RunnerError


class TensorRTRunner(Runner):
    """A serialized engine on the GPU; device buffers come from torch (pycuda is not needed)."""

    backend = "tensorrt"
    fixed_device = "cuda"
    profiler_device = "cuda"

    def _load(self) -> None:
        try:
            import tensorrt as trt
        except ImportError as exc:
            raise RunnerError("TensorRT is not installed (pip install 'compress[tensorrt]')") from exc
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
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        from serve_bench.runners.profiles import profile_tensorrt

        return profile_tensorrt(path, batch, iters=iters, top=top)


