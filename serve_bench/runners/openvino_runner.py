"""OpenVINO on the CPU, reading the pipeline's ONNX files (fp32 and Q/DQ INT8) as they are.

The same file can run faster or slower, and answer differently, in OpenVINO than in onnxruntime
(other kernels, other fusions, and on CPUs with native bf16 OpenVINO's default inference precision
for a float model is bf16), so it is measured as its own candidate and its accuracy comes from
OpenVINO itself. What it actually ran with — the performance hint, the threads, the inference
precision it chose — is read back from the compiled model and reported, never assumed.
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.runners.base import PerThread, Runner, RunnerError

HINTS = ("LATENCY", "THROUGHPUT")
PRECISIONS = ("auto", "f32", "bf16", "f16")


class OpenVinoSettings(BaseModel):
    """How the bench compiles a file for OpenVINO (the runner's options)."""

    model_config = ConfigDict(extra="forbid")
    hint: Literal["latency", "throughput"] = Field(
        "latency", description="OpenVINO's performance hint: latency (one request at a time, as the closed-loop "
                               "bench sends them) or throughput (several streams, for serving many at once)")
    inference_precision: Literal["auto", "f32", "bf16", "f16"] = Field(
        "auto", description="auto: OpenVINO's own choice (bf16 for a float file on CPUs with native bf16), what a "
                            "user gets by hand; f32 keeps a float file in float")

    def runner_options(self) -> dict:
        return {"hint": self.hint.upper(), "inference_precision": self.inference_precision}


class OpenVinoRunner(Runner):
    """Options: ``hint`` (LATENCY, the default for one request at a time, or THROUGHPUT) and
    ``inference_precision`` (``auto``: OpenVINO's own choice, what a user gets by hand; ``f32`` keeps a
    float file in float on bf16-capable CPUs)."""

    backend = "openvino"
    title = "OpenVINO"
    answers_depend_on_batch = True  # measured: logits of batches of 8 differ from batch 1 by up to 0.64 (2 threads)
    # Its oneDNN convolutions pad a width to the next block: 16 channels with AVX-512 (f32, and bf16 on AMX), 8 with
    # AVX2 (p50 rose with the width in steps of 8 under ONEDNN_MAX_CPU_ISA=AVX2); a dense 3×3 width off the block
    # cost up to 1.35× per MAC (pipelines/channel_multiples.py, AMX Xeon)
    channel_blocks = {"amx": 16, "avx512": 16, "avx2": 8}

    def _load(self) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise RunnerError("OpenVINO is not installed: pip install 'compress[cpu]'") from exc
        if self.device != "cpu":
            raise RunnerError(f"the openvino runner runs on the CPU only; device {self.device!r} was asked for")
        hint = str(self.options.get("hint", "LATENCY")).upper()
        precision = str(self.options.get("inference_precision", "auto")).lower()
        if hint not in HINTS or precision not in PRECISIONS:
            raise RunnerError(f"openvino runner: hint must be one of {', '.join(HINTS)} and inference_precision one "
                              f"of {', '.join(PRECISIONS)}; got {hint!r}, {precision!r}")
        core = ov.Core()
        if "CPU" not in core.available_devices:
            raise RunnerError(f"OpenVINO sees no CPU device (devices: {', '.join(core.available_devices) or 'none'})")
        config: dict[str, Any] = {"PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": self.threads}
        if precision != "auto":
            config["INFERENCE_PRECISION_HINT"] = precision
        if self.options.get("perf_count"):
            config["PERF_COUNT"] = True
        try:
            model = core.read_model(str(self.path))
            self.compiled = core.compile_model(model, "CPU", config)
        except RuntimeError as exc:
            raise RunnerError(f"OpenVINO could not compile {self.path}: {str(exc).splitlines()[0]}") from exc
        element = self.compiled.input(0).get_element_type().get_type_name()
        self.input_dtype = np.float16 if element == "f16" else np.float32
        # one infer request per calling thread: a request is not safe to share between threads
        self._requests = PerThread(self.compiled.create_infer_request)
        self._facts = {"version": ov.get_version(), "hint": hint,
                       "inference_precision": _type_name(self.compiled.get_property("INFERENCE_PRECISION_HINT")),
                       "threads_used": int(self.compiled.get_property("INFERENCE_NUM_THREADS")),
                       "cpu": core.get_property("CPU", "FULL_DEVICE_NAME")}

    def _prepare(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=self.input_dtype)

    def _run(self, staged: np.ndarray) -> np.ndarray:
        request = self._requests.get()
        request.infer({0: staged})
        return request.get_output_tensor(0).data.copy()  # the request's buffer is reused by its next run

    def _to_host(self, y: np.ndarray) -> np.ndarray:
        return y.astype(np.float32, copy=False)

    def requests(self) -> list:
        """The infer requests made so far (one per thread), whose per-layer counters the profiler reads."""
        return list(self._requests.made)

    def info(self) -> dict:
        return {**super().info(), **(self._facts if self.loaded else {})}

    def _close(self) -> None:
        self._requests = None
        self.compiled = None

    @classmethod
    def options_from_info(cls, info: dict) -> dict:
        """Its hint, inference precision and the threads it used: the same arithmetic as when it was measured."""
        options = {k: info[k] for k in ("hint", "inference_precision") if info.get(k)}
        return {**options, **({"threads": info["threads_used"]} if info.get("threads_used") else {})}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        from serve_bench.runners.profiles import profile_openvino

        return profile_openvino(path, batch, threads=threads, iters=iters, options=options, top=top)


def _type_name(value: Any) -> str:
    """OpenVINO's element type as it spells it (``f32``, ``bf16``), whatever object the property came back as."""
    name = getattr(value, "get_type_name", None)
    return name() if callable(name) else str(value)
