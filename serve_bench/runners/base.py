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
    """A runtime is unavailable, fell back to another device, or was misused."""


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

    runtime: ClassVar[str]
    # True where the same input answers differently in a batch of another size (OpenVINO on the CPU): its accuracy
    # is measured at the batch it serves
    answers_depend_on_batch: ClassVar[bool] = False
    title: ClassVar[str] = ""  # how messages name the runtime, where it differs from ``runtime`` (OpenVINO)
    fixed_device: ClassVar[str | None] = None  # the device it runs on whatever the bench's (TensorRT: cuda)
    profiler_device: ClassVar[str] = "cpu"  # where its operator profiler times a file (TensorRT's: cuda)
    # the channel multiple its convolutions want, by instruction-set class (serve_bench.runners.channel_widths);
    # none known: no rounding asked for
    channel_blocks: ClassVar[dict[str, int]] = {}
    # the artifact kinds it loads → the format name reports give such a file ("torch", "onnx", "tensorrt")
    formats: ClassVar[dict[str, str]] = {}
    # a kind's former name → today's (a manifest or card written before the rename is read, with a warning)
    former_kinds: ClassVar[dict[str, str]] = {}
    measured_by_default: ClassVar[bool] = True  # False: a bench measures files on it only where its runtimes say so
    # True for the framework running the model as written (torch eager): what a user has before deploying anything,
    # so the gate releases a file on it only where no exported or compiled file of any model passes
    eager: ClassVar[bool] = False
    install_hint: ClassVar[str] = ""  # the command that installs it, for every message that says it is missing
    profile_note: ClassVar[str] = ""  # how to read its operator profile (what its times include)
    bundle_folder: ClassVar[str] = "model"  # where a release bundle puts a file it is the home runtime of
    serving_file: ClassVar[str | None] = None  # the file in an artifact's folder it loads (None: the folder itself)
    native_int8_kind: ClassVar[str | None] = None  # the kind of INT8 file it makes from a torch model itself, if any
    library: ClassVar[str] = ""  # the module it imports (the doctor says "not installed" where it is absent)
    packages: ClassVar[tuple[str, ...]] = ()
    # how a bench stage configures it (a pydantic class with ``runner_options()``), under a field named after it
    settings: ClassVar[type | None] = None  # its distributions, whose versions a run's fingerprint records
    smoke_tolerance: ClassVar[float] = 1e-3  # largest |Δlogit| from torch in the doctor's smoke run, as a share
    smoke_options: ClassVar[dict] = {}  # runner options of the smoke run (fp32 arithmetic, to compare with torch)
    # How model servers run its files (serve_bench.servers): Triton's native backend for them (platform or backend,
    # the model file's name, where instances run, the parameter setting its intra-op threads, fixed parameters);
    # None: no model server here runs them. And whether OpenVINO Model Server runs them on this very runtime.
    triton_backend: ClassVar[dict[str, Any] | None] = None
    served_by_ovms: ClassVar[bool] = False

    @classmethod
    def write_served_file(cls, onnx_file: Path, target: Path, extra_files: tuple[Path, ...] = ()) -> None:
        """Write the file a model server loads as ``target`` (named by ``triton_backend``): the ONNX file as it is,
        its external-data files beside it."""
        import shutil

        shutil.copy2(onnx_file, target)
        for extra in extra_files:
            shutil.copy2(extra, target.parent / extra.name)

    def __init__(self, path: str | Path, *, threads: int | None = None, device: str = "cpu", **options: Any) -> None:
        self.path, self.device = Path(path), device
        self.threads = threads or physical_cores()
        self.options = options
        self.loaded = False

    def load(self) -> "Runner":
        if self.loaded:
            raise RunnerError(f"{self.runtime} runner for {self.path} is already loaded")
        self._load()
        self.loaded = True
        return self

    def prepare(self, x: np.ndarray) -> Any:
        """Stage an input where the runtime reads it (the device), for device-only timing."""
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
        return {"runtime": self.runtime, "device": self.device, "threads": self.threads}

    def use_threads(self, threads: int) -> None:
        """Size a thread pool the runtime shares across the process (torch's intra-op pool) for ``threads``; a
        runtime whose pool belongs to each session or compiled model has nothing to do."""

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        """Why this runtime cannot run files on ``device`` here, or None where it can. A check imports the library
        and asks it for the device, because an installed wheel is not a working runtime (onnxruntime-gpu without
        CUDA libraries, OpenVINO without a CPU plugin)."""
        return None

    @classmethod
    def version(cls) -> str | None:
        """The installed version of its library (None where it does not import): what a cached check ran on."""
        return None

    @classmethod
    def fingerprint(cls) -> dict | None:
        """What a run's fingerprint records of it (and a cached measurement depends on): its version; None where
        it is not installed."""
        found = cls.version()
        return {"version": found} if found else None

    @classmethod
    def variants(cls, file_format: str, options: dict) -> list[tuple[str, dict, str | None]]:
        """The candidates one file of ``file_format`` makes on this runtime, as (name suffix, runner options,
        precision; None keeps the file's own): one, unless the runtime runs a file several ways worth measuring
        apart."""
        return [("", options, None)]

    @classmethod
    def here(cls) -> dict:
        """What the doctor lists of it on this machine: version, the devices it sees, a detail, and why it cannot
        run files here (``unusable``, None where it can). Raises where its library is installed but broken."""
        device = cls.fixed_device or "cpu"
        reason = cls.unavailable(device)
        return {"version": cls.version(), "devices": [] if reason else [device], "detail": reason or "",
                "unusable": reason}

    @classmethod
    def smoke_file(cls, model_dir: Path, onnx_path: Path, folder: Path) -> tuple[Path, str]:
        """The file the doctor's smoke run loads in this runtime, made from the tiny model (its artifact folder and
        its ONNX export), and the device it runs on."""
        if "onnx" in cls.formats:
            return onnx_path, cls.fixed_device or "cpu"
        if "torch-model" in cls.formats:
            return model_dir, cls.fixed_device or "cpu"
        raise RunnerError(f"the {cls.runtime} runtime loads none of the smoke run's files")

    @classmethod
    def make_native_int8(cls, model: Any, description: dict, calibration: np.ndarray, folder: Path) -> dict:
        """Write its own INT8 file of a torch ``model`` into ``folder`` from the calibration images; the recipe."""
        raise RunnerError(f"the {cls.runtime} runtime makes no INT8 file of its own")

    def warm(self, x: np.ndarray) -> None:
        """Pay a first call's one-off cost (a compile) before anything is timed; :meth:`info` then reports it."""

    @classmethod
    def options_from_info(cls, info: dict) -> dict:
        """The options that run a file again as :meth:`info` says it ran (what a release's card recorded), where
        they change its answers; none for a runtime whose answers do not depend on them."""
        return {}

    @classmethod
    def profile(cls, path: str, batch: np.ndarray, *, threads: int, iters: int, options: dict, top: int) -> dict:
        """Per-operator times of one file under this runtime's own profiler."""
        raise RunnerError(f"the {cls.runtime} runner has no operator profiler")

    def __enter__(self) -> "Runner":
        return self.load()

    def __exit__(self, *exc) -> None:
        self.close()

    def _check(self, x: np.ndarray) -> None:
        if not self.loaded:
            raise RunnerError(f"{self.runtime} runner for {self.path}: call load() (or use it as a context manager) first")
        if x.ndim != 4:
            raise RunnerError(f"{self.runtime} runner expects N×C×H×W images, got shape {x.shape}")

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


PREDICT_AS = {"logits": lambda out: out,
              # a segmenter's answer: the class per pixel (uint8 where it fits), a 4·C-fold smaller hand-back than
              # its logits and all the metric reads
              "argmax": lambda out: out.argmax(1).astype(np.uint8 if out.shape[1] <= 256 else np.int32)}


def predict(runner: Runner, images: np.ndarray, batch_size: int, predict_as: str = "logits") -> np.ndarray:
    """Logits for every image, in batches (or what ``predict_as`` reduces them to, batch by batch): what accuracy
    is computed from, by the runner that ships."""
    reduce = PREDICT_AS[predict_as]
    return np.concatenate([reduce(np.asarray(runner.infer(images[i:i + batch_size])))
                           for i in range(0, len(images), batch_size)])
