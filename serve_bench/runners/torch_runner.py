"""Eager PyTorch: the baseline every artifact is compared with (compiled torch is the inductor runtime)."""
from __future__ import annotations

import logging
import os

import numpy as np

from serve_bench.runners.base import Runner, RunnerError
from serve_bench.runners.native_output import native_stderr_to_log
from serve_bench.runners.profile_common import WARMUP_RUNS, profile_result

logger = logging.getLogger(__name__)


class TorchRunner(Runner):
    """Eager PyTorch: the baseline every artifact is compared with (compiled torch is the inductor runtime)."""

    runtime = "torch"
    title = "torch eager"
    eager = True
    formats = {"torch-model": "torch"}
    install_hint = "pip install compress (torch is a core dependency)"
    library, smoke_tolerance = "torch", 1e-5
    packages = ("torch",)
    profile_note = ("self CPU time of each torch op (time inside the op, not in the ops it calls); profiling adds "
                    "overhead, so the totals exceed the un-profiled latency.")

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
        return {**super().info(), "precision": "fp32"}

    def use_threads(self, threads: int) -> None:
        self._torch.set_num_threads(threads)  # one intra-op pool per process: every copy in it shares it

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        import torch

        return "torch sees no CUDA device" if device == "cuda" and not torch.cuda.is_available() else None

    @classmethod
    def version(cls) -> str | None:
        import torch

        return torch.__version__

    @classmethod
    def here(cls) -> dict:
        import torch

        devices = ["cpu"]
        if torch.cuda.is_available():
            devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        return {"version": torch.__version__, "devices": devices, "unusable": None,
                "detail": f"{build}; CUDA device visible: {'yes' if torch.cuda.is_available() else 'no'}"}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        return _profile(cls, path, batch, threads=threads, iters=iters, top=top)


def _profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, top: int = 15) -> dict:
    """Self CPU time per torch op over ``iters`` eager runs (``top`` unused: torch has no single nodes)."""
    import torch

    from train.model_io import load_model

    model, _ = load_model(path)
    return torch_op_profile(cls, path, model.eval(), torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)),
                            threads=threads, iters=iters)


def torch_op_profile(cls, path: str, run, x, *, threads: int, iters: int) -> dict:
    """Self CPU time per op of ``run(x)`` (a torch module, eager or compiled) under torch's profiler, after a
    warm-up, in ``cls``'s result shape."""
    # Kineto (torch's profiler) probes for a GPU on its first use and logs an ERROR line to stderr where there is
    # none; on a CPU-only profile that line is noise in the run's console. Its log level is read at that first use.
    # Its USDT lines no level silences: native_stderr_to_log sends them to the log.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(WARMUP_RUNS):
                run(x)
            with native_stderr_to_log("torch profiler", logger), profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(iters):
                    with record_function("model_run"):  # the whole run, Python overhead included
                        run(x)
    finally:
        torch.set_num_threads(previous_threads)
    per_op: dict[str, list[float]] = {}
    run_ms = None
    for event in prof.key_averages():
        if event.key == "model_run":
            run_ms = event.cpu_time_total / 1000.0 / iters
        else:
            per_op[event.key] = [event.self_cpu_time_total / 1000.0, float(event.count)]
    result = profile_result(cls.runtime, cls.profile_note, x, iters, threads, run_ms, per_op, [])
    logger.info("profiled %s with %s: %d runs, %d op types", path, cls.runtime, iters, len(per_op))
    return result
