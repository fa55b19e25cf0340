"""Eager (optionally compiled) PyTorch: the baseline every artifact is compared with."""
from __future__ import annotations

import numpy as np

from serve_bench.runners.base import Runner, RunnerError


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

    def use_threads(self, threads: int) -> None:
        self._torch.set_num_threads(threads)  # one intra-op pool per process: every copy in it shares it

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        from serve_bench.runners.profiles import profile_torch

        return profile_torch(path, batch, threads=threads, iters=iters, top=top)


