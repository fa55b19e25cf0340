"""torch.compile with Inductor on the CPU: what a PyTorch user deploys instead of an ONNX file.

It runs the pipeline's torch models (fp32, and under bf16 autocast where the CPU computes bf16 natively) and
PyTorch's own x86 INT8 file (``native_int8``), each compiled once per process. A first call at a new shape
compiles (seconds); :meth:`warm` pays that before anything is timed, and :meth:`info` reports it apart from the
latency. For a float file batch 1 keeps its own specialised graph and other batch sizes make the batch dimension
dynamic (torch's automatic dynamic shapes), so accuracy batches and a batcher's sizes share a graph or two instead
of recompiling per size; an INT8 file compiles per size (see ``_load``). Accuracy is measured through the compiled
module, as it serves.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings

import numpy as np

from serve_bench.runners.base import Runner, RunnerError
import serve_bench.runners.inductor.native_int8 as native_int8
from serve_bench.runners.inductor.settings import InductorSettings
from serve_bench.runners.torch_runner import torch_op_profile

logger = logging.getLogger(__name__)
# Inductor's INT8 convolution lowering copies a tensor the way torch itself warns against (torch 2.14): a notice
# about torch's code, not the user's run, printed into the run's console at every compile
warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning,
                        module=r"torch\._inductor\.mkldnn_lowerings")

WARM_BATCHES = (1, 2, 64)


def native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX-512 BF16 or AMX); elsewhere torch emulates it, slowly."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class InductorRunner(Runner):
    """Options: ``mode`` (torch.compile's), ``freezing`` (Inductor's, default on), ``precision`` (fp32 or bf16:
    bf16 autocast around the compiled module) and ``bf16`` (auto/on/off: whether :meth:`variants` adds a bf16
    candidate)."""

    runtime = "inductor"
    title = "torch.compile (Inductor)"
    formats = {"torch-model": "torch", native_int8.KIND: "pt2e"}
    native_int8_kind = native_int8.KIND
    settings = InductorSettings
    library, smoke_tolerance = "torch", 1e-4  # Inductor's fused kernels reorder float sums
    packages = ("torch",)
    # its graphs differ by batch size (batch 1's own, dynamic ones, an INT8 file's per size), and bf16 kernels round
    # by their blocking: accuracy is measured at the batch it serves, as OpenVINO's is
    answers_depend_on_batch = True
    measured_by_default = False  # compiling costs seconds to minutes per file: a bench names it to measure it
    install_hint = "pip install compress (torch is a core dependency; Inductor also needs a C++ compiler: g++)"
    profile_note = ("self CPU time of each op of the compiled module (Inductor's generated kernels appear as "
                    "graph_* / cpp_fused_* ops, oneDNN's as mkldnn / onednn ops); profiling adds overhead, so the "
                    "totals exceed the un-profiled latency.")

    def _load(self) -> None:
        import torch
        import torch._inductor.config as inductor_config

        if self.device != "cpu":
            raise RunnerError(f"the inductor runner runs on the CPU here; device {self.device!r} was asked for")
        reason = self.unavailable(self.device)
        if reason:
            raise RunnerError(reason)
        self.precision = str(self.options.get("precision", "fp32"))
        if self.precision not in ("fp32", "bf16"):
            raise RunnerError(f"inductor runner: precision must be fp32 or bf16, got {self.precision!r}")
        torch.set_num_threads(self.threads)
        # Inductor reads these when it compiles, which happens on the first call at a shape: set for the process (one
        # candidate per worker process). dynamic_threads: the kernels follow torch's thread count at each call, so a
        # serving copy on fewer threads runs on them (otherwise the count compiled in stays, whatever is set later).
        # Each runner adds graphs (freezing guards on its weights), and past the recompile limit torch would run the
        # module eagerly with a log line only: the limit is raised, and reaching it is an error, never eager numbers.
        import torch._dynamo.config as dynamo_config

        inductor_config.freezing = bool(self.options.get("freezing", True))
        inductor_config.cpp.dynamic_threads = True
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        dynamo_config.fail_on_recompile_limit_hit = True
        if native_int8.is_native_int8(self.path):
            model, self.kind = native_int8.load(self.path), native_int8.KIND
        else:
            from train.model_io import load_model

            model, self.kind = load_model(self.path)[0].eval(), "torch-model"
        self._torch = torch
        # An INT8 file compiles one graph per batch size: with a dynamic batch, Inductor's quantized-convolution
        # lowering asserts on its output strides (torch 2.14, a channels-last fake kernel against an NCHW result)
        static = self._static = self.kind == native_int8.KIND  # a batcher's sizes each compile once
        self.model = torch.compile(model, mode=str(self.options.get("mode", "default")), dynamic=False if static else None)
        self._autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if self.precision == "bf16" \
            else contextlib.nullcontext
        self.compile_s: dict[str, float] = {}
        self._compiled_shapes: set[tuple] = set()
        self._lock = threading.Lock()

    def warm(self, x: np.ndarray) -> None:
        """Compile for ``x``'s batch size and the graphs other sizes need, timing each compile: batch 1 is its own
        graph, and the dynamic-batch graphs split by size where a convolution's kernel choice guards on it (on
        torch 2.14, 2–15 and 16 up), so batches of 2 and 64 (the accuracy batch) make them before any timing. An
        INT8 file's graphs are one per size: its latency batch and the accuracy batch."""
        for size in sorted({int(x.shape[0]), *(WARM_BATCHES if not self._static else (64,))}):
            self.infer(np.repeat(x[:1], size, axis=0))

    def _prepare(self, x: np.ndarray):
        return self._torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def _run(self, staged):
        key = tuple(staged.shape)
        if key in self._compiled_shapes:
            with self._torch.inference_mode(), self._autocast():
                return self.model(staged)
        with self._lock:  # a first call at a shape may compile: one thread at a time, and timed
            from torch._dynamo.utils import counters

            graphs, start = counters["stats"]["unique_graphs"], time.perf_counter()
            with self._torch.inference_mode(), self._autocast():
                y = self.model(staged)
            if key not in self._compiled_shapes:
                self._compiled_shapes.add(key)
                if counters["stats"]["unique_graphs"] != graphs:  # it made a graph (not a guard hit on one)
                    self.compile_s[f"batch {key[0]}"] = round(time.perf_counter() - start, 3)
        return y

    def _to_host(self, y) -> np.ndarray:
        return y.float().numpy()

    def use_threads(self, threads: int) -> None:
        self._torch.set_num_threads(threads)  # torch's intra-op pool is one per process

    def info(self) -> dict:
        return {**super().info(), "precision": self.precision if self.loaded else None,
                "mode": self.options.get("mode", "default"), "freezing": bool(self.options.get("freezing", True)),
                "compile_s": dict(self.compile_s) if self.loaded else {},
                "torch": self._torch.__version__ if self.loaded else None}

    @classmethod
    def options_from_info(cls, info: dict) -> dict:
        """Its precision and compile settings: bf16 answers differently from fp32."""
        return {k: info[k] for k in ("precision", "mode", "freezing") if info.get(k) is not None}

    @classmethod
    def variants(cls, file_format: str, options: dict) -> list[tuple[str, dict, str | None]]:
        """A float torch file in fp32, and under bf16 autocast as a candidate of its own where asked (``bf16``: auto
        where the CPU has native bf16); an INT8 file as it is."""
        base = {k: v for k, v in options.items() if k != "bf16"}
        bf16 = options.get("bf16", "auto")
        out = [("", {**base, "precision": "fp32"}, None)]
        if cls.formats.get("torch-model") == file_format and (bf16 == "on" or (bf16 == "auto" and native_bf16())):
            out.append(("-bf16", {**base, "precision": "bf16"}, "bf16"))
        return out

    @classmethod
    def make_native_int8(cls, model, description: dict, calibration: np.ndarray, folder) -> dict:
        """PT2E with ``X86InductorQuantizer`` (see ``native_int8``)."""
        return native_int8.make(model, description, calibration, folder)

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        if device != "cpu":
            return "the inductor runner runs on the CPU here"
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except (ImportError, RuntimeError, OSError) as exc:
            return f"Inductor cannot compile C++ here ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): " \
                   f"{cls.install_hint}"
        return None

    @classmethod
    def version(cls) -> str | None:
        import torch

        return torch.__version__

    @classmethod
    def here(cls) -> dict:
        out = super().here()
        if out["unusable"] is None:
            from torch._inductor.cpp_builder import get_cpp_compiler

            out["detail"] = (f"C++ compiler {get_cpp_compiler()}; a file compiles on its first call at a shape "
                             f"(reported apart from latency); bf16 autocast candidates "
                             f"{'on (native bf16)' if native_bf16() else 'off (bf16 would be emulated)'}")
        return out

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        with cls(path, threads=threads, **options) as runner:
            runner.warm(batch)
            return torch_op_profile(cls, path, runner.run_prepared, runner.prepare(batch), threads=threads,
                                    iters=iters)
