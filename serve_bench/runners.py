"""Backends behind one interface: load, infer, close; checking and bookkeeping live in the base.

Every runner refuses to pretend: onnxruntime silently falls back to the CPU when a GPU
provider cannot start, so the providers actually in use are checked after the session
is created and a fallback is an error, never a GPU number measured on the CPU.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from serve_bench.errors import BenchError


class RunnerError(BenchError):
    """A backend is unavailable, fell back to another device, or was misused."""


def physical_cores() -> int:
    """Physical cores (hyper-threads share execution units, so they add little to inference)."""
    try:
        pairs = set()
        physical = core = None
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    pairs.add((physical, core))
        if pairs:
            return len(pairs)
    except OSError:
        pass
    return os.cpu_count() or 1


class PerThread:
    """One object per calling thread, made on first use from ``factory``.

    Closed-loop clients call one runner from several threads; state that is not thread-safe
    (a TensorRT execution context with its tensor addresses, the CUDA stream it is synchronised
    on) must be one per client, or a thread's ``set_tensor_address`` lands in another's run and
    its ``synchronize`` waits for the others' work.
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory, self._local, self._lock = factory, threading.local(), threading.Lock()
        self.made: list[Any] = []

    def get(self) -> Any:
        value = getattr(self._local, "value", None)
        if value is None:
            value = self._local.value = self._factory()
            with self._lock:
                self.made.append(value)
        return value


class Runner:
    backend: ClassVar[str]

    def __init__(self, path: str | Path, *, threads: int | None = None, device: str = "cpu", **options: Any) -> None:
        self.path, self.device = Path(path), device
        self.threads = threads or physical_cores()
        self.options = options
        self.loaded = False

    def load(self) -> "Runner":
        if self.loaded:
            raise RunnerError(f"{self.backend} runner for {self.path} is already loaded")
        self._load()
        self.loaded = True
        return self

    def prepare(self, x: np.ndarray) -> Any:
        """Stage an input where the backend reads it (the device), for device-only timing."""
        self._check(x)
        return self._prepare(x)

    def run_prepared(self, staged: Any) -> Any:
        """Run on a staged input and wait for the result to be complete (GPU work synchronised)."""
        return self._run(staged)

    def infer(self, x: np.ndarray) -> np.ndarray:
        """Host array in, host array out: the end-to-end latency a caller sees."""
        self._check(x)
        return self._to_host(self._run(self._prepare(x)))

    def close(self) -> None:
        if self.loaded:
            self._close()
            self.loaded = False

    def info(self) -> dict:
        return {"backend": self.backend, "device": self.device, "threads": self.threads}

    def __enter__(self) -> "Runner":
        return self.load()

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, x: np.ndarray) -> None:
        if not self.loaded:
            raise RunnerError(f"{self.backend} runner for {self.path}: call load() (or use it as a context manager) first")
        if x.ndim != 4:
            raise RunnerError(f"{self.backend} runner expects N×C×H×W images, got shape {x.shape}")

    def _prepare(self, x: np.ndarray) -> Any:
        return x

    def _to_host(self, y: Any) -> np.ndarray:
        return y

    def _load(self) -> None:
        raise NotImplementedError

    def _run(self, staged: Any) -> Any:
        raise NotImplementedError

    def _close(self) -> None:
        pass


