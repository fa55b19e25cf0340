"""onnxruntime on the CPU or a GPU provider; a provider that falls back to the CPU is an error."""
from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from serve_bench.runners.base import Runner, RunnerError
from serve_bench.runners.kernel_census import census
from serve_bench.runners.profile_common import QDQ_OPS, WARMUP_RUNS, profile_result, qdq_in_file, rounded

logger = logging.getLogger(__name__)


class OnnxRuntimeRunner(Runner):
    runtime = "onnxruntime"
    formats = {"onnx": "onnx"}
    install_hint = "pip install 'compress[cpu]' (or 'compress[gpu]' on a GPU machine)"
    library = "onnxruntime"
    packages = ("onnxruntime", "onnxruntime-gpu")
    profile_note = ("onnxruntime kernel time per node (CPU provider, after graph optimisation); profiling adds "
                    "overhead, so the totals exceed the un-profiled latency.")
    # Its x86 convolutions run in NCHWc blocks of 16 channels with AVX-512 and 8 with AVX2 (MLAS's
    # NchwcBlockSize); a width off the block costs as much as the next whole block, and a depthwise width that is
    # not a multiple of 4 fell to a path 2.6× slower per MAC (pipelines/channel_multiples.py, AMX Xeon).
    channel_blocks = {"amx": 16, "avx512": 16, "avx2": 8}
    # Triton's onnxruntime backend (its README: intra_op_thread_count)
    triton_backend = {"platform": "onnxruntime_onnx", "model_file": "model.onnx", "kind": "KIND_CPU",
                      "threads_parameter": "intra_op_thread_count"}
    _DEVICE_PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                         "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}

    def _load(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RunnerError(f"onnxruntime is not installed: {self.install_hint}") from exc
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
        host↔device copies for every runtime alike. Each run binds it afresh (I/O binding, the
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

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        try:
            import onnxruntime as ort
        except ImportError:
            return f"onnxruntime is not installed: {cls.install_hint}"
        wanted = cls._DEVICE_PROVIDERS.get(device, ["?"])[0]
        if wanted not in ort.get_available_providers():
            return f"onnxruntime has no {wanted} here (providers: {', '.join(ort.get_available_providers())})"
        return None

    @classmethod
    def version(cls) -> str | None:
        try:
            import onnxruntime
        except ImportError:
            return None
        return onnxruntime.__version__

    @classmethod
    def fingerprint(cls) -> dict | None:
        """Its version and providers: a GPU build measures on other kernels."""
        try:
            import onnxruntime
        except ImportError:
            return None
        return {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}

    @classmethod
    def here(cls) -> dict:
        import onnxruntime as ort

        providers = list(ort.get_available_providers())
        reason = None if "CPUExecutionProvider" in providers else "no CPUExecutionProvider"
        return {"version": ort.__version__, "devices": providers, "unusable": reason,
                "detail": f"device {ort.get_device()}" + (f"; {reason}" if reason else "")}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        return _profile(cls, path, batch, threads=threads, iters=iters,
                                   inter_op_threads=options.get("inter_op_threads", 1), top=top)


class _OnDevice:
    """An input already on an onnxruntime device (told apart from a host feed dict)."""

    def __init__(self, value) -> None:
        self.value = value


def _profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, inter_op_threads: int = 1,
             top: int = 15) -> dict:
    """Kernel time per node from onnxruntime's own profiler (CPU provider, the graph as optimised)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RunnerError(f"onnxruntime is not installed: {cls.install_hint}") from exc
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads, options.inter_op_num_threads = threads, inter_op_threads
        options.enable_profiling, options.profile_file_prefix = True, os.path.join(folder, "ort_profile")
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's error types (NoSuchFile, InvalidProtobuf...) derive from Exception
            raise RunnerError(f"onnxruntime could not load {path} to profile it: {exc}") from exc
        first = session.get_inputs()[0]
        dtype = np.float16 if first.type == "tensor(float16)" else np.float32
        feed = {first.name: np.ascontiguousarray(batch, dtype=dtype)}
        # One session, warm-up included, and the warm-up runs' events dropped by time: Python cannot switch
        # profiling on mid-session, and a second session would only be cold again (arena growth, thread-pool
        # start). A run's node events lie inside its model_run event, so those from the first measured
        # model_run's start on are the measured runs' and nothing else's.
        for _ in range(WARMUP_RUNS + iters):
            session.run(None, feed)
        trace_file = Path(session.end_profiling())
        events = json.loads((trace_file if trace_file.is_absolute() else Path.cwd() / trace_file).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    if len(runs) != WARMUP_RUNS + iters:
        logger.warning("onnxruntime profile of %s holds %d model_run events, expected %d", path, len(runs),
                       WARMUP_RUNS + iters)
    measured = runs[-iters:]
    if not measured:
        raise RunnerError(f"onnxruntime wrote no model_run events profiling {path}")
    cutoff = measured[0]["ts"]
    per_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_node: dict[str, list] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e["ts"] < cutoff:
            continue
        args = e.get("args", {})
        op, ms = args.get("op_name", "?"), e["dur"] / 1000.0
        per_op[op][0] += ms
        per_op[op][1] += 1
        node = per_node.setdefault(name[:-len("_kernel_time")], [op, args.get("provider", "?"), 0.0])
        node[2] += ms
    n = len(measured)
    run_ms = sum(e["dur"] for e in measured) / 1000.0 / n
    nodes = sorted(per_node.items(), key=lambda kv: (-kv[1][2], kv[0]))
    top_nodes = [{"node": name, "op": op, "provider": provider, "ms_per_run": rounded(ms / n)}
                 for name, (op, provider, ms) in nodes[:top]]
    named, quant_in, dequant_out = qdq_in_file(path)
    unfused, edge = [], []
    for name, (op, _, ms) in nodes:
        if op in QDQ_OPS:
            # A Q reading a graph input or a DQ writing a graph output converts at the model's edge: a float
            # interface needs it whatever the fusions did. Any other Q/DQ still running was not folded.
            # in_file False: a node onnxruntime's optimiser made (it moves Q/DQ across Reshape and the like).
            at_edge = name in (quant_in if op == "QuantizeLinear" else dequant_out)
            (edge if at_edge else unfused).append({"node": name, "op": op, "ms_per_run": rounded(ms / n),
                                                   "in_file": name in named})
    result = profile_result(cls.runtime, cls.profile_note, batch, n, threads, run_ms, per_op, top_nodes, unfused, edge,
                     census("onnxruntime", {k: tuple(v) for k, v in per_node.items()}, n))
    logger.info("profiled %s with onnxruntime: %d runs, %.3f ms per run, %d op types, %d unfused Q/DQ",
                path, n, run_ms, len(per_op), len(unfused))
    return result
