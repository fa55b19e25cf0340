"""Backends behind one interface: load, infer, close; checking and bookkeeping live in the base.

Every runner refuses to pretend: onnxruntime silently falls back to the CPU when a GPU
provider cannot start, so the providers actually in use are checked after the session
is created and a fallback is an error, never a GPU number measured on the CPU.
"""
from __future__ import annotations

import os
import threading
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
    """What a runtime knows about itself lives on its runner class, so no caller branches on its name: whether its
    answers depend on the batch they come in, the device it always runs on, how its threads are set for a process,
    and how it profiles a file (``profile``)."""

    backend: ClassVar[str]
    # True where the same input answers differently in a batch of another size (OpenVINO on the CPU): its accuracy
    # is measured at the batch it serves
    answers_depend_on_batch: ClassVar[bool] = False
    title: ClassVar[str] = ""  # how messages name the runtime, where it differs from ``backend`` (OpenVINO)
    fixed_device: ClassVar[str | None] = None  # the device it runs on whatever the bench's (TensorRT: cuda)
    profiler_device: ClassVar[str] = "cpu"  # where its operator profiler times a file (TensorRT's: cuda)
    # the channel multiple its convolutions want, by instruction-set class (serve_bench.runners.channel_widths);
    # none known: no rounding asked for
    channel_blocks: ClassVar[dict[str, int]] = {}

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

    def use_threads(self, threads: int) -> None:
        """Size a thread pool the runtime shares across the process (torch's intra-op pool) for ``threads``; a
        runtime whose pool belongs to each session or compiled model has nothing to do."""

    @classmethod
    def options_from_info(cls, info: dict) -> dict:
        """The options that run a file again as :meth:`info` says it ran (what a release's card recorded), where
        they change its answers; none for a runtime whose answers do not depend on them."""
        return {}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        """Per-operator times of one file under this runtime's own profiler."""
        raise RunnerError(f"the {cls.backend} runner has no operator profiler")

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