def predict(runner: Runner, images: np.ndarray, batch_size: int) -> np.ndarray:
    """Logits for every image, in batches: what accuracy is computed from, by the runner that ships."""
    return np.concatenate([runner.infer(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


class TorchRunner(Runner):
    """Eager (optionally compiled) PyTorch: the baseline every artifact is compared with."""

    backend = "torch"

    def _load(self) -> None:
        import torch

        from train.model_io import load_model

        if self.device == "cuda" and not torch.cuda.is_available():
            raise RunnerError("torch runner: device cuda was asked for but no CUDA device is visible")
        if self.device == "cpu":
            torch.set_num_threads(self.threads)
        self._torch = torch
        model, self.description = load_model(self.path)
        self.model = model.eval().to(self.device)
        if self.options.get("compile"):
            self.model = torch.compile(self.model)

    def _prepare(self, x: np.ndarray):
        return self._torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)

    def _run(self, staged):
        with self._torch.inference_mode():
            y = self.model(staged)
        if self.device == "cuda":
            self._torch.cuda.synchronize()
        return y

    def _to_host(self, y) -> np.ndarray:
        return y.float().cpu().numpy()

    def info(self) -> dict:
        return {**super().info(), "precision": "fp32", "compile": bool(self.options.get("compile"))}


class OnnxRuntimeRunner(Runner):
    backend = "onnxruntime"
    _DEVICE_PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                         "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}

    def _load(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RunnerError("onnxruntime is not installed: pip install 'compress[cpu]' (or [gpu])") from exc
        if self.device not in self._DEVICE_PROVIDERS:
            raise RunnerError(f"onnxruntime device must be one of {', '.join(self._DEVICE_PROVIDERS)}, got {self.device!r}")
        wanted = self._DEVICE_PROVIDERS[self.device]
        missing = [p for p in wanted if p not in ort.get_available_providers()]
        if missing:
            raise RunnerError(f"onnxruntime on this machine has no {', '.join(missing)} "
                              f"(available: {', '.join(ort.get_available_providers())})")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: graph-cleanup warnings are not the measurement's business
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = self.options.get("inter_op_threads", 1)
        self.session = ort.InferenceSession(str(self.path), options, providers=wanted)
        active = self.session.get_providers()
        if active[0] != wanted[0]:
            raise RunnerError(f"onnxruntime fell back to {active[0]} although {wanted[0]} was asked for; "
                              "refusing to report its numbers as that device's")
        first = self.session.get_inputs()[0]
        self.input_name, self.output_name = first.name, self.session.get_outputs()[0].name
        self._ort, self._ort_device = ort, "cpu" if self.device == "cpu" else "cuda"
        self.input_dtype = np.float16 if first.type == "tensor(float16)" else np.float32

    def _prepare(self, x: np.ndarray):
        return {self.input_name: np.ascontiguousarray(x, dtype=self.input_dtype)}

    def prepare(self, x: np.ndarray):
        """The input copied once onto the session's device (an OrtValue), for device-only timing.

        Like the torch and TensorRT runners' staged tensors, so device-only timing leaves out the
        host↔device copies for every backend alike. Each run binds it afresh (I/O binding, the
        output left on the device): a binding shared by client threads would race.
        """
        self._check(x)
        return _OnDevice(self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x, dtype=self.input_dtype),
                                                                 self._ort_device, 0))

    def _run(self, staged):
        if isinstance(staged, _OnDevice):
            binding = self.session.io_binding()
            binding.bind_ortvalue_input(self.input_name, staged.value)
            binding.bind_output(self.output_name, self._ort_device, 0)
            self.session.run_with_iobinding(binding)  # returns once the providers are synchronised
            return binding
        return self.session.run(None, staged)[0]

    def _to_host(self, y) -> np.ndarray:
        if not isinstance(y, np.ndarray):  # an I/O binding: its output still on the device
            y = y.copy_outputs_to_cpu()[0]
        return y.astype(np.float32, copy=False)

    def info(self) -> dict:
        return {**super().info(), "providers": self.session.get_providers() if self.loaded else None,
                "inter_op_threads": self.options.get("inter_op_threads", 1)}


class _OnDevice:
    """An input already on an onnxruntime device (told apart from a host feed dict)."""

    def __init__(self, value) -> None:
        self.value = value


class TensorRTRunner(Runner):
    """A serialized engine on the GPU; device buffers come from torch (pycuda is not needed)."""

    backend = "tensorrt"

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


class SimulatedRunner(Runner):
    """A model with a known service time (sleeping, so other threads run meanwhile), for the harness itself.

    Queueing theory gives the latency such a model must show under a given load (M/D/1 for a fixed
    service time under Poisson arrivals), so it tests the load generator, the serving loop and every
    rule built on them; with ``service_ms=0`` it measures the harness's own overhead per query.
    Options: ``service_ms`` per batch, ``per_item_ms`` added per input after the first (what batching
    saves), ``stall_every_s``/``stall_ms`` (a pause of ``stall_ms`` once per period, like a garbage
    collector), ``classes`` (width of the zero logits it answers).
    """

    backend = "simulated"

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


RUNNERS: dict[str, type[Runner]] = {r.backend: r for r in (TorchRunner, OnnxRuntimeRunner, TensorRTRunner,
                                                          SimulatedRunner)}


def make_runner(backend: str, path: str | Path, **kwargs: Any) -> Runner:
    if backend not in RUNNERS:
        raise RunnerError(f"unknown backend {backend!r}; known: {', '.join(RUNNERS)}")
    return RUNNERS[backend](path, **kwargs)
