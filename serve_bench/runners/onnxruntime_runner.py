"""onnxruntime on the CPU or a GPU provider; a provider that falls back to the CPU is an error."""
from __future__ import annotations

import numpy as np

from serve_bench.runners.base import Runner, RunnerError


class OnnxRuntimeRunner(Runner):
    backend = "onnxruntime"
    # Its x86 convolutions run in NCHWc blocks of 16 channels with AVX-512 and 8 with AVX2 (MLAS's
    # NchwcBlockSize); a width off the block costs as much as the next whole block, and a depthwise width that is
    # not a multiple of 4 fell to a path 2.6× slower per MAC (pipelines/channel_multiples.py, AMX Xeon).
    channel_blocks = {"amx": 16, "avx512": 16, "avx2": 8}
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

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        from serve_bench.runners.profiles import profile_onnxruntime

        return profile_onnxruntime(path, batch, threads=threads, iters=iters,
                                   inter_op_threads=options.get("inter_op_threads", 1), top=top)


class _OnDevice:
    """An input already on an onnxruntime device (told apart from a host feed dict)."""

    def __init__(self, value) -> None:
        self.value = value


