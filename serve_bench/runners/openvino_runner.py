"""OpenVINO on the CPU, reading the pipeline's ONNX files (fp32 and Q/DQ INT8) as they are.

The same file can run faster or slower, and answer differently, in OpenVINO than in onnxruntime
(other kernels, other fusions, and on CPUs with native bf16 OpenVINO's default inference precision
for a float model is bf16), so it is measured as its own candidate and its accuracy comes from
OpenVINO itself. What it actually ran with — the performance hint, the threads, the inference
precision it chose — is read back from the compiled model and reported, never assumed.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from serve_bench.runners.base import PerThread, Runner, RunnerError
from serve_bench.runners.kernel_census import census
from serve_bench.runners.profile_common import WARMUP_RUNS, profile_result, qdq_in_file, rounded

logger = logging.getLogger(__name__)

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

    runtime = "openvino"
    title = "OpenVINO"
    formats = {"onnx": "onnx"}
    install_hint = "pip install 'compress[cpu]'"
    library = "openvino"
    packages = ("openvino",)
    settings = OpenVinoSettings
    smoke_options = {"inference_precision": "f32"}  # its default is bf16 on CPUs with native bf16
    profile_note = ("OpenVINO per-layer CPU time (PERF_COUNT) of the compiled graph, after its fusions: a layer's "
                    "kernel name says its precision (I8, f32, bf16); profiling adds overhead, so the totals exceed "
                    "the un-profiled latency.")
    answers_depend_on_batch = True  # measured: logits of batches of 8 differ from batch 1 by up to 0.64 (2 threads)
    # Its oneDNN convolutions pad a width to the next block: 16 channels with AVX-512 (f32, and bf16 on AMX), 8 with
    # AVX2 (p50 rose with the width in steps of 8 under ONEDNN_MAX_CPU_ISA=AVX2); a dense 3×3 width off the block
    # cost up to 1.35× per MAC (pipelines/channel_multiples.py, AMX Xeon)
    channel_blocks = {"amx": 16, "avx512": 16, "avx2": 8}
    # Triton's OpenVINO backend reads OpenVINO's IR (its README: INFERENCE_NUM_THREADS, NUM_STREAMS); OVMS runs
    # files on OpenVINO itself
    triton_backend = {"backend": "openvino", "model_file": "model.xml", "kind": "KIND_CPU",
                      "threads_parameter": "INFERENCE_NUM_THREADS", "parameters": {"NUM_STREAMS": "1"}}
    served_by_ovms = True

    @classmethod
    def write_served_file(cls, onnx_file, target, extra_files=()) -> None:
        """OpenVINO's IR (``model.xml`` and ``.bin``) of the ONNX file, as OpenVINO reads it: both servers' OpenVINO
        paths load it, and its tensors keep the ONNX file's names. Weights stay float32 (no fp16 compression)."""
        import openvino as ov

        ov.save_model(ov.Core().read_model(str(onnx_file)), str(target), compress_to_fp16=False)

    def _load(self) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise RunnerError(f"OpenVINO is not installed: {self.install_hint}") from exc
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
    def unavailable(cls, device: str = "cpu") -> str | None:
        if device != "cpu":
            return "the openvino runner runs on the CPU only"
        try:
            import openvino as ov
        except ImportError:
            return f"OpenVINO is not installed: {cls.install_hint}"
        try:
            devices = ov.Core().available_devices
        except RuntimeError as exc:  # a plugin that fails to load
            return f"OpenVINO cannot list its devices: {str(exc).splitlines()[0]}"
        return None if "CPU" in devices else f"OpenVINO sees no CPU device (devices: {', '.join(devices) or 'none'})"

    @classmethod
    def version(cls) -> str | None:
        try:
            import openvino
        except ImportError:
            return None
        return openvino.get_version()

    @classmethod
    def here(cls) -> dict:
        import openvino as ov

        core = ov.Core()
        devices = []
        for device in core.available_devices:
            try:
                devices.append(f"{device}: {core.get_property(device, 'FULL_DEVICE_NAME')}")
            except RuntimeError as exc:  # a plugin that lists a device but cannot describe it
                devices.append(f"{device}: (name unreadable: {str(exc).splitlines()[0]})")
        reason = None if "CPU" in core.available_devices else "no CPU device"
        return {"version": ov.get_version(), "devices": devices, "unusable": reason, "detail": reason or ""}

    @classmethod
    def options_from_info(cls, info: dict) -> dict:
        """Its hint, inference precision and the threads it used: the same arithmetic as when it was measured."""
        options = {k: info[k] for k in ("hint", "inference_precision") if info.get(k)}
        return {**options, **({"threads": info["threads_used"]} if info.get("threads_used") else {})}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        return _profile(cls, path, batch, threads=threads, iters=iters, options=options, top=top)


def _type_name(value: Any) -> str:
    """OpenVINO's element type as it spells it (``f32``, ``bf16``), whatever object the property came back as."""
    name = getattr(value, "get_type_name", None)
    return name() if callable(name) else str(value)


def _profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict | None = None,
             top: int = 15) -> dict:
    """OpenVINO's per-layer counters, summed over ``iters`` runs after a warm-up.

    Layers OpenVINO fused away or never ran are left out. Q/DQ pairs become FakeQuantize layers there:
    one still executed converts in float on every run (not folded into an integer kernel), except the one
    quantizing the graph's input, which a float interface always needs.
    """
    settings = {k: v for k, v in (options or {}).items() if k in ("hint", "inference_precision")}
    with cls(path, threads=threads, perf_count=True, **settings) as runner:
        for _ in range(WARMUP_RUNS):
            runner.infer(batch)
        per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        per_node: dict[str, list] = {}
        run_total = 0.0
        for _ in range(iters):
            start = time.perf_counter()
            runner.infer(batch)
            run_total += time.perf_counter() - start
            for layer in runner.requests()[0].get_profiling_info():
                if str(layer.status).rsplit(".", 1)[-1] != "EXECUTED":
                    continue
                ms = layer.real_time.total_seconds() * 1e3
                per_op[layer.node_type][0] += ms
                per_op[layer.node_type][1] += 1
                node = per_node.setdefault(layer.node_name, [layer.node_type, layer.exec_type, 0.0])
                node[2] += ms
    nodes = sorted(per_node.items(), key=lambda kv: (-kv[1][2], kv[0]))
    top_nodes = [{"node": name, "op": op, "provider": kernel, "ms_per_run": rounded(ms / iters)}
                 for name, (op, kernel, ms) in nodes[:top]]
    named, quant_in, _ = qdq_in_file(path)
    unfused, edge = [], []
    for name, (op, _, ms) in nodes:
        if op == "FakeQuantize":
            (edge if name in quant_in else unfused).append({"node": name, "op": op, "ms_per_run": rounded(ms / iters),
                                                            "in_file": name in named})
    result = profile_result(cls.runtime, cls.profile_note, batch, iters, threads, run_total * 1e3 / iters, per_op, top_nodes, unfused, edge,
                     census("openvino", {k: tuple(v) for k, v in per_node.items()}, iters))
    logger.info("profiled %s with OpenVINO: %d runs, %d layer types, %d unfused FakeQuantize", path, iters,
                len(per_op), len(unfused))
    return result
